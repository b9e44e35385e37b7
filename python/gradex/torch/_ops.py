"""The op library (libgradex_torch_ops.so, TORCH_LIBRARY(gradex)): loading it, and calling its ops so that
failures raise gradex's exceptions with the engine's message.

The ops run in the calling thread; torch releases the GIL while an op runs, so a blocking `wait` does not
stall other Python threads.
"""
import os
import re
import threading

import torch

from .. import _capi, _errors

_loaded = False
_lock = threading.Lock()
# The op library reports failures as c10::Error "gradex[<STATUS>]: <engine message>".
_FAILURE = re.compile(r"gradex\[([A-Z_]+)\]: (.*)", re.S)


def library_path():
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "libgradex_torch_ops.so")


def load():
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


def _translated(exc):
    match = _FAILURE.search(str(exc))
    if match is None:
        return exc
    return _errors.error_for_name(match.group(1), match.group(2).strip())


def submit(engine, key, tensor):
    """Hands a gradient to the engine; returns a ticket for wait(). `engine` is an Engine's address."""
    try:
        return torch.ops.gradex.submit(engine, key, tensor)
    except RuntimeError as exc:
        raise _translated(exc) from None


def average(engine, key, tensor):
    """Hands parameters to the engine for averaging across ranks; returns a ticket for wait()."""
    try:
        return torch.ops.gradex.average(engine, key, tensor)
    except RuntimeError as exc:
        raise _translated(exc) from None


def wait(ticket):
    """Blocks until the ticket's exchange is done; its tensor then holds the result."""
    try:
        torch.ops.gradex.wait(ticket)
    except RuntimeError as exc:
        raise _translated(exc) from None


def wait_all(tickets):
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


def has_cuda():
    """Whether this op library was built with its CUDA staging path."""
    return bool(torch.ops.gradex.has_cuda())
