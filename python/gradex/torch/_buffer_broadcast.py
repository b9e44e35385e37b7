"""DDP's per-forward buffer broadcast beside the delayed exchange: says once, in the log, what it costs.

DDP(broadcast_buffers=True), its default, sends rank 0's buffers (BatchNorm's running statistics) to every
rank at the start of every forward pass. It is a collective the step waits for before any compute, so on
a link where gradex's delayed exchange is on (the exchange does not hide behind compute: a slow or distant
link) every step waits about one network latency for it, whatever the comm hook does (docs/wan.md measures
a BatchNorm convnet with and without it). BatchNorm uses the running statistics only in
evaluation, so the remedy is the user's to take: broadcast_buffers=False, and gx.synchronize() before
evaluating or saving (it gives every rank rank 0's buffers). gradex does not change the DDP module's
setting itself: that would silently override what the user built.
"""
from __future__ import annotations

from typing import Any, Optional

from .. import _log

# Steps after which a delay still 0 ends the watch: auto decides within its first steps (its window), and a
# fixed GRADEX_DELAY is known from the first.
WATCHED_STEPS = 64


class BufferBroadcastCheck:
    """Watches a DDP module's steps until the engine's delay is known; warns once (per process) where DDP
    broadcasts buffers at every forward and the delay is on."""

    def __init__(self, ddp: Any) -> None:
        buffers = [b for b in ddp.module.buffers() if b.numel() > 0] if getattr(ddp, "broadcast_buffers", False) else []
        self._count = len(buffers)
        self._bytes = sum(b.numel() * b.element_size() for b in buffers)
        self._steps_left = WATCHED_STEPS if buffers else 0

    @classmethod
    def of(cls, ddp: Optional[Any]) -> Optional["BufferBroadcastCheck"]:
        """A check for `ddp`, or None when there is nothing to watch (no DDP module, no buffers, or DDP does
        not broadcast them)."""
        if ddp is None:
            return None
        check = cls(ddp)
        return check if check._steps_left else None

    @property
    def watching(self) -> bool:
        return self._steps_left > 0

    def after_step(self, delay: int) -> None:
        """One step ended with the engine's delay `delay` (0: the exchange hides, or auto has not decided)."""
        if self._steps_left <= 0:
            return
        self._steps_left -= 1
        if delay <= 0:
            return
        self._steps_left = 0
        _log.warn_once(
            "ddp-broadcast-buffers",
            "gradex: DDP broadcasts rank 0's %d buffers (%d bytes) at every forward (broadcast_buffers=True, its "
            "default): every step waits for that collective, about one network latency on this link, before "
            "its compute, and the delayed exchange (GRADEX_DELAY=%d now) cannot hide it. BatchNorm uses its "
            "running statistics only in evaluation: construct DDP with broadcast_buffers=False and call "
            "gx.synchronize() before evaluating or saving (it gives every rank rank 0's buffers)",
            self._count, self._bytes, delay)
