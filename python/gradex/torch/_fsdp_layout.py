"""Where each parameter's gradient shard lies in the flat tensor FSDP2 hands to an all-reduce hook.

fully_shard(module) manages the parameters of `module` that no nested fully_shard module manages, in
module traversal order (shared parameters once). After its reduce-scatter, FSDP2 gives the hook one flat
tensor per module: parameter i's shard starts where the previous parameter's padded shard ends (a dim-0
shard of n rows is padded to ceil(n / world) rows; shards on other dims are even) and its first
`local numel` elements are the rank's gradient shard, which FSDP2 then views as the sharded gradient.
The layout is computed from public facts (the module tree, the DTensor parameters' shapes and placements)
and checked against the flat tensor's size, so a change in FSDP2's layout is an error, never a silent
misassignment.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Shard

from .. import _errors


@dataclass(frozen=True)
class ShardSlice:
    key: str  # the engine's key: "<parameter name>/shard<index>of<count>"
    name: str  # the parameter's name in the model
    parameter: DTensor
    offset: int  # first element in the flat reduce output
    numel: int  # this rank's shard (0: an empty shard, nothing to exchange)
    rows: int  # the shard's output rows (a weight's dim 0), 0 for vectors


def fsdp_modules(model: torch.nn.Module) -> List[Any]:  # torch.nn.Module and FSDPModule
    """The model's fully_shard modules (the model itself included), in module order."""
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def managed_parameters(module: torch.nn.Module) -> List[torch.nn.Parameter]:
    """The parameters fully_shard(module) manages: those of its subtree outside nested FSDP modules."""
    seen: set = set()
    params: List[torch.nn.Parameter] = []
    stack = [module]
    order: List[torch.nn.Module] = []
    while stack:  # pre-order traversal, as module.modules(), pruned at nested FSDP modules
        m = stack.pop()
        order.append(m)
        children = [c for c in m.children() if not isinstance(c, FSDPModule)]
        stack.extend(reversed(children))
    for m in order:
        for p in m.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def _padded_shard_numel(param: DTensor) -> int:
    shape = tuple(param.shape)
    world = param.device_mesh.size()
    placement = param.placements[0]
    if not isinstance(placement, Shard):
        raise _errors.InvalidArgumentError(
            f"gradex: a parameter of shape {shape} is placed {placement} by FSDP2; gradex.torch.HSDP expects "
            f"sharded (Shard) parameters on the shard mesh")
    dim = placement.dim
    rows = -(-shape[dim] // world) if dim == 0 else shape[dim] // world
    return rows * math.prod(s for i, s in enumerate(shape) if i != dim)


def module_layout(module: torch.nn.Module, names: Dict[int, str], shard_index: int,
                  shard_count: int) -> List[ShardSlice]:
    """[ShardSlice] of a fully_shard module's parameters that train, in FSDP2's flat order."""
    slices: List[ShardSlice] = []
    offset = 0
    for p in managed_parameters(module):
        if not p.requires_grad:
            continue  # FSDP2 reduces only parameters that train
        if not isinstance(p, DTensor):
            raise _errors.InvalidArgumentError(
                f"gradex: parameter '{names.get(id(p), '?')}' is not a DTensor: call fully_shard on the module "
                f"before gradex.torch.HSDP")
        local = p.to_local()
        name = names.get(id(p))
        if name is None:
            raise _errors.InvalidArgumentError(
                f"gradex: a parameter of shape {tuple(p.shape)} of a fully_shard module is not a parameter of "
                f"the model given to gradex.torch.HSDP")
        rows = int(local.shape[0]) if local.dim() >= 2 and local.numel() > 0 else 0
        slices.append(ShardSlice(f"{name}/shard{shard_index}of{shard_count}", name, p, offset,
                                 local.numel(), rows))
        offset += _padded_shard_numel(p)
    return slices


def check_size(slices: List[ShardSlice], flat: torch.Tensor, module_name: str) -> None:
    """Raises MismatchError when FSDP2's flat reduce output does not have the size the layout expects."""
    if not slices:
        raise _errors.MismatchError(
            f"gradex: FSDP2 reduced {flat.numel()} gradient elements for module '{module_name}', which has no "
            f"parameter that trains in gradex's layout")
    last = slices[-1]
    expected = last.offset + _padded_shard_numel(last.parameter)
    if flat.numel() != expected:
        raise _errors.MismatchError(
            f"gradex: FSDP2 reduced {flat.numel()} gradient elements for module '{module_name}', but its "
            f"parameters' shards take {expected}: a parameter that trains got no gradient in this backward "
            f"(unused in the forward pass: call set_reduce_scatter_unused_params(True) on the module), or this "
            f"torch's FSDP2 lays gradients out differently than gradex.torch.HSDP expects")
