"""The process's gradex state for TensorFlow: the job's store, its engines and their op-library slots.

gxt.init() takes rank, size and local rank from the C API's launch information (torchrun, Open MPI, MPICH /
Intel MPI / PMI, Slurm: comm/rendezvous/launch.h, the code every gradex bootstrap uses), connects to the job's store and
creates two engines, collectively:
  - the collective engine: dense, fp32 on the wire, no momentum: exact averages (allreduce, metrics) and
    bit-exact broadcasts, whatever GRADEX_* says about gradients;
  - the default gradient engine: the GRADEX_* policy (DGC / fp16 / dense per tensor), for a gradient source
    that does not know its optimizer (gradex then adds momentum only when GRADEX_MOMENTUM is set explicitly).
The store is the core's TCP store (gradex_store_connect): rank 0 serves it on MASTER_ADDR:MASTER_PORT and
every connection proves GRADEX_JOB_SECRET when one is set. Under torchrun the launcher's agent already serves
MASTER_PORT: gradex is then a client of that store through torch, as the torch plugin is, and the secret
protects the UCX side (every pair of ranks proves it; docs/security.md).

Gradient engines are cached by their effective configuration (GRADEX_* overrides, including the momentum the
plugin decided): wrappers with equal configurations share one engine. A cache miss creates an engine, which
is collective: every rank must build its wrappers in the same order (store prefixes are numbered).
"""
from __future__ import annotations

import atexit
import datetime
import logging
import os
import socket
import threading
import weakref
from typing import Any, Dict, Hashable, List, Optional, Set, Tuple, Union

from .. import _capi, _errors
from .._exact_config import exact_average_config
from . import _ops

logger = logging.getLogger("gradex")

class Engine:
    """A gradex engine of this process as TensorFlow sees it: the C engine bound to an op-library slot, and
    the configuration it was created with. `gxt.engine(config)` returns one; wrappers take it as `engine=`."""

    def __init__(self, capi_engine: _capi.Engine, slot: int, config: Dict[str, str]) -> None:
        self.engine = capi_engine
        self.slot = slot
        self.config = dict(config)

    def stats(self, last_step: bool = False) -> _capi.Stats:
        return self.engine.stats(last_step)

    def describe_config(self) -> str:
        return self.engine.describe_config()

    def explain(self) -> str:
        return self.engine.explain()

    def save_state(self) -> bytes:
        return self.engine.save_state()

    def load_state(self, blob: bytes) -> None:
        self.engine.load_state(blob)

    @property
    def closed(self) -> bool:
        return not self.engine.address

    def close(self) -> None:
        if self.engine.address:
            _ops.unbind(self.slot)
            self.engine.close()


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.store: Optional[_JobStoreLike] = None
        self.rank = 0
        self.size = 1
        self.local_rank = 0
        self.local_size = 1
        self.launcher = "none"
        # The collective engine and the default gradient engine, from init() on (state() calls it).
        self.collective: Any = None
        self.gradients: Any = None
        self.init_config: Dict[str, str] = {}
        # configuration key -> Engine (gradient engines, the default one included)
        self.engines: Dict[Tuple[Tuple[str, str], ...], Engine] = {}
        self.order: List[Engine] = []  # gradient engines in creation order (state_dict)
        self.engines_created = 0
        self.next_slot = 1
        self.outers: List[weakref.ref[_capi.Outer]] = []  # weak references to DiLoCo outer optimizers (closed before the store)
        self.group: Optional[_capi.Group] = None  # exact collectives (broadcast_variables), from its first use


_state = _State()
_said_once: Set[Hashable] = set()


def say_once(key: Hashable, message: str, level: int = logging.WARNING) -> None:
    """Logs `message` on the "gradex" logger the first time `key` is seen in this process."""
    if key in _said_once:
        return
    _said_once.add(key)
    logger.log(level, message)


def _timeout_s() -> float:
    """GRADEX_TIMEOUT_S as gxt.init's config or the environment sets it."""
    try:
        return float(_state.init_config.get("GRADEX_TIMEOUT_S", os.environ.get("GRADEX_TIMEOUT_S", "300")))
    except ValueError:
        return 300.0  # the engine reports the bad value itself, naming its range


def normalized(config: _capi.Config) -> Dict[str, str]:
    return {str(k): str(v) for k, v in (config or {}).items()}


def known_names() -> Set[str]:
    """The GRADEX_* names the core knows (the first column of its configuration description)."""
    names = set()
    for line in _capi.describe_config().splitlines():
        head = line.strip().split("=", 1)[0]
        if head.startswith("GRADEX_") and "=" in line:
            names.add(head)
    return names


def check_config(config: _capi.Config, what: str = "config=") -> None:
    """Validates names and values of GRADEX_* overrides in this process, before any engine or connection:
    gradex.ConfigError naming the variable. Uses the core's gradex_check_config when this libgradex has it,
    else the names of the core's configuration description (values are then checked by engine creation,
    which parses them before it connects anywhere)."""
    config = normalized(config)
    if not config:
        return
    checker = getattr(_capi, "check_config", None)
    if checker is not None:
        try:
            checker(config)
        except _errors.ConfigError as exc:
            raise _errors.ConfigError(f"{exc} (in {what})") from None
        return
    known = known_names()
    unknown = sorted(k for k in config if k not in known)
    if unknown:
        raise _errors.ConfigError(
            f"gradex: unknown configuration variable{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(k) for k in unknown)} in {what} (gxt.describe_config() lists the known ones)")


