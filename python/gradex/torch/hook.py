"""The DDP communication hook: `ddp.register_comm_hook(gx.State(ddp), gx.hook)`.

Each bucket is exchanged per parameter (see _buckets.py): every parameter's gradient goes DGC, fp16 or dense
according to the engine's GRADEX_* policy, keyed by its name in the model. The future returned to DDP holds
the bucket averaged over ranks.

A State is lazy, as PyTorch's own hook states are: creating one checks the GRADEX_* configuration locally
and nothing else (no process group, rank variables or network needed), so frameworks can build it before
they launch the ranks, and can pickle it until it is used. The engine bootstraps collectively at the first
bucket, over the ranks of the DDP module's process group, through torch.distributed's store.
"""
import threading
import weakref
from typing import Any, Dict, Literal, Optional, Tuple, TypeGuard, Union

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

from .. import _capi, _errors
from . import _amp, _bootstrap, _buckets, _config_check, _discover, _horizon, _momentum
from ._buffer_broadcast import BufferBroadcastCheck

_STATE_FORMAT = "gradex.torch.State/2"


class State:
    """Per-process state of the gradex comm hook: one engine, per-parameter compressor state.

    model: the DDP module (or the module it wraps) whose parameter names key the gradients and whose process
    group the engine spans. Without it the State finds, at its first bucket, the live DDP module that owns
    the bucket's parameters (_discover.py) and uses its names and group; a plain module gives names only.
    config: GRADEX_* overrides (name -> value) that win over the environment; checked here (a bad value
    raises gradex.ConfigError at construction). dense_iterations: leading iterations averaged with a plain
    allreduce (default 0 with parameter names, 1 with positional keys "bucket3.param7", because DDP rebuilds
    its buckets after the first iteration). scaler: the torch.amp.GradScaler that scales the loss, if any, so
    that residuals and momenta stay unscaled (_amp.py). process_group: the group the engine spans (default:
    the DDP module's, else the default group). store: a torch.distributed.Store to bootstrap through
    (default: the default group's). optimizer: the optimizer that trains the model, so that momentum follows
    it (_momentum.py): gradex takes an SGD optimizer's momentum over and adds none to Adam-family ones;
    without it gradex adds no momentum unless GRADEX_MOMENTUM is set. horizon_steps: how many optimizer steps
    the training will run (GRADEX_POLICY_HORIZON_STEPS for GRADEX_POLICY=auto: the last steps are compressed
    less so that error feedback's residuals drain), or an LR scheduler that knows its total (OneCycleLR); None:
    unknown, no horizon rule.

    The engine is created collectively over the group's ranks: given the DDP module and the optimizer, at
    construction, on a thread of its own (the first bucket waits for what is left of its start; an error of the
    start is raised there); otherwise lazily, at the first bucket. A State owns its engine: close() (or the end
    of a `with` block, or garbage collection) releases it.
    """

    _starting: Optional[_bootstrap.EngineStart]  # an engine starting in the background (None: none)

    def __init__(self, model: Optional[torch.nn.Module] = None, *, config: _capi.Config = None,
                 dense_iterations: Optional[int] = None, store: Optional[_capi.KeyValueStore] = None,
                 scaler: Optional[_amp.GradScalerLike] = None,
                 process_group: Optional[dist.ProcessGroup] = None, optimizer: Optional[torch.optim.Optimizer] = None,
                 horizon_steps: Optional[int] = None) -> None:
        config = {str(k): str(v) for k, v in (config or {}).items()}
        config = _horizon.with_horizon(config, horizon_steps, "gx.State")
        _config_check.check(config)
        self._base_config = config  # before the momentum rule: set_optimizer() applies it again
        self._optimizer: Optional[torch.optim.Optimizer] = _momentum.unwrap(optimizer) if optimizer is not None else None
        self._config, self._takeover = _momentum.decide(optimizer, config, "the gradex DDP hook")
        self._model = model
        self._dense_iterations = dense_iterations
        self._store = store
        self._scaler = scaler
        self._group = process_group
        self._init_runtime()
        # Given its DDP module and optimizer, the State's settings are final: its engine starts now, in the
        # background (a long path's connection and link probe overlap the training's set-up and first forward
        # pass instead of filling its first step).
        if _is_ddp(model) and self._optimizer is not None:
            self._starting = _bootstrap.EngineStart(self._config, store, process_group or model.process_group)

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._engine: Union[_capi.Engine, None, Literal[False]] = None  # None: not bootstrapped; False: closed
        self._exchanger: Optional[_buckets.BucketExchanger] = None
        self._buffer_check: Optional[BufferBroadcastCheck] = None
        self._step_hook: Optional[RemovableHandle] = None
        self._finalizer: Optional[weakref.finalize] = None
        # a state dict loaded before bootstrap
        self._pending_load: Optional[Dict[str, Any]] = getattr(self, "_pending_load", None)
        # (rank, world_size, store, store_prefix) given to reconfigure() before bootstrap: the engine's
        # first membership.
        self._membership: Optional[Tuple[int, int, _capi.AnyStore, Optional[str]]] = getattr(self, "_membership", None)
        self._closed_iteration = 0
        self._starting = None

    def _bootstrap(self, bucket: Optional[dist.GradBucket] = None) -> _buckets.BucketExchanger:
        """The exchanger, creating the engine first if this is the State's first use (collective over the
        group's ranks). `bucket`: the first bucket, to find the DDP module when none was given."""
        with self._lock:
            if self._exchanger is not None:
                return self._exchanger
            if self._engine is False:
                raise _errors.InvalidArgumentError("gradex: this State was closed")
            model, group = self._model, self._group
            ddp: Optional[torch.nn.parallel.DistributedDataParallel]
            ddp = model if _is_ddp(model) else None
            if ddp is None and bucket is not None:
                ddp = _discover.owner_of(bucket.parameters())
            if group is None and ddp is not None:
                group = ddp.process_group
            if model is None:
                model = ddp
            if self._starting is not None:
                engine, self._starting = self._starting.engine(), None
            else:
                engine = _bootstrap.create_engine(self._config, self._store, group, membership=self._membership)
            try:
                exchanger = _buckets.BucketExchanger(engine, model, self._dense_iterations, end_steps=True,
                                                     scaler=self._scaler, group=group)
                if self._pending_load is not None:
                    _load(exchanger, engine, self._pending_load)
            except BaseException:
                engine.close()
                raise
            self._pending_load = None
            self._finalizer = weakref.finalize(self, _errors.close_quietly, engine)
            self._warner = _momentum.MomentumWarner("the gradex DDP hook",
                                                    _momentum.gradex_momentum(engine, self._config))
            # Sees every optimizer.step() in the process, to apply the momentum rule to whatever optimizer
            # trains the DDP model; removed after its first call.
            self._step_hook = register_optimizer_step_pre_hook(self._on_optimizer_step)
            self._buffer_check = BufferBroadcastCheck.of(ddp)
            self._engine, self._exchanger = engine, exchanger
            return exchanger

    def _on_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Tuple[object, ...],
                           kwargs: Dict[str, object]) -> None:
        self._warner.check(optimizer)
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None

    def set_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Gives the State the optimizer that trains its model, for frameworks that build the State before the
        optimizer exists (Lightning's DDPStrategy, a Hugging Face Trainer callback): afterwards the State is
        exactly what gx.State(..., optimizer=optimizer) would have been (the momentum rule, _momentum.py).
        Framework wrappers (Accelerate's AcceleratedOptimizer, Lightning's LightningOptimizer) are looked
        through. Must come before the first bucket, since the engine is created with the rule's settings
        (StateError after); giving the optimizer the State already has again does nothing, another one is an
        InvalidArgumentError."""
        inner = _momentum.unwrap(optimizer)
        with self._lock:
            if self._optimizer is not None:
                if self._optimizer is inner:
                    return
                raise _errors.InvalidArgumentError(
                    f"gradex: this State already follows a {type(self._optimizer).__name__} optimizer; one State "
                    f"serves one optimizer (got a {type(inner).__name__})")
            if self._engine is not None:
                raise _errors.StateError(
                    "gradex: set_optimizer() must come before the State's first bucket (the engine is created "
                    "with the momentum rule's settings); call it before the first backward pass")
            self._config, self._takeover = _momentum.decide(optimizer, self._base_config, "the gradex DDP hook")
            self._optimizer = inner

    @property
    def optimizer(self) -> Optional[torch.optim.Optimizer]:
        """The optimizer the momentum rule follows (given to the constructor or set_optimizer), unwrapped."""
        return self._optimizer

    def reconfigure(self, rank: int, world_size: int, store: _capi.AnyStore = None, store_prefix: Optional[str] = None) -> None:
        """A new membership for this State's engine (torchft's quorum changes; Engine.reconfigure): collective
        over the new members. Creates nothing: the engine keeps its per-tensor state (residuals, momenta,
        counters). Before the engine exists (no bucket yet), the membership is kept and the engine is created
        with it at the first bucket (rank, world_size, store and store_prefix as given, not the process
        group's)."""
        with self._lock:
            if self._engine is False:
                raise _errors.InvalidArgumentError("gradex: this State was closed")
            if self._exchanger is not None:
                engine = self._exchanger.engine
            elif self._starting is not None:
                engine = self._starting.engine()
            else:
                self._membership = (int(rank), int(world_size), store, store_prefix)
                return
        engine.reconfigure(rank, world_size, store, store_prefix)

    @property
    def bootstrapped(self) -> bool:
        """Whether the engine exists (after the first bucket, or an access that needed it)."""
        return self._exchanger is not None

    @property
    def engine(self) -> _capi.Engine:
        """The engine; creates it (collectively) if no bucket has done so yet."""
        return self._bootstrap().engine

    @property
    def iteration(self) -> int:
        """Backward passes seen by the hook."""
        if self._exchanger is None:
            return int(self._pending_load["iteration"]) if self._pending_load else self._closed_iteration
        return self._exchanger.iteration

    def stats(self, last_step: bool = False) -> _capi.Stats:
        return self.engine.stats(last_step)

    def state_dict(self) -> Dict[str, Any]:
        """The compressor state (residuals, momenta, step counters) and the tensors it belongs to, keyed by
        parameter name when the State knows the model (then it survives a change of bucket_cap_mb).
        Before the first bucket: the state given to load_state_dict, else the engine is created (collective)."""
        if self._exchanger is None and self._pending_load is not None:
            return dict(self._pending_load)
        exchanger = self._bootstrap()
        return {"format": _STATE_FORMAT, "iteration": exchanger.iteration,
                "keys": "names" if exchanger.keys.named else "positions",
                "tensors": exchanger.state(), "engine": exchanger.engine.save_state()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores state_dict()'s output, taken with the same model, world size and GRADEX_* policy. Before
        the first bucket the state is kept and applied when the engine is created (not collective)."""
        if state.get("format") != _STATE_FORMAT:
            raise _errors.StateError(f"gradex: not a {_STATE_FORMAT} state dict (format {state.get('format')!r}; "
                                     f"states of gradex.torch.State/1 were keyed by DDP bucket and cannot be "
                                     f"mapped to parameters)")
        with self._lock:
            exchanger = self._exchanger
            if exchanger is None:
                self._pending_load = dict(state)
                return
        _load(exchanger, exchanger.engine, state)

    def close(self) -> None:
        """Finishes outstanding exchanges, then releases the engine and gives an SGD optimizer whose momentum
        gradex took over its momentum back. Idempotent; also done at the end of a `with` block, by the garbage
        collector and at interpreter exit."""
        with self._lock:
            takeover = getattr(self, "_takeover", None)
            if takeover is not None:
                takeover.release()
                self._takeover = None
            finalizer = getattr(self, "_finalizer", None)
            if finalizer is not None:
                finalizer.detach()
            if self._step_hook is not None:
                self._step_hook.remove()
                self._step_hook = None
            if self._exchanger is not None:
                self._exchanger.close()
                self._closed_iteration = self._exchanger.iteration
            if self._engine:
                self._engine.close()
            if self._starting is not None:  # started, never used
                try:
                    self._starting.engine().close()
                except Exception:
                    pass  # the start failed (raised at the first use, which never came): nothing to release
                self._starting = None
            self._exchanger = None
            self._engine = False

    def __enter__(self) -> "State":
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False

    def __getstate__(self) -> Dict[str, object]:
        """Only a State that has not bootstrapped can be pickled: its configuration, scaler, process group
        and loaded state (which must be picklable themselves). The model is left out: an unpickled copy of it
        would not be the module that DDP trains, so the unpickled State finds its DDP module at the first
        bucket (_discover.py), as gx.State() does."""
        if self._engine is not None or self._starting is not None:
            raise TypeError("gradex.torch.State holds an engine once it has exchanged a bucket (or from its "
                            "construction, given its DDP module and optimizer); checkpoint state_dict() instead of "
                            "pickling it")
        # The momentum takeover stays with the optimizer of this process (a copy has none).
        return {"_config": self._config, "_base_config": self._base_config, "_optimizer": None, "_model": None,
                "_dense_iterations": self._dense_iterations,
                "_store": self._store, "_scaler": self._scaler, "_group": self._group,
                "_pending_load": self._pending_load, "_takeover": None,
                "_membership": getattr(self, "_membership", None)}

    def __setstate__(self, values: Dict[str, object]) -> None:
        self.__dict__.update(values)
        self._init_runtime()


def _is_ddp(module: object) -> TypeGuard[torch.nn.parallel.DistributedDataParallel]:
    return isinstance(module, torch.nn.parallel.DistributedDataParallel)


def _load(exchanger: _buckets.BucketExchanger, engine: _capi.Engine, state: Dict[str, Any]) -> None:
    kind = "names" if exchanger.keys.named else "positions"
    if state.get("keys") != kind:
        raise _errors.StateError(
            f"gradex: the saved state is keyed by parameter {state.get('keys')}, this State by {kind}: create "
            f"the State {'with' if state.get('keys') == 'names' else 'without'} the model")
    exchanger.keys.register_saved(engine, state["tensors"])
    engine.load_state(state["engine"])
    exchanger.iteration = max(exchanger.iteration, int(state["iteration"]))


# The annotations are evaluated (no `from __future__ import annotations` here): DDP's register_comm_hook
# compares them with dist.GradBucket and torch.futures.Future[torch.Tensor].
def hook(state: State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: submits the bucket to gradex and returns a future of its average over ranks."""
    exchanger = state._exchanger
    if exchanger is None:
        exchanger = state._bootstrap(bucket)
    future = exchanger.exchange(bucket)
    check = state._buffer_check
    if check is not None and check.watching and bucket.is_last():
        check.after_step(exchanger.engine.delay())
    return future
