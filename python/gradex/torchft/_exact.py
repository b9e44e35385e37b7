"""What a torchft ProcessGroup needs besides the engine's fp32 average: exact collectives over the generation's
gradex group (gradex_group_*: bytes unchanged, a pipelined chain broadcast and a ring allgather; gradex.torch's
_integration.exact), and the average itself over its engine.

Every function here is collective over the ranks of its engine or group and must be called by one thread per
generation at a time, in the same order on every rank (ProcessGroupGradex runs them on one worker thread per
generation).
"""
from __future__ import annotations

from typing import List, Sequence

import torch

from .. import _capi
from ..torch import _integration as _gxt

_bytes = _gxt.exact

_CHUNK_WORDS = 1 << 22  # floats per engine call (16 MiB): bounds the staging memory of large averages

as_bytes = _bytes.as_bytes
from_bytes = _bytes.from_bytes


def average_(engine: _capi.Engine, values: torch.Tensor) -> None:
    """Replaces a flat float32 CPU tensor by its average over the engine's ranks (chunks of _CHUNK_WORDS, one
    engine key per chunk size, reused from call to call). The chunks go as dense gradients (the engine runs
    with fp32 on the wire, no momentum, nothing compressed: a ring allreduce whose result has the same bits on
    every rank), not as LocalSGD parameter averages: those keep an anchor per key, which a survivor of a
    reconfiguration would hold and a newcomer would not."""
    for start in range(0, values.numel(), _CHUNK_WORDS):
        chunk = values[start:start + _CHUNK_WORDS]
        key = f"gx.torchft/{chunk.numel()}"
        engine.register(key, chunk.numel(), _capi.FLOAT32)
        _gxt.wait(_gxt.submit(engine.address, key, chunk))


def allgather(group: _capi.Group, tensor: torch.Tensor) -> List[torch.Tensor]:
    """Every rank's tensor (same shape and dtype everywhere), in rank order, as CPU tensors."""
    return _bytes.allgather(group, tensor)


def broadcast(group: _capi.Group, tensors: Sequence[torch.Tensor], root: int) -> None:
    """root's tensors into every rank's, after a check that every rank passes the same shapes and dtypes."""
    _bytes.broadcast_tensors(group, tensors, root, "broadcast")


def check_same_layout(group: _capi.Group, tensors: Sequence[torch.Tensor], operation: str) -> None:
    """MismatchError on every rank when ranks pass tensors of different shapes or dtypes: a collective over
    differently shaped tensors would otherwise mix bytes silently."""
    _bytes.require_same_layout(group, _bytes.tensors_layout(tensors), operation,
                               "tensors of different shapes or dtypes")
