"""Horovod-style collectives for scripts without DDP: rank and size, broadcast of parameters and optimizer
state, allreduce.

    import gradex.torch as gx
    gx.broadcast_parameters(model.state_dict(), root_rank=0)
    gx.broadcast_optimizer_state(optimizer, root_rank=0)
    total = gx.allreduce(torch.tensor([correct]), op=gx.Sum)

They run over one gradex engine of their own per process (created collectively at the first call, through
torch.distributed's store when a process group exists, else through gradex's own store and launcher detection,
like every gradex engine), configured for exactness: fp32 on the wire, no momentum, no compression.

Exactness. The engine's fp32 average is a sum divided by the world size P. Broadcasts and gathers therefore
travel as integers: the bytes of the tensors, cut into 16-bit words (8-bit from 257 ranks up), each multiplied
by P on the rank that owns it and 0 elsewhere. Every partial sum is then an integer below 2^24, the division by
P is exact, and the receiver gets the owner's bytes bit for bit, whatever the dtype (int64 buffers, bool,
bf16). That costs 2 floats per 2 bytes, i.e. twice the tensor's bytes on the wire (4x from 257 ranks). Average
is the engine's fp32 ring average (the same bits on every rank). Sum gathers every rank's tensor and adds them
in rank order in float64 (int64 for integer tensors), then casts back: exact for integers, one rounding for
floats, the same bits on every rank; it moves P times the tensor's bytes, so it is meant for counters and
metrics rather than gradients.
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
from . import _bootstrap, _ops
from . import _words

Average = "average"
Sum = "sum"

# The collectives' engine: exact (fp32 wire), no momentum, nothing compressed, no LocalSGD.
_CONFIG = {"GRADEX_FP16": "0", "GRADEX_MOMENTUM": "0", "GRADEX_SPARSITY": "0", "GRADEX_SPARSITY_OVERRIDES": "",
           "GRADEX_LOCALSGD_PERIOD": "0", "GRADEX_CLIP_NORM": "0", "GRADEX_NONFINITE": "propagate",
           "GRADEX_STATS_EVERY": "0", "GRADEX_POLICY": "fixed"}
_CHUNK_WORDS = 1 << 22  # floats per engine call (16 MiB): bounds the staging memory of large broadcasts

_lock = threading.RLock()
_engine: Optional[_capi.Engine] = None
_local: Optional[Tuple[int, int]] = None  # (local_rank, local_size), found once


def engine() -> _capi.Engine:
    """The collectives' engine of this process (created collectively at the first call)."""
    global _engine
    with _lock:
        if _engine is None or not _engine.address:
            _engine = _bootstrap.create_engine(_CONFIG)
        return _engine


def rank() -> int:
    """This process's rank: torch.distributed's when a process group exists, else the launcher's (as gradex's
    engines find it: torchrun, Open MPI, MPICH/Intel MPI, Slurm)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return engine().rank


def size() -> int:
    """The number of ranks (see rank())."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return engine().world_size


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


def _exact_slots(words: torch.Tensor, slot: Optional[int], slots: int) -> torch.Tensor:
    """Every rank's `words` (float32 integers < 2^16) placed in its slot; returns the slots' words on every
    rank, exactly (see the module docstring)."""
    world = size()
    m = words.numel()
    buffer = torch.zeros(slots * m, dtype=torch.float32)
    if slot is not None:
        buffer[slot * m:(slot + 1) * m] = words * world
    _average_in_place(buffer)
    return buffer.view(slots, m)


def _allgather_bytes(data: torch.Tensor) -> List[torch.Tensor]:
    """Every rank's uint8 tensor (the same length on every rank), in rank order."""
    bits = _words.word_bits(size())
    words = _words.to_words(data, bits)
    slots = _exact_slots(words, rank(), size())
    return [_words.from_words(slots[r], bits, data.numel()) for r in range(size())]


def _broadcast_bytes(data: torch.Tensor, root_rank: int) -> torch.Tensor:
    """root_rank's uint8 tensor (the same length on every rank), bit for bit."""
    bits = _words.word_bits(size())
    words = _words.to_words(data, bits)
    slots = _exact_slots(words, 0 if rank() == root_rank else None, 1)
    return _words.from_words(slots[0], bits, data.numel())


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


def require_same_layout(layout: bytes, operation: str, allgather: Callable[[torch.Tensor], List[torch.Tensor]],
                        what: str) -> None:
    """MismatchError on every rank unless every rank's `layout` is the same: a 16-byte digest of it gathered with
    `allgather` (every rank's uint8 tensor, in rank order). `what` says what the ranks passed differently."""
    digest = hashlib.sha256(layout).digest()[:16]
    digests = allgather(torch.frombuffer(bytearray(digest), dtype=torch.uint8))
    groups: Dict[bytes, List[int]] = {}
    for r, d in enumerate(digests):
        groups.setdefault(bytes(d.tolist()), []).append(r)
    if len(groups) > 1:
        raise _errors.MismatchError(f"gradex: {operation}: ranks passed {what}; groups of ranks that agree: "
                                    f"{sorted(groups.values())}")


def _same_everywhere(layout: bytes, operation: str) -> None:
    """MismatchError on every rank when ranks describe their tensors differently."""
    require_same_layout(layout, operation, _allgather_bytes, "different tensors (names, shapes or dtypes)")


def _broadcast_tensors(tensors: List[torch.Tensor], root_rank: int, operation: str,
                       layout: Optional[bytes] = None) -> None:
    if layout is None:
        layout = repr([(tuple(t.shape), str(t.dtype)) for t in tensors]).encode()
    if size() > 1:
        _same_everywhere(layout, operation)
    flats = [t.detach().reshape(-1).contiguous().cpu() for t in tensors]
    parts = [f.view(torch.uint8) for f in flats if f.numel()]
    data = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)
    if size() > 1 and data.numel():
        data = _broadcast_bytes(data, root_rank)
    if rank() == root_rank:
        return
    offset = 0
    with torch.no_grad():
        for t, f in zip(tensors, flats):
            n = f.numel() * f.element_size()
            if n:
                t.copy_(data[offset:offset + n].clone().view(f.dtype).view(t.shape))  # clone: aligned
            offset += n


def close() -> None:
    """Releases the collectives' engine (created again by the next collective). Collective."""
    global _engine
    with _lock:
        if _engine is not None:
            _engine.close()
            _engine = None
