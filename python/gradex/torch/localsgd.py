"""LocalSGD (post-local SGD): ranks train locally and average their parameters every `period` steps,
after `warmup_steps` fully synchronous steps.

    lsgd = gx.LocalSGD(model, period=4, warmup_steps=100)
    ...  loss.backward(); optimizer.step(); lsgd.step()

The schedule is the engine's (GRADEX_LOCALSGD_PERIOD / GRADEX_LOCALSGD_WARMUP_STEPS, set from the
arguments). With a DistributedDataParallel model, LocalSGD installs its own comm hook: during warm-up the
buckets are averaged through gradex (per parameter, keyed by name), afterwards the hook hands DDP its
gradients back at once (no submission, no staging of CUDA buckets). With a plain module, the warm-up steps
average the parameters after every step instead (the same as synchronous SGD for plain SGD, close to it with
momentum). Averaging rounds average the parameters and the floating-point buffers (BatchNorm running
statistics); integer buffers (num_batches_tracked) count steps and are equal on every rank already.

The momentum rule for LocalSGD: the optimizer owns momentum, in both phases. In the local phase gradex
does not see the gradients, so momentum applied by gradex (GRADEX_MOMENTUM) would stop after the warm-up;
LocalSGD therefore sets GRADEX_MOMENTUM=0 unless the caller set it (config= or the environment), and warns
when it is set above 0.
"""
import os
import warnings

import torch

from .. import _capi, _errors
from . import _bootstrap, _buckets, _ops

_AVERAGED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_STATE_FORMAT = "gradex.torch.LocalSGD/1"


class LocalSGD:
    def __init__(self, module, period, warmup_steps=0, config=None, store=None):
        if int(period) < 1:
            raise _errors.ConfigError(f"gradex: LocalSGD period must be >= 1, got {period}")
        merged = {"GRADEX_LOCALSGD_PERIOD": int(period), "GRADEX_LOCALSGD_WARMUP_STEPS": int(warmup_steps)}
        merged.update(config or {})
        merged = optimizer_owns_momentum(merged)
        self._engine = _bootstrap.create_engine(merged, store)
        self._ddp = isinstance(module, torch.nn.parallel.DistributedDataParallel)
        inner = module.module if self._ddp else module
        # Averaged every period: parameters, then floating-point buffers, each under its own key.
        self._tensors = [(f"param.{name}", p) for name, p in inner.named_parameters()]
        self._tensors += [(f"buffer.{name}", b) for name, b in inner.named_buffers() if b.dtype in _AVERAGED_DTYPES]
        for key, t in self._tensors:
            self._engine.register(key, t.numel(), _bootstrap.dtype_code(t.dtype), _capi.DEVICE_CPU)
        self._exchanger = None
        if self._ddp:
            self._exchanger = _buckets.BucketExchanger(self._engine, inner, end_steps=False)
            module.register_comm_hook(self, LocalSGD._hook)
        self.steps = 0  # steps ended by step()
        self.averaging_rounds = 0  # of which parameters were averaged

    @staticmethod
    def _hook(self, bucket):
        return self._exchanger.exchange(bucket)

    def step(self):
        """Ends a training step; call after optimizer.step(). Returns True when parameters were averaged."""
        exchanged = self._engine.exchanges_gradients()
        average_now = self._engine.end_step()
        self.steps += 1
        # A plain module has no gradient exchange: its synchronous warm-up averages parameters instead.
        if average_now or (exchanged and not self._ddp):
            self.average_parameters()
            self.averaging_rounds += 1
            return True
        return False

    @torch.no_grad()
    def average_parameters(self):
        """Averages parameters and floating-point buffers across ranks (collective)."""
        _ops.wait_all([_ops.average(self._engine.address, key, t.detach()) for key, t in self._tensors])

    @property
    def engine(self):
        return self._engine

    def stats(self, last_step=False):
        return self._engine.stats(last_step)

    def state_dict(self):
        return {"format": _STATE_FORMAT, "steps": self.steps, "engine": self._engine.save_state()}

    def load_state_dict(self, state):
        if state.get("format") != _STATE_FORMAT:
            raise _errors.StateError(f"gradex: not a {_STATE_FORMAT} state dict (format {state.get('format')!r})")
        self._engine.load_state(state["engine"])
        self.steps = int(state["steps"])

    def close(self):
        if self._exchanger is not None:
            self._exchanger.close()
        self._engine.close()


def optimizer_owns_momentum(config):
    """LocalSGD's momentum rule (module docstring): GRADEX_MOMENTUM defaults to 0; a value > 0 set by the
    caller is kept, with a warning. Returns the config to create the engine with."""
    value = config.get("GRADEX_MOMENTUM", os.environ.get("GRADEX_MOMENTUM"))
    if value is None:
        return dict(config, GRADEX_MOMENTUM="0")
    try:
        momentum = float(value)
    except ValueError:
        return config  # the engine reports the bad value, naming the variable
    if momentum > 0:
        warnings.warn(
            f"gradex: GRADEX_MOMENTUM={value} with LocalSGD: gradex applies momentum only while it exchanges "
            f"gradients (the synchronous warm-up), not in the local phase. Leave GRADEX_MOMENTUM unset (LocalSGD "
            f"then uses 0) and give the optimizer its momentum.", UserWarning, stacklevel=3)
    return config
