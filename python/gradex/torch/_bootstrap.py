"""Creating engines: from torch.distributed's store when it is initialized, else from the environment.

Under torchrun (or any init_process_group) the launcher's store already serves MASTER_PORT, so gradex never
starts a second server there: it bootstraps through that store, under a key prefix of its own. Engines are
created collectively; every rank must create its engines in the same order, which numbers their prefixes
("gradex/<n>/") identically everywhere.
"""
import atexit
import itertools
import threading
import weakref

import torch
import torch.distributed as dist

from .. import _capi, _errors
from . import _ops

_counter = itertools.count()
_live = []  # weak references to live engines, most recent last (for gradex.torch.stats())
_live_lock = threading.Lock()


def dtype_code(dtype):
    """gradex_dtype_t of a torch dtype."""
    codes = {torch.float32: _capi.FLOAT32, torch.float16: _capi.FLOAT16, torch.bfloat16: _capi.BFLOAT16}
    if dtype not in codes:
        raise _errors.InvalidArgumentError(
            f"gradex exchanges float32, float16 and bfloat16 tensors, not {dtype}")
    return codes[dtype]


def create_engine(config=None, store=None):
    """A new engine. `config`: GRADEX_* overrides (name -> value) that win over the environment. `store`:
    a torch.distributed.Store to bootstrap through (default: the default process group's, if any)."""
    _ops.load()
    config = {str(k): str(v) for k, v in (config or {}).items()}
    if store is None and dist.is_available() and dist.is_initialized():
        store = dist.distributed_c10d._get_default_store()
    if store is not None:
        if not (dist.is_available() and dist.is_initialized()):
            raise _errors.InvalidArgumentError("gradex: a store was given but torch.distributed is not initialized")
        prefix = f"gradex/{next(_counter)}/"
        engine = _capi.Engine(dist.get_rank(), dist.get_world_size(), store, prefix, config)
    else:
        # No framework store: the engine reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT itself.
        engine = _capi.Engine(-1, -1, None, None, config)
    with _live_lock:
        _live.append(weakref.ref(engine))
    return engine


def latest_engine():
    """The most recently created engine that is still open, or None."""
    with _live_lock:
        _live[:] = [ref for ref in _live if ref() is not None and ref().address]
        return _live[-1]() if _live else None


def _close_all_at_exit():
    """Destroys engines still open at interpreter exit, before the C++ runtime tears down under their
    background threads."""
    with _live_lock:
        engines = [ref() for ref in _live if ref() is not None]
        _live.clear()
    for engine in reversed(engines):
        try:
            engine.close()
        except _errors.GradexError:
            pass  # exiting anyway; the failure was reported where it happened


atexit.register(_close_all_at_exit)
