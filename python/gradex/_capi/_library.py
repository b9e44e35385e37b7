"""Loading libgradex.so (include/gradex/gradex.h, GRADEX_API_VERSION 1), the C structures every handle shares,
and turning a status into the gradex exception.

Every failing call raises the gradex exception for its status with the message gradex_last_error() holds, read
in the same thread right after the call (the message is per thread). ctypes releases the GIL around every
call, so a blocking call (create, wait, a collective) never stalls other Python threads, and store callbacks
(which take the GIL) can run while one is in progress. This module imports no other module of the binding.
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Optional, Set, Tuple, Type, Union

from .. import _errors

if TYPE_CHECKING:
    from ctypes import _CArgObject, _CData

    # A ctypes type as argtypes takes it, and as restype does (None: void).
    CArgType = Type[_CData]
    CType = Optional[Type[_CData]]
    ByRef = _CArgObject

API_VERSION = 1

# A value a GRADEX_* setting takes in a configuration mapping (str() of it is what the C API gets).
ConfigValue = Union[str, int, float, bool]
# A configuration as the API takes it: GRADEX_* names to values.
Config = Optional[Mapping[str, ConfigValue]]
# C functions' signatures: name -> (restype, argtypes).
Signatures = Dict[str, Tuple["CType", List["CArgType"]]]
# Counters as the engine reports them (gradex_stats_t plus staged_bytes, exposed_seconds, policy_switches).
Stats = Dict[str, Union[int, float]]

FLOAT32, FLOAT16, BFLOAT16 = 0, 1, 2
DEVICE_CPU, DEVICE_CUDA = 0, 1

SetFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
GetFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64,
                         ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t))
ReleaseFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
AddFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64,
                         ctypes.POINTER(ctypes.c_int64))


class StoreStruct(ctypes.Structure):
    """gradex_store_t."""
    _fields_ = [("context", ctypes.c_void_p), ("set", SetFn), ("get", GetFn), ("release", ReleaseFn),
                ("add", AddFn)]


class Options(ctypes.Structure):
    """gradex_engine_options_t (also what the outer optimizer, the job store and groups are created with)."""
    _fields_ = [("api_version", ctypes.c_uint32), ("rank", ctypes.c_int32), ("world_size", ctypes.c_int32),
                ("store", ctypes.POINTER(StoreStruct)), ("store_prefix", ctypes.c_char_p),
                ("config_count", ctypes.c_size_t), ("config_names", ctypes.POINTER(ctypes.c_char_p)),
                ("config_values", ctypes.POINTER(ctypes.c_char_p))]


class StatsStruct(ctypes.Structure):
    """gradex_stats_t."""
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "steps", "tensors", "bytes_sent", "bytes_received", "dense_bytes", "sparse_exchanges",
        "dense_fallbacks", "saturated", "nonfinite", "parameter_averages")] + \
        [(name, ctypes.c_double) for name in (
            "compress_seconds", "communicate_seconds", "decode_seconds", "compression_ratio")] + \
        [("control_bytes", ctypes.c_uint64)]


# The C string arrays of a configuration, kept referenced until the C call that reads them has returned.
ConfigArrays = Tuple["ctypes.Array[ctypes.c_char_p]", "ctypes.Array[ctypes.c_char_p]"]


def config_arrays(config: Config) -> Tuple[int, ConfigArrays]:
    """(count, (names, values)) of `config`'s name/value pairs as C string arrays (values as str())."""
    items = {str(k): str(v) for k, v in (config or {}).items()}
    names = (ctypes.c_char_p * max(len(items), 1))(*[k.encode() for k in items])
    values = (ctypes.c_char_p * max(len(items), 1))(*[v.encode() for v in items.values()])
    return len(items), (names, values)


def set_config(options: Options, config: Config) -> ConfigArrays:
    """Points `options`' config_* fields at `config`'s pairs; returns the arrays (keep them referenced until
    the C call that reads `options` has returned)."""
    count, arrays = config_arrays(config)
    options.config_count = count
    options.config_names = arrays[0]
    options.config_values = arrays[1]
    return arrays


def new_options(rank: int, world_size: int) -> Options:
    """gradex_engine_options_init'd options with rank and world size set."""
    options = Options()
    lib().gradex_engine_options_init(ctypes.byref(options))
    options.rank = int(rank)
    options.world_size = int(world_size)
    return options


def library_path() -> str:
    """Where libgradex.so is: $GRADEX_LIBRARY, else in the package (where pip installs it)."""
    return os.environ.get("GRADEX_LIBRARY") or os.path.join(os.path.dirname(os.path.dirname(__file__)),
                                                            "libgradex.so")


