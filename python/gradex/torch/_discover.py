"""Which DDP module a bucket came from, for a gx.State created without one (gx.State(), as PyTorch Lightning's
DDPStrategy(ddp_comm_state=gx.State()) does).

A comm hook receives only (state, bucket); the bucket does not say which DistributedDataParallel module, and
so which process group, it belongs to. An engine over the wrong ranks would average with ranks of another
group silently, so at its first bucket a State without a module looks for the live DDP module whose
parameters include the bucket's (a single scan of the garbage collector's objects, once per State) and
takes its process group and its parameter names from it.
"""
from __future__ import annotations

import gc
from typing import Optional, Sequence

import torch

from .. import _errors


def owner_of(parameters: Sequence[torch.Tensor]) -> Optional[torch.nn.parallel.DistributedDataParallel]:
    """The DistributedDataParallel module holding the first of `parameters`, or None."""
    if not parameters:
        return None
    target = id(parameters[0])
    found = []
    for obj in gc.get_objects():
        if isinstance(obj, torch.nn.parallel.DistributedDataParallel):
            if any(id(p) == target for p in obj.module.parameters()):
                found.append(obj)
    if len(found) > 1:
        raise _errors.InvalidArgumentError(
            f"gradex: {len(found)} DDP modules share the bucket's parameters; pass the one this hook serves "
            f"to gx.State(ddp)")
    return found[0] if found else None
