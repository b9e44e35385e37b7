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
"""
from __future__ import annotations

from typing import Any, Callable, Optional

try:  # the unified package first, then the standalone one (a Trainer accepts only its own Callback class)
    from lightning.pytorch import Callback as _Callback
except ImportError:  # pragma: no cover - depends on what is installed
    from pytorch_lightning import Callback as _Callback

import torch

from .. import _errors


class CommHook(_Callback):
    def __init__(self, state: Any = None, hook: Optional[Callable[..., Any]] = None) -> None:
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
            if trainer.strategy.root_device.type == "cuda":
                return  # Lightning registered it
        ddp.register_comm_hook(state, hook)
