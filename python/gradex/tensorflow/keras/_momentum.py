"""Who owns momentum, decided from the optimizer gxk.DistributedOptimizer wraps (the torch plugin's rule).

- SGD with momentum m > 0: gradex takes the momentum over (DGC momentum correction needs it: the residual
  must accumulate the velocity, not the gradient). The wrapper runs with momentum 0 and gradex with
  GRADEX_MOMENTUM = m (and GRADEX_NESTEROV as the optimizer's nesterov); get_config() still says m. An
  explicit GRADEX_MOMENTUM=0 keeps the optimizer's momentum instead (plain error-feedback top-k).
- Optimizers that keep their own first moment (Adam, AdamW, Nadam, Adamax, Lion, Adafactor, LAMB, RMSprop with
  momentum, any optimizer with a `beta_1`) and those that build their update from their own state (Muon, Dion,
  Shampoo, SOAP): gradex never adds momentum (GRADEX_MOMENTUM=0), whatever is set. The families are
  gradex/_optimizer_family.py's, shared with the torch plugin.
- SGD without momentum and other optimizers: GRADEX_MOMENTUM as set explicitly (config=, gxt.init's config or
  the environment), else 0.
- LocalSGD: the optimizer owns momentum (in both phases); GRADEX_MOMENTUM as set explicitly, else 0.
The rule itself is gradex/_momentum_rule.py's (shared with torch; Keras' SGD keeps weight decay out of its
momentum, so weight decay does not stop the takeover here as it does for torch.optim.SGD).
The decided value is always passed to the engine explicitly, so the core's default never matters.
An optimizer that keeps its own first moment makes the engine's GRADEX_OPTIMIZER `adam` (unless set
explicitly): its compressed tensors use the Adam codec (docs/adam_codec.md); any other (Muon included) keeps
DGC's error-feedback top-k.
"""
from __future__ import annotations

import logging
from typing import Dict, Optional, Tuple

from ... import _capi, _momentum_rule, _optimizer_family
from ..._optimizer_family import Family
from .. import _runtime


def optimizer_momentum(optimizer: object) -> float:
    try:
        return float(getattr(optimizer, "momentum", 0) or 0)
    except (TypeError, ValueError):  # a variable or schedule: not SGD's plain float
        return 0.0


def is_sgd(optimizer: object) -> bool:
    return _optimizer_family.family(optimizer) is Family.SGD


def keeps_own_momentum(optimizer: object) -> bool:
    """Adam-family and orthogonalising/preconditioning optimizers (gradex/_optimizer_family.py)."""
    return _optimizer_family.keeps_own_momentum(_optimizer_family.family(optimizer))


def decide(optimizer: object, config: _capi.Config, local_sgd: bool) -> Tuple[Dict[str, str], float]:
    """(GRADEX_* settings to add to the engine's config, momentum gradex takes over from the optimizer or 0)."""
    settings, m = _decide_momentum(optimizer, config, local_sgd)
    # `adam` changes the codecs and `other` keeps GRADEX_DELAY=auto at D = 0 (_optimizer_family.engine_optimizer);
    # SGD is left at the default, so that its engine keeps the configuration of gxt.init()'s and is shared with it.
    engine_optimizer = _optimizer_family.engine_optimizer(optimizer)
    if _runtime.explicit_setting("GRADEX_OPTIMIZER", config) is None and engine_optimizer:
        settings["GRADEX_OPTIMIZER"] = engine_optimizer
    return settings, m


def rule_inputs(optimizer: object, explicit: Optional[float], local_sgd: bool) -> _momentum_rule.MomentumInputs:
    """The momentum rule's inputs read from a Keras optimizer. Keras applies weight decay to the variables,
    outside SGD's momentum, and its SGD has no dampening."""
    kind = _optimizer_family.family(optimizer)
    return _momentum_rule.MomentumInputs(
        family=kind, momenta=frozenset({optimizer_momentum(optimizer)}) if kind is Family.SGD else frozenset(),
        nesterovs=frozenset({bool(getattr(optimizer, "nesterov", False))}),
        weight_decay_in_momentum=False, explicit=explicit, local_sgd=local_sgd)


def _decide_momentum(optimizer: object, config: _capi.Config, local_sgd: bool) -> Tuple[Dict[str, str], float]:
    explicit = _runtime.explicit_setting("GRADEX_MOMENTUM", config)
    explicit_value = float(explicit) if explicit is not None else None
    name = type(optimizer).__name__
    m = optimizer_momentum(optimizer) if is_sgd(optimizer) else 0.0
    decision = _momentum_rule.decide(rule_inputs(optimizer, explicit_value, local_sgd))
    Reason = _momentum_rule.Reason
    if decision.reason is Reason.LOCAL_SGD and explicit_value and m > 0:
        _runtime.say_once(("double", name), f"gradex: GRADEX_MOMENTUM={explicit} with LocalSGD and {name}"
                          f"(momentum={m:g}) applies momentum twice; LocalSGD leaves momentum to the "
                          f"optimizer unless GRADEX_MOMENTUM is set")
    elif decision.reason is Reason.OWN_MOMENTUM and explicit_value:
        kind = _optimizer_family.family(optimizer)
        _runtime.say_once(("first-moment", name),
                          f"gradex: {_optimizer_family.why_no_momentum(kind, name)}, so gradex adds no "
                          f"momentum (GRADEX_MOMENTUM={explicit} is not used for it)")
    if not decision.takeover:
        # Always explicit, so that the core's default never matters.
        value = explicit if decision.momentum is None and explicit is not None else "0"
        return {"GRADEX_MOMENTUM": value}, 0.0
    if explicit_value is not None and explicit_value != m:
        _runtime.say_once(("sgd-momentum", name, m),
                          f"gradex: takes {name}'s momentum={m:g} over (GRADEX_MOMENTUM={explicit} is "
                          f"not used for this optimizer)")
    _runtime.say_once(("takeover", name, m),
                      f"gradex: takes {name}'s momentum={m:g} over (DGC momentum correction); the "
                      f"optimizer runs with momentum 0 and its config still says {m:g}", logging.INFO)
    return {"GRADEX_MOMENTUM": repr(m), "GRADEX_NESTEROV": "1" if decision.nesterov else "0"}, m
