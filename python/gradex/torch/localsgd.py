"""LocalSGD (post-local SGD): ranks train locally and average their parameters every `period` steps,
after `warmup_steps` fully synchronous steps.

    lsgd = gx.LocalSGD(model, period=4, warmup_steps=100)
    ...  loss.backward(); optimizer.step(); lsgd.step()

The schedule is the engine's (GRADEX_LOCALSGD_PERIOD / GRADEX_LOCALSGD_WARMUP_STEPS, set from the
arguments). With a DistributedDataParallel model, LocalSGD installs its own comm hook: during warm-up the
buckets are averaged through gradex, afterwards DDP's gradients stay local. With a plain module, the
warm-up steps average the parameters after every step instead (the same as synchronous SGD for plain SGD,
close to it with momentum). Only parameters are averaged, not buffers (e.g. BatchNorm statistics).
"""
import torch

from .. import _capi, _errors
from . import _bootstrap, _buckets, _ops

_STATE_FORMAT = "gradex.torch.LocalSGD/1"


class LocalSGD:
    def __init__(self, module, period, warmup_steps=0, config=None, store=None):
        if int(period) < 1:
            raise _errors.ConfigError(f"gradex: LocalSGD period must be >= 1, got {period}")
        merged = {"GRADEX_LOCALSGD_PERIOD": int(period), "GRADEX_LOCALSGD_WARMUP_STEPS": int(warmup_steps)}
        merged.update(config or {})
        self._engine = _bootstrap.create_engine(merged, store)
        self._ddp = isinstance(module, torch.nn.parallel.DistributedDataParallel)
        inner = module.module if self._ddp else module
        self._params = [(name, p) for name, p in inner.named_parameters()]
        for name, p in self._params:
            self._engine.register(f"param.{name}", p.numel(), _bootstrap.dtype_code(p.dtype), _capi.DEVICE_CPU)
        self._exchanger = None
        if self._ddp:
            self._exchanger = _buckets.BucketExchanger(self._engine, dense_iterations=1, end_steps=False)
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
        _ops.wait_all([_ops.average(self._engine.address, f"param.{name}", p.detach()) for name, p in self._params])

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
