"""The DDP communication hook: `ddp.register_comm_hook(gx.State(ddp), gx.hook)`.

Each bucket is exchanged per parameter (see _buckets.py): every parameter's gradient goes DGC, fp16 or dense
according to the engine's GRADEX_* policy, keyed by its name in the model. The future returned to DDP holds
the bucket averaged over ranks.
"""
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .. import _errors
from . import _bootstrap, _buckets, _momentum

_STATE_FORMAT = "gradex.torch.State/2"


class State:
    """Per-process state of the gradex comm hook: one engine, per-parameter compressor state.

    model: the DDP module (or the module it wraps) whose parameter names key the gradients; without it keys
    are bucket positions ("bucket3.param7"), which tie checkpoints to DDP's bucket layout.
    config: GRADEX_* overrides (name -> value) that win over the environment. dense_iterations: leading
    iterations averaged with a plain allreduce (default 0 with a model, 1 without: DDP rebuilds its buckets
    after the first iteration). scaler: the torch.amp.GradScaler that scales the loss, if any, so that
    residuals and momenta stay unscaled (see _amp.py). Creating a State is collective (it bootstraps the
    engine), like creating the DDP module: a bad GRADEX_* value raises gradex.ConfigError here.
    """

    def __init__(self, model=None, *, config=None, dense_iterations=None, store=None, scaler=None):
        self._engine = _bootstrap.create_engine(config, store)
        self._exchanger = _buckets.BucketExchanger(self._engine, model, dense_iterations, end_steps=True,
                                                   scaler=scaler)
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
        """The compressor state (residuals, momenta, step counters) and the tensors it belongs to, keyed by
        parameter name when the State knows the model (then it survives a change of bucket_cap_mb)."""
        return {"format": _STATE_FORMAT, "iteration": self._exchanger.iteration,
                "keys": "names" if self._exchanger.keys.named else "positions",
                "tensors": self._exchanger.state(), "engine": self._engine.save_state()}

    def load_state_dict(self, state):
        """Restores state_dict()'s output, taken with the same model, world size and GRADEX_* policy.
        Registers the saved tensors first, so this works before the first iteration."""
        if state.get("format") != _STATE_FORMAT:
            raise _errors.StateError(f"gradex: not a {_STATE_FORMAT} state dict (format {state.get('format')!r}; "
                                     f"states of gradex.torch.State/1 were keyed by DDP bucket and cannot be "
                                     f"mapped to parameters)")
        kind = "names" if self._exchanger.keys.named else "positions"
        if state.get("keys") != kind:
            raise _errors.StateError(
                f"gradex: the saved state is keyed by parameter {state.get('keys')}, this State by {kind}: "
                f"create the State {'with' if state.get('keys') == 'names' else 'without'} the model")
        self._exchanger.keys.register_saved(self._engine, state["tensors"])
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
