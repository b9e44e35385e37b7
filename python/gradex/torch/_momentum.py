"""Who owns momentum: it follows the optimizer.

- torch.optim.SGD with momentum m > 0 (dampening 0, no weight decay, the same m and nesterov in every group):
  gradex takes the momentum over. The optimizer runs at momentum 0 while gradex owns it (its state_dict()
  still says m, and a loaded state dict is put back under gradex's ownership), and the engine gets
  GRADEX_MOMENTUM=m and GRADEX_NESTEROV per the optimizer, so DGC gets its momentum correction and dense
  tensors train exactly like SGD with momentum. GRADEX_MOMENTUM=0 set explicitly keeps the optimizer's
  momentum instead. SGD with dampening or weight decay keeps its own momentum (gradex's u = m*u + g has
  neither) and gradex adds none.
- Optimizers that keep their own first moment (Adam, AdamW, NAdam, RAdam, Adamax, Adafactor, Lion, LAMB, LARS,
  Sophia, Adan, RMSprop with momentum, anything with `betas`) and optimizers that build their update from their
  own state (Muon, Dion, Shampoo, SOAP, GaLore): gradex never adds momentum, even when GRADEX_MOMENTUM is set.
  The families are gradex/_optimizer_family.py's, shared with the Keras plugin.
- Other optimizers, and no optimizer given: no gradex momentum unless GRADEX_MOMENTUM is set explicitly
  (environment or config=); without an optimizer gradex says so once through the "gradex" logger.

An optimizer that keeps its own first moment makes the engine's GRADEX_OPTIMIZER `adam` (unless set
explicitly): its compressed tensors then use the Adam codec (top-k of a decaying first-moment buffer,
docs/adam_codec.md) instead of DGC; any other optimizer keeps DGC, as without one.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Dict, Optional, Tuple, Union

import torch

from .. import _capi, _log, _momentum_rule, _optimizer_family
from .._optimizer_family import Family, unwrap


def engine_setting(engine: Optional[_capi.Engine], config: _capi.Config, name: str, default: float) -> float:
    """An engine's effective numeric GRADEX_* setting (gradex_get_setting_number); without an open engine, the
    API config, the environment and `default` (in that order)."""
    if engine is not None and engine.address:
        return engine.setting(name)
    value = (config or {}).get(name, os.environ.get(name))
    try:
        return float(value) if value is not None else default
    except ValueError:
        return default


def gradex_momentum(engine: Optional[_capi.Engine], config: _capi.Config) -> float:
    """The engine's effective GRADEX_MOMENTUM."""
    return engine_setting(engine, config, "GRADEX_MOMENTUM", 0.0)


def gradex_clip_norm(engine: Optional[_capi.Engine], config: _capi.Config) -> float:
    """The engine's effective GRADEX_CLIP_NORM (0: no clipping)."""
    return engine_setting(engine, config, "GRADEX_CLIP_NORM", 0.0)


def keeps_first_moment(optimizer: object) -> bool:
    """Whether the optimizer keeps its own first moment (Adam family, Lion, LAMB, RMSprop with momentum...)."""
    return _optimizer_family.family(optimizer) is Family.FIRST_MOMENT


def _explicit_momentum(config: _capi.Config) -> Optional[float]:
    """GRADEX_MOMENTUM as the user set it (config= first, then the environment), or None."""
    value = (config or {}).get("GRADEX_MOMENTUM", os.environ.get("GRADEX_MOMENTUM"))
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None  # gradex_check_config reports it


