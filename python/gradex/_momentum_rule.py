"""Who owns momentum, as a pure function of plain values: the one decision of the torch and Keras plugins
(torch/_momentum.py and tensorflow/keras/_momentum.py read the values from their optimizers, apply the
decision to their engine configuration and say its reason in their own words).

The rule, in order:
1. LocalSGD (Keras): the optimizer owns momentum in both phases; gradex's is GRADEX_MOMENTUM as set.
2. No optimizer: GRADEX_MOMENTUM as set.
3. An optimizer that keeps its own first moment or builds its update from its own state (_optimizer_family.py):
   gradex adds none (0), whatever is set.
4. Not SGD, or SGD without momentum: GRADEX_MOMENTUM as set.
5. SGD with momentum and GRADEX_MOMENTUM=0 set explicitly: the optimizer keeps its momentum.
6. SGD whose momentum gradex's u = m*u + g cannot reproduce (groups that differ, dampening, weight decay that the
   front end's SGD folds into its momentum buffer): the optimizer keeps it and gradex adds none (0).
7. Otherwise gradex takes SGD's momentum (and nesterov) over.

The front ends differ deliberately in one input: torch.optim.SGD adds weight decay to the gradient before its
momentum buffer (`weight_decay_in_momentum=True`), Keras applies it to the variables, outside momentum (False).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import FrozenSet, Optional

from ._optimizer_family import Family, keeps_own_momentum


class Reason(enum.Enum):
    LOCAL_SGD = "LocalSGD leaves momentum to the optimizer"
    NO_OPTIMIZER = "no optimizer was given"
    OWN_MOMENTUM = "the optimizer keeps its own momentum or builds its update from its own state"
    NO_SGD_MOMENTUM = "the optimizer is not SGD with momentum"
    EXPLICIT_ZERO = "GRADEX_MOMENTUM=0 is set, so the optimizer keeps its momentum"
    SGD_KEPT = "gradex cannot reproduce this SGD's momentum"
    TAKEOVER = "gradex takes the SGD optimizer's momentum over"


@dataclass(frozen=True)
class MomentumInputs:
    family: Optional[Family]  # None: no optimizer
    momenta: FrozenSet[float] = frozenset()  # SGD's momentum per parameter group (one value in Keras)
    nesterovs: FrozenSet[bool] = frozenset()
    dampening: float = 0.0  # the largest of the groups' (Keras' SGD has none)
    weight_decay: float = 0.0  # the largest of the groups'
    weight_decay_in_momentum: bool = True  # torch.optim.SGD: True; Keras: False
    explicit: Optional[float] = None  # GRADEX_MOMENTUM as the user set it (config or environment), or None
    local_sgd: bool = False


@dataclass(frozen=True)
class MomentumDecision:
    reason: Reason
    momentum: Optional[float]  # the engine's GRADEX_MOMENTUM; None: as set (explicitly, else 0)
    nesterov: Optional[bool] = None  # set with a takeover
    problems: tuple[str, ...] = ()  # why SGD_KEPT

    @property
    def takeover(self) -> bool:
        return self.reason is Reason.TAKEOVER


def decide(inputs: MomentumInputs) -> MomentumDecision:
    """The decision for `inputs` (the rule in this module's docstring)."""
    if inputs.local_sgd:
        return MomentumDecision(Reason.LOCAL_SGD, None)
    if inputs.family is None:
        return MomentumDecision(Reason.NO_OPTIMIZER, None)
    if keeps_own_momentum(inputs.family):
        return MomentumDecision(Reason.OWN_MOMENTUM, 0.0)
    if inputs.family is not Family.SGD or not inputs.momenta or inputs.momenta == {0.0}:
        return MomentumDecision(Reason.NO_SGD_MOMENTUM, None)
    if inputs.explicit == 0:
        return MomentumDecision(Reason.EXPLICIT_ZERO, None)
    problems = []
    if len(inputs.momenta) > 1 or len(inputs.nesterovs) > 1:
        problems.append("its parameter groups use different momentum or nesterov settings")
    if inputs.dampening != 0:
        problems.append("dampening is not 0")
    if inputs.weight_decay != 0 and inputs.weight_decay_in_momentum:
        problems.append("weight decay is folded into SGD's momentum buffer")
    if problems:
        return MomentumDecision(Reason.SGD_KEPT, 0.0, problems=tuple(problems))
    (momentum,) = inputs.momenta
    (nesterov,) = inputs.nesterovs or frozenset({False})
    return MomentumDecision(Reason.TAKEOVER, momentum, nesterov)
