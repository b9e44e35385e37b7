"""Horovod-style DistributedOptimizer: gradients are exchanged through gradex without DDP.

    opt = gx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())

A gradient hook on every parameter submits its gradient as soon as autograd has accumulated it, so
communication overlaps the rest of backward; step() waits for all of them, then steps the wrapped optimizer,
then ends the engine's step (and averages parameters when LocalSGD says so, GRADEX_LOCALSGD_PERIOD > 0).
Parameter names are the engine's tensor keys and must be the same on every rank.

Only parameters with requires_grad are exchanged (frozen ones are neither registered nor touched). A
parameter without a gradient this step (unused in the forward pass) contributes zeros, and its `.grad` is
set only when the average over ranks is non-zero: a parameter no rank trained keeps `grad is None`, so
optimizers with weight decay or momentum leave it alone.

Momentum follows the optimizer (_momentum.py): gradex takes an SGD optimizer's momentum over, never adds any
to Adam-family optimizers. The object owns its engine: close() (or leaving a `with` block, or garbage
collection) finishes pending exchanges, then releases it.

With a torch.amp.GradScaler, pass it (scaler=) so that gradex's residuals and momenta stay unscaled
(_amp.py), and call opt.synchronize() before scaler.unscale_(opt) / scaler.step(opt): the scaler reads the
gradients, which must hold the averages by then. step() does not exchange again after a synchronize().
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable, Dict, Iterable, List, Literal, Optional, Set, Tuple

import torch
import torch.distributed as dist
from torch.utils.hooks import RemovableHandle

from .. import _capi, _errors
from . import _amp, _bootstrap, _horizon, _layout, _momentum, _ops, _profile

_live_optimizers: weakref.WeakSet[DistributedOptimizer] = weakref.WeakSet()  # open DistributedOptimizers (for gx.join)

_STATE_FORMAT = "gradex.torch.DistributedOptimizer/1"


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps `optimizer`; shares its param_groups and state (LR schedulers work on either).

    horizon_steps: how many optimizer steps the training will run (GRADEX_POLICY_HORIZON_STEPS for the default
    GRADEX_POLICY=auto), or an LR scheduler that knows its total (OneCycleLR: horizon_steps=scheduler); None:
    unknown, no horizon rule."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 named_parameters: Optional[Iterable[Tuple[str, torch.nn.Parameter]]] = None,
                 config: _capi.Config = None, store: Optional[_capi.KeyValueStore] = None,
                 scaler: Optional[_amp.GradScalerLike] = None,
                 process_group: Optional[dist.ProcessGroup] = None, uneven_inputs: bool = False,
                 horizon_steps: Optional[int] = None) -> None:
        if isinstance(optimizer, DistributedOptimizer):
            raise _errors.InvalidArgumentError("gradex: the optimizer is already a gx.DistributedOptimizer")
        self._gradex_ready = False
        self._takeover: Optional[_momentum.SgdMomentumTakeover] = None
        self._engine: Any = None  # the Engine from the first step on (every user checks _bootstrap first)
        self._hooks: List[RemovableHandle] = []
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state
        self._gradex_wrapped = optimizer
        # uneven_inputs: every step also tells the ranks how many still train (gx.join); one more tiny
        # exchange per step, on the collectives' engine.
        self._uneven = bool(uneven_inputs)
        # [(name, parameter)] of the parameters that train; frozen ones are never registered or exchanged.
        self._params = [(name, p) for name, p in self._name_parameters(optimizer, named_parameters)
                        if p.requires_grad]
        self._scale = _amp.ScaleDomain(scaler)
        config = {str(k): str(v) for k, v in (config or {}).items()}
        # GRADEX_POLICY=auto's training horizon: a number of steps, or an LR scheduler with total_steps.
        config = _horizon.with_horizon(config, horizon_steps, "gx.DistributedOptimizer")
        _capi.check_config(config)
        self._localsgd = _localsgd_period(config) > 0
        if self._localsgd:
            # LocalSGD: the optimizer keeps its own momentum unless GRADEX_MOMENTUM is set explicitly.
            from .localsgd import optimizer_owns_momentum
            config = optimizer_owns_momentum(config)
        else:
            config, self._takeover = _momentum.decide(optimizer, config, "gx.DistributedOptimizer")
        self._config, self._store, self._group = config, store, process_group
        self._lock = threading.RLock()
        # name -> (ticket, buffer submitted, gradient to copy the result into, scale)
        self._pending: Dict[str, Tuple[int, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]] = {}
        self._synchronized = False  # synchronize() ran and no gradient was submitted since
        self._deferred: Set[str] = set()  # gradients produced but not submitted yet (clipping waits for all)
        self._on_device: Set[str] = set()
        self._clip = False
        self._closed = False
        self._pending_load: Optional[bytes] = None  # gradex state loaded before the engine exists
        # what the finalizer closes (it must not hold this object)
        self._box: Dict[str, Optional[_capi.Engine]] = {"engine": None}
        self._finalizer = weakref.finalize(self, _close_engine, self._box, self._takeover)
        self._hooks = [p.register_post_accumulate_grad_hook(self._make_hook(name)) for name, p in self._params]
        _live_optimizers.add(self)
        self._gradex_ready = True
        if store is not None or process_group is not None or (dist.is_available() and dist.is_initialized()):
            try:
                self._bootstrap()
            except BaseException:
                self._closed = True
                self._detach()
                raise

    def _bootstrap(self) -> _capi.Engine:
        """The engine, created at the first use when this optimizer was constructed before torch.distributed
        was initialized (collective: every rank's first gradient, step() or state call creates it; without a
        process group it bootstraps from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT)."""
        with self._lock:
            if self._engine is not None:
                return self._engine
            if self._closed:
                raise _errors.InvalidArgumentError("gradex: this gx.DistributedOptimizer was closed")
            engine = _bootstrap.create_engine(self._config, self._store, self._group)
            try:
                # float32 CUDA parameters: their gradients are exchanged on the GPU (_ops.memory_of); parameter
                # averages (LocalSGD) are staged through host memory either way.
                for name, p in self._params:
                    memory = _ops.memory_of(p)
                    engine.register(name, p.numel(), _bootstrap.dtype_code(p.dtype), memory, _layout.output_rows(p))
                    if memory == _capi.DEVICE_CUDA:
                        self._on_device.add(name)
                self._clip = _momentum.gradex_clip_norm(engine, self._config) > 0
                _momentum.MomentumWarner("gx.DistributedOptimizer",
                                         _momentum.gradex_momentum(engine, self._config)).check(self._gradex_wrapped)
                if self._pending_load is not None:
                    engine.load_state(self._pending_load)
                    self._pending_load = None
            except BaseException:
                engine.close()
                raise
            self._engine = self._box["engine"] = engine
            return engine

    @staticmethod
    def _name_parameters(optimizer: torch.optim.Optimizer,
                         named_parameters: Optional[Iterable[Tuple[str, torch.nn.Parameter]]]
                         ) -> List[Tuple[str, torch.Tensor]]:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if named_parameters is None:
            return [(f"param.{i}", p) for i, p in enumerate(params)]
        named = list(named_parameters)
        names = [name for name, _ in named]
        if len(set(names)) != len(names):
            raise _errors.InvalidArgumentError("gradex: named_parameters has duplicate names")
        by_id = {id(p): name for name, p in named}
        missing = [i for i, p in enumerate(params) if id(p) not in by_id]
        if missing:
            raise _errors.InvalidArgumentError(
                f"gradex: {len(missing)} of the optimizer's parameters are not in named_parameters")
        return [(by_id[id(p)], p) for p in params]

    def _make_hook(self, name: str) -> Callable[[torch.Tensor], None]:
        owner = weakref.ref(self)  # the parameter's hook must not keep the optimizer (and its engine) alive

        def on_gradient(p: torch.Tensor) -> None:
            opt = owner()
            if opt is not None:
                opt._submit(name, p)
        return on_gradient

    def _submit(self, name: str, p: torch.Tensor, now: bool = False) -> None:
        """Hands a gradient to the engine; with clipping (GRADEX_CLIP_NORM > 0) only notes it, unless `now`:
        synchronize() submits every gradient once the whole model's norm is known. A parameter without a
        gradient submits a zero buffer of its own (its .grad is set later only if the average is non-zero)."""
        engine = self._bootstrap()  # lazy: a rank's first gradient creates the engine (collective)
        grad = p.grad
        if grad is not None and grad.is_sparse:
            raise _errors.InvalidArgumentError(f"gradex: parameter '{name}' has a sparse gradient")
        with self._lock:
            self._synchronized = False
            if name in self._pending or (name in self._deferred and not now):
                raise _errors.InvalidArgumentError(
                    f"gradex: the gradient of '{name}' was produced twice before step(); call step() after "
                    f"each backward (gradient accumulation is not supported by gx.DistributedOptimizer)")
            if self._clip and not now:
                self._deferred.add(name)
                return
            self._deferred.discard(name)
            if grad is None:
                buffer = torch.zeros_like(p, memory_format=torch.contiguous_format)
            else:
                buffer = grad if grad.is_contiguous() else grad.contiguous()
            scale = self._scale.current()
            _amp.ScaleDomain.unscale(buffer, scale)
            with _profile.range("gradex.submit"):
                ticket = _ops.submit(engine.address, name, buffer.detach(), on_device=name in self._on_device)
            self._pending[name] = (ticket, buffer, grad, scale)

    def synchronize(self) -> None:
        """Waits until every parameter's gradient holds its average over ranks. Parameters whose hook did
        not fire this step (unused, or no backward) contribute zeros, as every rank must submit every key;
        their .grad stays None unless the average is non-zero. Does nothing when called again before the
        next backward."""
        if self._synchronized:
            return
        self._check_open()
        self._bootstrap()
        if self._clip:  # this rank's norm over the whole model's gradient, before any submission
            norms = [torch.linalg.vector_norm(p.grad, dtype=torch.float32) for _, p in self._params
                     if p.grad is not None]
            scale = self._scale.current()
            norm = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())
            self._engine.set_gradient_norm(float(norm / scale if scale is not None else norm))
        for name, p in self._params:
            if name not in self._pending:
                self._submit(name, p, now=True)
        active = self._active_ranks(training=True) if self._uneven else None
        self._wait_pending(write=True)
        if active is not None and active < self._engine.world_size:
            # Joined ranks contributed zeros: the average over the ranks still training.
            factor = self._engine.world_size / active
            for _, p in self._params:
                if p.grad is not None:
                    p.grad.mul_(factor)

    def _active_ranks(self, training: bool) -> int:
        """How many ranks still train this step (each says whether it does); collective."""
        from . import collectives
        flag = torch.tensor([1.0 if training else 0.0])
        collectives.allreduce_(flag, collectives.Average)
        return round(float(flag) * self._engine.world_size)

    def join(self) -> int:
        """For a rank that has run out of data (uneven_inputs=True): keeps taking part in the other ranks'
        steps until every rank has called join(), submitting an absent contribution for every parameter
        (gradex_submit_absent): it adds exact zeros to every exchange, and its gradex momentum and DGC residual
        stay as they were (they would otherwise keep flowing into the others' averages). The ranks still
        training get the average over themselves (their results are rescaled by world size / ranks training).
        Works with every policy (DGC tensors included) and with gradex-owned momentum; not with LocalSGD
        (InvalidArgumentError). Returns the number of steps this rank mirrored. Collective with the other
        ranks' steps."""
        if not self._uneven:
            raise _errors.InvalidArgumentError(
                "gradex: join() needs gx.DistributedOptimizer(..., uneven_inputs=True) on every rank")
        if self._localsgd:
            raise _errors.InvalidArgumentError(
                "gradex: join() is not supported with LocalSGD (GRADEX_LOCALSGD_PERIOD > 0): its local steps "
                "exchange nothing a joined rank could be absent from")
        self._check_open()
        self._bootstrap()
        self._wait_pending(write=False)
        # Receive the averages (never read by the engine): one buffer per parameter for every step.
        outputs = {name: torch.zeros_like(p, memory_format=torch.contiguous_format) for name, p in self._params}
        mirrored = 0
        while self._active_ranks(training=False) > 0:
            tickets = [_ops.submit_absent(self._engine.address, name, outputs[name].detach(),
                                          on_device=name in self._on_device)
                       for name, _ in self._params]
            _ops.wait_all(tickets)
            if self._engine.end_step():
                self.average_parameters()
            mirrored += 1
        return mirrored

    def _wait_pending(self, write: bool) -> None:
        """Waits for every submitted gradient (every ticket is consumed, even after a failure); with `write`
        the averages go into the gradients."""
        with self._lock:
            pending, self._pending = self._pending, {}
            self._synchronized = write
            self._deferred.clear()
        first_error = None
        for name, p in self._params:
            if name not in pending:
                continue
            ticket, buffer, grad, scale = pending[name]
            try:
                with _profile.range("gradex.wait"):
                    _ops.wait(ticket)
            except _errors.GradexError as exc:
                first_error = first_error or exc
                continue
            if not write:
                continue
            _amp.ScaleDomain.rescale(buffer, scale)
            if grad is None:
                if bool(torch.count_nonzero(buffer)):  # some rank trained it: the average is its gradient
                    p.grad = buffer
            elif buffer is not grad:
                grad.copy_(buffer)
        if first_error is not None:
            raise first_error

    @torch.no_grad()
    def average_parameters(self) -> None:
        """Averages every parameter across ranks (LocalSGD's averaging round)."""
        engine = self._bootstrap()
        _ops.wait_all([_ops.average(engine.address, name, p.detach()) for name, p in self._params])

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.synchronize()
        self._gradex_wrapped.step()
        self._synchronized = False
        if self._bootstrap().end_step():
            self.average_parameters()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._gradex_wrapped.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        if not self._gradex_ready:  # torch.optim.Optimizer.__init__ building the shared groups
            return super().add_param_group(param_group)
        raise _errors.InvalidArgumentError(
            "gradex: add parameter groups to the optimizer before wrapping it in gx.DistributedOptimizer "
            "(every rank must register the same tensors when the engine is created)")

    @property
    def engine(self) -> _capi.Engine:
        """The engine (created now, collectively, if this optimizer was constructed before
        torch.distributed was initialized and has not been used yet)."""
        return self._bootstrap()

    def stats(self, last_step: bool = False) -> _capi.Stats:
        return self._bootstrap().stats(last_step)

    def state_dict(self) -> Dict[str, Any]:
        """The wrapped optimizer's state_dict plus gradex's compressor state."""
        return {"format": _STATE_FORMAT, "optimizer": self._gradex_wrapped.state_dict(),
                "gradex": self._bootstrap().save_state()}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Accepts state_dict()'s output, or a plain state dict of the wrapped optimizer."""
        if state_dict.get("format") == _STATE_FORMAT:
            with self._lock:
                if self._engine is not None:
                    self._engine.load_state(state_dict["gradex"])
                elif not self._closed:  # loaded into the engine when it is created
                    self._pending_load = bytes(state_dict["gradex"])
                else:
                    raise _errors.InvalidArgumentError("gradex: this gx.DistributedOptimizer was closed")
            self._gradex_wrapped.load_state_dict(state_dict["optimizer"])
        else:
            self._gradex_wrapped.load_state_dict(state_dict)

    def close(self) -> None:
        """Finishes the exchanges in flight, removes the gradient hooks, gives an SGD optimizer its momentum
        back and releases the engine. Idempotent; also run when a `with` block ends and (without the draining,
        which needs this object) by the garbage collector."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self._engine is not None:
                self._wait_pending(write=False)
        finally:
            self._detach()
            if self._engine is not None:
                self._engine.close()

    def _detach(self) -> None:
        """Unhooks this closed optimizer from its parameters, gives the optimizer its momentum back and
        takes it out of gx.join()'s view and the garbage collector's finalizer (the caller closes the engine)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self._takeover is not None:
            self._takeover.release()
            self._takeover = None
        _live_optimizers.discard(self)
        self._finalizer.detach()

    def _check_open(self) -> None:
        if self._closed or (self._engine is not None and not self._engine.address):
            raise _errors.InvalidArgumentError("gradex: this gx.DistributedOptimizer was closed")

    def __enter__(self) -> DistributedOptimizer:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        return f"gx.DistributedOptimizer({self._gradex_wrapped!r})"


def join(optimizer: Optional[DistributedOptimizer] = None) -> int:
    """gx.join(): this rank has run out of data; see DistributedOptimizer.join. `optimizer`: the
    gx.DistributedOptimizer (default: the only open one in this process)."""
    if optimizer is None:
        live = [o for o in list(_live_optimizers) if o._uneven]
        if len(live) != 1:
            raise _errors.InvalidArgumentError(
                f"gradex: join() found {len(live)} open gx.DistributedOptimizer(uneven_inputs=True); pass the "
                f"one to join")
        optimizer = live[0]
    return optimizer.join()


def _close_engine(box: Dict[str, Optional[_capi.Engine]], takeover: Optional[_momentum.SgdMomentumTakeover]) -> None:
    if takeover is not None:
        takeover.release()
    if box["engine"] is None:
        return
    try:
        box["engine"].close()
    except _errors.GradexError:
        pass  # garbage collection: nobody is left to tell


def _localsgd_period(config: _capi.Config) -> int:
    value = (config or {}).get("GRADEX_LOCALSGD_PERIOD", os.environ.get("GRADEX_LOCALSGD_PERIOD", "0"))
    try:
        return int(value)
    except ValueError:
        return 0  # the engine reports the bad value, naming the variable
