"""gradex's phases as named ranges in the user's own torch.profiler trace (record_function).

The ranges, all prefixed "gradex.":
- "gradex.submit" around a DDP bucket's (or a DistributedOptimizer gradient's) hand-over to the engine, inside
  the backward pass that produced it;
- "gradex.wait" where the training thread waits on gradex: at the end of a backward pass through the DDP hook
  (the callback that collects the pass's exchanges, queued before DDP's own wait), in
  DistributedOptimizer.step()/synchronize();
- "gradex.exchange" on gradex's completion thread, from a bucket's hand-over being queued to its average being
  written (what DDP's own wait then sees as done).
A range costs one check of whether a profiler is recording when none is (record_function itself is not
entered), so the hook pays nothing measurable without a profiler.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

try:  # the flag torch.profiler sets while it records
    from torch.autograd.profiler import _is_profiler_enabled as _probe  # noqa: F401

    def recording() -> bool:
        """Whether a torch profiler is recording now."""
        return bool(torch.autograd.profiler._is_profiler_enabled)
except ImportError:  # pragma: no cover - older or newer torch without the module flag
    def recording() -> bool:
        return bool(torch._C._autograd._profiler_enabled())


def range(name: str) -> ContextManager[object]:  # noqa: A001 - reads as profile.range("gradex.wait")
    """A context manager that records `name` in the user's profiler trace while one records."""
    if recording():
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()
