"""The gradient-exchange methods of the training race: how each one wraps a model in DDP, which
optimizer momentum it runs with, and what it does after each optimizer step.

Every method wraps the model in DDP with gradient_as_bucket_view=True (the parameters' .grad are views of
DDP's buckets, no copies in and out; the record says so).

  ddp              DDP's default exchange: gloo allreduce of fp32 buckets; SGD momentum 0.9
  torch_fp16       PyTorch's fp16_compress_hook (divide, fp16 allreduce, cast back); SGD momentum 0.9
  powersgd_r1/_r4  PyTorch's PowerSGD hook at rank 1 / 4 (error feedback, warm start), plain allreduce for
                   the first --sync-warmup iterations; SGD momentum 0.9
  gradex_auto      gx.hook with GRADEX_POLICY=auto (the cost model picks each tensor's codec for this link);
                   a gradex build without GRADEX_POLICY runs its default policy instead, and the record
                   says so ("policy"); momentum inside gradex: gx.State(ddp, optimizer=opt) takes the SGD
                   optimizer's momentum 0.9 over (the optimizer then runs at momentum 0), and, its settings
                   being final, starts its engine at construction, in the background
  gradex_delay     gradex_auto with GRADEX_DELAY=auto (the delayed exchange when the exchange does not hide)
  gradex_delay1    gradex_auto with GRADEX_DELAY=1 (gradex_delay2 .. 4, gradex_delay8: that many exchanges in flight); gradex_stale1 the
                   same with GRADEX_DELAY_RULE=stale
                   (plain staleness, for the comparison in docs/tuning.md)
  gradex_default   gx.hook with gradex's defaults, nothing overridden (before GRADEX_POLICY: DGC 99.9 % for
                   large tensors, fp16 dense for small ones; momentum inside gradex, as for gradex_auto)
  gradex_dgc       gx.hook with DGC at 99.9 % on every tensor (GRADEX_DENSE_THRESHOLD=0), small ones too
  gradex_localsgd  gx.LocalSGD: synchronous for --sync-warmup steps (dense fp16), then parameters averaged
                   every --period steps; SGD momentum 0.9 in the optimizer
  nocomm           DDP with a hook that returns the bucket as is: no communication, so its steps per second
                   are this machine's compute bound (its accuracy means nothing: ranks never average)

Optimizer (--optimizer): sgd, the race's own (SGD momentum 0.9, as above), or adamw: torch.optim.AdamW
(weight decay 0.01) in every method, handed to gradex's hook as a user would (gx.State(model,
optimizer=opt)), so that gradex adds no momentum of its own and configures itself for an Adam-family
optimizer (GRADEX_OPTIMIZER=adam); gradex_localsgd's optimizer owns its moments under either. gradex_dgc is
DGC with gradex's momentum correction, which exists only for SGD momentum: rejected under adamw.

The Keras row of the race is not set up here: keras_gradex_default and keras_gradex_dense run
bench/train/keras_rank.py (train_suite.py's PROGRAMS), Keras 3 + gxk.DistributedOptimizer.
"""
import inspect
import os
import re
import sys
from typing import Any, Dict

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from bench.baselines.modes import _noop_hook, serialized_hook  # noqa: E402
from bench.train.optimizers import ADAMW_UNSUPPORTED, ADAMW_WEIGHT_DECAY, OPTIMIZERS  # noqa: E402

# The delayed exchange (GRADEX_DELAY): gradex_auto with D exchanges in flight, drained by gx.synchronize.
DELAYED = ("gradex_delay", "gradex_delay1", "gradex_delay2", "gradex_delay3", "gradex_delay4", "gradex_delay8",
           "gradex_stale1")
METHODS = ("ddp", "torch_fp16", "powersgd_r1", "powersgd_r4", "gradex_auto", "gradex_default", "gradex_dgc",
           "gradex_localsgd", "nocomm") + DELAYED