def explicit_setting(name: str, config: _capi.Config = None) -> Optional[str]:
    """The value of `name` set explicitly in `config`, gxt.init(config=...) or the environment (None if none)."""
    for source in (normalized(config), _state.init_config):
        if name in source:
            return source[name]
    value = os.environ.get(name)
    return value if value not in (None, "") else None


def _launcher_store(host: str, port: int, size: int) -> Optional[_TorchStore]:
    """Under torchrun the launcher's agent already serves its store on MASTER_PORT: gradex becomes one more
    client of it (through torch, which torchrun implies) instead of trying to serve the port again."""
    if not os.environ.get("TORCHELASTIC_RUN_ID"):
        return None
    from torch.distributed import TCPStore
    return _TorchStore(TCPStore(host, port, size, False, timeout=datetime.timedelta(seconds=_timeout_s())))


class _TorchStore:
    """torch's TCPStore with JobStore's get(key, timeout_ms), for the local-size agreement."""

    def __init__(self, store: Any) -> None:  # torch.distributed.TCPStore (its stubs type values as str)
        self.store = store

    def set(self, key: str, value: bytes) -> None:
        self.store.set(key, bytes(value))

    def get(self, key: str, timeout_ms: int) -> bytes:
        self.store.wait([key], datetime.timedelta(milliseconds=timeout_ms))
        return bytes(self.store.get(key))

    def wait(self, keys: List[str], timeout: datetime.timedelta) -> None:
        self.store.wait(keys, timeout)

    def add(self, key: str, delta: int) -> int:
        return int(self.store.add(key, int(delta)))


def _local_placement(store: _JobStoreLike, rank: int, size: int, prefix: str) -> Tuple[int, int]:
    """(local rank, local size) when the launcher does not say: ranks sharing this host's name, numbered in
    global rank order, agreed through the store (each rank publishes its host, then reads the others')."""
    host = socket.gethostname().encode()
    store.set(f"{prefix}host/{rank}", host)
    ms = int(_timeout_s() * 1000)
    hosts = [store.get(f"{prefix}host/{r}", ms) for r in range(size)]
    mine = [r for r in range(size) if hosts[r] == host]
    return mine.index(rank), len(mine)


# The job's store: the core's JobStore, or torchrun's store (_TorchStore).
_JobStoreLike = Union[_capi.JobStore, _TorchStore]


def initialized() -> bool:
    return _state.collective is not None


def state() -> _State:
    if _state.collective is None:
        raise _errors.InvalidArgumentError("gradex: call gradex.tensorflow.init() first")
    return _state


def _new_engine(config: Dict[str, str]) -> Engine:
    """Creates an engine through the job's store (collective) and binds it to a fresh slot."""
    s = _state
    # A torchrun restart reuses the launcher's store: the attempt number keeps its keys apart.
    prefix = f"gradex/tf/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{s.engines_created}/"
    store = s.store.store if isinstance(s.store, _TorchStore) else s.store
    engine = _capi.Engine(s.rank, s.size, store, prefix, config)
    s.engines_created += 1
    slot = s.next_slot
    s.next_slot += 1
    try:
        _ops.bind(slot, engine)
    except BaseException:
        engine.close()
        raise
    return Engine(engine, slot, config)


def new_outer(config: _capi.Config) -> _capi.Outer:
    """A DiLoCo outer optimizer (_capi.Outer) through the job's store (collective; numbered with the engines),
    closed by shutdown() before the store."""
    with _state.lock:
        s = state()
        prefix = f"gradex/tf/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{s.engines_created}/"
        store = s.store.store if isinstance(s.store, _TorchStore) else s.store
        outer = _capi.Outer(s.rank, s.size, store, prefix, dict(s.init_config, **normalized(config)))
        s.engines_created += 1
        s.outers.append(weakref.ref(outer))
        return outer


def group() -> _capi.Group:
    """The group of eager exact collectives (broadcast_variables), created at its first use through the job's
    store (collective; numbered with the engines), closed by shutdown() before the store."""
    with _state.lock:
        s = state()
        if s.group is None:
            prefix = f"gradex/tf/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{s.engines_created}/"
            store = s.store.store if isinstance(s.store, _TorchStore) else s.store
            s.group = _capi.Group(s.rank, s.size, store, prefix, s.init_config)
            s.engines_created += 1
        return s.group


def raw_gradient_config(config: _capi.Config = None) -> Dict[str, str]:
    """The configuration of an engine whose optimizer gradex does not know: GRADEX_MOMENTUM as set
    explicitly, else 0."""
    merged = dict(_state.init_config, **normalized(config))
    merged["GRADEX_MOMENTUM"] = explicit_setting("GRADEX_MOMENTUM", config) or "0"
    return merged


