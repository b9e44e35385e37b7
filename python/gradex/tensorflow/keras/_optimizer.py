"""Keras 3 DistributedOptimizer: gradients are averaged through gradex inside the optimizer's `apply`
(which Keras's TF trainer calls from model.fit, and apply_gradients calls too).

The wrapper is an instance of a subclass of the wrapped optimizer's class, built from its config, so
Keras sees the same optimizer (serialization, learning-rate schedules, `iterations`). Its `apply`:
  1. exchanges every gradient in one grouped op, each under its variable's path (None -> zeros,
     IndexedSlices -> dense), so every rank submits the same keys;
  2. applies the averages with the wrapped class's `apply`;
  3. ends the engine's step and, with LocalSGD, averages the trainable variables when the engine says so.

mixed_float16: Keras's LossScaleOptimizer checks the gradients for Inf/NaN on each rank before calling the
inner optimizer; a rank that skips would leave the others waiting in the exchange. So the exchange must
come first: given a LossScaleOptimizer, or created while the global dtype policy is mixed_float16, the
wrapper is a LossScaleOptimizer subclass that exchanges the scaled gradients and then runs the check on
the averages (identical on every rank: an Inf anywhere makes every rank skip).
"""
from __future__ import annotations

import sys
from types import FrameType
from typing import Any, Dict, List, Optional, Sequence, Tuple

import keras
import tensorflow as tf

from ... import _capi, _errors
from .. import _exchange, _runtime
from . import _legacy, _momentum, _wrapper

def _inside_plain_loss_scale_optimizer() -> bool:
    """True when a LossScaleOptimizer that is not ours is calling this wrapper's apply (model.compile
    wrapped it because the model's policy is mixed_float16): its finiteness check already ran locally."""
    frame: Optional[FrameType] = sys._getframe(1)  # noqa: SLF001 - a bounded walk up the caller frames, at trace time
    for _ in range(8):
        if frame is None:
            return False
        caller = frame.f_locals.get("self")
        if isinstance(caller, keras.optimizers.LossScaleOptimizer) and not isinstance(caller, _GradexMixin):
            return True
        frame = frame.f_back
    return False


class _GradexMixin(_wrapper.WrapperAccessors):
    """What every gradex wrapper adds to a Keras optimizer class."""

    def _gradex_setup(self, ref: _runtime.Engine, local_sgd: bool) -> None:
        self._gradex_ref = ref
        self._gradex_local_sgd = local_sgd

    def _gradex_exchange(self, grads: Sequence[Any], trainable_variables: Sequence[Any]) -> List[Any]:
        variables = list(trainable_variables)
        keys = _exchange.unique_keys("grad", [_exchange.variable_key(v) for v in variables])
        dense = [_exchange.dense(g, v, k) for g, v, k in zip(grads, variables, keys)]
        return _exchange.exchange(dense, keys, self._gradex_ref)

    def _gradex_end_step(self, trainable_variables: Sequence[Any], after: Sequence[Any]) -> None:
        ref = self._gradex_ref
        with tf.control_dependencies(after):
            average_now = _exchange.end_step(ref)
        if not self._gradex_local_sgd:
            return
        variables = list(trainable_variables)
        keys = _exchange.unique_keys("param", [_exchange.variable_key(v) for v in variables])

        def average() -> Any:
            values = _exchange.exchange([tf.convert_to_tensor(v) for v in variables], keys, ref, parameters=True)
            for v, value in zip(variables, values):
                v.assign(value)
            return tf.constant(True)

        tf.cond(average_now, average, lambda: tf.constant(False))

    def _gradex_variables(self, trainable_variables: Optional[Sequence[Any]]) -> List[Any]:
        if trainable_variables is not None:
            return list(trainable_variables)
        return list(self._trainable_variables)  # type: ignore[attr-defined]  # the Keras optimizer's


class _DistributedApply(_GradexMixin):
    def apply(self, grads: Sequence[Any], trainable_variables: Optional[Sequence[Any]] = None) -> Any:
        if _inside_plain_loss_scale_optimizer():
            raise _errors.InvalidArgumentError(
                "gradex: model.compile wrapped gxk.DistributedOptimizer in a LossScaleOptimizer (mixed_float16), "
                "whose local Inf/NaN check would run before the exchange and could leave ranks waiting for "
                "each other. Call keras.mixed_precision.set_global_policy('mixed_float16') before creating "
                "gxk.DistributedOptimizer, or pass it a keras.optimizers.LossScaleOptimizer")
        variables = self._gradex_variables(trainable_variables)
        averaged = self._gradex_exchange(list(grads), variables)
        result = super().apply(averaged, trainable_variables)  # type: ignore[misc]  # the optimizer's
        self._gradex_end_step(variables, [tf.convert_to_tensor(v) for v in variables])
        return result


class _DistributedLossScaleApply(_GradexMixin):
    def apply(self, grads: Sequence[Any], trainable_variables: Optional[Sequence[Any]] = None) -> Any:
        variables = self._gradex_variables(trainable_variables)
        averaged = self._gradex_exchange(list(grads), variables)  # scaled: the check below sees averages
        result = super().apply(averaged, trainable_variables)  # type: ignore[misc]  # the optimizer's
        self._gradex_end_step(variables, [tf.convert_to_tensor(v) for v in variables])
        return result


