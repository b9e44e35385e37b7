"""The DGC momentum rule: with GRADEX_MOMENTUM = m > 0 gradex applies momentum correction itself, so the
optimizer must run with momentum 0 (else momentum is applied twice). Objects that can see the optimizer
warn once when they see an SGD optimizer with momentum > 0 in that case.
"""
import os
import re
import warnings

import torch

# Mirrors base/config_vars.cc; used only when the engine's own description cannot be read.
_DEFAULT_MOMENTUM = 0.9


def engine_setting(engine, config, name, default):
    """An engine's effective numeric GRADEX_* setting: from its configuration description, else from the
    API config, the environment and `default` (in that order)."""
    try:
        text = engine.describe_config()
        match = re.search(r"(?m)^" + name + r"=([-+0-9.eEinf]+)\s", text)  # "NAME=value    [source; ...]"
        if match:
            return float(match.group(1))
    except Exception:  # noqa: BLE001 - fall back to what this process was told
        pass
    value = (config or {}).get(name, os.environ.get(name))
    try:
        return float(value) if value is not None else default
    except ValueError:
        return default


def gradex_momentum(engine, config):
    """The engine's effective GRADEX_MOMENTUM."""
    return engine_setting(engine, config, "GRADEX_MOMENTUM", _DEFAULT_MOMENTUM)


def gradex_clip_norm(engine, config):
    """The engine's effective GRADEX_CLIP_NORM (0: no clipping)."""
    return engine_setting(engine, config, "GRADEX_CLIP_NORM", 0.0)


def sgd_momentum(optimizer):
    """The largest momentum of an SGD optimizer's groups (0 for other optimizers)."""
    inner = getattr(optimizer, "_gradex_wrapped", optimizer)
    if not isinstance(inner, torch.optim.SGD):
        return 0.0
    return max(float(group.get("momentum", 0) or 0) for group in inner.param_groups)


class MomentumWarner:
    """Warns once per owner when an SGD optimizer with momentum > 0 runs while gradex's momentum is on."""

    def __init__(self, owner, momentum):
        self._owner = owner
        self._momentum = momentum
        self._warned = False

    def check(self, optimizer):
        if self._warned or self._momentum <= 0:
            return
        m = sgd_momentum(optimizer)
        if m > 0:
            self._warned = True
            warnings.warn(
                f"gradex: GRADEX_MOMENTUM={self._momentum:g} means gradex applies DGC momentum correction "
                f"itself, but {self._owner} sees torch.optim.SGD with momentum={m:g}: momentum is then applied "
                f"twice. Use SGD(momentum=0) with gradex, or set GRADEX_MOMENTUM=0 to keep the optimizer's "
                f"momentum (plain error-feedback top-k).", UserWarning, stacklevel=3)
