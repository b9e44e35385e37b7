"""The op library (_gradex_tf_ops.so): loading it under the TensorFlow it was built for, binding engines
to its slots, and turning its failures into gradex exceptions.

The library records the TF version it was compiled against in _gradex_tf_ops.version; loading it under
another TF could crash inside TF's op registry, so the version is compared before tf.load_op_library.
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Optional

import tensorflow as tf

from .. import _capi, _errors

_lock = threading.Lock()
_module: Any = None
_cdll: Optional[ctypes.CDLL] = None


def _package_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def library_path() -> str:
    return os.environ.get("GRADEX_TF_OPS_LIBRARY") or os.path.join(_package_dir(), "_gradex_tf_ops.so")


def built_for() -> Optional[str]:
    """The TF version the op library was built against (None when the library is not installed)."""
    stamp = os.path.splitext(library_path())[0] + ".version"
    try:
        with open(stamp, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def load() -> Any:
    """The op module (ops: gradex_exchange, gradex_broadcast, gradex_end_step), loaded once."""
    global _module, _cdll
    with _lock:
        if _module is not None:
            return _module
        _capi.lib()  # libgradex.so first, with its API version check
        path = library_path()
        if not os.path.exists(path):
            raise ImportError(
                f"gradex: {path} does not exist: the package was installed without TensorFlow. Install "
                f"tensorflow, then reinstall gradex (pip install --no-build-isolation .; see docs/tensorflow.md)")
        wanted = built_for()
        if wanted != tf.__version__:
            raise ImportError(
                f"gradex: the TensorFlow op library was built for TensorFlow {wanted}, but this process runs "
                f"TensorFlow {tf.__version__}; reinstall gradex against this TensorFlow "
                f"(pip install --no-build-isolation .)")
        module = tf.load_op_library(path)
        cdll = ctypes.CDLL(path)  # the same loaded object: the slot functions
        cdll.gradex_tf_bind.argtypes = [ctypes.c_int64, ctypes.c_void_p]
        cdll.gradex_tf_bind.restype = ctypes.c_int
        cdll.gradex_tf_unbind.argtypes = [ctypes.c_int64]
        cdll.gradex_tf_unbind.restype = ctypes.c_int
        _module, _cdll = module, cdll
        return _module


def bind(slot: int, engine: _capi.Engine) -> None:
    load()
    assert _cdll is not None  # load() opened it
    if _cdll.gradex_tf_bind(slot, engine.address) != 0:
        raise _errors.InternalError(f"gradex: engine slot {slot} is already bound")


def unbind(slot: int) -> None:
    """Closes the slot after every exchange queued on it has completed (ctypes releases the GIL)."""
    if _cdll is not None:
        _cdll.gradex_tf_unbind(slot)

