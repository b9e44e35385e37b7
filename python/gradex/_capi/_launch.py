"""The configuration check and the launcher's view of the job (gradex_check_config, gradex_launch_info; additive
to API version 1)."""
from __future__ import annotations

import ctypes
from typing import Optional, TypedDict

from .. import _errors
from ._library import Config, check, config_arrays, lib_with


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
    count, (names, values) = config_arrays(config)
    check(c.gradex_check_config(count, names, values))


class _LaunchInfo(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int32), ("world_size", ctypes.c_int32), ("local_rank", ctypes.c_int32),
                ("local_size", ctypes.c_int32), ("master_port", ctypes.c_uint16),
                ("master_addr", ctypes.c_char * 256), ("launcher", ctypes.c_char * 32)]


class LaunchInfo(TypedDict):
    """launch_info()'s answer (a dict)."""
    rank: int
    world_size: int
    local_rank: Optional[int]
    local_size: Optional[int]
    master_addr: str
    master_port: int
    launcher: str


def launch_info() -> LaunchInfo:
    """What the launcher says about this process (gradex_launch_info): a dict with rank, world_size,
    local_rank and local_size (None where the launcher does not say), master_addr, master_port and launcher
    ("torchrun", "Open MPI", "MPICH/Intel MPI", "Slurm" or "none"). ConfigError for a rank without a size (or
    the reverse) and malformed values."""
    c = lib_with("launch", lambda: {"gradex_launch_info": (ctypes.c_int, [ctypes.POINTER(_LaunchInfo)])})
    info = _LaunchInfo()
    check(c.gradex_launch_info(ctypes.byref(info)))
    local_rank: Optional[int] = info.local_rank if info.local_rank >= 0 else None
    local_size: Optional[int] = info.local_size if info.local_size > 0 else None
    return {"rank": info.rank, "world_size": info.world_size, "local_rank": local_rank, "local_size": local_size,
            "master_addr": info.master_addr.decode(), "master_port": info.master_port,
            "launcher": info.launcher.decode()}
