"""Horovod-style collectives for scripts without DDP: rank and size, broadcast of parameters and optimizer
state, allreduce.

    import gradex.torch as gx
    gx.broadcast_parameters(model.state_dict(), root_rank=0)
    gx.broadcast_optimizer_state(optimizer, root_rank=0)
    total = gx.allreduce(torch.tensor([correct]), op=gx.Sum)

They run over gradex groups and engines of this process's own (created collectively at the first call that
needs them, through torch.distributed's store when a process group exists, else through gradex's own store and
launcher detection, like every gradex engine).

Exactness. Broadcasts and gathers move the tensors' bytes unchanged through a gradex group
(gradex_group_broadcast: a pipelined chain in which every rank sends the bytes once; gradex_group_allgather: a
ring), bit for bit whatever the dtype (int64 buffers, bool, bf16). Ranks agree on the byte count first: a
different count on some rank is a MismatchError on every rank. Average is an engine's fp32 ring average (fp32
on the wire, no momentum, nothing compressed: the same bits on every rank). Sum gathers every rank's tensor and
adds them in rank order in float64 (int64 for integer tensors), then casts back: exact for integers, one
rounding for floats, the same bits on every rank; it moves P times the tensor's bytes, so it is meant for
counters and metrics rather than gradients.
"""
from __future__ import annotations

import hashlib
import io
import pickle
import socket
import struct
import threading
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import torch
import torch.distributed as dist

from .. import _capi, _errors
from .._exact_config import exact_average_config
from . import _bootstrap, _exact, _ops

Average = "average"
Sum = "sum"

# The collectives run on an engine created with gradex._exact_config.exact_average_config().
_CHUNK_WORDS = 1 << 22  # floats per engine call (16 MiB): bounds the staging memory of large averages

_lock = threading.RLock()
_engine: Optional[_capi.Engine] = None
_group: Optional[_capi.Group] = None
_local: Optional[Tuple[int, int]] = None  # (local_rank, local_size), found once


def engine() -> _capi.Engine:
    """The engine of allreduce(op=gx.Average) in this process (created collectively at its first call)."""
    global _engine
    with _lock:
        if _engine is None or not _engine.address:
            _engine = _bootstrap.create_engine(exact_average_config())
        return _engine


def group() -> _capi.Group:
    """The group of the exact collectives (broadcasts, gathers) in this process (created collectively at the
    first call)."""
    global _group
    with _lock:
        if _group is None or not _group.address:
            _group = _bootstrap.create_group()
        return _group


def rank() -> int:
    """This process's rank: torch.distributed's when a process group exists, else the launcher's (as gradex's
    engines find it: torchrun, Open MPI, MPICH/Intel MPI, Slurm)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return group().rank


def size() -> int:
    """The number of ranks (see rank())."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return group().world_size


def local_rank() -> int:
    """This process's index among the ranks on its host (ranks ordered by global rank; hosts told apart by
    host name). Collective at the first call of local_rank() or local_size()."""
    return _local_ranks()[0]


def local_size() -> int:
    """The number of ranks on this host (see local_rank())."""
    return _local_ranks()[1]


def _local_ranks() -> Tuple[int, int]:
    global _local
    with _lock:
        if _local is None:
            host = hashlib.sha256(socket.gethostname().encode()).digest()[:8]
            hosts = _allgather_bytes(torch.frombuffer(bytearray(host), dtype=torch.uint8))
            me = rank()
            same = [r for r, h in enumerate(hosts) if torch.equal(h, hosts[me])]
            _local = (same.index(me), len(same))
        return _local


# --- exact transport of bytes -------------------------------------------------------------------------



def _average_in_place(values: torch.Tensor) -> None:
    """The engine's fp32 average over ranks of a flat float32 CPU tensor, in chunks of _CHUNK_WORDS."""
    e = engine()
    for start in range(0, values.numel(), _CHUNK_WORDS):
        chunk = values[start:start + _CHUNK_WORDS]
        key = f"gx.collective/{chunk.numel()}"
        e.register(key, chunk.numel(), _capi.FLOAT32)
        _ops.wait(_ops.average(e.address, key, chunk))


def _allgather_bytes(data: torch.Tensor) -> List[torch.Tensor]:
    """Every rank's uint8 tensor (the same length on every rank, else MismatchError everywhere), in rank
    order."""
    return _exact.allgather_bytes(group(), data)


def _broadcast_bytes(data: torch.Tensor, root_rank: int) -> torch.Tensor:
    """root_rank's uint8 tensor (the same length on every rank), bit for bit; returns it."""
    return _exact.broadcast_bytes(group(), data, root_rank)


def _check_root(root_rank: int) -> None:
    world = size()
    if not isinstance(root_rank, int) or not 0 <= root_rank < world:
        raise _errors.InvalidArgumentError(f"gradex: root_rank must be a rank in [0, {world}), got {root_rank!r}")


def _u64(value: int) -> torch.Tensor:
    return torch.frombuffer(bytearray(struct.pack("<Q", value)), dtype=torch.uint8)


# --- public collectives -------------------------------------------------------------------------------

def broadcast_object(obj: Any, root_rank: int = 0) -> Any:
    """root_rank's `obj` (pickled there, unpickled everywhere else; every rank of the job is trusted, as with
    torch.distributed.broadcast_object_list). Collective."""
    with _lock:
        _check_root(root_rank)
        payload = pickle.dumps(obj) if rank() == root_rank else b""
        length = struct.unpack("<Q", bytes(_broadcast_bytes(_u64(len(payload)), root_rank).tolist()))[0]
        data = _broadcast_bytes(torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload
                                else torch.zeros(length, dtype=torch.uint8), root_rank)
        if rank() == root_rank:
            return obj
        return pickle.loads(data.numpy().tobytes())


