"""gradex for TensorFlow (Horovod's names).

    import gradex.tensorflow as gxt
    gxt.init()                                   # torchrun / mpirun / srun / RANK+WORLD_SIZE; bad GRADEX_* -> error
    tape = gxt.DistributedGradientTape(tape)     # custom training loops, eager or tf.function
    gxt.broadcast_variables(model.variables, root_rank=0)

Keras 3: gradex.tensorflow.keras (DistributedOptimizer, callbacks). See docs/tensorflow.md. Engine errors
raise gradex.GradexError subclasses eagerly, and tf.errors carrying "gradex[<STATUS>]: <message>" inside
graphs.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

import tensorflow as tf

from .. import (AbortedError, ConfigError, CorruptError, GradexError, InternalError, InvalidArgumentError,
                MismatchError, PeerError, StateError, TimeoutError, TransportError, VersionError)
from .. import _capi
from . import _exchange, _ops, _runtime
from .tape import DistributedGradientTape

_STATE_FORMAT = "gradex.tensorflow/1"


def init(config: _capi.Config = None) -> None:
    """Joins the job (collective: every rank calls it). Rank, size and local rank come from the launcher
    (torchrun, Open MPI, MPICH / Intel MPI / PMI, Slurm; gradex's C API reads them as for every plugin); a
    launcher's size without a rank raises gradex.ConfigError. Rank 0 serves gradex's authenticated store on
    MASTER_ADDR:MASTER_PORT (GRADEX_JOB_SECRET). `config`: GRADEX_* overrides for every engine of this
    process except the collective one; names and values are checked here (gradex.ConfigError). Idempotent."""
    _runtime.init(config)


def shutdown() -> None:
    """Completes outstanding exchanges and releases every engine (graphs traced before then stop working)."""
    _runtime.shutdown()


def is_initialized() -> bool:
    return _runtime.initialized()


def rank() -> int:
    return _runtime.state().rank


def size() -> int:
    return _runtime.state().size


def local_rank() -> int:
    return _runtime.state().local_rank


def local_size() -> int:
    """Ranks on this host (the launcher's value, else counted by host name at init)."""
    return _runtime.state().local_size


def engine(config: _capi.Config = None) -> _runtime.Engine:
    """The gradient engine for `config` (GRADEX_* overrides over init's config and the environment):
    the one already created for an equal configuration, else a new one (collective: same order on every
    rank). Pass it to wrappers as `engine=` to share it explicitly. Without GRADEX_MOMENTUM in `config`
    or the environment it adds no momentum (the optimizer owns momentum)."""
    ref = _runtime.engine_for(config, what="gxt.engine")
    _runtime.say_no_optimizer(config)
    return ref


def _engine_of(source: object) -> _runtime.Engine:
    if source is None:
        return _runtime.state().gradients
    if isinstance(source, bool):
        raise InvalidArgumentError("gradex: stats(source=None, *, last_step=False): pass last_step by keyword")
    if isinstance(source, _runtime.Engine):
        return source
    ref = getattr(source, "_gradex_ref", None)  # DistributedGradientTape, gxk.DistributedOptimizer
    if isinstance(ref, _runtime.Engine):
        return ref
    raise InvalidArgumentError(
        f"gradex: stats() takes a DistributedGradientTape, a gxk.DistributedOptimizer or an engine from "
        f"gxt.engine(), not {type(source).__name__}")


def stats(source: object = None, *, last_step: bool = False) -> _capi.Stats:
    """The counters of `source`'s engine (a DistributedGradientTape, a gxk.DistributedOptimizer or an engine
    from gxt.engine(); None: init's default gradient engine): bytes_sent, bytes_received, dense_bytes,
    compression_ratio, steps, tensors, sparse_exchanges, dense_fallbacks, saturated, nonfinite,
    parameter_averages, compress/communicate/decode_seconds. last_step: the last completed step's counters
    instead of the cumulative ones."""
    return _engine_of(source).stats(last_step)


def describe_config(source: object = None) -> str:
    """The effective GRADEX_* configuration of `source`'s engine (as for stats()), with help text."""
    return _engine_of(source).describe_config()


def explain(source: object = None) -> str:
    """Each tensor's codec and why, for `source`'s engine (as for stats()): with GRADEX_POLICY=auto the
    agreed link, codec and step numbers and per tensor its choice with predicted and measured times."""
    return _engine_of(source).explain()


def allreduce(tensor: Any, average: bool = True, name: Optional[str] = None) -> tf.Tensor:
    """The average (or, average=False, the sum) of `tensor` over the ranks, computed exactly in fp32 on the
    wire by the collective engine. float32/float16/bfloat16; float64 is averaged in float32. `name`
    matches calls across ranks (default: numbered per traced graph; eagerly, one shared name)."""
    ref = _runtime.state().collective
    t = tf.convert_to_tensor(tensor)
    original = t.dtype
    if original == tf.float64:
        t = tf.cast(t, tf.float32)
    (out,) = _exchange.exchange([t], [_exchange.graph_key("allreduce", name, t)], ref)
    if not average:
        out = out * tf.cast(size(), out.dtype)
    return tf.cast(out, original) if out.dtype != original else out


def broadcast(tensor: Any, root_rank: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """root_rank's `tensor` on every rank, bit for bit (any numeric or bool dtype)."""
    ref = _runtime.state().collective
    t = tf.convert_to_tensor(tensor)
    return _exchange.broadcast(t, _exchange.graph_key("broadcast", name, t), root_rank, ref)


def broadcast_variables(variables: Iterable[tf.Variable], root_rank: int = 0, prefix: str = "var") -> None:
    """Assigns root_rank's value to every variable (e.g. the model's initial weights and the optimizer's
    slots). Eagerly, the variables' bytes travel unchanged in one broadcast of the job's gradex group (each
    rank sends them once), after a check that every rank passes the same paths, shapes and dtypes
    (MismatchError on every rank otherwise); inside a graph, each variable is a broadcast op of the
    collective engine, matched by path."""
    variables = list(variables)
    if not variables:
        return
    if tf.executing_eagerly():
        _broadcast_variables_eagerly(variables, root_rank)
        return
    ref = _runtime.state().collective
    keys = _exchange.unique_keys(prefix, [_exchange.variable_key(v) for v in variables])

    def assign_all() -> None:
        for v, key in zip(variables, keys):
            v.assign(_exchange.broadcast(tf.convert_to_tensor(v), key, root_rank, ref))

    assign_all()


def _broadcast_variables_eagerly(variables: List[tf.Variable], root_rank: int) -> None:
    import hashlib

    import numpy as np
    group = _runtime.group()
    if not isinstance(root_rank, int) or not 0 <= root_rank < group.world_size:
        raise InvalidArgumentError(f"gradex: root_rank must be a rank in [0, {group.world_size}), got {root_rank!r}")
    if group.world_size == 1:
        return
    # Keras 3 variables carry their dtype as a string, tf.Variable as a tf.DType: one name for both.
    layout = repr([(_exchange.variable_key(v), tuple(v.shape), tf.as_dtype(v.dtype).name)
                   for v in variables]).encode()
    digest = np.frombuffer(hashlib.sha256(layout).digest()[:16], dtype=np.uint8).copy()
    digests = np.empty(16 * group.world_size, dtype=np.uint8)
    group.allgather(digest.ctypes.data, 16, digests.ctypes.data)
    agreeing: Dict[bytes, List[int]] = {}
    for r in range(group.world_size):
        agreeing.setdefault(digests[16 * r:16 * (r + 1)].tobytes(), []).append(r)
    if len(agreeing) > 1:
        raise MismatchError(f"gradex: broadcast_variables: ranks passed different variables (paths, shapes or "
                            f"dtypes); groups of ranks that agree: {sorted(agreeing.values())}")
    values = [np.array(v.numpy(), order="C") for v in variables]  # 0-d stays 0-d
    data = np.concatenate([a.reshape(-1).view(np.uint8) for a in values]) if values else np.zeros(0, np.uint8)
    group.broadcast(data.ctypes.data, data.nbytes, root_rank)
    if group.rank == root_rank:
        return
    offset = 0
    for v, a in zip(variables, values):
        n = a.nbytes
        v.assign(data[offset:offset + n].view(a.dtype).reshape(tuple(v.shape)))
        offset += n


def state_dict() -> Dict[str, object]:
    """The compressor state (residuals, momenta, step counters) of every gradient engine of this process,
    for checkpoints; restore with load_state_dict() after creating the same wrappers in the same order."""
    s = _runtime.state()
    return {"format": _STATE_FORMAT, "engines": [ref.save_state() for ref in s.order]}


def load_state_dict(state: Dict[str, Any]) -> None:
    if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
        raise StateError(f"gradex: not a {_STATE_FORMAT} state dict")
    refs = _runtime.state().order
    if len(state["engines"]) != len(refs):
        raise StateError(f"gradex: the state holds {len(state['engines'])} engines, this process has "
                         f"{len(refs)} (create the same wrappers before loading)")
    for ref, blob in zip(refs, state["engines"]):
        ref.load_state(blob)


def built_for() -> Optional[str]:
    """The TensorFlow version the op library was built against."""
    return _ops.built_for()


__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "engine", "stats",
           "describe_config",
           "allreduce", "broadcast", "broadcast_variables", "DistributedGradientTape", "state_dict",
           "load_state_dict", "built_for", "ConfigError", "CorruptError", "GradexError", "InternalError",
           "InvalidArgumentError", "MismatchError", "PeerError", "StateError", "TimeoutError",
           "TransportError", "VersionError", "AbortedError"]
