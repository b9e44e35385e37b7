"""ctypes binding of the gradex C API (include/gradex/gradex.h, GRADEX_API_VERSION 1).

`Engine` owns one gradex_engine_t. Every failing call raises the gradex exception for its status with the
engine's message, read in the same thread right after the call (gradex_last_error is per thread).
ctypes releases the GIL around every call, so a blocking call (create, wait) never stalls other Python
threads, and store callbacks (which take the GIL) can run while one is in progress.
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple, Union

from . import _errors

API_VERSION = 1

# A configuration as the API takes it: GRADEX_* names to values (strings, numbers or booleans).
Config = Optional[Mapping[str, Any]]
# C functions' signatures: name -> (restype, argtypes).
Signatures = Dict[str, Tuple[Any, List[Any]]]
# Counters as the engine reports them (gradex_stats_t plus staged_bytes, exposed_seconds, policy_switches).
Stats = Dict[str, Union[int, float]]

FLOAT32, FLOAT16, BFLOAT16 = 0, 1, 2
DEVICE_CPU, DEVICE_CUDA = 0, 1

_SetFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
_GetFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64,
                          ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t))
_ReleaseFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
_AddFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64,
                          ctypes.POINTER(ctypes.c_int64))


class _Store(ctypes.Structure):
    _fields_ = [("context", ctypes.c_void_p), ("set", _SetFn), ("get", _GetFn), ("release", _ReleaseFn),
                ("add", _AddFn)]


class _Options(ctypes.Structure):
    _fields_ = [("api_version", ctypes.c_uint32), ("rank", ctypes.c_int32), ("world_size", ctypes.c_int32),
                ("store", ctypes.POINTER(_Store)), ("store_prefix", ctypes.c_char_p),
                ("config_count", ctypes.c_size_t), ("config_names", ctypes.POINTER(ctypes.c_char_p)),
                ("config_values", ctypes.POINTER(ctypes.c_char_p))]


def _set_config(options: _Options, config: Config) -> Tuple[Any, Any]:
    """Points `options`' config_* fields at `config`'s name/value pairs (values as strings). Returns the
    two C arrays, which the caller keeps referenced until the C call that reads `options` has returned."""
    config = {str(k): str(v) for k, v in (config or {}).items()}
    names = (ctypes.c_char_p * max(len(config), 1))(*[k.encode() for k in config])
    values = (ctypes.c_char_p * max(len(config), 1))(*[v.encode() for v in config.values()])
    options.config_count = len(config)
    options.config_names = names
    options.config_values = values
    return names, values


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "steps", "tensors", "bytes_sent", "bytes_received", "dense_bytes", "sparse_exchanges",
        "dense_fallbacks", "saturated", "nonfinite", "parameter_averages")] + \
        [(name, ctypes.c_double) for name in (
            "compress_seconds", "communicate_seconds", "decode_seconds", "compression_ratio")] + \
        [("control_bytes", ctypes.c_uint64)]


def device_available(device: int, device_index: int = 0) -> Tuple[bool, str]:
    """(available, reason): whether tensors on (device, device_index) can be exchanged by this gradex (for
    CUDA: libgradex_backend_cuda.so, the CUDA runtime and the device load)."""
    flag = ctypes.c_int()
    check(lib().gradex_device_available(device, device_index, ctypes.byref(flag)))
    reason = "" if flag.value else (lib().gradex_last_error() or b"").decode(errors="replace")
    return bool(flag.value), reason


def library_path() -> str:
    """Where libgradex.so is: $GRADEX_LIBRARY, else next to this file (where pip installs it)."""
    return os.environ.get("GRADEX_LIBRARY") or os.path.join(os.path.dirname(__file__), "libgradex.so")


_lib: Optional[ctypes.CDLL] = None
_lib_lock = threading.Lock()


def lib() -> ctypes.CDLL:
    """The loaded C library, with argument and result types declared; checks the API version once."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = library_path()
        if not os.path.exists(path):
            raise ImportError(f"gradex: {path} does not exist; install the package with pip (see README.md)")
        handle = ctypes.CDLL(path)
        status = ctypes.c_int
        engine_p = ctypes.c_void_p
        sigs = {
            "gradex_api_version": (ctypes.c_uint32, []),
            "gradex_last_error": (ctypes.c_char_p, []),
            "gradex_engine_options_init": (None, [ctypes.POINTER(_Options)]),
            "gradex_engine_create": (status, [ctypes.POINTER(_Options), ctypes.POINTER(ctypes.c_void_p)]),
            "gradex_engine_destroy": (status, [engine_p]),
            "gradex_engine_rank": (status, [engine_p, ctypes.POINTER(ctypes.c_int32),
                                            ctypes.POINTER(ctypes.c_int32)]),
            "gradex_register_tensor": (status, [engine_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int,
                                                ctypes.c_int]),
            "gradex_register_tensor_rows": (status, [engine_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int,
                                                     ctypes.c_int, ctypes.c_uint64]),
            "gradex_submit": (status, [engine_p, ctypes.c_char_p, ctypes.c_void_p,
                                       ctypes.POINTER(ctypes.c_uint64)]),
            "gradex_average": (status, [engine_p, ctypes.c_char_p, ctypes.c_void_p,
                                        ctypes.POINTER(ctypes.c_uint64)]),
            "gradex_wait": (status, [engine_p, ctypes.c_uint64]),
            "gradex_test": (status, [engine_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]),
            "gradex_end_step": (status, [engine_p, ctypes.POINTER(ctypes.c_int)]),
            "gradex_set_gradient_norm": (status, [engine_p, ctypes.c_double]),
            "gradex_set_policy_horizon": (status, [engine_p, ctypes.c_uint64]),
            "gradex_exchanges_gradients": (status, [engine_p, ctypes.POINTER(ctypes.c_int)]),
            "gradex_get_stats": (status, [engine_p, ctypes.c_int, ctypes.POINTER(_Stats)]),
            "gradex_save_state": (status, [engine_p, ctypes.c_void_p, ctypes.c_size_t,
                                           ctypes.POINTER(ctypes.c_size_t)]),
            "gradex_load_state": (status, [engine_p, ctypes.c_void_p, ctypes.c_size_t]),
            "gradex_describe_config": (status, [engine_p, ctypes.c_char_p, ctypes.c_size_t,
                                                ctypes.POINTER(ctypes.c_size_t)]),
            "gradex_submit_device": (status, [engine_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int,
                                              ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]),
            "gradex_submit_absent": (status, [engine_p, ctypes.c_char_p, ctypes.c_void_p,
                                              ctypes.POINTER(ctypes.c_uint64)]),
            "gradex_submit_device_absent": (status, [engine_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int,
                                                     ctypes.c_int, ctypes.c_void_p,
                                                     ctypes.POINTER(ctypes.c_uint64)]),
            "gradex_handle_event": (status, [engine_p, ctypes.c_uint64, ctypes.c_void_p]),
            "gradex_delay_drain": (status, [engine_p]),
            "gradex_get_delay": (status, [engine_p, ctypes.POINTER(ctypes.c_int)]),
            "gradex_device_available": (status, [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]),
            "gradex_get_staged_bytes": (status, [engine_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]),
            "gradex_get_step_report": (status, [engine_p, ctypes.c_int, ctypes.POINTER(ctypes.c_double),
                                                ctypes.POINTER(ctypes.c_uint64)]),
            "gradex_explain": (status, [engine_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
            "gradex_engine_reconfigure": (status, [engine_p, ctypes.POINTER(_Options)]),
            "gradex_engine_abort": (status, [engine_p, ctypes.c_char_p]),
            "gradex_state_snapshot": (status, [engine_p]),
            "gradex_state_rollback": (status, [engine_p]),
        }
        _declare(handle, sigs)
        version = handle.gradex_api_version()
        if version != API_VERSION:
            raise _errors.VersionError(
                f"gradex: {path} implements C API version {version}, this package needs {API_VERSION}")
        _lib = handle
        return _lib


def _declare(handle: ctypes.CDLL, sigs: Mapping[str, Tuple[Any, Any]]) -> None:
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(handle, name)
        fn.restype = restype
        fn.argtypes = argtypes


_declared_parts: Set[str] = set()


def lib_with(part: str, signatures: Callable[[], Signatures]) -> ctypes.CDLL:
    """The loaded library with the signatures of an additive part of the API declared, once per process
    (`part` names it; `signatures()` is called only the first time)."""
    c = lib()
    with _lib_lock:
        if part not in _declared_parts:
            _declare(c, signatures())
            _declared_parts.add(part)
    return c


def last_error() -> str:
    return (lib().gradex_last_error() or b"").decode("utf-8", "replace")


def check(status: int) -> None:
    """Raises the gradex exception for a non-zero status, with this thread's last error message."""
    if status != 0:
        raise _errors.error_for_status(status, last_error())


def read_out(fn: Callable[..., int], handle: Optional[int]) -> bytes:
    """What a C call in the two-call form, fn(handle, buffer, capacity, &length), copies out: its length
    first (buffer NULL), then the bytes."""
    length = ctypes.c_size_t()
    check(fn(handle, None, 0, ctypes.byref(length)))
    buf = ctypes.create_string_buffer(max(length.value, 1))
    check(fn(handle, buf, length.value, ctypes.byref(length)))
    return buf.raw[:length.value]


def read_text(fn: Callable[..., int], handle: Optional[int]) -> str:
    """read_out of a NUL-terminated text."""
    return read_out(fn, handle).split(b"\0", 1)[0].decode("utf-8", "replace")


def write_in(fn: Callable[..., int], handle: Optional[int], blob: bytes) -> None:
    """fn(handle, buffer, length) with a copy of blob (never a NULL buffer, even when blob is empty)."""
    blob = bytes(blob)
    buf = ctypes.create_string_buffer(blob, max(len(blob), 1))
    check(fn(handle, buf, len(blob)))


class _StoreCallbacks:
    """What the engine's store callbacks run on: the store, the buffers handed to the engine and the last failure.
    It references no callback object, so an adapter and its callbacks form no reference cycle: the store (and the
    connection it holds) is released as soon as its adapter is dropped, not at the next full garbage collection
    (one connection per quorum change stayed open until then)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.buffers: Dict[int, Any] = {}  # address -> ctypes buffer handed to the engine, until it calls release
        self.lock = threading.Lock()
        self.last_failure: Optional[str] = None

    def _fail(self, what: str, key: bytes, exc: BaseException) -> int:
        self.last_failure = f"store {what} '{key.decode(errors='replace')}': {type(exc).__name__}: {exc}"
        return 1

    def on_set(self, _ctx: Any, key: bytes, value: Any, length: int) -> int:
        try:
            self.store.set(key.decode(), ctypes.string_at(value, length) if length else b"")
            return 0
        except BaseException as exc:  # noqa: BLE001 - nothing may propagate into C
            return self._fail("set", key, exc)

    def on_get(self, _ctx: Any, key: bytes, timeout_ms: int, value_out: Any, length_out: Any) -> int:
        try:
            import datetime
            k = key.decode()
            if timeout_ms >= 0:
                self.store.wait([k], datetime.timedelta(milliseconds=timeout_ms))
            data = bytes(self.store.get(k))
            buf = ctypes.create_string_buffer(data, max(len(data), 1))
            address = ctypes.addressof(buf)
            with self.lock:
                self.buffers[address] = buf
            value_out[0] = address
            length_out[0] = len(data)
            return 0
        except BaseException as exc:  # noqa: BLE001
            return self._fail("get", key, exc)

    def on_release(self, _ctx: Any, value: int) -> None:
        with self.lock:
            self.buffers.pop(value, None)

    def on_add(self, _ctx: Any, key: bytes, delta: int, new_value: Any) -> int:
        try:
            new_value[0] = int(self.store.add(key.decode(), int(delta)))
            return 0
        except BaseException as exc:  # noqa: BLE001
            return self._fail("add", key, exc)


class StoreAdapter:
    """Presents a key-value store to the engine as a gradex_store_t.

    `store` needs set(key, bytes), get(key) -> bytes, wait([key], timedelta) and add(key, int) -> int, as
    torch.distributed.Store has. Callbacks never raise into C: a failure returns non-zero (the engine then
    reports the operation and key) and is kept in `last_failure` for diagnostics.
    """

    def __init__(self, store: Any) -> None:
        self._callbacks = _StoreCallbacks(store)
        # The CFUNCTYPE objects must live as long as the engine may call them (as long as this adapter).
        self._set = _SetFn(self._callbacks.on_set)
        self._get = _GetFn(self._callbacks.on_get)
        self._release = _ReleaseFn(self._callbacks.on_release)
        self._add = _AddFn(self._callbacks.on_add)
        self.struct = _Store(None, self._set, self._get, self._release, self._add)

    @property
    def last_failure(self) -> Optional[str]:
        return self._callbacks.last_failure


def _membership_options(rank: int, world_size: int, store: Any, store_prefix: Optional[str],
                        keep: List[Any]) -> Tuple[_Options, Union[StoreAdapter, JobStore, None]]:
    """gradex_engine_options_t for a reconfiguration: rank, world size, the store (None: the object's current
    one) and prefix (None: the C default). Appends what the C call needs alive to `keep`; returns (options,
    adapter or None)."""
    options = _Options()
    lib().gradex_engine_options_init(ctypes.byref(options))
    options.rank = int(rank)
    options.world_size = int(world_size)
    adapter: Union[StoreAdapter, JobStore, None] = None
    if isinstance(store, JobStore):
        adapter = store
        options.store = store.pointer()
    elif store is not None:
        adapter = StoreAdapter(store)
        options.store = ctypes.pointer(adapter.struct)
    prefix = store_prefix.encode() if store_prefix else None
    options.store_prefix = prefix
    keep.extend([adapter, prefix])
    return options, adapter


def _keep_store(owner: Any, adapter: Union[StoreAdapter, JobStore, None], succeeded: bool) -> None:
    """After a reconfiguration: the C side keeps one store, the membership's (the new adapter, or the current one
    when none was given). A success releases the earlier adapters (each may hold a connection: keeping them all
    leaked one descriptor per quorum change); a failure keeps both, as either may still be called."""
    if adapter is None:
        return
    earlier = [] if succeeded else [owner._store] + getattr(owner, "_failed_stores", [])
    owner._failed_stores = [a for a in earlier if a is not None]
    owner._store = adapter


def _check_with_store(status: int, adapter: Union[StoreAdapter, JobStore, None]) -> None:
    if status != 0:
        message = last_error()
        if adapter is not None and getattr(adapter, "last_failure", None):
            message += f" ({adapter.last_failure})"
        raise _errors.error_for_status(status, message)


def _create_collectively(owner: Any, c: ctypes.CDLL, create: Any, rank: int, world_size: int, store: Any,
                         store_prefix: Optional[str], config: Config) -> Optional[int]:
    """Runs create(options, &handle) (gradex_engine_create or gradex_outer_create) with the options every
    collective handle takes; returns the handle. `owner` keeps what the core holds pointers to for the
    handle's life: the store (JobStore: the core's own, no Python in the loop; else a StoreAdapter around a
    framework store) and the prefix."""
    options = _Options()
    c.gradex_engine_options_init(ctypes.byref(options))
    options.rank = rank
    options.world_size = world_size
    if isinstance(store, JobStore):
        owner._store = store
        options.store = store.pointer()
    else:
        owner._store = StoreAdapter(store) if store is not None else None
        if owner._store is not None:
            options.store = ctypes.pointer(owner._store.struct)
    owner._prefix = store_prefix.encode() if store_prefix else None
    options.store_prefix = owner._prefix
    config_arrays = _set_config(options, config)  # noqa: F841 - alive until the call returns
    out = ctypes.c_void_p()
    _check_with_store(create(ctypes.byref(options), ctypes.byref(out)), owner._store)
    return out.value


class Engine:
    """One gradex engine (gradex_engine_create). Creation is collective: every rank creates its engine at
    the same point, with the same store prefix."""

    def __init__(self, rank: int = -1, world_size: int = -1, store: Any = None, store_prefix: Optional[str] = None,
                 config: Config = None) -> None:
        c = lib()
        self._ptr: Optional[int] = _create_collectively(self, c, c.gradex_engine_create, rank, world_size, store,
                                                        store_prefix, config)
        r, w = ctypes.c_int32(), ctypes.c_int32()
        check(c.gradex_engine_rank(self._ptr, ctypes.byref(r), ctypes.byref(w)))
        self.rank, self.world_size = r.value, w.value

    @property
    def address(self) -> int:
        """The gradex_engine_t* as an integer (what the op library takes); 0 once closed."""
        return self._ptr or 0

    def _engine(self) -> int:
        if not self._ptr:
            raise _errors.InvalidArgumentError("gradex: the engine is closed")
        return self._ptr

    def close(self) -> None:
        """Finishes outstanding work (bounded by GRADEX_TIMEOUT_S) and releases the engine. Idempotent."""
        ptr, self._ptr = self._ptr, None
        if ptr:
            check(lib().gradex_engine_destroy(ptr))

    def reconfigure(self, rank: int, world_size: int, store: Any = None, store_prefix: Optional[str] = None) -> None:
        """A new membership without destroying the engine (gradex_engine_reconfigure; collective over the new
        members, a newcomer creates its Engine with the same arguments instead). `store`: a torch-like store or
        a JobStore (None: the one given at creation or at the last reconfiguration); `store_prefix` must be new
        for that store (None: "gradex/"). Work of the old membership in flight fails with AbortedError; state is
        kept per tensor key; a failed engine (dead peer, abort) is usable again afterwards."""
        keep: List[Any] = []  # alive for the call
        options, adapter = _membership_options(rank, world_size, store, store_prefix, keep)
        status = lib().gradex_engine_reconfigure(self._engine(), ctypes.byref(options))
        _keep_store(self, adapter, status == 0)
        _check_with_store(status, adapter)
        r, w = ctypes.c_int32(), ctypes.c_int32()
        check(lib().gradex_engine_rank(self._ptr, ctypes.byref(r), ctypes.byref(w)))
        self.rank, self.world_size = r.value, w.value

    def abort(self, reason: object) -> None:
        """From any thread: every handle in flight and every later submission fails with AbortedError carrying
        `reason`, within milliseconds; peers learn it at once. The engine stays usable for reconfigure()."""
        check(lib().gradex_engine_abort(self._engine(), str(reason).encode()))

    def snapshot_state(self) -> None:
        """Records the engine's per-tensor state at the start of a step (gradex_state_snapshot), into buffers
        reused by the next snapshot. StateError after a failure (reconfigure first)."""
        check(lib().gradex_state_snapshot(self._engine()))

    def rollback_state(self) -> None:
        """Restores the last snapshot bit for bit (gradex_state_rollback): a step that did not commit leaves the
        state as if it never ran. Every rank must roll back the same steps."""
        check(lib().gradex_state_rollback(self._engine()))

    def register(self, key: str, numel: int, dtype: int, device: int = DEVICE_CPU, rows: int = 0) -> None:
        """rows: the tensor's output rows (a weight's shape[0]; 0: unknown), so that GRADEX_POLICY=auto
        keeps at least GRADEX_POLICY_MIN_PER_ROW values per row when it sparsifies it."""
        if rows:
            check(lib().gradex_register_tensor_rows(self._engine(), key.encode(), numel, dtype, device, rows))
        else:
            check(lib().gradex_register_tensor(self._engine(), key.encode(), numel, dtype, device))

    def submit(self, key: str, address: int) -> int:
        handle = ctypes.c_uint64()
        check(lib().gradex_submit(self._engine(), key.encode(), address, ctypes.byref(handle)))
        return handle.value

    def wait(self, handle: int) -> None:
        check(lib().gradex_wait(self._engine(), handle))

    def submit_device(self, key: str, address: int, device: int, device_index: int = 0,
                      stream: Optional[int] = None) -> int:
        """gradex_submit_device: `address` in `device`'s memory, ready on `stream` (a cudaStream_t as an
        int; None: the default stream)."""
        handle = ctypes.c_uint64()
        check(lib().gradex_submit_device(self._engine(), key.encode(), address, device, device_index, stream,
                                         ctypes.byref(handle)))
        return handle.value

    def submit_absent(self, key: str, address: int, device: Optional[int] = None, device_index: int = 0,
                      stream: Optional[int] = None) -> int:
        """gradex_submit_absent (device None) or gradex_submit_device_absent: this rank has no gradient of
        `key` this step (gx.join); it contributes zeros and keeps its momentum and DGC state. `address` is
        not read; it receives the average over all ranks."""
        handle = ctypes.c_uint64()
        if device is None:
            check(lib().gradex_submit_absent(self._engine(), key.encode(), address, ctypes.byref(handle)))
        else:
            check(lib().gradex_submit_device_absent(self._engine(), key.encode(), address, device, device_index,
                                                    stream, ctypes.byref(handle)))
        return handle.value

    def handle_event(self, handle: int, stream: Optional[int] = None) -> None:
        """Makes `stream` wait on the device for a completed device handle's result (gradex_handle_event)."""
        check(lib().gradex_handle_event(self._engine(), handle, stream))

    def set_gradient_norm(self, norm: float) -> None:
        """GRADEX_CLIP_NORM > 0: this rank's L2 norm over all gradients of the current step, given before
        the step's first submit; gradients submitted until end_step() are clipped by it (see gradex.h)."""
        check(lib().gradex_set_gradient_norm(self._engine(), float(norm)))

    def set_policy_horizon(self, steps: int) -> None:
        """GRADEX_POLICY=auto: `steps` more exchange steps from the next one (0: unknown), learnt after the
        engine was created; every rank must call it alike before its next step (gradex_set_policy_horizon)."""
        steps = int(steps)
        if steps < 0:
            raise _errors.InvalidArgumentError(f"gradex: a training horizon must be >= 0 steps, got {steps}")
        check(lib().gradex_set_policy_horizon(self._engine(), steps))

    def end_step(self) -> bool:
        """Ends a step; True when LocalSGD says to average parameters now."""
        flag = ctypes.c_int()
        check(lib().gradex_end_step(self._engine(), ctypes.byref(flag)))
        return bool(flag.value)

    def exchanges_gradients(self) -> bool:
        flag = ctypes.c_int()
        check(lib().gradex_exchanges_gradients(self._engine(), ctypes.byref(flag)))
        return bool(flag.value)

    def stats(self, last_step: bool = False) -> Dict[str, Union[int, float]]:
        """The engine's counters (gradex_stats_t), plus staged_bytes: bytes copied between device and host
        memory for device tensors (what crossed PCIe); exposed_seconds: what the framework waited on gradex (per
        step from its last submission to its last completion, summed); policy_switches: tensors whose codec a
        GRADEX_POLICY=auto plan changed."""
        s = _Stats()
        check(lib().gradex_get_stats(self._engine(), int(bool(last_step)), ctypes.byref(s)))
        out = {name: getattr(s, name) for name, _ in _Stats._fields_}
        staged = ctypes.c_uint64()
        check(lib().gradex_get_staged_bytes(self._engine(), int(bool(last_step)), ctypes.byref(staged)))
        out["staged_bytes"] = staged.value
        exposed, switches = ctypes.c_double(), ctypes.c_uint64()
        check(lib().gradex_get_step_report(self._engine(), int(bool(last_step)), ctypes.byref(exposed),
                                           ctypes.byref(switches)))
        out["exposed_seconds"], out["policy_switches"] = exposed.value, switches.value
        return out

    def save_state(self) -> bytes:
        return read_out(lib().gradex_save_state, self._engine())

    def load_state(self, blob: bytes) -> None:
        write_in(lib().gradex_load_state, self._engine(), blob)

    def describe_config(self) -> str:
        return describe_config(self)

    def explain(self) -> str:
        """Each tensor's codec and why (gradex_explain); with GRADEX_POLICY=auto the newest plan: the agreed
        link, codec and step numbers and per tensor its choice with predicted and measured times."""
        return read_text(lib().gradex_explain, self._engine())

    def delay(self) -> int:
        """The delay D that submissions now get (GRADEX_DELAY; auto's choice once made; gradex_get_delay)."""
        value = ctypes.c_int()
        check(lib().gradex_get_delay(self._engine(), ctypes.byref(value)))
        return value.value

    def delay_drain(self) -> None:
        """Waits for every delayed exchange in flight and drops the averages not yet applied
        (gradex_delay_drain): averaging the parameters next leaves every rank with the same model."""
        check(lib().gradex_delay_drain(self._engine()))


def describe_config(engine: Optional[Engine] = None) -> str:
    """The effective configuration with help text (engine None: the environment's)."""
    return read_text(lib().gradex_describe_config, engine._engine() if engine is not None else None)


# The DiLoCo binding and the launcher's view of the job live in their own modules (they import the names
# above); importing them here keeps gradex._capi the one name the plugins use.
from ._capi_outer import Outer  # noqa: E402
from ._capi_launch import JobStore, check_config, launch_info  # noqa: E402
