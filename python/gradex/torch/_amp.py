"""Mixed precision: keeping gradex's stored state (DGC residuals, momenta) free of the GradScaler's scale.

With torch.amp.GradScaler, backward produces gradients multiplied by the current loss scale, and the scale
changes (halved after an overflow, doubled every growth_interval steps). Residuals and momenta accumulated
in the scaled domain would be weighted wrongly after every change. So an exchanger that knows the scaler
divides each gradient by the current scale before handing it to the engine and multiplies the average by
the same scale afterwards: the engine only ever sees unscaled gradients, and what it returns is scaled again
for the GradScaler, whose unscale_()/step()/update() then work as without gradex. Default scales are powers
of two, so the round trip is exact (barring fp32 underflow). A non-finite gradient stays non-finite through
the division; the engine tells every rank (GRADEX_NONFINITE=propagate), so every rank's scaler skips the step.
"""
from __future__ import annotations

from typing import Optional, Protocol

import torch

from .. import _errors


class GradScalerLike(Protocol):
    """What gradex calls of a torch.amp.GradScaler; its scale tensor is read as the attribute `_scale`, and
    ScaleDomain checks that scale, unscale_ and update exist."""

    def is_enabled(self) -> bool: ...


class ScaleDomain:
    """Reads a GradScaler's current scale (or none) for unscale()/rescale()."""

    def __init__(self, scaler: Optional[GradScalerLike]) -> None:
        if scaler is not None and not all(hasattr(scaler, a) for a in ("scale", "unscale_", "update")):
            raise _errors.InvalidArgumentError(
                f"gradex: scaler= takes a torch.amp.GradScaler, not {type(scaler).__name__}")
        self._scaler = scaler

    @property
    def scaler(self) -> Optional[GradScalerLike]:
        return self._scaler

    def current(self) -> Optional[torch.Tensor]:
        """The scale tensor the last backward was scaled by, or None (no scaler, disabled, not used yet).
        The tensor lives on the scaler's device: no host synchronisation is needed to apply it."""
        s = self._scaler
        if s is None or not s.is_enabled():
            return None
        # GradScaler keeps its scale as a one-element tensor, updated in place by update(); reading the
        # attribute avoids get_scale()'s .item(), which would synchronise a CUDA device every bucket.
        scale: Optional[torch.Tensor] = getattr(s, "_scale", None)
        return scale

    @staticmethod
    @torch.no_grad()
    def unscale(tensor: torch.Tensor, scale: Optional[torch.Tensor]) -> None:
        if scale is not None:
            tensor.div_(scale.to(tensor.device, non_blocking=True))

    @staticmethod
    @torch.no_grad()
    def rescale(tensor: torch.Tensor, scale: Optional[torch.Tensor]) -> None:
        if scale is not None:
            tensor.mul_(scale.to(tensor.device, non_blocking=True))