def say_no_optimizer(config: _capi.Config = None) -> None:
    """Said once per process when gradients whose optimizer gradex does not know (a tape, gxt.engine) get no
    momentum because GRADEX_MOMENTUM is not set."""
    if explicit_setting("GRADEX_MOMENTUM", config) is None:
        say_once("raw-momentum",
                 "gradex: the gradients' optimizer is unknown here (DistributedGradientTape, gxt.engine), so "
                 "gradex adds no momentum: the optimizer applies its own. Set GRADEX_MOMENTUM explicitly for "
                 "DGC momentum correction (then run the optimizer without momentum), or use "
                 "gxk.DistributedOptimizer, which decides from the optimizer.", logging.INFO)


def init(config: _capi.Config = None) -> None:
    """Idempotent; see gradex.tensorflow.init."""
    s = _state
    with s.lock:
        if s.collective is not None:
            return
        _ops.load()
        config = normalized(config)
        check_config(config, "gxt.init(config=...)")
        info = _capi.launch_info()  # ConfigError for a rank without a size (or the reverse)
        s.init_config = config
        rank, size = info["rank"], info["world_size"]
        store: Optional[_JobStoreLike] = None
        try:
            if size > 1:
                store = _launcher_store(info["master_addr"], info["master_port"], size)
            if store is None:
                store = _capi.JobStore(rank, size, config)
            s.store, s.rank, s.size, s.launcher = store, rank, size, info["launcher"]
            s.engines_created = 0  # a fresh store: prefixes restart everywhere
            local_rank, local_size = info["local_rank"], info["local_size"]
            if local_rank is None or local_size is None:
                found_rank, found_size = _local_placement(
                    store, rank, size, f"gradex/tf/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/")
                local_rank = found_rank if local_rank is None else local_rank
                local_size = found_size if local_size is None else local_size
            s.local_rank, s.local_size = local_rank, local_size
            s.collective = _new_engine(exact_average_config())
            s.gradients = _gradient_engine_locked(raw_gradient_config())
        except BaseException:
            if s.store is None and store is not None and hasattr(store, "close"):
                store.close()
            _shutdown_locked()
            raise


def _config_key(config: _capi.Config) -> Tuple[Tuple[str, str], ...]:
    return tuple(sorted(normalized(config).items()))


def _gradient_engine_locked(effective: Dict[str, str]) -> Engine:
    s = _state
    key = _config_key(effective)
    found = s.engines.get(key)
    if found is not None and not found.closed:
        return found
    ref = _new_engine(effective)
    s.engines[key] = ref
    s.order.append(ref)
    return ref


def gradient_engine(effective_config: _capi.Config) -> Engine:
    """The gradient engine with exactly this effective configuration (GRADEX_* overrides over gxt.init's
    config and the environment): cached, or created now (collective)."""
    s = state()
    with s.lock:
        return _gradient_engine_locked(dict(s.init_config, **normalized(effective_config)))


def engine_for(config: _capi.Config = None, engine: Optional[Engine] = None, what: str = "the wrapper") -> Engine:
    """What a wrapper given `config=` or `engine=` runs on (not both): `engine`, the default gradient engine,
    or the cached engine of gxt.init's config plus `config` (momentum as for an unknown optimizer)."""
    if engine is not None:
        if config:
            raise _errors.InvalidArgumentError(f"gradex: give {what} config= or engine=, not both")
        if not isinstance(engine, Engine):
            raise _errors.InvalidArgumentError(
                f"gradex: engine= takes an engine from gxt.engine(...), not {type(engine).__name__}")
        if engine.closed:
            raise _errors.InvalidArgumentError("gradex: engine= is closed (gxt.shutdown() was called)")
        return engine
    check_config(config)
    if not config:
        return state().gradients
    return gradient_engine(raw_gradient_config(config))


def _shutdown_locked() -> None:
    s = _state
    first_error: Optional[BaseException] = None
    for ref in reversed(s.outers):
        outer = ref()
        if outer is not None:
            try:
                outer.close()
            except _errors.GradexError as exc:
                first_error = first_error or exc
    s.outers = []
    group, s.group = s.group, None
    if group is not None:
        try:
            group.close()
        except _errors.GradexError as exc:
            first_error = first_error or exc
    for ref in reversed(s.order + [s.collective]):
        if ref is None:
            continue
        try:
            ref.close()
        except _errors.GradexError as exc:
            first_error = first_error or exc
    s.engines, s.order, s.gradients, s.collective = {}, [], None, None
    s.init_config = {}
    if s.store is not None:
        if hasattr(s.store, "close"):  # torch.distributed.TCPStore (torchrun) has none
            try:
                s.store.close()
            except _errors.GradexError as exc:
                first_error = first_error or exc
        s.store = None
    if first_error is not None:
        raise first_error


def shutdown() -> None:
    with _state.lock:
        _shutdown_locked()


def _at_exit() -> None:
    try:
        shutdown()
    except _errors.GradexError:
        pass  # exiting anyway; the failure was reported where it happened


atexit.register(_at_exit)
