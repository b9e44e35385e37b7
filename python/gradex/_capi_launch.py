"""The configuration check and the launcher's view of the job (gradex_check_config, gradex_launch_info,
gradex_store_*; additive to API version 1), re-exported by gradex._capi."""
from __future__ import annotations

import ctypes
from typing import Any, Dict, Optional

from . import _errors
from ._capi import Config, _Options, _Store, _set_config, check, last_error, lib_with

# --- Configuration check (gradex_check_config; additive to API version 1) ---------------------------

def check_config(config: Config = None) -> None:
    """Validates GRADEX_* settings in this process as engine creation would: the environment, overridden by
    `config` (a dict of GRADEX_* name -> value). Raises gradex.ConfigError naming the variable and its allowed
    range for an invalid value or an unknown name in `config` (an unknown name in the environment is only a
    warning, as at engine creation). Creates nothing and touches no network."""
    c = lib_with("check_config", lambda: {"gradex_check_config": (ctypes.c_int, [
        ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p)])})
    if config is not None and not isinstance(config, dict):
        raise _errors.InvalidArgumentError(f"gradex: config must be a dict of GRADEX_* names to values, "
                                           f"not {type(config).__name__}")
    items = [(str(k), str(v)) for k, v in (config or {}).items()]
    names = (ctypes.c_char_p * max(len(items), 1))(*[k.encode() for k, _ in items])
    values = (ctypes.c_char_p * max(len(items), 1))(*[v.encode() for _, v in items])
    check(c.gradex_check_config(len(items), names, values))


# --- Launch information and the job's shared store (gradex_launch_info, gradex_store_*; additive) ------


class _LaunchInfo(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int32), ("world_size", ctypes.c_int32), ("local_rank", ctypes.c_int32),
                ("local_size", ctypes.c_int32), ("master_port", ctypes.c_uint16),
                ("master_addr", ctypes.c_char * 256), ("launcher", ctypes.c_char * 32)]


def _launch_lib() -> ctypes.CDLL:
    return lib_with("launch", lambda: {
        "gradex_launch_info": (ctypes.c_int, [ctypes.POINTER(_LaunchInfo)]),
        "gradex_store_connect": (ctypes.c_int, [ctypes.POINTER(_Options), ctypes.POINTER(ctypes.POINTER(_Store))]),
        "gradex_store_destroy": (ctypes.c_int, [ctypes.POINTER(_Store)]),
    })


def launch_info() -> Dict[str, Any]:
    """What the launcher says about this process (gradex_launch_info): a dict with rank, world_size,
    local_rank and local_size (None where the launcher does not say), master_addr, master_port and launcher
    ("torchrun", "Open MPI", "MPICH/Intel MPI", "Slurm" or "none"). ConfigError for a rank without a size (or
    the reverse) and malformed values."""
    info = _LaunchInfo()
    check(_launch_lib().gradex_launch_info(ctypes.byref(info)))
    return {"rank": info.rank, "world_size": info.world_size,
            "local_rank": info.local_rank if info.local_rank >= 0 else None,
            "local_size": info.local_size if info.local_size > 0 else None,
            "master_addr": info.master_addr.decode(), "master_port": info.master_port,
            "launcher": info.launcher.decode()}


class JobStore:
    """The job's TCP store in the core (gradex_store_connect): rank 0 serves it on MASTER_ADDR:MASTER_PORT,
    every connection proves GRADEX_JOB_SECRET when one is set. Collective. Pass it as Engine(store=...) to
    bootstrap several engines through it (each under its own prefix); set/get/add serve small plugin-level
    agreements. Close it after the engines that use it."""

    last_failure: Optional[str] = None

    def __init__(self, rank: int = -1, world_size: int = -1, config: Config = None) -> None:
        c = _launch_lib()
        options = _Options()
        c.gradex_engine_options_init(ctypes.byref(options))
        options.rank = rank
        options.world_size = world_size
        config_arrays = _set_config(options, config)  # alive until the call returns
        out = ctypes.POINTER(_Store)()
        check(c.gradex_store_connect(ctypes.byref(options), ctypes.byref(out)))
        self._ptr: Any = out

    def pointer(self) -> Any:
        if not self._ptr:
            raise _errors.InvalidArgumentError("gradex: the job store is closed")
        return self._ptr

    def set(self, key: str, value: bytes) -> None:
        value = bytes(value)
        s = self.pointer().contents
        if s.set(s.context, key.encode(), value, len(value)) != 0:
            raise _errors.TransportError(f"gradex: store set of '{key}' failed: {last_error()}")

    def get(self, key: str, timeout_ms: int) -> bytes:
        s = self.pointer().contents
        value, length = ctypes.c_void_p(), ctypes.c_size_t()
        if s.get(s.context, key.encode(), int(timeout_ms), ctypes.byref(value), ctypes.byref(length)) != 0:
            raise _errors.TimeoutError(f"gradex: store get of '{key}' failed: {last_error()}")
        try:
            return ctypes.string_at(value, length.value) if length.value else b""
        finally:
            s.release(s.context, value)

    def add(self, key: str, delta: int) -> int:
        s = self.pointer().contents
        out = ctypes.c_int64()
        if s.add(s.context, key.encode(), int(delta), ctypes.byref(out)) != 0:
            raise _errors.TransportError(f"gradex: store add to '{key}' failed: {last_error()}")
        return out.value

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr:
            check(_launch_lib().gradex_store_destroy(ptr))
