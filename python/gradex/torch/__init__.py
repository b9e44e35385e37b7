"""gradex for PyTorch.

    import gradex.torch as gx
    ddp.register_comm_hook(gx.State(ddp), gx.hook)                                # DDP
    opt = gx.DistributedOptimizer(opt, named_parameters=model.named_parameters())  # without DDP
    lsgd = gx.LocalSGD(model, period=4, warmup_steps=100)                          # lsgd.step() after opt.step()
    hsdp = gx.HSDP(model, mesh, optimizer=opt)        # FSDP2 on mesh['shard'], gradex across mesh['replicate']
    gx.broadcast_parameters(model.state_dict(), root_rank=0)                        # Horovod-style collectives

gx.State and gx.LocalSGD are lazy (their engine bootstraps at first use; gx.State(ddp, optimizer=opt) starts it
at once, in the background); PyTorch Lightning on CPU also needs
gradex.torch.lightning.CommHook. See docs/pytorch.md. Errors from the engine raise gradex.GradexError subclasses with the engine's message.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Union

import torch

from .. import _log, _scalars
from .. import (AbortedError, ConfigError, CorruptError, GradexError, InternalError, InvalidArgumentError,
                MismatchError, PeerError, StateError, TimeoutError, TransportError, VersionError)
from . import _bootstrap, _ops
from .hook import State, hook
from .localsgd import LocalSGD
from .diloco import DiLoCo
from .optimizer import DistributedOptimizer, join
from .collectives import (Average, Sum, allreduce, allreduce_, broadcast, broadcast_, broadcast_object,
                          broadcast_optimizer_state, broadcast_parameters, local_rank, local_size, rank, size)


def _engine_of(source: Any, what: str) -> Any:
    if source is None:
        engine = _bootstrap.latest_engine()
        if engine is None:
            raise InvalidArgumentError("gradex: no open gradex engine in this process")
        return engine
    if hasattr(source, "engine") and not hasattr(source, "address"):
        return source.engine  # State, DistributedOptimizer, HSDP, LocalSGD, DiLoCo
    if hasattr(source, "stats") and hasattr(source, "address"):
        return source  # an engine itself
    raise InvalidArgumentError(f"gradex: {what}() takes a State, DistributedOptimizer, LocalSGD, DiLoCo or "
                               f"engine, not {type(source).__name__}")


def stats(source: object = None, *, last_step: bool = False) -> Dict[str, Union[int, float]]:
    """Counters as a dict: bytes_sent, bytes_received, dense_bytes (what a dense fp32 ring allreduce would have
    sent), compression_ratio, steps, tensors, sparse_exchanges, dense_fallbacks, saturated, nonfinite,
    parameter_averages, compress/communicate/decode_seconds, control_bytes and staged_bytes.

    source: whose counters: a gx.State, gx.DistributedOptimizer, gx.HSDP, gx.LocalSGD, gx.DiLoCo or an engine
    (gradex._capi.Engine); None: the most recently created engine that is still open.
    last_step: the counters of the last completed step instead of the cumulative ones (not for DiLoCo)."""
    return _engine_of(source, "stats").stats(last_step)


def explain(source: object = None) -> str:
    """Each tensor's codec and why, as text (source as for stats(); not for DiLoCo): with GRADEX_POLICY=auto
    the agreed link, codec and step numbers, and per tensor its choice with predicted and measured times
    (what `gradex-bench plan` prints)."""
    return _engine_of(source, "explain").explain()


def synchronize(source: object = None, model: Optional[torch.nn.Module] = None) -> None:
    """Leaves every rank with the same model under the delayed exchange (GRADEX_DELAY > 0), e.g. before
    evaluating or saving: drains the exchanges in flight (their averages are not applied), then averages
    every floating-point parameter across ranks, all of them in one flat fp32 average (gx.allreduce_, the
    engine's fp32 average: the same bits on every rank; one negotiation a 16 MiB chunk, not one a
    parameter: across a WAN each costs a round trip or more), and gives every rank rank 0's buffers
    (BatchNorm's running statistics, which each rank's forward updates from its own batch: what DDP's
    broadcast_buffers would send at the next forward), bit for bit. source as for stats(); model: the module
    whose parameters and buffers to make equal (default: the State's model, or a DistributedOptimizer's
    parameters). The next D steps apply local gradients only, as at the start. Without delay the parameters
    are already identical and only the drain (a no-op) runs. Collective. For a BatchNorm model it says once
    in the log that those running statistics were gathered for rank 0's parameters, not the average now in
    place, and how to measure them again before evaluating (docs/tuning.md: about half of a convnet's
    accuracy cost of the delay)."""
    engine = _engine_of(source, "synchronize")
    if engine.delay() == 0:
        return
    engine.delay_drain()
    if model is None:
        model = getattr(source, "_model", None)
    if model is not None:
        params = [p for p in model.parameters()]
    elif hasattr(source, "_params"):
        params = [p for _, p in getattr(source, "_params")]
    else:
        raise InvalidArgumentError("gradex: synchronize() needs the model whose parameters to average")
    floating = [p for p in params if p.is_floating_point()]
    if floating:
        with torch.no_grad():
            flat = torch.cat([p.detach().to("cpu", torch.float32).reshape(-1) for p in floating])
            allreduce_(flat, Average)
            offset = 0
            for p in floating:
                p.data.copy_(flat[offset:offset + p.numel()].view(p.shape))
                offset += p.numel()
    buffers = list(model.named_buffers()) if model is not None else []
    if buffers:
        broadcast_parameters(buffers, 0)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
             and m.track_running_stats] if model is not None else []
    if norms:
        _log.info_once(
            "synchronize-batchnorm",
            "gradex: gx.synchronize averaged the parameters and gave every rank rank 0's running statistics "
            "of its BatchNorm layers (%d), which rank 0 gathered for its own parameters, not for the average now in "
            "place: measure them again for the synchronized model before evaluating, as after any average of "
            "weights (torch.optim.swa_utils.update_bn(loader, model) over a few training batches; "
            "docs/tuning.md, \"Delayed exchange\")", len(norms))


_windows: Dict[int, _scalars.Window] = {}  # id(engine) -> its _scalars.Window (an engine lives as long as its source)


def log_scalars(writer: _scalars.ScalarWriter, step: int, source: object = None) -> Dict[str, float]:
    """Writes gradex's scalars over the steps since the previous call for the same source (bytes sent,
    compression, codec mix, exposed exchange time, plan changes: gradex/_scalars.py) to `writer`, a
    torch.utils.tensorboard.SummaryWriter (anything with add_scalar(tag, value, step)), at `step`; returns them
    (empty, and nothing written, when no gradex step completed since). source as for stats(). Call it every N
    steps; on every rank each writes its own counters (pass rank 0's writer only, as usual)."""
    engine = _engine_of(source, "log_scalars")
    window = _windows.setdefault(id(engine), _scalars.Window())
    values = window.take(engine.stats())
    for tag, value in values.items():
        writer.add_scalar(tag, value, step)
    return values


def has_cuda() -> bool:
    """Whether the installed op library has its CUDA path (CUDA tensors staged through pinned memory)."""
    _ops.load()
    return _ops.has_cuda()


__all__ = ["State", "hook", "HSDP", "DistributedOptimizer", "LocalSGD", "DiLoCo", "stats", "log_scalars", "has_cuda",
           "join", "synchronize",
           "rank", "size", "local_rank", "local_size", "allreduce", "allreduce_", "Average", "Sum", "broadcast",
           "broadcast_", "broadcast_object", "broadcast_parameters", "broadcast_optimizer_state", "ConfigError",
           "CorruptError", "GradexError", "InternalError", "InvalidArgumentError", "MismatchError",
           "PeerError", "StateError", "TimeoutError", "TransportError", "VersionError", "AbortedError"]


def __getattr__(name: str) -> Any:
    """gx.HSDP: gradex.torch.fsdp.HSDP, imported on first use (it imports torch's FSDP2). gx.torchft:
    gradex.torchft (torchft's process group and compressed hook, docs/elastic.md), imported on first use
    because torchft is an optional extra."""
    if name == "HSDP":  # imports FSDP2 on first use
        from .fsdp import HSDP
        return HSDP
    if name == "torchft":
        import importlib
        return importlib.import_module("gradex.torchft")
    raise AttributeError(f"module 'gradex.torch' has no attribute {name!r}")
