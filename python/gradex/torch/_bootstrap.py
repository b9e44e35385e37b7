"""Creating engines: from torch.distributed's store when it is initialized, else from the environment.

Under torchrun (or any init_process_group) the launcher's store already serves MASTER_PORT, so gradex never
starts a second server there: it bootstraps through that store, under a key prefix of its own. Engines are
created collectively by the ranks of one process group; every rank must create its engines for a group in the
same order, which numbers their prefixes identically everywhere: "gradex/<n>/" for the default group,
"gradex/g<r0>-<r1>-.../<n>/" for a subgroup (named by its global ranks, so that several groups' engines
coexist in one store and one process).
"""
from __future__ import annotations

import atexit
import collections
import itertools
import threading
import weakref
from typing import DefaultDict, Iterator, List, Optional, Tuple, Union, cast

import torch
import torch.distributed as dist

from .. import _capi, _errors
from . import _ops

_counters: DefaultDict[str, Iterator[int]] = collections.defaultdict(itertools.count)  # group tag -> engine numbers
# weak references to live engines, most recent last (for gradex.torch.stats())
_live: List[weakref.ref[Union[_capi.Engine, _capi.Outer]]] = []
_live_lock = threading.Lock()
# engines still starting in the background (EngineStart): joined at exit before the live ones close
_starting: "weakref.WeakSet[EngineStart]" = weakref.WeakSet()


def dtype_code(dtype: torch.dtype) -> int:
    """gradex_dtype_t of a torch dtype."""
    codes = {torch.float32: _capi.FLOAT32, torch.float16: _capi.FLOAT16, torch.bfloat16: _capi.BFLOAT16}
    if dtype not in codes:
        raise _errors.InvalidArgumentError(
            f"gradex exchanges float32, float16 and bfloat16 tensors, not {dtype}")
    return codes[dtype]


def group_ranks(group: Optional[dist.ProcessGroup]) -> List[int]:
    """Global ranks of a process group (None: the default group's, when torch.distributed is initialized)."""
    if group is None or group is dist.GroupMember.WORLD:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


def is_default_group(group: Optional[dist.ProcessGroup]) -> bool:
    return group is None or group is dist.GroupMember.WORLD or \
        (dist.is_initialized() and group_ranks(group) == list(range(dist.get_world_size())))


def _membership(store: Optional[_capi.KeyValueStore], group: Optional[dist.ProcessGroup]
                ) -> Tuple[int, int, Optional[_capi.KeyValueStore], Optional[str]]:
    """(rank, world_size, store, prefix) of a new handle over the ranks of `group` (default: the default
    process group), through `store` (default: the default process group's, if any); (-1, -1, None, None)
    without torch.distributed: the handle reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT itself."""
    if group is not None and not (dist.is_available() and dist.is_initialized()):
        raise _errors.InvalidArgumentError("gradex: a process group was given but torch.distributed is not initialized")
    if store is None and dist.is_available() and dist.is_initialized():
        # torch's Store is a KeyValueStore (its stubs declare set's value as str; it takes bytes too).
        store = cast(_capi.KeyValueStore, dist.distributed_c10d._get_default_store())
    if store is None:
        return -1, -1, None, None
    if not (dist.is_available() and dist.is_initialized()):
        raise _errors.InvalidArgumentError("gradex: a store was given but torch.distributed is not initialized")
    if is_default_group(group):
        rank, world, tag = dist.get_rank(), dist.get_world_size(), ""
    else:
        ranks = group_ranks(group)
        if dist.get_rank() not in ranks:
            raise _errors.InvalidArgumentError(
                f"gradex: rank {dist.get_rank()} is not a member of the process group of ranks {ranks}")
        rank, world, tag = ranks.index(dist.get_rank()), len(ranks), "g" + "-".join(map(str, ranks)) + "/"
    return rank, world, store, f"gradex/{tag}{next(_counters[tag])}/"


def create_engine(config: _capi.Config = None, store: Optional[_capi.KeyValueStore] = None,
                  group: Optional[dist.ProcessGroup] = None,
                  membership: Optional[Tuple[int, int, _capi.AnyStore, Optional[str]]] = None) -> _capi.Engine:
    """A new engine over the ranks of `group` (default: the default process group). `config`: GRADEX_*
    overrides (name -> value) that win over the environment. `store`: a torch.distributed.Store to bootstrap
    through (default: the default process group's, if any). `membership`: (rank, world_size, store,
    store_prefix) given explicitly (State.reconfigure before bootstrap, torchft): used as is, without
    torch.distributed."""
    _ops.load()
    config = {str(k): str(v) for k, v in (config or {}).items()}
    if membership is None:
        engine = _capi.Engine(*_membership(store, group), config)
    else:
        engine = _capi.Engine(*membership, config)
    with _live_lock:
        _live.append(weakref.ref(engine))
    return engine


class EngineStart:
    """An engine being created on a thread of its own (create_engine's arguments): its prefix is numbered on the
    caller's thread, in the order every rank creates its engines, and the collective start (connection,
    agreement, layout and, on a long path, the link probe) runs meanwhile, overlapping whatever the process does
    until engine() is called."""

    def __init__(self, config: _capi.Config, store: Optional[_capi.KeyValueStore],
                 group: Optional[dist.ProcessGroup]) -> None:
        _ops.load()
        membership = _membership(store, group)
        self._engine: Optional[_capi.Engine] = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(config, membership), daemon=True,
                                        name="gradex engine start")
        with _live_lock:
            _starting.add(self)
        self._thread.start()

    def _run(self, config: _capi.Config, membership: Tuple[int, int, _capi.AnyStore, Optional[str]]) -> None:
        try:
            self._engine = create_engine(config, membership=membership)
        except BaseException as e:  # raised where the engine is first needed
            self._error = e

    def join(self) -> None:
        """Waits for the start to end, whether it succeeded or failed (bounded by GRADEX_TIMEOUT_S)."""
        self._thread.join()

    def engine(self) -> _capi.Engine:
        """The engine, once started (waits for it); the start's error, raised again on every call."""
        self.join()
        if self._error is not None:
            raise self._error
        assert self._engine is not None
        return self._engine


def create_group(store: Optional[_capi.KeyValueStore] = None, group: Optional[dist.ProcessGroup] = None
                 ) -> _capi.Group:
    """A new gradex group (exact collectives) over the ranks of `group`, bootstrapped as create_engine's
    engines are (numbered in the same sequence: every rank creates its engines and groups in one order)."""
    _ops.load()
    return _capi.Group(*_membership(store, group))


def latest_engine() -> Optional[Union[_capi.Engine, _capi.Outer]]:
    """The most recently created engine that is still open, or None."""
    with _live_lock:
        _live[:] = [ref for ref in _live if (engine := ref()) is not None and engine.address]
        return _live[-1]() if _live else None


def _close_all_at_exit() -> None:
    """Destroys engines still open at interpreter exit, before the C++ runtime tears down under their
    background threads."""
    with _live_lock:
        starts = list(_starting)
    for start in starts:  # a start still connecting (bounded by GRADEX_TIMEOUT_S) ends before teardown
        start.join()
    with _live_lock:
        engines = [engine for engine in (ref() for ref in _live) if engine is not None]
        _live.clear()
    for engine in reversed(engines):
        try:
            engine.close()
        except _errors.GradexError:
            pass  # exiting anyway; the failure was reported where it happened


atexit.register(_close_all_at_exit)
