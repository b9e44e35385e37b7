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

The momentum rule for LocalSGD: whoever owns momentum owns it in both phases. By default the optimizer
does: LocalSGD sets GRADEX_MOMENTUM=0 unless the caller set it (config= or the environment), and in the local
phase the hook hands DDP its buckets back at once. A caller who sets GRADEX_MOMENTUM > 0 (optimizer at
momentum 0) gets gradex's momentum in both phases: in the local phase the hook then submits the gradients,
and the engine applies this rank's momentum in place without any traffic (sync/engine/localsgd.h).
"""
import os
import threading
import weakref
from typing import Any, Dict, Literal, Mapping, Optional, Union, cast

import torch
import torch.distributed as dist

from .. import _capi, _errors
from . import _bootstrap, _buckets, _config_check, _ops

_AVERAGED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_STATE_FORMAT = "gradex.torch.LocalSGD/1"


class LocalSGD:
    """Lazy like gx.State: construction checks the configuration and installs the DDP hook; the engine
    bootstraps collectively (over the DDP module's process group) at the first bucket or the first step(),
    whichever comes first. Picklable until then."""

    def __init__(self, module: torch.nn.Module, period: int, warmup_steps: int = 0, config: _capi.Config = None,
                 store: Optional[_capi.KeyValueStore] = None) -> None:
        if int(period) < 1:
            raise _errors.ConfigError(f"gradex: LocalSGD period must be >= 1, got {period}")
        merged: Dict[str, _capi.ConfigValue] = {"GRADEX_LOCALSGD_PERIOD": int(period), "GRADEX_LOCALSGD_WARMUP_STEPS": int(warmup_steps)}
        merged.update(config or {})
        self._config = {str(k): str(v) for k, v in optimizer_owns_momentum(merged).items()}
        _config_check.check(self._config)
        self._module: Any = cast(Any, module)  # DDP or not: its attributes are looked up dynamically
        self._store = store
        self.steps = 0  # steps ended by step()
        self.averaging_rounds = 0  # of which parameters were averaged
        self._init_runtime()
        if self._ddp:
            self._module.register_comm_hook(self, LocalSGD._hook)

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._engine: Union[_capi.Engine, None, Literal[False]] = None  # None: not bootstrapped; False: closed
        self._exchanger: Optional[_buckets.BucketExchanger] = None
        self._ddp = isinstance(self._module, torch.nn.parallel.DistributedDataParallel)
        inner = self._module.module if self._ddp else self._module
        # Averaged every period: parameters, then floating-point buffers, each under its own key.
        self._tensors = [(f"param.{name}", p) for name, p in inner.named_parameters()]
        self._tensors += [(f"buffer.{name}", b) for name, b in inner.named_buffers() if b.dtype in _AVERAGED_DTYPES]

    def _bootstrap(self) -> _capi.Engine:
        with self._lock:
            if self._engine is False:
                raise _errors.InvalidArgumentError("gradex: this LocalSGD was closed")
            if self._engine is None:
                group = self._module.process_group if self._ddp else None
                engine = _bootstrap.create_engine(self._config, self._store, group)
                try:
                    for key, t in self._tensors:
                        engine.register(key, t.numel(), _bootstrap.dtype_code(t.dtype), _capi.DEVICE_CPU)
                    if self._ddp:
                        self._exchanger = _buckets.BucketExchanger(engine, self._module.module, end_steps=False,
                                                                   group=group)
                except BaseException:
                    engine.close()
                    raise
                self._engine = engine
                self._finalizer = weakref.finalize(self, _errors.close_quietly, engine)
            return self._engine

    @staticmethod
    # Evaluated annotations (no `from __future__ import annotations` in this module): DDP's register_comm_hook
    # compares them with dist.GradBucket and torch.futures.Future[torch.Tensor].
    def _hook(self: "LocalSGD", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        if self._exchanger is None:
            self._bootstrap()
        assert self._exchanger is not None  # _bootstrap() made it (DDP)
        return self._exchanger.exchange(bucket)

    def step(self) -> bool:
        """Ends a training step; call after optimizer.step(). Returns True when parameters were averaged."""
        engine = self._bootstrap()
        exchanged = engine.exchanges_gradients()
        average_now = engine.end_step()
        self.steps += 1
        # A plain module has no gradient exchange: its synchronous warm-up averages parameters instead.
        if average_now or (exchanged and not self._ddp):
            self.average_parameters()
            self.averaging_rounds += 1
            return True
        return False

    @torch.no_grad()
    def average_parameters(self) -> None:
        """Averages parameters and floating-point buffers across ranks (collective)."""
        engine = self._bootstrap()
        _ops.wait_all([_ops.average(engine.address, key, t.detach()) for key, t in self._tensors])

    @property
    def engine(self) -> _capi.Engine:
        """The engine; creates it (collectively) if nothing has yet."""
        return self._bootstrap()

    def stats(self, last_step: bool = False) -> _capi.Stats:
        return self.engine.stats(last_step)

    def state_dict(self) -> Dict[str, Any]:
        return {"format": _STATE_FORMAT, "steps": self.steps, "engine": self.engine.save_state()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state.get("format") != _STATE_FORMAT:
            raise _errors.StateError(f"gradex: not a {_STATE_FORMAT} state dict (format {state.get('format')!r})")
        self.engine.load_state(state["engine"])
        self.steps = int(state["steps"])

    def close(self) -> None:
        """Finishes outstanding exchanges, then releases the engine. Idempotent; also done at the end of a `with`
        block and by the garbage collector."""
        with self._lock:
            if getattr(self, "_finalizer", None) is not None:
                self._finalizer.detach()
            if self._exchanger is not None:
                self._exchanger.close()
            if self._engine:
                self._engine.close()
            self._engine = False

    def __enter__(self) -> "LocalSGD":
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False

    def __getstate__(self) -> Dict[str, object]:
        if self._engine is not None:
            raise TypeError("gradex.torch.LocalSGD holds an engine once it has been used; checkpoint "
                            "state_dict() instead of pickling it")
        return {"_config": self._config, "_module": self._module, "_store": self._store, "steps": self.steps,
                "averaging_rounds": self.averaging_rounds}

    def __setstate__(self, values: Dict[str, object]) -> None:
        self.__dict__.update(values)
        self._init_runtime()
        if self._ddp:  # the unpickled DDP module has a new reducer without the hook
            self._module.register_comm_hook(self, LocalSGD._hook)


def optimizer_owns_momentum(config: Mapping[str, _capi.ConfigValue]) -> Mapping[str, _capi.ConfigValue]:
    """LocalSGD's default momentum rule (module docstring): GRADEX_MOMENTUM defaults to 0, so the optimizer
    owns momentum; a value the caller set (config= or the environment) is kept. Returns the config to create
    the engine with."""
    if config.get("GRADEX_MOMENTUM", os.environ.get("GRADEX_MOMENTUM")) is None:
        return dict(config, GRADEX_MOMENTUM="0")
    return config
