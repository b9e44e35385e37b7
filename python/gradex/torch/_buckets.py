"""Exchanging DDP's gradient buckets through an engine: the part of the comm hook that State and LocalSGD
share.

A bucket is exchanged per parameter: DDP's per-parameter gradient views (bucket.gradients(), which alias
the bucket's buffer) are submitted one by one under their parameter's key (_layout.py), so the engine's
policy decides per tensor and the averages land in the bucket in place, without a copy. Keys that are
parameter names are independent of the bucket layout, so the engine is used from the first iteration;
positional keys ("bucket3.param7") only once DDP has rebuilt its buckets, so the first `dense_iterations`
iterations then go through a plain allreduce on the default process group.

Every bucket is submitted as soon as DDP hands it over and its future is completed by a Completer thread:
communication overlaps the rest of backward, and only DDP's own wait at the end of backward blocks. With
GRADEX_CLIP_NORM > 0 an iteration's buckets are held until the last one: the engine clips by this rank's norm
over the whole model's gradient, which is known only then.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from .. import _capi, _errors
from . import _amp, _completion, _layout, _momentum, _ops, _profile


class BucketExchanger:
    def __init__(self, engine: _capi.Engine, module: Optional[torch.nn.Module] = None,
                 dense_iterations: Optional[int] = None, end_steps: bool = True, scaler: Any = None,
                 group: Any = None) -> None:
        """`module`: the model whose parameter names key the gradients (None: positional keys).
        `dense_iterations`: leading iterations averaged by a plain allreduce (None: 0 with names, 1 without).
        `end_steps`: call the engine's end_step once an iteration's last bucket is done (State); LocalSGD
        ends steps itself, after the optimizer step. `scaler`: a GradScaler whose scale is kept out of the
        engine (_amp.py). `group`: the DDP module's process group (the engine's ranks; None: the default)."""
        self.keys = _layout.BucketKeys(module)
        if dense_iterations is None:
            dense_iterations = 0 if self.keys.named else 1
        if dense_iterations < (0 if self.keys.named else 1):
            raise _errors.InvalidArgumentError(
                "gradex: dense_iterations must be >= 1 without parameter names (DDP rebuilds its buckets after "
                "the first iteration); pass the model to gx.State to key gradients by name")
        self.engine = engine
        self.group = group
        self.dense_iterations = dense_iterations
        self.iteration = 0  # backward passes seen (an iteration ends with its last bucket)
        self.scale = _amp.ScaleDomain(scaler)
        self.clip = _momentum.gradex_clip_norm(engine, None) > 0
        # Under LocalSGD the local phase still needs the engine when it applies momentum or clipping in place.
        self.local_work = self.clip or _momentum.gradex_momentum(engine, None) > 0
        self._held: List[Any] = []  # buckets of this iteration waiting for the last one (clipping only)
        self._end_steps = end_steps
        self._lock = threading.Lock()
        self._completer = _completion.Completer("gradex-buckets")
        self._watched: List[torch.futures.Future] = []  # this backward pass's futures, checked when it ends (_watch)

    def exchange(self, bucket: dist.GradBucket) -> torch.futures.Future:
        buffer = bucket.buffer()
        last = bucket.is_last()
        with self._lock:
            iteration = self.iteration
            if last:
                self.iteration += 1
        if iteration < self.dense_iterations:
            return self._allreduce(buffer, self.group)
        if not self.local_work and not self.engine.exchanges_gradients():
            # LocalSGD's local phase with nothing for gradex to do locally (no gradex momentum, no clipping):
            # no submission and no staging of CUDA buckets.
            if last and self._end_steps:
                self.engine.end_step()
            return self._completed(buffer)
        gradients = bucket.gradients()
        keys = self.keys.keys(bucket.index(), bucket.parameters(), gradients)
        self.keys.register_all(self.engine, keys, gradients)
        scale = self.scale.current()
        _amp.ScaleDomain.unscale(buffer, scale)
        future: torch.futures.Future = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
        self._watch(future)
        item = (buffer, keys, gradients, scale, future, last and self._end_steps)
        if not self.clip:
            self._submit([item])
            return future
        # Clipping by the whole model's norm needs every gradient of the iteration: hold the buckets until
        # the last one, then give the engine this rank's norm and submit them all (overlap is traded away).
        with self._lock:
            self._held.append(item)
            held, self._held = (self._held, []) if last else (None, self._held)
        if held is not None:
            norms = [torch.linalg.vector_norm(b, dtype=torch.float32) for b, *_ in held]
            self.engine.set_gradient_norm(float(torch.linalg.vector_norm(torch.stack(norms))))
            self._submit(held)
        return future

    def _watch(self, future: torch.futures.Future) -> None:
        """Makes an engine error reach backward() as gradex's own exception with the engine's message.
        DDP's reducer reads a hook's future in C++ and can only take a tensor from it: an exception set on
        a Python future reaches backward() as "Unable to cast <message> to Tensor". So the first bucket of
        each backward pass queues a callback that the autograd engine runs when the pass ends, before
        DDP's own (queued after the last bucket's hook): it waits for the pass's futures and raises the
        first error, which backward() raises unchanged."""
        with self._lock:
            self._watched.append(future)
            if len(self._watched) > 1:
                return
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self._raise_first_error)
        except RuntimeError:  # not inside a backward pass: the futures report errors themselves
            with self._lock:
                self._watched.clear()

    def _raise_first_error(self) -> None:
        with self._lock:
            futures, self._watched = self._watched, []
        with _profile.range("gradex.wait"):
            for future in futures:
                future.wait()  # raises the exception the Completer set (gradex's type)

    def _submit(self, items: Any) -> None:
        """Submits every view of `items` and queues their completion; on a failure, nothing stays in
        flight and every item's future fails too."""
        with _profile.range("gradex.submit"):
            self._submit_items(items)

    def _submit_items(self, items: Any) -> None:
        queued = 0
        try:
            for buffer, keys, gradients, scale, future, end_step in items:
                tickets = []
                try:
                    for key, view in zip(keys, gradients):
                        tickets.append(_ops.submit(self.engine.address, key, view,
                                                   on_device=key in self.keys.on_device))
                except BaseException:
                    try:  # none may stay in flight on a buffer DDP is about to reuse
                        _ops.wait_all(tickets)
                    except _errors.GradexError:
                        pass  # the submission's own error is the one to report
                    raise
                self._completer.add(tickets, future, buffer, self._after(buffer, scale, end_step))
                queued += 1
        except BaseException as exc:
            for *_, future, _ in items[queued:]:
                future.set_exception(exc)
            raise

    def _after(self, buffer: torch.Tensor, scale: Optional[torch.Tensor], end_step: bool) -> Callable[[], None]:
        def after() -> None:
            _amp.ScaleDomain.rescale(buffer, scale)
            if end_step:
                self.engine.end_step()
        return after

    @staticmethod
    def _completed(buffer: torch.Tensor) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
        future.set_result(buffer)
        return future

    @staticmethod
    def _allreduce(tensor: torch.Tensor, group: Any) -> torch.futures.Future:
        # As DDP's default hook: divide first, then sum, so the result is the average.
        tensor.div_(dist.get_world_size(group))
        work = dist.all_reduce(tensor, group=group, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    def state(self) -> Dict[str, Tuple[int, str]]:
        """What a state dict needs besides the engine's blob: the registered keys and shapes."""
        return {key: (numel, str(dtype)) for key, (numel, dtype) in self.keys.registered.items()}

    def close(self) -> None:
        self._completer.close()
