"""Exceptions raised for the engine's status codes (include/gradex/gradex.h, gradex_status_t).

Each carries the engine's message (gradex_last_error) unchanged. All derive from GradexError, itself a
RuntimeError, so code that catches RuntimeError around a training step keeps working.
"""


class GradexError(RuntimeError):
    """A gradex call failed; `status` is the gradex_status_t value, `str(e)` the engine's message."""

    status = 8  # GRADEX_ERR_INTERNAL unless a subclass says otherwise

    def __init__(self, message):
        super().__init__(message)
        self.message = message


class InvalidArgumentError(GradexError, ValueError):
    status = 1


class ConfigError(GradexError, ValueError):
    """A GRADEX_* value (environment or API) is invalid."""

    status = 2


class TimeoutError(GradexError):  # noqa: A001 - gradex.TimeoutError, deliberately like the builtin's name
    """A peer stalled or never submitted within GRADEX_TIMEOUT_S."""

    status = 3


class PeerError(GradexError):
    """A peer died or failed."""

    status = 4


class CorruptError(GradexError):
    status = 5


class MismatchError(GradexError):
    """Ranks disagree on tensor keys, sizes or dtypes."""

    status = 6


class TransportError(GradexError):
    status = 7


class InternalError(GradexError):
    status = 8


class StateError(GradexError):
    """Saved compressor state cannot be restored here."""

    status = 9


class VersionError(GradexError):
    """The gradex library and this package disagree on the C API version."""

    status = 10


_BY_STATUS = {cls.status: cls for cls in (InvalidArgumentError, ConfigError, TimeoutError, PeerError,
                                           CorruptError, MismatchError, TransportError, InternalError,
                                           StateError, VersionError)}
_BY_NAME = {"INVALID_ARGUMENT": InvalidArgumentError, "CONFIG": ConfigError, "TIMEOUT": TimeoutError,
            "PEER": PeerError, "CORRUPT": CorruptError, "MISMATCH": MismatchError,
            "TRANSPORT": TransportError, "INTERNAL": InternalError, "STATE": StateError,
            "VERSION": VersionError}


def error_for_status(status, message):
    """The exception for a non-zero gradex_status_t."""
    cls = _BY_STATUS.get(status, GradexError)
    return cls(message or f"gradex call failed with status {status}")


def error_for_name(name, message):
    """The exception for a status name as written by the op library ("gradex[TIMEOUT]: ...")."""
    return _BY_NAME.get(name, GradexError)(message)
