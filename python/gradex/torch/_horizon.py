"""The training's horizon for GRADEX_POLICY=auto (GRADEX_POLICY_HORIZON_STEPS), from what the user gives the
plugin: `horizon_steps=` as a number of optimizer steps, or an LR scheduler that knows its total (OneCycleLR's
total_steps). Never guessed: without it the engine applies no horizon rule (docs/pytorch.md)."""
from __future__ import annotations

import numbers
from typing import Dict, Mapping, Optional

from .. import _capi, _errors

VARIABLE = "GRADEX_POLICY_HORIZON_STEPS"


def steps_of(horizon_steps: Optional[int], what: str) -> Optional[int]:
    """The horizon in steps from `horizon_steps`: an int >= 0, or an object with an integer `total_steps`
    (torch.optim.lr_scheduler.OneCycleLR). gradex.InvalidArgumentError for anything else."""
    if isinstance(horizon_steps, bool):
        raise _errors.InvalidArgumentError(f"gradex: {what}: horizon_steps must be a number of steps, not a bool")
    if isinstance(horizon_steps, numbers.Integral):
        steps = int(horizon_steps)
    else:
        total = getattr(horizon_steps, "total_steps", None)
        if isinstance(total, bool) or not isinstance(total, numbers.Integral):
            raise _errors.InvalidArgumentError(
                f"gradex: {what}: horizon_steps takes the number of optimizer steps the training will run, or an "
                f"LR scheduler that knows its total (OneCycleLR.total_steps), not {type(horizon_steps).__name__}")
        steps = int(total)
    if steps < 0:
        raise _errors.InvalidArgumentError(f"gradex: {what}: horizon_steps must be >= 0, got {steps}")
    return steps


def with_horizon(config: Mapping[str, _capi.ConfigValue], horizon_steps: Optional[int],
                 what: str) -> Dict[str, _capi.ConfigValue]:
    """`config` (GRADEX_* overrides) with GRADEX_POLICY_HORIZON_STEPS set from `horizon_steps` (None: unchanged).
    A different value already in `config` is an error: the two would contradict each other."""
    if horizon_steps is None:
        return dict(config)
    steps = str(steps_of(horizon_steps, what))
    given = config.get(VARIABLE)
    if given is not None and str(given).strip() != steps:
        raise _errors.InvalidArgumentError(
            f"gradex: {what}: horizon_steps={steps} contradicts config {VARIABLE}={given}")
    return {**config, VARIABLE: steps}