def broadcast_(tensor: torch.Tensor, root_rank: int = 0) -> torch.Tensor:
    """Overwrites `tensor` with root_rank's, bit for bit (any dtype and device). Collective; returns it."""
    with _lock:
        _check_root(root_rank)
        _broadcast_tensors([tensor], root_rank, "broadcast_")
        return tensor


def broadcast(tensor: torch.Tensor, root_rank: int = 0) -> torch.Tensor:
    """A copy of root_rank's `tensor` on every rank (the argument is left as it is)."""
    return broadcast_(tensor.detach().clone(), root_rank)


def broadcast_parameters(params: Union[Mapping[str, torch.Tensor], Iterable[Tuple[str, torch.Tensor]]],
                         root_rank: int = 0) -> None:
    """Copies root_rank's values into `params` on every rank, bit for bit: a state_dict (model.state_dict():
    parameters and buffers, any dtype) or an iterable of (name, tensor) pairs (model.named_parameters()).
    Matched by name; every rank must pass the same names, shapes and dtypes (else gradex.MismatchError on
    every rank, naming the ranks). Collective."""
    items = sorted(params.items() if hasattr(params, "items") else list(params), key=lambda kv: kv[0])
    names = [name for name, _ in items]
    if len(set(names)) != len(names):
        raise _errors.InvalidArgumentError("gradex: broadcast_parameters got duplicate names")
    tensors = [t for _, t in items]
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        bad = [n for n, t in items if not isinstance(t, torch.Tensor)]
        raise _errors.InvalidArgumentError(f"gradex: broadcast_parameters needs tensors; not tensors: {bad[:8]}")
    with _lock:
        _check_root(root_rank)
        layout = repr([(n, tuple(t.shape), str(t.dtype)) for n, t in items]).encode()
        _broadcast_tensors(tensors, root_rank, "broadcast_parameters", layout)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Gives every rank root_rank's optimizer state (the wrapped optimizer's for a gx.DistributedOptimizer):
    its state_dict() travels bit for bit and is loaded with load_state_dict() on the other ranks, so state
    that exists only on the root (moments created by a first step) arrives too. The optimizers must have the
    same parameter groups. Collective."""
    inner = getattr(optimizer, "_gradex_wrapped", optimizer)
    with _lock:
        _check_root(root_rank)
        blob = b""
        if rank() == root_rank:
            buffer = io.BytesIO()
            torch.save(inner.state_dict(), buffer)
            blob = buffer.getvalue()
        length = struct.unpack("<Q", bytes(_broadcast_bytes(_u64(len(blob)), root_rank).tolist()))[0]
        data = _broadcast_bytes(torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob
                                else torch.zeros(length, dtype=torch.uint8), root_rank)
        if rank() != root_rank:
            state = torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True, map_location="cpu")
            inner.load_state_dict(state)


def allreduce(tensor: torch.Tensor, op: str = Average) -> torch.Tensor:
    """A new tensor holding the average (op=gx.Average: floating-point tensors) or the sum (op=gx.Sum: exact
    for integers, float64 accumulation in rank order for floats) of `tensor` over ranks; the same bits on
    every rank. Collective."""
    return allreduce_(tensor.detach().clone(), op)


def allreduce_(tensor: torch.Tensor, op: str = Average) -> torch.Tensor:
    """allreduce() in place; returns `tensor`."""
    if op not in (Average, Sum):
        raise _errors.InvalidArgumentError(f"gradex: allreduce op must be gx.Average or gx.Sum, not {op!r}")
    if tensor.is_complex():
        raise _errors.InvalidArgumentError("gradex: allreduce of complex tensors is not supported")
    with _lock:
        if op == Average:
            if not tensor.is_floating_point():
                raise _errors.InvalidArgumentError(
                    f"gradex: op=gx.Average needs a floating-point tensor, not {tensor.dtype}; use op=gx.Sum")
            values = tensor.detach().to("cpu", torch.float32).reshape(-1).clone()
            _average_in_place(values)
            with torch.no_grad():
                tensor.copy_(values.view(tensor.shape))
            return tensor
        flat = tensor.detach().reshape(-1).contiguous().cpu()
        if size() == 1:
            return tensor
        _same_everywhere(f"allreduce {tuple(tensor.shape)} {tensor.dtype}".encode(), "allreduce")
        gathered = _allgather_bytes(flat.view(torch.uint8) if flat.numel() else torch.zeros(0, dtype=torch.uint8))
        accumulate = torch.float64 if tensor.is_floating_point() else torch.int64
        total = torch.zeros(flat.numel(), dtype=accumulate)
        for data in gathered:  # rank order: the same bits everywhere
            total += data.view(flat.dtype).to(accumulate) if tensor.dtype != torch.bool \
                else data.view(torch.bool).to(accumulate)
        with torch.no_grad():
            tensor.copy_(total.to(tensor.dtype).view(tensor.shape))
        return tensor


def _same_everywhere(layout: bytes, operation: str) -> None:
    """MismatchError on every rank when ranks describe their tensors differently."""
    _exact.require_same_layout(group(), layout, operation, "different tensors (names, shapes or dtypes)")


def _broadcast_tensors(tensors: List[torch.Tensor], root_rank: int, operation: str,
                       layout: Optional[bytes] = None) -> None:
    if size() > 1:
        _exact.broadcast_tensors(group(), tensors, root_rank, operation, layout)


def close() -> None:
    """Releases the collectives' group and engine (created again by the next collective). Collective."""
    global _engine, _group
    with _lock:
        if _group is not None:
            _group.close()
            _group = None
        if _engine is not None:
            _engine.close()
            _engine = None
