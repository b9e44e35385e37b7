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

The torchft hook (gradex.torchft.hook) uses the same exchanger and adds, per step, what fault tolerance needs:
absent submissions for a replica that does not take part, a factor that rescales the average from the quorum's
members to its participants, skipped buckets once torchft has an error, and `on_failure` (an error goes to the
Manager and the bucket comes back as it was, instead of raising out of backward).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .. import _capi, _errors
from . import _amp, _completion, _layout, _momentum, _ops, _profile


@dataclass
class _Item:
    """One bucket on its way through the engine."""
    buffer: torch.Tensor
    keys: List[str]
    gradients: List[torch.Tensor]
    scale: Optional[torch.Tensor]  # the GradScaler's scale the buffer was divided by (_amp.py)
    future: torch.futures.Future
    end_step: bool  # the iteration's last bucket, and the exchanger ends the engine's steps
    absent: bool  # this rank contributes zeros (torchft: a replica that does not take part)
    factor: float  # multiplies the average (torchft: quorum members / participants)


class BucketExchanger:
    def __init__(self, engine: _capi.Engine, module: Optional[torch.nn.Module] = None,
                 dense_iterations: Optional[int] = None, end_steps: bool = True,
                 scaler: Optional[_amp.GradScalerLike] = None, group: Optional[dist.ProcessGroup] = None,
                 on_failure: Optional[Callable[[BaseException], None]] = None) -> None:
        """`module`: the model whose parameter names key the gradients (None: positional keys).
        `dense_iterations`: leading iterations averaged by a plain allreduce (None: 0 with names, 1 without).
        `end_steps`: call the engine's end_step once an iteration's last bucket is done (State); LocalSGD
        ends steps itself, after the optimizer step. `scaler`: a GradScaler whose scale is kept out of the
        engine (_amp.py). `group`: the DDP module's process group (the engine's ranks; None: the default).
        `on_failure`: None: an engine error reaches backward() as gradex's exception (_watch); else it is
        given to on_failure and the bucket's future completes with the bucket as it was (torchft)."""
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
        self._on_failure = on_failure
        self._held: List[_Item] = []  # buckets of this iteration waiting for the last one (clipping only)
        self._end_steps = end_steps
        self._lock = threading.Lock()
        self._completer = _completion.Completer("gradex-buckets")
        self._watched: List[torch.futures.Future] = []  # this backward pass's futures, checked when it ends (_watch)

    def exchange(self, bucket: dist.GradBucket, absent: bool = False, factor: float = 1.0) -> torch.futures.Future:
        """Submits the bucket; its future holds the average over ranks, times `factor`. `absent`: this rank
        contributes zeros and its engine state stays untouched (_ops.submit_absent)."""
        buffer = bucket.buffer()
        iteration, last = self._advance(bucket)
        if iteration < self.dense_iterations:
            return self._allreduce(buffer, self.group)
        if not self.local_work and not self.engine.exchanges_gradients():
            # LocalSGD's local phase with nothing for gradex to do locally (no gradex momentum, no clipping):
            # no submission and no staging of CUDA buckets.
            if last and self._end_steps:
                self.engine.end_step()
            return self._completed(buffer)
        gradients = bucket.gradients()
        try:
            keys = self.keys.keys(bucket.index(), bucket.parameters(), gradients)
            self.keys.register_all(self.engine, keys, gradients)
        except _errors.GradexError as exc:
            if self._on_failure is None:
                raise
            self._on_failure(exc)
            return self.skip(bucket, counted=True)
        scale = self.scale.current()
        _amp.ScaleDomain.unscale(buffer, scale)
        future: torch.futures.Future = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
        if self._on_failure is None:
            self._watch(future)
        item = _Item(buffer, keys, gradients, scale, future, last and self._end_steps, absent, factor)
        try:
            self._submit_or_hold(item, last)
        except _errors.GradexError:
            if self._on_failure is None:
                raise
            # The futures of every unsubmitted item carry the error: _settled reports it.
        return future if self._on_failure is None else self._settled(future, buffer)

    def skip(self, bucket: dist.GradBucket, counted: bool = False) -> torch.futures.Future:
        """Returns the bucket as it is, without an exchange (torchft: a step that cannot commit); buckets held
        for clipping are returned too (rescaled back to the GradScaler's domain), so none is left waiting.
        `counted`: exchange() already counted the bucket."""
        if not counted:
            self._advance(bucket)
        if bucket.is_last():
            with self._lock:
                held, self._held = self._held, []
            for item in held:
                _amp.ScaleDomain.rescale(item.buffer, item.scale)
                item.future.set_result(item.buffer)
        return self._completed(bucket.buffer())

    def _advance(self, bucket: dist.GradBucket) -> Tuple[int, bool]:
        """Counts the bucket: its iteration, and whether it is the iteration's last one."""
        last = bucket.is_last()
        with self._lock:
            iteration = self.iteration
            if last:
                self.iteration += 1
        return iteration, last

    def _submit_or_hold(self, item: _Item, last: bool) -> None:
        if not self.clip:
            self._submit([item])
            return
        # Clipping by the whole model's norm needs every gradient of the iteration: hold the buckets until
        # the last one, then give the engine this rank's norm and submit them all (overlap is traded away).
        with self._lock:
            self._held.append(item)
            held, self._held = (self._held, []) if last else ([], self._held)
        if held:
            norms = [torch.linalg.vector_norm(h.buffer, dtype=torch.float32) for h in held]
            self.engine.set_gradient_norm(float(torch.linalg.vector_norm(torch.stack(norms))))
            self._submit(held)

    def _settled(self, future: torch.futures.Future, buffer: torch.Tensor) -> torch.futures.Future:
        on_failure = self._on_failure
        assert on_failure is not None

        def settle(fut: torch.futures.Future) -> torch.Tensor:
            try:
                value: torch.Tensor = fut.value()
                return value
            except Exception as exc:  # noqa: BLE001 - handed to on_failure, the bucket comes back as it is
                on_failure(exc)
                return buffer
        return future.then(settle)

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

    def _submit(self, items: Sequence[_Item]) -> None:
        """Submits every view of `items` and queues their completion; on a failure, nothing stays in
        flight and every item's future fails too."""
        with _profile.range("gradex.submit"):
            self._submit_items(items)

    def _submit_items(self, items: Sequence[_Item]) -> None:
        queued = 0
        try:
            for item in items:
                tickets: List[int] = []
                submit = _ops.submit_absent if item.absent else _ops.submit
                try:
                    for key, view in zip(item.keys, item.gradients):
                        tickets.append(submit(self.engine.address, key, view, on_device=key in self.keys.on_device))
                except BaseException:
                    try:  # none may stay in flight on a buffer DDP is about to reuse
                        _ops.wait_all(tickets)
                    except _errors.GradexError:
                        pass  # the submission's own error is the one to report
                    raise
                self._completer.add(tickets, item.future, item.buffer, self._after(item))
                queued += 1
        except BaseException as exc:
            for item in items[queued:]:
                item.future.set_exception(exc)
            raise

    def _after(self, item: _Item) -> Callable[[], None]:
        buffer, scale, factor, end_step = item.buffer, item.scale, item.factor, item.end_step

        def after() -> None:
            _amp.ScaleDomain.rescale(buffer, scale)
            if factor != 1.0:
                buffer.mul_(factor)
            if end_step:
                self.engine.end_step()
        return after

    @staticmethod
    def _completed(buffer: torch.Tensor) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
        future.set_result(buffer)
        return future

    @staticmethod
    def _allreduce(tensor: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.futures.Future:
        # As DDP's default hook: divide first, then sum, so the result is the average.
        tensor.div_(dist.get_world_size(group))
        work = dist.all_reduce(tensor, group=group, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    def state(self) -> Dict[str, Tuple[int, str]]:
        """What a state dict needs besides the engine's blob: the registered keys and shapes."""
        return {key: (numel, str(dtype)) for key, (numel, dtype) in self.keys.registered.items()}

    def close(self) -> None:
        self._completer.close()
