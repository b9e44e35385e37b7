"""Which family an optimizer belongs to, and so who owns its momentum: the one rule of the torch and Keras
plugins (each adapts it: torch/_momentum.py, tensorflow/keras/_momentum.py).

- SGD: plain stochastic gradient descent (torch.optim.SGD, keras.optimizers.SGD). gradex may take its momentum
  over, so that DGC gets its momentum correction (the plugin checks the conditions: one momentum for all
  groups, no dampening, no weight decay folded into the buffer).
- FIRST_MOMENT: keeps its own first moment: Adam, AdamW, NAdam, RAdam, Adamax, AdaBelief, Adafactor, Lion, LAMB,
  LARS, Sophia, Adan, the fused variants, RMSprop with momentum, and any optimizer with `betas`, `beta1` or
  `beta_1`. gradex adds no momentum; the tensors the policy compresses use the Adam codec
  (GRADEX_OPTIMIZER=adam: top-k of a decaying first-moment buffer, docs/adam_codec.md).
- OWN_UPDATE: builds its update from its own state: orthogonalising (Muon, Dion), preconditioning (Shampoo,
  Distributed Shampoo, SOAP) and low-rank projecting (GaLore) optimizers. gradex never takes their momentum
  and adds none (their state must see the averaged raw gradient); the tensors the policy compresses keep
  DGC's error-feedback top-k, without momentum correction. Matched by name before `betas`, since SOAP and
  Shampoo variants have betas but no Adam-style first moment of the gradient alone.
- OTHER: anything else (Adagrad, Rprop, LBFGS, user optimizers): no gradex momentum unless GRADEX_MOMENTUM is
  set explicitly.

Framework-neutral: the rule reads only class names (through the class hierarchy, through a gradex wrapper's
`_gradex_wrapped` and through the wrappers of Accelerate and Lightning) and hyperparameters found in `defaults`,
`param_groups` (torch) or attributes (Keras).
"""
from __future__ import annotations

import enum
from typing import Any, List, Optional, SupportsFloat

# Lower-case class names. A class name containing one of _OWN_UPDATE_WORDS is OWN_UPDATE ("SingleDeviceMuon",
# "DistributedShampoo", "MuonWithAuxAdam").
_OWN_UPDATE_WORDS = ("muon", "dion", "shampoo", "soap", "galore")
_FIRST_MOMENT = frozenset({
    "adam", "adamw", "nadam", "radam", "adamax", "adabelief", "adafactor", "lion", "lamb", "lars", "sophia",
    "sophiag", "adan", "fusedadam", "fusedlamb", "sparseadam", "adamwschedulefree"})
_BETA_NAMES = ("betas", "beta1", "beta_1")


class Family(enum.Enum):
    SGD = "sgd"
    FIRST_MOMENT = "first moment"
    OWN_UPDATE = "own update"
    OTHER = "other"


# Wrappers that training frameworks put around the user's optimizer, by lower-case class name, and the
# attribute holding the optimizer they wrap: Accelerate's prepare() (and so the Hugging Face Trainer) returns an
# AcceleratedOptimizer, Lightning hands LightningOptimizer to the LightningModule. A wrapper hides the class the
# rule reads: SGD inside an AcceleratedOptimizer would otherwise be an optimizer of no known family.
_FRAMEWORK_WRAPPERS = {"acceleratedoptimizer": "optimizer", "lightningoptimizer": "_optimizer"}


