"""gradex: gradient exchange for data-parallel training on slow Ethernet.

The framework-neutral pieces live here: the exceptions (one per C API status) and the ctypes binding of
the C API (gradex._capi). The PyTorch plugin is gradex.torch.
"""
from __future__ import annotations

from ._errors import (AbortedError, ConfigError, CorruptError, GradexError, InternalError, InvalidArgumentError,
                      MismatchError, PeerError, StateError, TimeoutError, TransportError, VersionError)

__version__ = "0.1.0"


def describe_config() -> str:
    """The effective GRADEX_* configuration of the environment, with help text."""
    from . import _capi
    return _capi.describe_config()


__all__ = ["AbortedError", "ConfigError", "CorruptError", "GradexError", "InternalError", "InvalidArgumentError",
           "MismatchError", "PeerError", "StateError", "TimeoutError", "TransportError", "VersionError",
           "describe_config", "__version__"]
