"""PyTorch Lightning: registering gradex's comm hook on the DDP module Lightning builds, on any device.

    strategy = DDPStrategy(process_group_backend="gloo", ddp_comm_state=gx.State(), ddp_comm_hook=gx.hook)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy,
                         callbacks=[gx.lightning.CommHook()])

Lightning's DDPStrategy registers `ddp_comm_hook` only when its root device is CUDA (a restriction from
torch 1.8 that DDP no longer has), and ignores it on CPU. CommHook registers the strategy's hook itself when
Lightning did not, at on_fit_start (after Lightning has wrapped the model in DDP, before the first
backward); with CUDA devices it leaves Lightning's registration alone. CommHook(state, hook) registers the
given pair instead, with any DDPStrategy. Works with the default (subprocess) and spawn launchers: an
unused gx.State pickles (its configuration only).

The optimizer reaches gradex here too: Lightning builds the State before configure_optimizers() runs, so
CommHook hands the Trainer's optimizer to the State at on_fit_start (State.set_optimizer, before the first
backward pass), and the momentum rule applies exactly as with gx.State(ddp, optimizer=opt): an SGD optimizer's
momentum moves into gradex (DGC's momentum correction), Adam-family optimizers keep theirs. With several
optimizers (manual optimization) no single one trains every parameter, so the State gets none and gradex adds
no momentum (as gx.State() alone; a warning says so).
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional

try:  # the unified package first, then the standalone one (a Trainer accepts only its own Callback class)
    from lightning.pytorch import Callback as _Callback
except ImportError:  # pragma: no cover - depends on what is installed
    from pytorch_lightning import Callback as _Callback

import torch

from .. import _errors, _log


class CommHook(_Callback):
    def __init__(self, state: object = None, hook: Optional[Callable[..., object]] = None) -> None:
        super().__init__()
        if (state is None) != (hook is None):
            raise _errors.InvalidArgumentError("gradex: CommHook takes both state and hook, or neither")
        self._state, self._hook = state, hook

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        ddp = trainer.strategy.model
        if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            raise _errors.InvalidArgumentError(
                f"gradex: CommHook needs a DDP strategy (Lightning's model is a {type(ddp).__name__})")
        state, hook = self._state, self._hook
        if hook is None:
            state = getattr(trainer.strategy, "_ddp_comm_state", None)
            hook = getattr(trainer.strategy, "_ddp_comm_hook", None)
            if hook is None:
                raise _errors.InvalidArgumentError(
                    "gradex: CommHook() registers the DDPStrategy's ddp_comm_hook, and it has none: pass "
                    "DDPStrategy(ddp_comm_state=gx.State(), ddp_comm_hook=gx.hook) or CommHook(gx.State(), gx.hook)")
        _give_optimizer(state, trainer.optimizers)
        if self._hook is None and trainer.strategy.root_device.type == "cuda":
            return  # Lightning registered it
        ddp.register_comm_hook(state, hook)


def _give_optimizer(state: object, optimizers: List[torch.optim.Optimizer]) -> None:
    """Hands the Trainer's optimizer to a gx.State that has none yet (other hook states are left alone)."""
    from .hook import State

    if not isinstance(state, State) or state.optimizer is not None or not optimizers:
        return
    if len(optimizers) > 1:
        _log.warn_once("lightning-optimizers", "gradex: the Trainer has %d optimizers; gx.State follows one, so "
                       "gradex adds no momentum (pass gx.State(optimizer=...) to CommHook to choose)",
                       len(optimizers))
        return
    state.set_optimizer(optimizers[0])


class Scalars(_Callback):
    """Logs gradex's scalars (bytes sent, compression, codec mix, exposed exchange time, plan changes over the
    last `every_n_steps` optimizer steps: gradex/_scalars.py) to the Trainer's loggers (TensorBoard, CSV, ...)
    every `every_n_steps` steps. source: whose counters (default: the DDPStrategy's ddp_comm_state)."""

    def __init__(self, every_n_steps: int = 50, source: object = None) -> None:
        super().__init__()
        if every_n_steps < 1:
            raise _errors.InvalidArgumentError(f"gradex: Scalars(every_n_steps={every_n_steps}) must be >= 1")
        from .. import _scalars
        self._every, self._source = every_n_steps, source
        self._window = _scalars.Window()
        self._logged_step = -1

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        if step == 0 or step % self._every != 0 or step == self._logged_step:
            return  # gradient accumulation ends several batches on one optimizer step: logged once
        self._logged_step = step
        from . import stats
        source = self._source if self._source is not None else getattr(trainer.strategy, "_ddp_comm_state", None)
        if source is None:
            return
        values = self._window.take(stats(source))
        if values:
            for logger in trainer.loggers:
                logger.log_metrics(values, step=step)