def unwrap(optimizer: Any) -> Any:
    """The optimizer the user built: through gradex's wrapper (gx.DistributedOptimizer, `_gradex_wrapped`) and
    the training frameworks' wrappers (_FRAMEWORK_WRAPPERS), in any nesting; else the optimizer itself."""
    for _ in range(8):  # a bound on nesting, so that a wrapper that wraps itself cannot loop
        inner = getattr(optimizer, "_gradex_wrapped", None)
        if inner is None:
            # By the class hierarchy: Lightning's wrapper is a class made per optimizer ("LightningSGD")
            # deriving from LightningOptimizer and the optimizer's class.
            attribute = next((_FRAMEWORK_WRAPPERS[c.__name__.lower()] for c in type(optimizer).__mro__
                              if c.__name__.lower() in _FRAMEWORK_WRAPPERS), None)
            inner = getattr(optimizer, attribute, None) if attribute else None
        if inner is None or inner is optimizer:
            return optimizer
        optimizer = inner
    return optimizer


def class_names(optimizer: object) -> List[str]:
    """Lower-case names of the optimizer's classes, most derived first."""
    return [c.__name__.lower() for c in type(unwrap(optimizer)).__mro__]


def hyperparameter(optimizer: object, name: str) -> object:
    """A hyperparameter's value: the first found in `defaults`, each of `param_groups` (torch), or as an
    attribute (Keras); None when the optimizer has no such setting."""
    inner = unwrap(optimizer)
    defaults = getattr(inner, "defaults", None)
    if isinstance(defaults, dict) and name in defaults:
        return defaults[name]
    for group in getattr(inner, "param_groups", None) or []:
        if isinstance(group, dict) and name in group:
            return group[name]
    return getattr(inner, name, None)


def _number(value: object) -> float:
    if value is None or not isinstance(value, (SupportsFloat, str)):
        return 0.0  # a schedule, or no such setting
    try:
        return float(value or 0)
    except (TypeError, ValueError):  # a variable or a schedule: not a plain number
        return 0.0


def family(optimizer: object) -> Family:
    """The family of `optimizer` (None: OTHER)."""
    if optimizer is None:
        return Family.OTHER
    names = class_names(optimizer)
    own = names[0]
    if any(word in own for word in _OWN_UPDATE_WORDS):
        return Family.OWN_UPDATE
    if own in _FIRST_MOMENT or any(hyperparameter(optimizer, b) is not None for b in _BETA_NAMES):
        return Family.FIRST_MOMENT
    if "rmsprop" in names:
        return Family.FIRST_MOMENT if _number(hyperparameter(optimizer, "momentum")) > 0 else Family.OTHER
    if any(word in n for n in names[1:] for word in _OWN_UPDATE_WORDS):
        return Family.OWN_UPDATE  # a user subclass of Muon, Shampoo, ...
    if any(n in _FIRST_MOMENT for n in names[1:]):
        return Family.FIRST_MOMENT
    if "sgd" in names:
        return Family.SGD
    return Family.OTHER


def engine_optimizer(optimizer: object) -> Optional[str]:
    """The GRADEX_OPTIMIZER value the optimizer's family sets when the user did not set one: "adam" for
    FIRST_MOMENT (its compressed tensors use the Adam codec), "other" for OWN_UPDATE and OTHER (codecs as by
    default; GRADEX_DELAY=auto keeps D = 0, since the delayed exchange's correction carries through SGD's
    linear update only and the ranks' models would drift apart under Muon's orthogonalised or Adagrad's scaled
    one), None for SGD and where no optimizer is known (None: the default, `unknown`)."""
    if optimizer is None:
        return None
    kind = family(optimizer)
    if kind is Family.FIRST_MOMENT:
        return "adam"
    return "other" if kind in (Family.OWN_UPDATE, Family.OTHER) else None


def keeps_own_momentum(kind: Family) -> bool:
    """Whether gradex must never add momentum for the family (whatever GRADEX_MOMENTUM says)."""
    return kind in (Family.FIRST_MOMENT, Family.OWN_UPDATE)


def why_no_momentum(kind: Family, name: str) -> str:
    """Why gradex adds no momentum for `name` of family `kind` (for the plugins' messages)."""
    if kind is Family.OWN_UPDATE:
        return f"{name} builds its update from its own momentum and state (orthogonalised or preconditioned)"
    return f"{name} keeps its own first moment"
