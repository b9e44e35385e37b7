"""ctypes binding of the gradex C API (include/gradex/gradex.h, GRADEX_API_VERSION 1).

Its modules import one way: _library (loading the library, the shared C structures, status checks) →
_store (the stores a handle bootstraps through) → _handle (the base of every collective handle) → _engine,
_outer, _group and _launch, which import nothing from each other. This package re-exports the names the
plugins and tests use (gradex._capi.Engine, ...).
"""
from ._engine import Engine, describe_config, setting_number
from ._group import Group
from ._handle import Handle
from ._launch import LaunchInfo, check_config, launch_info
from ._library import (API_VERSION, BFLOAT16, DEVICE_CPU, DEVICE_CUDA, FLOAT16, FLOAT32, Config, ConfigValue,
                       Signatures, Stats, check, device_available, last_error, lib, lib_with, library_path)
from ._outer import Outer
from ._store import AnyStore, JobStore, KeyValueStore, StoreAdapter

__all__ = ["API_VERSION", "BFLOAT16", "DEVICE_CPU", "DEVICE_CUDA", "FLOAT16", "FLOAT32", "AnyStore", "Config",
           "ConfigValue", "Engine", "Group", "Handle", "JobStore", "KeyValueStore", "LaunchInfo", "Outer", "Signatures",
           "Stats", "StoreAdapter", "check", "check_config", "describe_config", "device_available", "launch_info",
           "last_error", "setting_number", "lib", "lib_with", "library_path"]
