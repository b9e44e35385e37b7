"""The Hugging Face Trainer: gradex's comm hook on the DDP module the Trainer trains, with its optimizer.

    from gradex.torch.transformers import CommHook
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[CommHook()])

The Trainer builds its DDP module (through Accelerate's prepare()) and its optimizer inside train(), so a user
has neither to hand to gx.State. CommHook does it at on_train_begin, after both exist and before the first
backward pass: it finds the DDP module that trains the Trainer's model, builds gx.State(ddp) (or takes the State
given), hands it the Trainer's optimizer (State.set_optimizer: the momentum rule applies exactly as with
gx.State(ddp, optimizer=opt), an SGD optimizer's momentum moving into gradex) and registers the hook. One process
(no DDP module): nothing to exchange, nothing registered. The State stays open after train() (statistics, a
checkpoint's state_dict()); close() it, or let garbage collection do so.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from transformers import TrainerCallback

from .. import _capi, _errors
from . import _discover
from .hook import State
from .hook import hook as _gradex_hook


class CommHook(TrainerCallback):
    """state: a gx.State to register (default: gx.State(ddp, config=config) at the start of training);
    hook: the comm hook (default gx.hook); config: GRADEX_* overrides of the State CommHook builds."""

    def __init__(self, state: Optional[State] = None, hook: Optional[Callable[..., object]] = None, *,
                 config: _capi.Config = None) -> None:
        super().__init__()
        if state is not None and config:
            raise _errors.InvalidArgumentError("gradex: CommHook takes a State or a config for the State it "
                                               "builds, not both")
        self.gradex_state: Optional[State] = state
        self._hook = hook or _gradex_hook
        self._config = config
        self._registered: Optional[torch.nn.Module] = None

    def on_train_begin(self, args: object, state: object, control: object, model: Optional[torch.nn.Module] = None,
                       optimizer: Optional[torch.optim.Optimizer] = None, **kwargs: Any) -> None:
        if model is None:
            raise _errors.InvalidArgumentError("gradex: CommHook.on_train_begin got no model from the Trainer")
        ddp = model if isinstance(model, torch.nn.parallel.DistributedDataParallel) else \
            _discover.owner_of(list(model.parameters()))
        if ddp is None:
            if int(getattr(args, "world_size", 1) or 1) > 1:
                raise _errors.InvalidArgumentError(
                    "gradex: the Trainer runs on several processes but trains no DistributedDataParallel module; "
                    "CommHook works with the Trainer's DDP (not FSDP or DeepSpeed)")
            return
        if ddp is self._registered:
            return  # a second train() on the same module: the hook is in place
        if self._registered is not None:
            raise _errors.InvalidArgumentError("gradex: this CommHook already serves another DDP module; give "
                                               "each Trainer its own CommHook")
        if self.gradex_state is None:
            self.gradex_state = State(ddp, config=self._config)
        if optimizer is not None and self.gradex_state.optimizer is None:
            self.gradex_state.set_optimizer(optimizer)
        ddp.register_comm_hook(self.gradex_state, self._hook)
        self._registered = ddp
