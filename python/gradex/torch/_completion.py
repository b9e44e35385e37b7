"""Completes torch futures when the engine finishes submissions, without blocking the submitter.

One daemon thread per owner waits for each future's tickets in submission order (the op releases the GIL
while it waits; every ticket is consumed, even after a failure), runs an optional callback, then sets the
future's result, or its exception with the engine's error. For CUDA tensors the wait runs with a side stream of
this thread current: a tensor exchanged on the GPU makes that stream wait for gradex's completion event, a staged
one is copied back on it, and the future, created with the tensor's device, records that stream: consumers wait
on it, not on the whole device.
"""
from __future__ import annotations

import contextlib
import queue
import threading
from typing import Callable, ContextManager, Dict, List, Optional, Sequence, Union

import torch

from . import _ops, _profile


class Completer:
    def __init__(self, name: str) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._streams: Dict[torch.device, torch.cuda.Stream] = {}
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, tickets: Union[int, Sequence[int]], future: torch.futures.Future, value: torch.Tensor,
            after: Optional[Callable[[], None]] = None) -> None:
        """Waits for `tickets` (a ticket or a list, in order), calls `after()`, then
        future.set_result(value)."""
        self._queue.put(([tickets] if isinstance(tickets, int) else list(tickets), future, value, after))

    def close(self) -> None:
        """Completes everything queued, then stops the thread."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _stream_context(self, tensor: torch.Tensor) -> ContextManager[object]:
        if not tensor.is_cuda:
            return contextlib.nullcontext()
        device = tensor.device
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        return torch.cuda.stream(self._streams[device])

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            tickets, future, value, after = item
            try:
                with self._stream_context(value), _profile.range("gradex.exchange"):
                    _ops.wait_all(tickets)
                    if after is not None:
                        after()
                    future.set_result(value)
            except BaseException as exc:  # noqa: BLE001 - delivered to whoever waits on the future
                with contextlib.suppress(RuntimeError):  # already completed: nothing left to tell
                    future.set_exception(exc)
