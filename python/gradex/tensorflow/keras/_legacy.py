"""tf-keras 2.21 (Keras 2, selected with TF_USE_LEGACY_KERAS=1): the wrapper overrides the optimizer's
`aggregate_gradients`, the hook tf-keras provides for cross-replica aggregation.

tf-keras's optimizer calls it from apply_gradients, and its LossScaleOptimizer calls the inner optimizer's
aggregate_gradients before its Inf/NaN check ("so that any NaN or Inf gradients are propagated to each
replica"), so `LossScaleOptimizer(gxk.DistributedOptimizer(opt))` (what compile() builds for a
mixed_float16 model) exchanges first and every rank skips together. tf-keras drops None gradients before
aggregating: a variable must lack a gradient on every rank or on none (true whenever ranks run the same
model). LocalSGD is not offered on this path.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Tuple

import tensorflow as tf

from ... import _errors
from .. import _exchange, _runtime
from . import _wrapper


def is_legacy_optimizer(optimizer: object) -> bool:
    try:
        import tf_keras
    except ImportError:
        return False
    return isinstance(optimizer, tf_keras.optimizers.Optimizer)


class _LegacyMixin(_wrapper.WrapperAccessors):
    _gradex_legacy = True

    def _gradex_setup(self, ref: _runtime.Engine, local_sgd: bool) -> None:
        if local_sgd:
            raise _errors.InvalidArgumentError("gradex: LocalSGD is offered for Keras 3 optimizers only")
        self._gradex_ref = ref
        self._gradex_local_sgd = False

    def aggregate_gradients(self, grads_and_vars: Iterable[Tuple[Any, Any]]) -> List[Tuple[Any, Any]]:
        pairs = list(grads_and_vars)
        if not pairs:
            return pairs
        variables = [v for _, v in pairs]
        keys = _exchange.unique_keys("grad", [_exchange.variable_key(v) for v in variables])
        dense = [_exchange.dense(g, v, k) for (g, v), k in zip(pairs, keys)]
        averaged = _exchange.exchange(dense, keys, self._gradex_ref)
        with tf.control_dependencies(averaged):
            _exchange.end_step(self._gradex_ref)
        return list(zip(averaged, variables))


_classes: Dict[type, Any] = {}


def wrap(optimizer: Any, ref: _runtime.Engine, local_sgd: bool) -> Any:
    base = type(optimizer)
    if base not in _classes:
        _classes[base] = type(f"Distributed{base.__name__}", (_LegacyMixin, base), {"__module__": __name__})
    wrapped = _classes[base].from_config(optimizer.get_config())
    wrapped._gradex_setup(ref, local_sgd)
    return wrapped
