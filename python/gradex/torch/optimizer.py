"""Horovod-style DistributedOptimizer: gradients are exchanged through gradex without DDP.

    opt = gx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())

A gradient hook on every parameter submits its gradient as soon as autograd has accumulated it, so
communication overlaps the rest of backward; step() waits for all of them, then steps the wrapped optimizer,
then ends the engine's step (and averages parameters when LocalSGD says so, GRADEX_LOCALSGD_PERIOD > 0).
Parameter names are the engine's tensor keys and must be the same on every rank.

With a torch.amp.GradScaler, pass it (scaler=) so that gradex's residuals and momenta stay unscaled
(_amp.py), and call opt.synchronize() before scaler.unscale_(opt) / scaler.step(opt): the scaler reads the
gradients, which must hold the averages by then. step() does not exchange again after a synchronize().
"""
import os
import threading

import torch

from .. import _capi, _errors
from . import _amp, _bootstrap, _momentum, _ops

_STATE_FORMAT = "gradex.torch.DistributedOptimizer/1"


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps `optimizer`; shares its param_groups and state (LR schedulers work on either)."""

    def __init__(self, optimizer, named_parameters=None, config=None, store=None, scaler=None, process_group=None):
        if isinstance(optimizer, DistributedOptimizer):
            raise _errors.InvalidArgumentError("gradex: the optimizer is already a gx.DistributedOptimizer")
        self._gradex_ready = False
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state
        self._gradex_wrapped = optimizer
        self._params = self._name_parameters(optimizer, named_parameters)  # [(name, parameter)]
        self._scale = _amp.ScaleDomain(scaler)
        if _localsgd_period(config) > 0:
            from .localsgd import optimizer_owns_momentum
            config = optimizer_owns_momentum(dict(config or {}))
        self._engine = _bootstrap.create_engine(config, store, process_group)
        # float32 CUDA parameters: their gradients are exchanged on the GPU (_ops.memory_of); parameter
        # averages (LocalSGD) are staged through host memory either way.
        self._on_device = set()
        for name, p in self._params:
            memory = _ops.memory_of(p)
            self._engine.register(name, p.numel(), _bootstrap.dtype_code(p.dtype), memory)
            if memory == _capi.DEVICE_CUDA:
                self._on_device.add(name)
        self._lock = threading.Lock()
        self._pending = {}  # name -> (ticket, buffer submitted, gradient to copy the result into, scale)
        self._synchronized = False  # synchronize() ran and no gradient was submitted since
        self._deferred = set()  # gradients produced but not submitted yet (clipping waits for all)
        self._hooks = [p.register_post_accumulate_grad_hook(self._make_hook(name))
                       for name, p in self._params if p.requires_grad]
        self._clip = _momentum.gradex_clip_norm(self._engine, config) > 0
        _momentum.MomentumWarner("gx.DistributedOptimizer",
                                 _momentum.gradex_momentum(self._engine, config)).check(optimizer)
        self._gradex_ready = True

    @staticmethod
    def _name_parameters(optimizer, named_parameters):
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

    def _make_hook(self, name):
        def on_gradient(p):
            self._submit(name, p)
        return on_gradient

    def _submit(self, name, p, now=False):
        """Hands a gradient to the engine; with clipping (GRADEX_CLIP_NORM > 0) only notes it, unless `now`:
        synchronize() submits every gradient once the whole model's norm is known."""
        grad = p.grad
        if grad.is_sparse:
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
            buffer = grad if grad.is_contiguous() else grad.contiguous()
            scale = self._scale.current()
            _amp.ScaleDomain.unscale(buffer, scale)
            ticket = _ops.submit(self._engine.address, name, buffer.detach(), on_device=name in self._on_device)
            self._pending[name] = (ticket, buffer, grad, scale)

    def synchronize(self):
        """Waits until every parameter's gradient holds its average over ranks. Parameters whose hook did
        not fire this step (unused, or no backward) contribute zeros, as every rank must submit every key.
        Does nothing when called again before the next backward."""
        if self._synchronized:
            return
        if self._clip:  # this rank's norm over the whole model's gradient, before any submission
            for _, p in self._params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            norms = [torch.linalg.vector_norm(p.grad, dtype=torch.float32) for _, p in self._params]
            scale = self._scale.current()
            norm = torch.linalg.vector_norm(torch.stack(norms))
            self._engine.set_gradient_norm(float(norm / scale if scale is not None else norm))
        for name, p in self._params:
            if name not in self._pending:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._submit(name, p, now=True)
        with self._lock:
            pending, self._pending = self._pending, {}
            self._synchronized = True
        first_error = None
        for name, _ in self._params:
            ticket, buffer, grad, scale = pending[name]
            try:
                _ops.wait(ticket)  # consumes every ticket, even after a failure
            except _errors.GradexError as exc:
                first_error = first_error or exc
                continue
            _amp.ScaleDomain.rescale(buffer, scale)
            if buffer is not grad:
                grad.copy_(buffer)
        if first_error is not None:
            raise first_error

    @torch.no_grad()
    def average_parameters(self):
        """Averages every parameter across ranks (LocalSGD's averaging round)."""
        _ops.wait_all([_ops.average(self._engine.address, name, p.detach()) for name, p in self._params])

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.synchronize()
        self._gradex_wrapped.step()
        self._synchronized = False
        if self._engine.end_step():
            self.average_parameters()
        return loss

    def zero_grad(self, set_to_none=True):
        self._gradex_wrapped.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        if not self._gradex_ready:  # torch.optim.Optimizer.__init__ building the shared groups
            return super().add_param_group(param_group)
        raise _errors.InvalidArgumentError(
            "gradex: add parameter groups to the optimizer before wrapping it in gx.DistributedOptimizer "
            "(every rank must register the same tensors when the engine is created)")

    @property
    def engine(self):
        return self._engine

    def stats(self, last_step=False):
        return self._engine.stats(last_step)

    def state_dict(self):
        """The wrapped optimizer's state_dict plus gradex's compressor state."""
        return {"format": _STATE_FORMAT, "optimizer": self._gradex_wrapped.state_dict(),
                "gradex": self._engine.save_state()}

    def load_state_dict(self, state_dict):
        """Accepts state_dict()'s output, or a plain state dict of the wrapped optimizer."""
        if state_dict.get("format") == _STATE_FORMAT:
            self._engine.load_state(state_dict["gradex"])
            self._gradex_wrapped.load_state_dict(state_dict["optimizer"])
        else:
            self._gradex_wrapped.load_state_dict(state_dict)

    def close(self):
        """Removes the gradient hooks and releases the engine."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._engine.close()

    def __repr__(self):
        return f"gx.DistributedOptimizer({self._gradex_wrapped!r})"


def _localsgd_period(config):
    value = (config or {}).get("GRADEX_LOCALSGD_PERIOD", os.environ.get("GRADEX_LOCALSGD_PERIOD", "0"))
    try:
        return int(value)
    except ValueError:
        return 0  # the engine reports the bad value, naming the variable
