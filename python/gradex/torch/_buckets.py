"""Exchanging DDP's gradient buckets through an engine: the part of the comm hook that State and LocalSGD
share.

DDP rebuilds its buckets after the first iteration, so the first `dense_iterations` iterations are averaged
with a plain allreduce on the default process group, and engine state (registered per bucket, keyed
"bucket.<index>") starts after them. Every bucket is submitted as soon as DDP hands it over and its future
is completed by a Completer thread: communication overlaps the rest of backward, and only DDP's own wait at
the end of backward blocks.
"""
import threading

import torch
import torch.distributed as dist

from .. import _capi, _errors
from . import _bootstrap, _completion, _ops


class BucketExchanger:
    def __init__(self, engine, dense_iterations, end_steps):
        """`end_steps`: call the engine's end_step once an iteration's last bucket is done (State); LocalSGD
        ends steps itself, after the optimizer step."""
        if dense_iterations < 1:
            raise _errors.InvalidArgumentError(
                "gradex: dense_iterations must be >= 1: DDP rebuilds its buckets after the first iteration")
        self.engine = engine
        self.dense_iterations = dense_iterations
        self.iteration = 0  # backward passes seen (an iteration ends with its last bucket)
        self.buckets = {}  # index -> (numel, torch dtype), as registered with the engine
        self._end_steps = end_steps
        self._lock = threading.Lock()
        self._completer = _completion.Completer("gradex-buckets")

    def exchange(self, bucket):
        tensor = bucket.buffer()
        last = bucket.is_last()
        with self._lock:
            iteration = self.iteration
            if last:
                self.iteration += 1
        if iteration < self.dense_iterations:
            return self._allreduce(tensor)
        key = self.register(bucket.index(), tensor.numel(), tensor.dtype)
        ticket = _ops.submit(self.engine.address, key, tensor)
        future = torch.futures.Future(devices=[tensor.device] if tensor.is_cuda else None)
        after = self.engine.end_step if (last and self._end_steps) else None
        self._completer.add(ticket, future, tensor, after)
        return future

    def register(self, index, numel, dtype):
        """Registers bucket `index` with the engine (once); a changed layout is an error, not a silent reset."""
        key = f"bucket.{index}"
        known = self.buckets.get(index)
        if known is None:
            self.engine.register(key, numel, _bootstrap.dtype_code(dtype), _capi.DEVICE_CPU)
            self.buckets[index] = (numel, dtype)
        elif known != (numel, dtype):
            raise _errors.MismatchError(
                f"gradex: DDP bucket {index} changed from {known[0]} {known[1]} elements to {numel} {dtype} "
                f"after gradex registered it (bucket layouts must stay fixed after the first iteration)")
        return key

    @staticmethod
    def _allreduce(tensor):
        # As DDP's default hook: divide first, then sum, so the result is the average.
        tensor.div_(dist.get_world_size())
        work = dist.all_reduce(tensor, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    def close(self):
        self._completer.close()
