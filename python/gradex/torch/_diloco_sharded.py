"""DiLoCo over FSDP2: which tensors the outer optimizer owns and which ranks it spans.

A model sharded by fully_shard(..., mesh=mesh[shard_dim]) holds DTensor parameters whose local shards are
persistent (FSDP2 swaps in unsharded parameters only between a forward pass and the end of backward): the
outer optimizer reads and writes those shards in place, and exchanges each with the ranks of its replicate
group, which hold the same shard in the other replica groups. Inside a replica group FSDP2 trains as usual
(the inner steps); across groups only DiLoCo's pseudo-gradients travel. A forward pass outside training (an
evaluation) leaves the root module unsharded, its forward then reading the unsharded copy: DiLoCo reshards
every FSDP2 module before it reads or writes the shards (FSDPModule.reshard), so a merge is never bypassed.
Empty shards (a parameter with fewer
rows than shards) are left out, identically on every rank of a replicate group.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from .. import _errors


def fsdp_modules(model: torch.nn.Module) -> List[Any]:
    """The model's FSDP2 modules (empty for a model FSDP2 does not shard)."""
    from torch.distributed.fsdp import FSDPModule
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def reshard(modules: List[Any]) -> None:
    """Puts the sharded parameters back into FSDP2 modules left unsharded by a forward pass."""
    for m in modules:
        m.reshard()


def local_parameters(model: torch.nn.Module) -> List[Tuple[str, torch.Tensor]]:
    """[(name, tensor)]: the model's parameters, as this rank's non-empty local shards for an FSDP2 model
    (after resharding it). Raises InvalidArgumentError for a model only partly sharded."""
    from torch.distributed.tensor import DTensor
    reshard(fsdp_modules(model))
    named: List[Tuple[str, torch.Tensor]] = list(model.named_parameters())
    if not any(isinstance(p, DTensor) for _, p in named):
        return named
    unsharded = [n for n, p in named if not isinstance(p, DTensor)]
    if unsharded:
        raise _errors.InvalidArgumentError(
            f"gradex: parameter '{unsharded[0]}' is not sharded by FSDP2 while others are: call fully_shard on "
            f"the root module too")
    # Every parameter is a DTensor here (checked above).
    shards = ((n, p.to_local().detach()) for n, p in named if isinstance(p, DTensor))
    return [(name, local) for name, local in shards if local.numel()]


def outer_tensors(model: torch.nn.Module, mesh: Optional[DeviceMesh], replicate_dim: str,
                  shard_dim: str) -> Tuple[Optional[dist.ProcessGroup], List[Tuple[str, torch.Tensor]]]:
    """(process group or None, [(name, tensor)]): the group the outer optimizer spans (None: the default
    group) and the parameters, as local shards for an FSDP2 model."""
    from torch.distributed.tensor import DTensor
    reshard(fsdp_modules(model))
    sharded = [n for n, p in model.named_parameters() if isinstance(p, DTensor)]
    if not sharded:
        if mesh is not None:
            raise _errors.InvalidArgumentError(
                "gradex: DiLoCo was given a mesh but the model has no DTensor parameters: call fully_shard(module, "
                "mesh=mesh['shard']) first, or leave mesh out for an unsharded model")
        return None, list(model.named_parameters())
    if mesh is None:
        raise _errors.InvalidArgumentError(
            f"gradex: parameter '{sharded[0]}' is a DTensor (an FSDP2 model): pass the 2-D DeviceMesh (mesh=) "
            f"whose '{shard_dim}' dimension FSDP2 shards over, so that DiLoCo exchanges across '{replicate_dim}'")
    from .fsdp import check_sharded_on, replicate_layout
    group, _, _, shard_mesh = replicate_layout(mesh, replicate_dim, shard_dim)
    check_sharded_on(model, shard_mesh, "gx.DiLoCo")
    return group, local_parameters(model)