class SgdMomentumTakeover:
    """While gradex owns an SGD optimizer's momentum: the optimizer's groups run at momentum 0 (and without
    nesterov), its state_dict() reports the user's values, and load_state_dict() keeps gradex the owner."""

    def __init__(self, optimizer: object, momentum: float, nesterov: bool) -> None:
        self.optimizer = unwrap(optimizer)
        self.momentum, self.nesterov = momentum, nesterov
        self._saved = [(g["momentum"], g.get("nesterov", False)) for g in self.optimizer.param_groups]
        self._own()
        self._hooks = [self.optimizer.register_state_dict_post_hook(self._report_user_values),
                       self.optimizer.register_load_state_dict_post_hook(self._after_load)]

    def _own(self) -> None:
        for g in self.optimizer.param_groups:
            g["momentum"] = 0.0
            g["nesterov"] = False

    def _report_user_values(self, _optimizer: torch.optim.Optimizer, state_dict: Dict[str, Any]) -> Dict[str, Any]:
        for group, (m, nesterov) in zip(state_dict["param_groups"], self._saved):
            group["momentum"], group["nesterov"] = m, nesterov
        return state_dict

    def _after_load(self, _optimizer: torch.optim.Optimizer) -> None:
        loaded = [(g["momentum"], g.get("nesterov", False)) for g in self.optimizer.param_groups]
        if any(m != self.momentum or bool(n) != self.nesterov for m, n in loaded if m != 0):
            _log.warn_once(("momentum-load", id(self)),
                           "gradex: the loaded optimizer state has momentum %s, but gradex's engine applies "
                           "momentum %g (nesterov %s), fixed when it was created", [m for m, _ in loaded],
                           self.momentum, self.nesterov)
        self._saved = [(m if m != 0 else self.momentum, n if m != 0 else self.nesterov) for m, n in loaded]
        self._own()

    def release(self) -> None:
        """Gives the momentum back to the optimizer (its groups get the user's values again)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for g, (m, nesterov) in zip(self.optimizer.param_groups, self._saved):
            g["momentum"], g["nesterov"] = m, nesterov


def rule_inputs(optimizer: object, explicit: Optional[float]) -> _momentum_rule.MomentumInputs:
    """The momentum rule's inputs read from a torch optimizer (None: no optimizer). An SGD-family optimizer
    that is not a torch.optim.SGD (its momentum may not be SGD's) counts as Family.OTHER."""
    if optimizer is None:
        return _momentum_rule.MomentumInputs(family=None, explicit=explicit)
    inner = unwrap(optimizer)
    kind = _optimizer_family.family(optimizer)
    if kind is Family.SGD and not isinstance(inner, torch.optim.SGD):
        kind = Family.OTHER
    if kind is not Family.SGD:
        return _momentum_rule.MomentumInputs(family=kind, explicit=explicit)
    groups = inner.param_groups
    return _momentum_rule.MomentumInputs(
        family=kind, momenta=frozenset(float(g.get("momentum", 0) or 0) for g in groups),
        nesterovs=frozenset(bool(g.get("nesterov", False)) for g in groups),
        dampening=max(float(g.get("dampening", 0) or 0) for g in groups),
        weight_decay=max(abs(float(g.get("weight_decay", 0) or 0)) for g in groups),
        weight_decay_in_momentum=True, explicit=explicit)


def decide(optimizer: object, config: _capi.Config,
           owner: str) -> Tuple[Dict[str, Union[str, int, float]], Optional[SgdMomentumTakeover]]:
    """Applies the momentum rule (gradex/_momentum_rule.py) for `owner` (e.g. "gx.DistributedOptimizer"):
    returns (config, takeover), `config` a copy of the API overrides with GRADEX_MOMENTUM/GRADEX_NESTEROV set
    when the rule fixes them, `takeover` an SgdMomentumTakeover when gradex now owns the optimizer's momentum
    (else None)."""
    config = dict(config or {})
    explicit = _explicit_momentum(config)
    # `adam` changes the codecs; `other` keeps GRADEX_DELAY=auto at D = 0 (_optimizer_family.engine_optimizer).
    engine_optimizer = _optimizer_family.engine_optimizer(optimizer)
    if engine_optimizer and "GRADEX_OPTIMIZER" not in config and "GRADEX_OPTIMIZER" not in os.environ:
        config["GRADEX_OPTIMIZER"] = engine_optimizer
    decision = _momentum_rule.decide(rule_inputs(optimizer, explicit))
    Reason = _momentum_rule.Reason
    name = type(unwrap(optimizer)).__name__
    if decision.reason is Reason.NO_OPTIMIZER and explicit is None:
        _log.info_once("momentum-none", "gradex: %s adds no momentum (GRADEX_MOMENTUM is not set and no "
                       "optimizer= was given); pass optimizer= so that an SGD optimizer's momentum moves "
                       "into gradex (DGC's momentum correction), or set GRADEX_MOMENTUM", owner)
    elif decision.reason is Reason.OWN_MOMENTUM and explicit:
        _log.warn_once(("momentum-own", name), "gradex: GRADEX_MOMENTUM=%g is ignored: %s, so gradex adds no "
                       "momentum to its gradients", explicit,
                       _optimizer_family.why_no_momentum(_optimizer_family.family(optimizer), name))
    elif decision.reason is Reason.EXPLICIT_ZERO:
        _log.info_once(("momentum-kept", name), "gradex: GRADEX_MOMENTUM=0 is set, so %s keeps its own momentum",
                       name)
    elif decision.reason is Reason.SGD_KEPT:
        _log.warn_once(("momentum-sgd-kept", id(unwrap(optimizer))), "gradex: %s keeps the momentum of its SGD "
                       "optimizer (%s) and gradex adds none, so DGC runs without momentum correction", owner,
                       "; ".join(decision.problems))
    if decision.momentum is not None and not decision.takeover:
        config["GRADEX_MOMENTUM"] = "0"
    if not decision.takeover:
        return config, None
    momentum, nesterov = float(decision.momentum or 0.0), bool(decision.nesterov)
    if explicit is not None and explicit != momentum:
        _log.warn_once(("momentum-mismatch", id(unwrap(optimizer))), "gradex: GRADEX_MOMENTUM=%g is replaced by "
                       "the SGD optimizer's momentum %g, which gradex takes over", explicit, momentum)
    config["GRADEX_MOMENTUM"] = repr(momentum)
    config["GRADEX_NESTEROV"] = "1" if nesterov else "0"
    logging.getLogger("gradex").debug("gradex: %s takes over SGD momentum %g (nesterov %s)", owner, momentum,
                                      nesterov)
    return config, SgdMomentumTakeover(unwrap(optimizer), momentum, nesterov)


class MomentumWarner:
    """Warns once when an SGD optimizer with momentum > 0 runs while the engine applies gradex momentum too
    (an optimizer gradex was not told about)."""

    def __init__(self, owner: str, momentum: float) -> None:
        self._owner = owner
        self._momentum = momentum
        self._warned = False

    def check(self, optimizer: object) -> None:
        if self._warned or self._momentum <= 0:
            return
        inner = unwrap(optimizer)
        if not isinstance(inner, torch.optim.SGD):
            return
        m = max(float(group.get("momentum", 0) or 0) for group in inner.param_groups)
        if m > 0:
            self._warned = True
            _log.logger.warning(
                "gradex: GRADEX_MOMENTUM=%g means gradex applies momentum itself, but %s sees torch.optim.SGD "
                "with momentum=%g: momentum is then applied twice. Pass the optimizer (optimizer=) so that "
                "gradex takes its momentum over, or set GRADEX_MOMENTUM=0.", self._momentum, self._owner, m)