def _core_signatures() -> Signatures:
    status, engine_p = ctypes.c_int, ctypes.c_void_p
    u64_p, i32_p, int_p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_int32), \
        ctypes.POINTER(ctypes.c_int)
    size_p = ctypes.POINTER(ctypes.c_size_t)
    return {
        "gradex_api_version": (ctypes.c_uint32, []),
        "gradex_last_error": (ctypes.c_char_p, []),
        "gradex_engine_options_init": (None, [ctypes.POINTER(Options)]),
        "gradex_engine_create": (status, [ctypes.POINTER(Options), ctypes.POINTER(ctypes.c_void_p)]),
        "gradex_engine_destroy": (status, [engine_p]),
        "gradex_engine_rank": (status, [engine_p, i32_p, i32_p]),
        "gradex_register_tensor": (status, [engine_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_int]),
        "gradex_register_tensor_rows": (status, [engine_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int,
                                                 ctypes.c_int, ctypes.c_uint64]),
        "gradex_submit": (status, [engine_p, ctypes.c_char_p, ctypes.c_void_p, u64_p]),
        "gradex_average": (status, [engine_p, ctypes.c_char_p, ctypes.c_void_p, u64_p]),
        "gradex_wait": (status, [engine_p, ctypes.c_uint64]),
        "gradex_test": (status, [engine_p, ctypes.c_uint64, int_p]),
        "gradex_end_step": (status, [engine_p, int_p]),
        "gradex_set_gradient_norm": (status, [engine_p, ctypes.c_double]),
        "gradex_set_policy_horizon": (status, [engine_p, ctypes.c_uint64]),
        "gradex_exchanges_gradients": (status, [engine_p, int_p]),
        "gradex_get_stats": (status, [engine_p, ctypes.c_int, ctypes.POINTER(StatsStruct)]),
        "gradex_save_state": (status, [engine_p, ctypes.c_void_p, ctypes.c_size_t, size_p]),
        "gradex_load_state": (status, [engine_p, ctypes.c_void_p, ctypes.c_size_t]),
        "gradex_describe_config": (status, [engine_p, ctypes.c_char_p, ctypes.c_size_t, size_p]),
        "gradex_submit_device": (status, [engine_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                          ctypes.c_void_p, u64_p]),
        "gradex_submit_absent": (status, [engine_p, ctypes.c_char_p, ctypes.c_void_p, u64_p]),
        "gradex_submit_device_absent": (status, [engine_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int,
                                                 ctypes.c_int, ctypes.c_void_p, u64_p]),
        "gradex_handle_event": (status, [engine_p, ctypes.c_uint64, ctypes.c_void_p]),
        "gradex_delay_drain": (status, [engine_p]),
        "gradex_get_delay": (status, [engine_p, ctypes.POINTER(ctypes.c_int)]),
        "gradex_device_available": (status, [ctypes.c_int, ctypes.c_int, int_p]),
        "gradex_get_staged_bytes": (status, [engine_p, ctypes.c_int, u64_p]),
        "gradex_get_step_report": (status, [engine_p, ctypes.c_int, ctypes.POINTER(ctypes.c_double), u64_p]),
        "gradex_explain": (status, [engine_p, ctypes.c_char_p, ctypes.c_size_t, size_p]),
        "gradex_engine_reconfigure": (status, [engine_p, ctypes.POINTER(Options)]),
        "gradex_engine_abort": (status, [engine_p, ctypes.c_char_p]),
        "gradex_state_snapshot": (status, [engine_p]),
        "gradex_state_rollback": (status, [engine_p]),
    }


_lib: Optional[ctypes.CDLL] = None
_lib_lock = threading.Lock()
_declared_parts: Set[str] = set()


def _declare(handle: ctypes.CDLL, sigs: Signatures) -> None:
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(handle, name)
        fn.restype = restype
        fn.argtypes = argtypes


def lib() -> ctypes.CDLL:
    """The loaded C library, with the core signatures declared; checks the API version once."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = library_path()
        if not os.path.exists(path):
            if os.environ.get("GRADEX_LIBRARY"):
                raise ImportError(f"gradex: GRADEX_LIBRARY={path} does not exist; point it at a built libgradex.so "
                                  f"or unset it to load the package's own")
            raise ImportError(f"gradex: {path} does not exist; install the package with pip (see README.md)")
        handle = ctypes.CDLL(path)
        _declare(handle, _core_signatures())
        version = handle.gradex_api_version()
        if version != API_VERSION:
            raise _errors.VersionError(
                f"gradex: {path} implements C API version {version}, this package needs {API_VERSION}")
        _lib = handle
        return _lib


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


# A C call in the two-call copy-out form, fn(handle, buffer, capacity, &length), or the copy-in form,
# fn(handle, buffer, length); handle None: the call's global form.
CopyOutFn = Callable[[Optional[int], Optional["ctypes.Array[ctypes.c_char]"], int, "ByRef"], int]
CopyInFn = Callable[[Optional[int], "ctypes.Array[ctypes.c_char]", int], int]


def read_out(fn: CopyOutFn, handle: Optional[int]) -> bytes:
    """What fn copies out: its length first (buffer NULL), then the bytes."""
    length = ctypes.c_size_t()
    check(fn(handle, None, 0, ctypes.byref(length)))
    buf = ctypes.create_string_buffer(max(length.value, 1))
    check(fn(handle, buf, length.value, ctypes.byref(length)))
    return buf.raw[:length.value]


def read_text(fn: CopyOutFn, handle: Optional[int]) -> str:
    """read_out of a NUL-terminated text."""
    return read_out(fn, handle).split(b"\0", 1)[0].decode("utf-8", "replace")


def write_in(fn: CopyInFn, handle: Optional[int], blob: bytes) -> None:
    """fn(handle, buffer, length) with a copy of blob (never a NULL buffer, even when blob is empty)."""
    blob = bytes(blob)
    buf = ctypes.create_string_buffer(blob, max(len(blob), 1))
    check(fn(handle, buf, len(blob)))


def device_available(device: int, device_index: int = 0) -> Tuple[bool, str]:
    """(available, reason): whether tensors on (device, device_index) can be exchanged by this gradex (for
    CUDA: libgradex_backend_cuda.so, the CUDA runtime and the device load)."""
    flag = ctypes.c_int()
    check(lib().gradex_device_available(device, device_index, ctypes.byref(flag)))
    reason = "" if flag.value else last_error()
    return bool(flag.value), reason


def describe_config_of(handle: Optional[int]) -> str:
    """The effective configuration with help text: an engine's (its address) or the environment's (None)."""
    return read_text(lib().gradex_describe_config, handle)


def stats_dict(s: StatsStruct) -> Stats:
    return {name: getattr(s, name) for name, _ in StatsStruct._fields_}