_classes: Dict[Tuple[type, type], Any] = {}


def _subclass(base: type, mixin: type) -> Any:
    key = (base, mixin)
    if key not in _classes:
        _classes[key] = type(f"Distributed{base.__name__}", (mixin, base), {"__module__": __name__})
    return _classes[key]


def _take_over_momentum(optimizer: Any, momentum: float) -> None:
    """Runs `optimizer` (not built yet) without its momentum, which gradex now owns."""
    optimizer.momentum = 0.0
    optimizer._gradex_owned_momentum = momentum


def DistributedOptimizer(optimizer: Any, config: _capi.Config = None, local_sgd_period: int = 0,  # noqa: N802
                         local_sgd_warmup_steps: int = 0, engine: Optional[_runtime.Engine] = None) -> Any:
    """Wraps a Keras 3 (or tf-keras) optimizer (Horovod's name). Momentum follows the optimizer
    (keras/_momentum.py): gradex takes SGD's momentum over and adds none to Adam-family optimizers.
    `config`: GRADEX_* overrides; the engine for the resulting configuration is created once and shared by
    wrappers with an equal one. `engine`: an engine from gxt.engine() to use as it is (then momentum is as that
    engine was configured). `local_sgd_period` H > 0: LocalSGD — after `local_sgd_warmup_steps` synchronous
    steps, gradients stay local and trainable variables are averaged every H steps; the optimizer keeps its
    momentum. Call gxt.init() first; compile with jit_compile=False."""
    if isinstance(optimizer, _GradexMixin) or getattr(optimizer, "_gradex_legacy", False):
        raise _errors.InvalidArgumentError("gradex: the optimizer is already a gxk.DistributedOptimizer")
    legacy = _legacy.is_legacy_optimizer(optimizer)
    if not legacy and not isinstance(optimizer, keras.optimizers.Optimizer):
        raise _errors.InvalidArgumentError(
            f"gradex: gxk.DistributedOptimizer wraps Keras 3 (or tf-keras) optimizers, not "
            f"{type(optimizer).__name__}")
    if legacy and int(local_sgd_period) > 0:
        raise _errors.InvalidArgumentError("gradex: LocalSGD is offered for Keras 3 optimizers only")
    if int(local_sgd_period) < 0:
        raise _errors.ConfigError(f"gradex: local_sgd_period must be >= 0, got {local_sgd_period}")
    local_sgd = int(local_sgd_period) > 0
    if engine is not None and (config or local_sgd):
        raise _errors.InvalidArgumentError("gradex: give gxk.DistributedOptimizer engine= or config=/local_sgd_*, "
                                           "not both")
    loss_scale = not legacy and isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    inner = optimizer.inner_optimizer if loss_scale else optimizer
    owned = 0.0
    if engine is not None:
        ref = _runtime.engine_for(None, engine, "gxk.DistributedOptimizer")
        m = _momentum.optimizer_momentum(inner) if _momentum.is_sgd(inner) else 0.0
        if m > 0 and float(ref.config.get("GRADEX_MOMENTUM", "0")) > 0:
            _runtime.say_once(("engine-double", id(ref)),
                              f"gradex: engine= applies GRADEX_MOMENTUM={ref.config['GRADEX_MOMENTUM']} and the "
                              f"wrapped {type(inner).__name__} has momentum={m:g}: momentum is applied twice "
                              f"(pass config= instead, and gradex takes the optimizer's momentum over)")
    else:
        _runtime.check_config(config)
        merged = _runtime.normalized(config)
        if local_sgd:
            merged.update(GRADEX_LOCALSGD_PERIOD=str(int(local_sgd_period)),
                          GRADEX_LOCALSGD_WARMUP_STEPS=str(int(local_sgd_warmup_steps)))
        settings, owned = _momentum.decide(inner, config, local_sgd)
        merged.update(settings)
        ref = _runtime.gradient_engine(merged)
    if legacy:
        wrapped = _legacy.wrap(optimizer, ref, local_sgd)
        if owned:
            _take_over_momentum(wrapped, owned)
        return wrapped

    if not loss_scale and keras.config.dtype_policy().name == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        loss_scale = True
    if loss_scale:
        if owned:  # a copy of the user's inner optimizer, so theirs keeps its momentum
            inner = _subclass(type(inner), _wrapper.OwnedMomentumConfig).from_config(inner.get_config())
            _take_over_momentum(inner, owned)
        cls = _subclass(type(optimizer), _DistributedLossScaleApply)
        wrapped = cls(inner, initial_scale=optimizer.initial_scale,
                      dynamic_growth_steps=optimizer.dynamic_growth_steps, name=optimizer.name)
    else:
        cls = _subclass(type(optimizer), _DistributedApply)
        wrapped = cls.from_config(optimizer.get_config())
        if owned:
            _take_over_momentum(wrapped, owned)
    wrapped._gradex_setup(ref, local_sgd)
    return wrapped
