"""Bytes moved unchanged between ranks through a gradex group: the exact transport of gradex.torch.collectives
(broadcasts and gathers without a process group's help) and of gradex.torchft's process group (every collective
but the float average). Every function is collective over the group's ranks, called by one thread per group at
a time, in the same order on every rank."""
from __future__ import annotations

import hashlib
from typing import Dict, List, Optional, Sequence

import torch

from .. import _capi, _errors

_ALIGN = 16  # bytes: where each tensor starts in a fused broadcast buffer, so that its slice views as its dtype


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU uint8 view of a tensor's bytes (a copy when it lives elsewhere or is not contiguous)."""
    flat = tensor.detach().reshape(-1).contiguous().cpu()
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    return flat.view(torch.uint8) if flat.numel() else torch.zeros(0, dtype=torch.uint8)


def from_bytes(data: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A CPU tensor of `like`'s dtype and shape holding `data`'s bytes."""
    if like.numel() == 0:
        return torch.empty_like(like, device="cpu")
    raw = data.clone()  # aligned storage of its own
    return raw.view(like.dtype).view(like.shape)


def allgather_bytes(group: _capi.Group, data: torch.Tensor) -> List[torch.Tensor]:
    """Every rank's uint8 tensor (the same length on every rank, else MismatchError on every rank), in rank
    order: views of one buffer filled in place around the ring."""
    data = data.reshape(-1).contiguous()
    out = torch.empty(group.world_size * data.numel(), dtype=torch.uint8)
    group.allgather(data.data_ptr(), data.numel(), out.data_ptr())
    return list(out.view(group.world_size, data.numel()).unbind(0))


def allgather(group: _capi.Group, tensor: torch.Tensor) -> List[torch.Tensor]:
    """Every rank's tensor (same shape and dtype everywhere), in rank order, as CPU tensors."""
    return [from_bytes(d, tensor) for d in allgather_bytes(group, as_bytes(tensor))]


def broadcast_bytes(group: _capi.Group, data: torch.Tensor, root: int) -> torch.Tensor:
    """root's uint8 tensor (the same length on every rank, else MismatchError on every rank), bit for bit, in
    place when `data` is contiguous; returns it."""
    data = data.reshape(-1).contiguous()
    group.broadcast(data.data_ptr(), data.numel(), root)
    return data


def require_same_layout(group: _capi.Group, layout: bytes, operation: str, what: str) -> None:
    """MismatchError on every rank unless every rank's `layout` is the same (a 16-byte digest of it is
    gathered). `what` says what the ranks passed differently."""
    if group.world_size == 1:
        return
    digest = hashlib.sha256(layout).digest()[:16]
    digests = allgather_bytes(group, torch.frombuffer(bytearray(digest), dtype=torch.uint8))
    groups: Dict[bytes, List[int]] = {}
    for r, d in enumerate(digests):
        groups.setdefault(bytes(d.tolist()), []).append(r)
    if len(groups) > 1:
        raise _errors.MismatchError(f"gradex: {operation}: ranks passed {what}; groups of ranks that agree: "
                                    f"{sorted(groups.values())}")


def tensors_layout(tensors: Sequence[torch.Tensor]) -> bytes:
    return repr([(tuple(t.shape), str(t.dtype)) for t in tensors]).encode()


def broadcast_tensors(group: _capi.Group, tensors: Sequence[torch.Tensor], root: int, operation: str,
                      layout: Optional[bytes] = None) -> None:
    """root's tensors into every rank's (any dtype and device), in one broadcast of their bytes after a check
    that every rank passes the same layout (`layout`, default: shapes and dtypes; else MismatchError on every
    rank). A contiguous CPU tensor alone travels in place; several are packed into one buffer on the root and
    unpacked on the others."""
    if group.world_size == 1:
        return
    require_same_layout(group, tensors_layout(tensors) if layout is None else layout, operation,
                        "different tensors (names, shapes or dtypes)")
    nbytes = [t.numel() * t.element_size() for t in tensors]
    if sum(nbytes) == 0:
        return
    if len(tensors) == 1 and tensors[0].is_contiguous() and tensors[0].device.type == "cpu":
        group.broadcast(tensors[0].data_ptr(), nbytes[0], root)
        return
    offsets, total = [], 0
    for n in nbytes:
        offsets.append(total)
        total += -(-n // _ALIGN) * _ALIGN
    is_root = group.rank == root
    data = torch.zeros(total, dtype=torch.uint8) if is_root else torch.empty(total, dtype=torch.uint8)
    present = [(t, data[o:o + n].view(t.dtype).view(t.shape)) for t, o, n in zip(tensors, offsets, nbytes) if n]
    if is_root:
        for t, view in present:
            view.copy_(t.detach())
    group.broadcast(data.data_ptr(), total, root)
    if not is_root:
        with torch.no_grad():
            for t, view in present:
                t.copy_(view)
