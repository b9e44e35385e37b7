"""Graph-level wrappers of the ops: grouped gradient exchange, allreduce, broadcast, end of step.

Every wrapper works eagerly and inside tf.function. Tensors are matched across ranks by key: gradients by
their variable's path, other tensors by a name (given, or numbered per traced graph in creation order, which
is the same on every rank that traces the same code). Eager failures raise gradex exceptions; inside a graph
they surface as tf.errors with the engine's message ("gradex[TIMEOUT]: ...").
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence

import tensorflow as tf

from .. import _errors
from . import _ops

if TYPE_CHECKING:
    from ._runtime import Engine

EXCHANGED_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


def _in_xla_context() -> bool:
    try:
        from tensorflow.python.framework import ops as tf_ops
        from tensorflow.python.ops import control_flow_util
        return bool(control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph()))
    except Exception:  # noqa: BLE001 - private TF API; without it XLA reports the op itself
        return False


def check_not_xla() -> None:
    if _in_xla_context():
        raise _errors.InvalidArgumentError(
            "gradex: its exchange ops are custom ops, which XLA cannot compile: pass jit_compile=False to "
            "model.compile(...) or tf.function(...) (Keras's jit_compile='auto' turns XLA on when a GPU is "
            "present)")


@contextlib.contextmanager
def gradex_errors() -> Iterator[None]:
    """Turns TF errors raised by gradex ops (eager execution) into gradex exceptions."""
    try:
        yield
    except tf.errors.OpError as exc:
        translated = _errors.translate_op_error(exc)
        if translated is exc:
            raise
        raise translated from None


def variable_key(variable: object) -> str:
    """A variable's name that is the same on every rank: Keras 3's path, else the TF variable name."""
    path = getattr(variable, "path", None)
    if path:
        return str(path)
    name = getattr(variable, "name", None)
    if name:
        return str(name).split(":")[0]
    raise _errors.InvalidArgumentError(f"gradex: cannot name {variable!r}; pass keys explicitly")


def unique_keys(prefix: str, names: Sequence[str]) -> List[str]:
    """`prefix/name` for each name; repeated names get '#<position>' so keys stay unique and stable."""
    seen: Dict[str, int] = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
    return [f"{prefix}/{name}" if seen[name] == 1 else f"{prefix}/{name}#{i}" for i, name in enumerate(names)]


def graph_key(kind: str, name: Optional[str], tensor: tf.Tensor) -> str:
    """Key of a named or anonymous allreduce/broadcast: includes dtype and size, so one name can carry
    tensors of several shapes in turn."""
    if name is None:
        if tf.executing_eagerly():
            name = "eager"
        else:
            graph = tf.compat.v1.get_default_graph()
            n = getattr(graph, "_gradex_counter", 0)
            graph._gradex_counter = n + 1  # noqa: SLF001 - per-graph numbering, same on every rank
            name = f"auto{n}"
    numel = tensor.shape.num_elements()
    size = numel if numel is not None else "dyn"
    return f"{kind}/{name}/{tensor.dtype.name}/{size}"


def dense(value: Any, variable: Any = None, key: str = "") -> tf.Tensor:
    """A gradient as a dense tensor: None -> zeros of the variable (every rank submits every key);
    IndexedSlices (embeddings) -> densified."""
    if value is None:
        if variable is None:
            raise _errors.InvalidArgumentError(f"gradex: gradient '{key}' is None and has no variable")
        return tf.zeros_like(tf.convert_to_tensor(variable))
    if isinstance(value, tf.IndexedSlices):
        return tf.convert_to_tensor(value)
    return tf.convert_to_tensor(value)


def exchange(tensors: Sequence[tf.Tensor], keys: Sequence[str], ref: Engine,
             parameters: bool = False) -> List[tf.Tensor]:
    """Averages each tensor over the ranks under its key through engine `ref` (one grouped op)."""
    if not tensors:
        return []
    check_not_xla()
    if len(set(keys)) != len(keys):
        raise _errors.InvalidArgumentError("gradex: duplicate tensor keys in one exchange")
    for key, t in zip(keys, tensors):
        if t.dtype not in EXCHANGED_DTYPES:
            raise _errors.InvalidArgumentError(
                f"gradex: tensor '{key}' has dtype {t.dtype.name}; gradex exchanges float32, float16 and "
                f"bfloat16")
    with gradex_errors():
        return list(_ops.load().gradex_exchange(tensors, keys=list(keys), engine=ref.slot,
                                                parameters=bool(parameters)))


def broadcast(tensor: tf.Tensor, key: str, root_rank: int, ref: Engine) -> tf.Tensor:
    check_not_xla()
    with gradex_errors():
        return _ops.load().gradex_broadcast(tensor, key=key, root_rank=int(root_rank), engine=ref.slot)


def end_step(ref: Engine) -> tf.Tensor:
    """Ends the engine's step; a bool tensor, true when LocalSGD says to average parameters now."""
    with gradex_errors():
        return _ops.load().gradex_end_step(engine=ref.slot)
