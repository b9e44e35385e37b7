"""Exceptions raised for the engine's status codes (include/gradex/gradex.h, gradex_status_t).

The codes are defined once, in gradex.h; each class below names its code (`status`, `name` as in
gradex.h without the GRADEX_ERR_ prefix), and tests/base/status_table_check.py fails when this file,
the torch op's names or base/error.h disagree with the header.

Each carries the engine's message (gradex_last_error) unchanged. All derive from GradexError, itself a
RuntimeError, so code that catches RuntimeError around a training step keeps working.

This module is also the one home, for every framework integration (torch, TensorFlow/Keras, torchft), of
turning an op library's failure into these exceptions (translate_op_error) and of closing quietly in a
finalizer (close_quietly).
"""
from __future__ import annotations

import re
from typing import Any, Optional, Protocol


class GradexError(RuntimeError):
    """A gradex call failed; `status` is the gradex_status_t value, `str(e)` the engine's message.

    A subclass names its code in its class line (`class PeerError(GradexError, status=4, name="PEER")`);
    one that names none keeps its base's."""

    status = 8  # GRADEX_ERR_INTERNAL unless a subclass says otherwise
    name = "INTERNAL"

    def __init_subclass__(cls, status: Optional[int] = None, name: Optional[str] = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if name is not None:
            cls.name = name

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgumentError(GradexError, ValueError, status=1, name="INVALID_ARGUMENT"):
    """An argument is outside what the call accepts."""


class ConfigError(GradexError, ValueError, status=2, name="CONFIG"):
    """A GRADEX_* value (environment or API) is invalid."""


# gradex.TimeoutError: deliberately like the builtin's name.
class TimeoutError(GradexError, status=3, name="TIMEOUT"):  # noqa: A001
    """A peer stalled or never submitted within GRADEX_TIMEOUT_S."""


class PeerError(GradexError, status=4, name="PEER"):
    """A peer died or failed."""


class CorruptError(GradexError, status=5, name="CORRUPT"):
    """A received payload failed validation."""


class MismatchError(GradexError, status=6, name="MISMATCH"):
    """Ranks disagree on tensor keys, sizes or dtypes."""


class TransportError(GradexError, status=7, name="TRANSPORT"):
    """The transport (UCX, sockets) failed."""


class InternalError(GradexError, status=8, name="INTERNAL"):
    """A broken invariant inside gradex."""


class StateError(GradexError, status=9, name="STATE"):
    """Saved compressor state cannot be restored here."""


class VersionError(GradexError, status=10, name="VERSION"):
    """The gradex library and this package disagree on the C API version."""


class AbortedError(GradexError, status=11, name="ABORTED"):
    """The work was aborted (Engine.abort on this rank or a peer, or a reconfiguration ended it)."""


_CLASSES = (InvalidArgumentError, ConfigError, TimeoutError, PeerError, CorruptError, MismatchError,
            TransportError, InternalError, StateError, VersionError, AbortedError)
_BY_STATUS = {cls.status: cls for cls in _CLASSES}
_BY_NAME = {cls.name: cls for cls in _CLASSES}


def error_for_status(status: int, message: Optional[str]) -> GradexError:
    """The exception for a non-zero gradex_status_t."""
    cls = _BY_STATUS.get(status, GradexError)
    return cls(message or f"gradex call failed with status {status}")


def error_for_name(name: str, message: str) -> GradexError:
    """The exception for a status name as written by the op library ("gradex[TIMEOUT]: ...")."""
    return _BY_NAME.get(name, GradexError)(message)


# The op libraries (torch's and TensorFlow's) report a failure as "gradex[<STATUS>]: <engine message>", inside
# the framework's own error type.
_OP_FAILURE = re.compile(r"gradex\[([A-Z_]+)\]: (.*)", re.S)
# What TensorFlow appends to an op's message: the failing node (" [[{{node ...}}]]") and the eager op
# (" [Op:Name]"); not part of the engine's message.
_FRAMEWORK_CONTEXT = re.compile(r"\s*\[\[|\s*\[Op:")


def translate_op_error(exc: BaseException) -> BaseException:
    """The gradex exception for a framework error raised by one of gradex's ops (torch's RuntimeError from a
    c10::Error, a tf.errors.OpError); `exc` itself when it is not a gradex op failure. The message is the
    engine's, without the framework's appended context."""
    text = getattr(exc, "message", None) or str(exc)
    match = _OP_FAILURE.search(str(text))
    if match is None:
        return exc
    message = _FRAMEWORK_CONTEXT.split(match.group(2), maxsplit=1)[0]
    return error_for_name(match.group(1), message.strip())


class _Closable(Protocol):
    def close(self) -> None: ...


def close_quietly(closable: Optional[_Closable]) -> None:
    """closable.close(), a gradex error swallowed: for finalizers (garbage collection, interpreter exit), where
    the peers may be gone and nobody is left to tell. `None` is accepted (nothing to close)."""
    if closable is None:
        return
    try:
        closable.close()
    except GradexError:
        pass
