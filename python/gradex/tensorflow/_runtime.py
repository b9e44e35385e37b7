"""The process's gradex state for TensorFlow: the job's store, its engines and their op-library slots.

gxt.init() reads the launcher's environment (RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT, or Open
MPI's OMPI_COMM_WORLD_*), starts the store (rank 0 serves it) and creates two engines, collectively:
  - the collective engine: dense, fp32 on the wire, no momentum: exact averages (allreduce, metrics) and
    bit-exact broadcasts, whatever GRADEX_* says about gradients;
  - the default gradient engine: the GRADEX_* policy (DGC / fp16 / dense per tensor, LocalSGD).
Wrappers given their own `config` create further gradient engines; every rank must create them in the
same order (their store prefixes are numbered).
"""
import atexit
import os
import threading

from .. import _capi, _errors
from . import _ops, _store

# What makes the collective engine exact: every tensor dense (sparsity 0), fp32 on the wire, no DGC
# momentum, clipping or LocalSGD.
COLLECTIVE_CONFIG = {"GRADEX_SPARSITY": "0", "GRADEX_SPARSITY_OVERRIDES": "", "GRADEX_FP16": "0",
                     "GRADEX_MOMENTUM": "0", "GRADEX_CLIP_NORM": "0", "GRADEX_LOCALSGD_PERIOD": "0",
                     "GRADEX_WARMUP_STEPS": "0", "GRADEX_NONFINITE": "propagate"}


class EngineRef:
    """A gradient or collective engine bound to an op-library slot."""

    def __init__(self, engine, slot, config):
        self.engine = engine
        self.slot = slot
        self.config = dict(config or {})

    def close(self):
        if self.engine.address:
            _ops.unbind(self.slot)
            self.engine.close()


class _State:
    def __init__(self):
        self.lock = threading.RLock()
        self.store = None
        self.rank = 0
        self.size = 1
        self.local_rank = 0
        self.collective = None
        self.gradients = None
        self.extra = []  # further engines created by wrappers
        self.engines_created = 0
        self.next_slot = 1


_state = _State()


def _env_int(*names):
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise _errors.ConfigError(f"gradex: {name}={value!r} is not an integer") from None
    return None


def _timeout_s():
    try:
        return float(os.environ.get("GRADEX_TIMEOUT_S", "300"))
    except ValueError:
        return 300.0  # the engine reports the bad value itself, naming its range


def _launcher_store(host, port, size):
    """Under torchrun the launcher's agent already serves its store on MASTER_PORT: gradex becomes one more
    client of it (through torch, which torchrun implies) instead of trying to serve the port again."""
    if not os.environ.get("TORCHELASTIC_RUN_ID"):
        return None
    import datetime

    from torch.distributed import TCPStore
    return TCPStore(host, port, size, False, timeout=datetime.timedelta(seconds=_timeout_s()))


def initialized():
    return _state.collective is not None


def state():
    if _state.collective is None:
        raise _errors.InvalidArgumentError("gradex: call gradex.tensorflow.init() first")
    return _state


def _new_engine(config):
    """Creates an engine through the job's store (collective) and binds it to a fresh slot."""
    s = _state
    # A torchrun restart reuses the launcher's store: the attempt number keeps its keys apart.
    prefix = f"gradex/tf/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{s.engines_created}/"
    s.engines_created += 1
    engine = _capi.Engine(s.rank, s.size, s.store, prefix, config)
    slot = s.next_slot
    s.next_slot += 1
    try:
        _ops.bind(slot, engine)
    except BaseException:
        engine.close()
        raise
    return EngineRef(engine, slot, config)


def init(config=None):
    """Idempotent; see gradex.tensorflow.init."""
    s = _state
    with s.lock:
        if s.collective is not None:
            return
        _ops.load()
        rank = _env_int("RANK", "OMPI_COMM_WORLD_RANK")
        size = _env_int("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE")
        if (rank is None) != (size is None):
            raise _errors.ConfigError("gradex: set both RANK and WORLD_SIZE (or neither, for one process)")
        rank, size = (0, 1) if rank is None else (rank, size)
        if size < 1 or not 0 <= rank < size:
            raise _errors.ConfigError(f"gradex: RANK={rank} must be in [0, WORLD_SIZE={size})")
        local_rank = _env_int("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")
        if size == 1:
            store = _store.LocalStore()
        else:
            host = os.environ.get("MASTER_ADDR", "127.0.0.1")
            port = _env_int("MASTER_PORT")
            if port is None or not 1 <= port <= 65535:
                raise _errors.ConfigError("gradex: MASTER_PORT must be set to a port in [1, 65535] for "
                                          f"WORLD_SIZE={size}")
            store = _launcher_store(host, port, size) or _store.TcpStore(host, port, rank == 0, _timeout_s())
        s.store, s.rank, s.size = store, rank, size
        s.engines_created = 0  # a fresh store: prefixes restart everywhere
        s.local_rank = rank if local_rank is None else local_rank
        try:
            s.collective = _new_engine(COLLECTIVE_CONFIG)
            s.gradients = _new_engine(config)
        except BaseException:
            _shutdown_locked()
            raise


def gradient_engine(config=None):
    """The default gradient engine (config None), or a new one with `config` overriding GRADEX_*."""
    s = state()
    with s.lock:
        if not config:
            return s.gradients
        ref = _new_engine({str(k): str(v) for k, v in config.items()})
        s.extra.append(ref)
        return ref


def _shutdown_locked():
    s = _state
    first_error = None
    for ref in reversed(s.extra + [s.gradients, s.collective]):
        if ref is None:
            continue
        try:
            ref.close()
        except _errors.GradexError as exc:
            first_error = first_error or exc
    s.extra, s.gradients, s.collective = [], None, None
    if s.store is not None:
        if hasattr(s.store, "close"):  # torch.distributed.TCPStore (torchrun) has none
            s.store.close()
        s.store = None
    if first_error is not None:
        raise first_error


def shutdown():
    with _state.lock:
        _shutdown_locked()


def _at_exit():
    try:
        shutdown()
    except _errors.GradexError:
        pass  # exiting anyway; the failure was reported where it happened


atexit.register(_at_exit)
