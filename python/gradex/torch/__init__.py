"""gradex for PyTorch.

    import gradex.torch as gx
    ddp.register_comm_hook(gx.State(ddp), gx.hook)                                # DDP
    opt = gx.DistributedOptimizer(opt, named_parameters=model.named_parameters())  # without DDP
    lsgd = gx.LocalSGD(model, period=4, warmup_steps=100)                          # lsgd.step() after opt.step()

gx.State and gx.LocalSGD are lazy (their engine bootstraps at first use); PyTorch Lightning on CPU also needs
gradex.torch.lightning.CommHook. See docs/pytorch.md. Errors from the engine raise gradex.GradexError subclasses with the engine's message.
"""
from .. import (ConfigError, CorruptError, GradexError, InternalError, InvalidArgumentError, MismatchError,
                PeerError, StateError, TimeoutError, TransportError, VersionError)
from . import _bootstrap, _ops
from .hook import State, hook
from .localsgd import LocalSGD
from .diloco import DiLoCo
from .optimizer import DistributedOptimizer


def stats(source=None, last_step=False):
    """The engine's counters as a dict: bytes_sent, bytes_received, dense_bytes (what a dense fp32 ring
    allreduce would have sent), compression_ratio, steps, tensors, sparse_exchanges, dense_fallbacks,
    saturated, nonfinite, parameter_averages and compress/communicate/decode_seconds.

    source: a State, DistributedOptimizer or LocalSGD (default: the most recently created open engine).
    last_step: the counters of the last completed step instead of the cumulative ones."""
    engine = source.engine if source is not None else _bootstrap.latest_engine()
    if engine is None:
        raise InvalidArgumentError("gradex: no open gradex engine in this process")
    return engine.stats(last_step)


def has_cuda():
    """Whether the installed op library has its CUDA path (CUDA tensors staged through pinned memory)."""
    _ops.load()
    return _ops.has_cuda()


__all__ = ["State", "hook", "DistributedOptimizer", "LocalSGD", "stats", "has_cuda", "ConfigError",
           "CorruptError", "GradexError", "InternalError", "InvalidArgumentError", "MismatchError",
           "PeerError", "StateError", "TimeoutError", "TransportError", "VersionError"]
