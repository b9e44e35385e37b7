"""The Work objects ProcessGroupGradex returns: a torch Future completed by the group's worker thread.

torchft reads a failed collective two ways: `work.wait()` raises, and `work.get_future()` completes with the
exception (its Manager and DDP hook chain callbacks on it). Both are served by one record per operation,
completed exactly once: by the worker thread with the result or the engine's error, or earlier by an abort
(a timeout, a reconfiguration, torchft's abort()) with the reason.
"""
from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist


class Operation:
    """One issued collective: its name (for messages), the value its future completes with, its completion."""

    def __init__(self, name: str, result: object) -> None:
        self.name = name
        self.result = result
        self.future: torch.futures.Future = torch.futures.Future()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._completed = False
        self.error: Optional[BaseException] = None

    def succeed(self) -> bool:
        with self._lock:
            if self._completed:
                return False
            self._completed = True
        self._done.set()
        self.future.set_result(self.result)
        return True

    def fail(self, error: BaseException) -> bool:
        """Completes with `error` unless already completed; returns whether this call completed it."""
        with self._lock:
            if self._completed:
                return False
            self._completed = True
            self.error = error
        self._done.set()
        self.future.set_exception(error)
        return True

    def wait_done(self, seconds: Optional[float]) -> bool:
        return self._done.wait(seconds)


class GradexWork(dist._Work):
    """Work of one ProcessGroupGradex operation."""

    def __init__(self, group: Any, operation: Operation) -> None:
        super().__init__()
        self._group = group
        self._operation = operation

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        """Blocks until the operation completes; raises its error. `timeout` (None or 0: the group's): past it
        the group aborts (every pending operation fails, as after a lost peer) and this raises."""
        if not self._operation.wait_done(0):
            seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout or 0)
            if seconds <= 0:  # c10d's kNoTimeout (0): the group's own limit
                seconds = self._group._timeout.total_seconds()
            if not self._operation.wait_done(seconds):
                self._group._abort_generation(
                    f"{self._operation.name} timed out after {seconds:g} s")
        if self._operation.error is not None:
            raise self._operation.error
        return True

    def is_completed(self) -> bool:
        return self._operation.wait_done(0)

    def is_success(self) -> bool:
        return self.is_completed() and self._operation.error is None

    def exception(self) -> Optional[BaseException]:
        return self._operation.error

    def get_future(self) -> torch.futures.Future:
        return self._operation.future


def completed_work(result: object) -> GradexWork:
    """A Work that has already succeeded with `result`."""
    operation = Operation("noop", result)
    operation.succeed()
    return GradexWork(None, operation)