GRADEX_MOMENTUM = 0.9  # the optimizer's momentum, or gradex's when gradex owns it
# gx.hook methods: gradex owns SGD's momentum
GRADEX_HOOKS = ("gradex_auto", "gradex_default", "gradex_dgc") + DELAYED
SYNCED = "synced"  # what after_step returns when every rank holds the same parameters


class Method:
    """One method set up on one model: .ddp, .optimizer, .after_step() (returns whether every rank now
    holds the same parameters), .stats() (gradex's counters or None), .close()."""

    def __init__(self, name, model, args):
        self.name, self.gradex, self._lsgd, self.policy = name, None, None, None
        self._takes_optimizer = False
        self.delayed = name in DELAYED  # its ranks' parameters differ by their last D local steps
        self.optimizer_name = getattr(args, "optimizer", "sgd")
        if self.optimizer_name == "adamw" and name in ADAMW_UNSUPPORTED:
            raise ValueError(f"--optimizer adamw: {ADAMW_UNSUPPORTED[name]}")
        # Every method's .grad are views of DDP's buckets, as a user after speed sets it: DDP then skips its two
        # copies of every gradient a step (into the bucket, back out): 5-10 % more steps/s here (docs/pytorch.md).
        # broadcast_buffers (DDP's default True) sends rank 0's buffers (BatchNorm statistics) to every rank at every
        # forward: one latency a step before any gradient exists; --no-broadcast-buffers turns it off in every method.
        # The no-communication bound never sends it: it is the compute alone.
        self.ddp = DistributedDataParallel(model, gradient_as_bucket_view=True,
                                           broadcast_buffers=getattr(args, "broadcast_buffers", True) and name != "nocomm")
        self.optimizer: torch.optim.Optimizer
        if self.optimizer_name == "sgd":
            # gx.State(ddp, optimizer=opt) takes the SGD momentum over (docs/pytorch.md): gradex applies it and the
            # optimizer runs at momentum 0. A gradex without optimizer= is given GRADEX_MOMENTUM instead.
            self._takes_optimizer = name in GRADEX_HOOKS and _state_takes_optimizer()
            momentum = 0.0 if name in GRADEX_HOOKS and not self._takes_optimizer else GRADEX_MOMENTUM
            self.optimizer = torch.optim.SGD(self.ddp.parameters(), lr=args.lr, momentum=momentum)
        elif self.optimizer_name == "adamw":
            self.optimizer = torch.optim.AdamW(self.ddp.parameters(), lr=args.lr, weight_decay=ADAMW_WEIGHT_DECAY)
        else:
            raise ValueError(f"unknown optimizer {self.optimizer_name!r} (expected one of {', '.join(OPTIMIZERS)})")
        if name == "torch_fp16":
            self.ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif name.startswith("powersgd_r"):
            state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=int(name[len("powersgd_r"):]),
                start_powerSGD_iter=max(2, args.sync_warmup), use_error_feedback=True, warm_start=True)
            self.ddp.register_comm_hook(state, serialized_hook(powerSGD_hook.powerSGD_hook))
        elif name in GRADEX_HOOKS:
            import gradex.torch as gx
            auto = auto_policy_config(args.steps)
            config = {"gradex_auto": auto, "gradex_default": {},
                      "gradex_dgc": {"GRADEX_SPARSITY": 0.999, "GRADEX_DENSE_THRESHOLD": 0},
                      "gradex_delay": dict(auto, GRADEX_DELAY="auto"), "gradex_delay1": dict(auto, GRADEX_DELAY=1),
                      "gradex_delay2": dict(auto, GRADEX_DELAY=2), "gradex_delay3": dict(auto, GRADEX_DELAY=3),
                      "gradex_delay4": dict(auto, GRADEX_DELAY=4), "gradex_delay8": dict(auto, GRADEX_DELAY=8),
                      "gradex_stale1": dict(auto, GRADEX_DELAY=1, GRADEX_DELAY_RULE="stale")}[name]
            self.policy = config.get("GRADEX_POLICY", "default")
            if self.optimizer_name == "sgd" and not self._takes_optimizer:
                # gradex owns SGD's momentum (as gx.State(ddp, optimizer=SGD(momentum=0.9)) arranges).
                self.gradex = _gx_state(gx, self.ddp, dict(config, GRADEX_MOMENTUM=GRADEX_MOMENTUM))
            else:  # the public route: gradex learns the optimizer and sets itself up for it (and starts its engine)
                self.gradex = gx.State(self.ddp, config=config, optimizer=self.optimizer)
            self.ddp.register_comm_hook(self.gradex, gx.hook)
        elif name == "gradex_localsgd":
            import gradex.torch as gx
            self._lsgd = gx.LocalSGD(self.ddp, period=args.period, warmup_steps=args.sync_warmup,
                                     config={"GRADEX_SPARSITY": 0, "GRADEX_MOMENTUM": 0})
            self.gradex = self._lsgd
        elif name == "nocomm":
            self.ddp.register_comm_hook(None, _noop_hook)
        elif name != "ddp":
            raise ValueError(f"unknown method {name!r} (expected one of {', '.join(METHODS)})")

    def settings(self):
        """What the record states about the optimizer: its name and class, and the momentum and optimizer
        family gradex's engine runs with as the engine reports them (None without gradex)."""
        out = {"optimizer": self.optimizer_name, "optimizer_class": type(self.optimizer).__name__,
               "gradex_momentum": None, "gradex_optimizer": None,
               "gradient_as_bucket_view": bool(self.ddp.gradient_as_bucket_view),
               "broadcast_buffers": bool(self.ddp.broadcast_buffers)}
        if self.gradex is not None:
            text = self.gradex.engine.describe_config()  # "NAME=value    [source; ...]" lines
            momentum = re.search(r"(?m)^GRADEX_MOMENTUM=(\S+)", text)
            family = re.search(r"(?m)^GRADEX_OPTIMIZER=(\S+)", text)
            out["gradex_momentum"] = float(momentum.group(1)) if momentum else None
            out["gradex_optimizer"] = family.group(1) if family else None
        return out

    def after_step(self):
        """Ends a step after optimizer.step(); True when every rank now has the same parameters."""
        if self._lsgd is not None:
            exchanged = self._lsgd.engine.exchanges_gradients()
            averaged = self._lsgd.step()
            return averaged or exchanged
        return self.name != "nocomm"

    def synchronize(self):
        """Brings every rank to the same parameters (LocalSGD: averages them now; a delayed exchange:
        gx.synchronize drains it and averages them); returns whether they are the same now."""
        if self._lsgd is not None:
            self._lsgd.average_parameters()
            return True
        if self.name in DELAYED:
            import gradex.torch as gx
            gx.synchronize(self.gradex, self.ddp.module)
            return True
        return self.name != "nocomm"

    def stats(self):
        return dict(self.gradex.stats()) if self.gradex is not None else None

    def close(self):
        if self.gradex is not None:
            self.gradex.close()


def auto_policy_config(steps=None):
    """{"GRADEX_POLICY": "auto"} when this gradex build declares GRADEX_POLICY, else {} (its default);
    with the training's length in `steps` (the schedule every method runs: its horizon) as
    GRADEX_POLICY_HORIZON_STEPS when the build declares it, as a user who knows epochs x steps would."""
    import gradex
    described = "\n" + gradex.describe_config()
    if "\nGRADEX_POLICY=" not in described:
        return {}
    config: Dict[str, Any] = {"GRADEX_POLICY": "auto"}
    if steps and "\nGRADEX_POLICY_HORIZON_STEPS=" in described:
        config["GRADEX_POLICY_HORIZON_STEPS"] = int(steps)
    return config


def _state_takes_optimizer():
    """Whether this gradex's gx.State takes optimizer= (and with it an SGD optimizer's momentum)."""
    import gradex.torch as gx
    return "optimizer" in inspect.signature(gx.State).parameters


def _gx_state(gx, ddp, config):
    """gx.State for this DDP model, handing it the module (for per-parameter names) when this gradex
    version takes one."""
    parameters = inspect.signature(gx.State).parameters
    if "model" in parameters:
        return gx.State(config=config, model=ddp)
    return gx.State(config=config)
