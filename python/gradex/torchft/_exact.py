"""Exact collectives over one gradex engine: what a torchft ProcessGroup needs besides the fp32 average.

The engine's only collective is the fp32 average (a ring sum divided by the world size P, the same bits on
every rank). Everything else travels as integers through it, the way gradex.torch.collectives does for the
Horovod-style calls: the bytes of the tensors, cut into 16-bit words (8-bit from 257 ranks up), each
multiplied by P on the rank that owns it and 0 elsewhere. Every partial sum is then an integer below 2^24, the
division by P is exact, and every rank gets the owner's bytes bit for bit, whatever the dtype. A gather moves
2P times the tensor's bytes (4P from 257 ranks), so it is meant for the Manager's small collectives, metrics,
quorum-time broadcasts and integer reductions, not for gradients (those go through average()).

Every function here is collective over the engine's ranks and must be called by one thread per engine at a
time, in the same order on every rank (ProcessGroupGradex runs them on one worker thread per engine).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from .. import _capi, _errors
from ..torch import _integration as _gxt
from ..torch.collectives import require_same_layout

_CHUNK_WORDS = 1 << 22  # floats per engine call (16 MiB): bounds the staging memory of large transfers


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




def _slots(engine: _capi.Engine, words: torch.Tensor, slot: Optional[int], slots: int) -> torch.Tensor:
    """Every rank's `words` placed in its slot (None: this rank owns none); returns the slots' words."""
    world = engine.world_size
    m = words.numel()
    buffer = torch.zeros(slots * m, dtype=torch.float32)
    if slot is not None and m:
        buffer[slot * m:(slot + 1) * m] = words * world
    if buffer.numel():
        average_(engine, buffer)
    return buffer.view(slots, m)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU uint8 view of a tensor's bytes (a copy when it lives elsewhere)."""
    flat = tensor.detach().reshape(-1).contiguous().cpu()
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    return flat.view(torch.uint8) if flat.numel() else torch.zeros(0, dtype=torch.uint8)


def allgather_bytes(engine: _capi.Engine, data: torch.Tensor) -> List[torch.Tensor]:
    """Every rank's uint8 tensor (the same length on every rank), in rank order."""
    if engine.world_size == 1:
        return [data.clone()]
    bits = _gxt.word_bits(engine.world_size)
    slots = _slots(engine, _gxt.to_words(data, bits), engine.rank, engine.world_size)
    return [_gxt.from_words(slots[r], bits, data.numel()) for r in range(engine.world_size)]


def broadcast_bytes(engine: _capi.Engine, data: torch.Tensor, root: int) -> torch.Tensor:
    """root's uint8 tensor (the same length on every rank), bit for bit."""
    if engine.world_size == 1:
        return data.clone()
    bits = _gxt.word_bits(engine.world_size)
    slots = _slots(engine, _gxt.to_words(data, bits), 0 if engine.rank == root else None, 1)
    return _gxt.from_words(slots[0], bits, data.numel())


def from_bytes(data: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A tensor of `like`'s dtype and shape holding `data`'s bytes."""
    if like.numel() == 0:
        return torch.empty_like(like, device="cpu")
    raw = data.clone()  # aligned storage of its own
    if like.dtype == torch.bool:
        return raw.view(torch.uint8).to(torch.bool).view(like.shape)
    return raw.view(like.dtype).view(like.shape)


def allgather(engine: _capi.Engine, tensor: torch.Tensor) -> List[torch.Tensor]:
    """Every rank's tensor (same shape and dtype everywhere), in rank order, as CPU tensors."""
    return [from_bytes(d, tensor) for d in allgather_bytes(engine, as_bytes(tensor))]


def check_same_layout(engine: _capi.Engine, tensors: Sequence[torch.Tensor], operation: str) -> None:
    """MismatchError on every rank when ranks pass tensors of different shapes or dtypes: a collective over
    differently shaped tensors would otherwise mix bytes silently."""
    if engine.world_size == 1:
        return
    layout = repr([(tuple(t.shape), str(t.dtype)) for t in tensors]).encode()
    require_same_layout(layout, operation, lambda t: allgather_bytes(engine, t),
                        "tensors of different shapes or dtypes")
