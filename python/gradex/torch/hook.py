"""The DDP communication hook: `ddp.register_comm_hook(gx.State(), gx.hook)`.

Each bucket goes DGC, fp16 or dense according to the engine's GRADEX_* policy (a bucket is one tensor to
the engine, named "bucket.<index>"). The future returned to DDP holds the bucket averaged over ranks.
"""
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .. import _errors
from . import _bootstrap, _buckets, _momentum

_STATE_FORMAT = "gradex.torch.State/1"


class State:
    """Per-process state of the gradex comm hook: one engine, per-bucket compressor state.

    config: GRADEX_* overrides (name -> value) that win over the environment. dense_iterations: leading
    iterations averaged with a plain allreduce (>= 1, because DDP rebuilds its buckets after the first).
    Creating a State is collective (it bootstraps the engine), like creating the DDP module: a bad GRADEX_*
    value raises gradex.ConfigError here.
    """

    def __init__(self, config=None, dense_iterations=1, store=None):
        self._engine = _bootstrap.create_engine(config, store)
        self._exchanger = _buckets.BucketExchanger(self._engine, dense_iterations, end_steps=True)
        self._warner = _momentum.MomentumWarner("the gradex DDP hook",
                                                _momentum.gradex_momentum(self._engine, config))
        # Sees every optimizer.step() in the process, to apply the momentum rule to whatever optimizer
        # trains the DDP model; removed after its first call.
        self._step_hook = register_optimizer_step_pre_hook(self._on_optimizer_step)

    def _on_optimizer_step(self, optimizer, args, kwargs):
        self._warner.check(optimizer)
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None

    @property
    def engine(self):
        return self._engine

    @property
    def iteration(self):
        """Backward passes seen by the hook."""
        return self._exchanger.iteration

    def stats(self, last_step=False):
        return self._engine.stats(last_step)

    def state_dict(self):
        """The compressor state (residuals, momenta, step counters) and the bucket layout it belongs to."""
        return {"format": _STATE_FORMAT, "iteration": self._exchanger.iteration,
                "buckets": {index: (numel, str(dtype))
                            for index, (numel, dtype) in self._exchanger.buckets.items()},
                "engine": self._engine.save_state()}

    def load_state_dict(self, state):
        """Restores state_dict()'s output, taken with the same model, world size and GRADEX_* policy.
        Registers the saved buckets first (DDP rebuilds the same layout for the same model), so this works
        before the first iteration."""
        if state.get("format") != _STATE_FORMAT:
            raise _errors.StateError(f"gradex: not a {_STATE_FORMAT} state dict (format {state.get('format')!r})")
        for index, (numel, dtype_name) in sorted(state["buckets"].items()):
            dtype = getattr(torch, dtype_name.replace("torch.", ""))
            self._exchanger.register(int(index), int(numel), dtype)
        self._engine.load_state(state["engine"])
        self._exchanger.iteration = max(self._exchanger.iteration, int(state["iteration"]))

    def close(self):
        """Finishes outstanding exchanges and releases the engine (also done at interpreter exit)."""
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None
        self._exchanger.close()
        self._engine.close()

    def __getstate__(self):
        raise TypeError("gradex.torch.State holds an engine; checkpoint state_dict() instead of pickling it")


def hook(state, bucket):
    """DDP comm hook: submits the bucket to gradex and returns a future of its average over ranks."""
    return state._exchanger.exchange(bucket)
