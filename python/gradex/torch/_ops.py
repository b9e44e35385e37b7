"""The op library (libgradex_torch_ops.so, TORCH_LIBRARY(gradex)): loading it, and calling its ops so that
failures raise gradex's exceptions with the engine's message.

The ops run in the calling thread; torch releases the GIL while an op runs, so a blocking `wait` does not
stall other Python threads.
"""
from __future__ import annotations

import os
import threading
import warnings
from typing import Dict, Iterable, Set

import torch

from .. import _capi, _errors

_loaded = False
_lock = threading.Lock()


def library_path() -> str:
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "libgradex_torch_ops.so")


def load() -> None:
    """Loads libgradex.so (checking its API version) and then the op library, once per process."""
    global _loaded
    with _lock:
        if _loaded:
            return
        _capi.lib()
        path = library_path()
        if not os.path.exists(path):
            raise ImportError(f"gradex: {path} does not exist; install the package with pip (see docs/pytorch.md)")
        torch.ops.load_library(path)
        _loaded = True


_device_checked: Dict[int, bool] = {}  # CUDA device index -> whether gradex's CUDA backend works there
_warned: Set[int] = set()


def memory_of(tensor: torch.Tensor) -> int:
    """The memory a tensor is registered in: _capi.DEVICE_CUDA for float32 CUDA tensors when gradex's CUDA
    backend loads (the engine then computes on the GPU; submit with on_device=True), else _capi.DEVICE_CPU
    (CPU tensors; CUDA tensors are then staged whole through pinned host memory, with a one-time warning
    when the backend is what is missing)."""
    if not tensor.is_cuda:
        return _capi.DEVICE_CPU
    if tensor.dtype != torch.float32 or not has_cuda():
        return _capi.DEVICE_CPU
    index = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    with _lock:
        ok = _device_checked.get(index)
        if ok is None:
            ok, reason = _capi.device_available(_capi.DEVICE_CUDA, index)
            _device_checked[index] = ok
            if not ok and index not in _warned:
                _warned.add(index)
                warnings.warn(f"gradex: the CUDA backend is unavailable on cuda:{index} ({reason}); CUDA "
                              f"gradients are staged whole through host memory and compressed on the CPU",
                              RuntimeWarning, stacklevel=3)
    return _capi.DEVICE_CUDA if ok else _capi.DEVICE_CPU


def submit(engine: int, key: str, tensor: torch.Tensor, on_device: bool = False) -> int:
    """Hands a gradient to the engine; returns a ticket for wait(). `engine` is an Engine's address.
    `on_device`: the key is registered as CUDA memory (memory_of): the engine works on the tensor itself,
    ordered after the current stream, and wait() orders the waiting thread's current stream after it."""
    try:
        if on_device:
            return torch.ops.gradex.submit_device(engine, key, tensor)
        return torch.ops.gradex.submit(engine, key, tensor)
    except RuntimeError as exc:
        raise _errors.translate_op_error(exc) from None


def submit_absent(engine: int, key: str, tensor: torch.Tensor, on_device: bool = False) -> int:
    """An absent contribution (a rank that ran out of data, gx.join): the exchange runs as for submit(), but
    this rank contributes zeros and its momentum and DGC state stay untouched; `tensor` is not read and
    receives the average over all ranks. Returns a ticket for wait()."""
    try:
        return torch.ops.gradex.submit_absent(engine, key, tensor, bool(on_device))
    except RuntimeError as exc:
        raise _errors.translate_op_error(exc) from None


def average(engine: int, key: str, tensor: torch.Tensor) -> int:
    """Hands parameters to the engine for averaging across ranks; returns a ticket for wait()."""
    try:
        return torch.ops.gradex.average(engine, key, tensor)
    except RuntimeError as exc:
        raise _errors.translate_op_error(exc) from None


def wait(ticket: int) -> None:
    """Blocks until the ticket's exchange is done; its tensor then holds the result."""
    try:
        torch.ops.gradex.wait(ticket)
    except RuntimeError as exc:
        raise _errors.translate_op_error(exc) from None


def wait_all(tickets: Iterable[int]) -> None:
    """Waits for every ticket (none is left in flight, even after a failure), then raises the first
    error seen, if any."""
    first_error = None
    for ticket in tickets:
        try:
            wait(ticket)
        except _errors.GradexError as exc:
            first_error = first_error or exc
    if first_error is not None:
        raise first_error


def has_cuda() -> bool:
    """Whether this op library was built with its CUDA paths (device submission and staging)."""
    return bool(torch.ops.gradex.has_cuda())
