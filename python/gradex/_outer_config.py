"""DiLoCo's keyword arguments as GRADEX_OUTER_* settings, shared by the torch (gx.DiLoCo) and Keras
(gxk.callbacks.DiLoCoCallback) front ends of the one outer optimizer (_capi.Outer, outer/)."""
from __future__ import annotations

from typing import Dict, Optional, TypedDict

from . import _capi, _errors

# The keyword defaults of both front ends (docs/pytorch.md, "Which method for which optimizer and link").
class Defaults(TypedDict):
    period: int
    outer_lr: float
    outer_momentum: float
    fragments: int
    delay: int
    bits: int
    nesterov: bool
    mixing: float
    compression: str
    density: Optional[float]


DEFAULTS = Defaults(period=100, outer_lr=0.7, outer_momentum=0.9, fragments=1, delay=0, bits=4, nesterov=True,
                    mixing=0.0, compression="quant", density=None)


def _int_arg(name: str, value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _errors.ConfigError(f"gradex: DiLoCo {name} must be an integer, got {value!r}")
    return str(value)


def _float_arg(name: str, value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _errors.ConfigError(f"gradex: DiLoCo {name} must be a number, got {value!r}")
    return repr(float(value))


def outer_config(period: int, outer_lr: float, outer_momentum: float, fragments: int, delay: int, bits: int,
                 nesterov: bool, mixing: float, compression: str, density: Optional[float],
                 config: _capi.Config) -> Dict[str, str]:
    """{GRADEX_* name: value} for _capi.Outer: the arguments, then `config` (which wins). Raises
    gradex.ConfigError naming the argument or variable for a bad value (the core's registry checks the
    variables, and that the delay is below the period)."""
    if bits not in (4, 8, 32) or isinstance(bits, bool):
        raise _errors.ConfigError(f"gradex: DiLoCo bits must be 4, 8 or 32, got {bits!r}")
    if compression not in ("quant", "topk"):
        raise _errors.ConfigError(f"gradex: DiLoCo compression must be 'quant' or 'topk', got {compression!r}")
    if density is not None:
        if compression != "topk":
            raise _errors.ConfigError(
                f"gradex: DiLoCo density={density!r} applies only to compression='topk', got {compression!r}")
        if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0.0 < float(density) <= 1.0:
            raise _errors.ConfigError(f"gradex: DiLoCo density must be a number in (0, 1], got {density!r}")
    merged = {
        "GRADEX_OUTER_PERIOD": _int_arg("period", period),
        "GRADEX_OUTER_LR": _float_arg("outer_lr", outer_lr),
        "GRADEX_OUTER_MOMENTUM": _float_arg("outer_momentum", outer_momentum),
        "GRADEX_OUTER_FRAGMENTS": _int_arg("fragments", fragments),
        "GRADEX_OUTER_DELAY": _int_arg("delay", delay),
        "GRADEX_OUTER_BITS": "topk" if compression == "topk" else str(bits),
        "GRADEX_OUTER_NESTEROV": str(int(bool(nesterov))),
        "GRADEX_OUTER_MIXING": _float_arg("mixing", mixing),
    }
    if density is not None:
        merged["GRADEX_OUTER_DENSITY"] = repr(float(density))
    merged.update({str(k): str(v) for k, v in (config or {}).items()})
    # A bad value, or a delay not below the period, is a ConfigError now, also when the outer optimizer is
    # created later (lazily).
    _capi.check_config(merged)
    return merged


def fragment_offset(fragment: int, fragments: int, period: int) -> int:
    """The phase (step mod period) at which `fragment` starts its exchange (outer/fragments.cc)."""
    return (fragment * period // fragments) % period
