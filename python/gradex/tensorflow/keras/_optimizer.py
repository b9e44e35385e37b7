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
import re
import sys
import warnings

import keras
import tensorflow as tf

from ... import _errors
from .. import _exchange, _runtime
from . import _legacy

_DEFAULT_MOMENTUM = 0.9  # base/config_vars.cc; used only when the engine's description cannot be read


def _gradex_momentum(ref):
    try:
        match = re.search(r"GRADEX_MOMENTUM\s*[=:]?\s*['\"]?([-+0-9.eE]+)", ref.engine.describe_config())
        if match:
            return float(match.group(1))
    except Exception:  # noqa: BLE001 - fall back to the documented default
        pass
    return _DEFAULT_MOMENTUM


def _warn_momentum(ref, optimizer):
    """The PyTorch plugin's rule: with GRADEX_MOMENTUM > 0 gradex applies DGC momentum correction itself,
    so an SGD optimizer with momentum applies momentum twice. Warns once per wrapper."""
    m = float(getattr(optimizer, "momentum", 0) or 0) if type(optimizer).__name__ == "SGD" else 0.0
    g = _gradex_momentum(ref)
    if m > 0 and g > 0:
        warnings.warn(
            f"gradex: GRADEX_MOMENTUM={g:g} means gradex applies DGC momentum correction itself, but "
            f"gxk.DistributedOptimizer wraps an SGD optimizer with momentum={m:g}: momentum is then applied "
            f"twice. Use SGD(momentum=0.0) with gradex, or set GRADEX_MOMENTUM=0 to keep the optimizer's "
            f"momentum (plain error-feedback top-k).", UserWarning, stacklevel=3)


def _inside_plain_loss_scale_optimizer():
    """True when a LossScaleOptimizer that is not ours is calling this wrapper's apply (model.compile
    wrapped it because the model's policy is mixed_float16): its finiteness check already ran locally."""
    frame = sys._getframe(1)  # noqa: SLF001 - a bounded walk up the caller frames, at trace time
    for _ in range(8):
        if frame is None:
            return False
        caller = frame.f_locals.get("self")
        if isinstance(caller, keras.optimizers.LossScaleOptimizer) and not isinstance(caller, _GradexMixin):
            return True
        frame = frame.f_back
    return False


class _GradexMixin:
    """What every gradex wrapper adds to a Keras optimizer class."""

    def _gradex_setup(self, ref, local_sgd):
        self._gradex_ref = ref
        self._gradex_local_sgd = local_sgd

    def _gradex_exchange(self, grads, trainable_variables):
        variables = list(trainable_variables)
        keys = _exchange.unique_keys("grad", [_exchange.variable_key(v) for v in variables])
        dense = [_exchange.dense(g, v, k) for g, v, k in zip(grads, variables, keys)]
        return _exchange.exchange(dense, keys, self._gradex_ref)

    def _gradex_end_step(self, trainable_variables, after):
        ref = self._gradex_ref
        with tf.control_dependencies(after):
            average_now = _exchange.end_step(ref)
        if not self._gradex_local_sgd:
            return
        variables = list(trainable_variables)
        keys = _exchange.unique_keys("param", [_exchange.variable_key(v) for v in variables])

        def average():
            values = _exchange.exchange([tf.convert_to_tensor(v) for v in variables], keys, ref, parameters=True)
            for v, value in zip(variables, values):
                v.assign(value)
            return tf.constant(True)

        tf.cond(average_now, average, lambda: tf.constant(False))

    def _gradex_variables(self, trainable_variables):
        if trainable_variables is not None:
            return list(trainable_variables)
        return list(self._trainable_variables)

    @property
    def gradex_engine(self):
        return self._gradex_ref.engine

    def gradex_state(self):
        """This wrapper's compressor state (bytes) for checkpoints."""
        return self._gradex_ref.engine.save_state()

    def load_gradex_state(self, blob):
        self._gradex_ref.engine.load_state(blob)


class _DistributedApply(_GradexMixin):
    def apply(self, grads, trainable_variables=None):
        if _inside_plain_loss_scale_optimizer():
            raise _errors.InvalidArgumentError(
                "gradex: model.compile wrapped gxk.DistributedOptimizer in a LossScaleOptimizer (mixed_float16), "
                "whose local Inf/NaN check would run before the exchange and could leave ranks waiting for "
                "each other. Call keras.mixed_precision.set_global_policy('mixed_float16') before creating "
                "gxk.DistributedOptimizer, or pass it a keras.optimizers.LossScaleOptimizer")
        variables = self._gradex_variables(trainable_variables)
        averaged = self._gradex_exchange(list(grads), variables)
        result = super().apply(averaged, trainable_variables)
        self._gradex_end_step(variables, [tf.convert_to_tensor(v) for v in variables])
        return result


class _DistributedLossScaleApply(_GradexMixin):
    def apply(self, grads, trainable_variables=None):
        variables = self._gradex_variables(trainable_variables)
        averaged = self._gradex_exchange(list(grads), variables)  # scaled: the check below sees averages
        result = super().apply(averaged, trainable_variables)
        self._gradex_end_step(variables, [tf.convert_to_tensor(v) for v in variables])
        return result


_classes = {}


def _subclass(base, mixin):
    key = (base, mixin)
    if key not in _classes:
        _classes[key] = type(f"Distributed{base.__name__}", (mixin, base), {"__module__": __name__})
    return _classes[key]


def DistributedOptimizer(optimizer, config=None, local_sgd_period=0, local_sgd_warmup_steps=0):  # noqa: N802
    """Wraps a Keras 3 optimizer (Horovod's name). `config`: GRADEX_* overrides for an engine of its own
    (default: gxt.init()'s gradient engine). `local_sgd_period` H > 0: LocalSGD — after
    `local_sgd_warmup_steps` synchronous steps, gradients stay local and trainable variables are averaged
    every H steps (an engine of its own). Call gxt.init() first; compile with jit_compile=False."""
    if isinstance(optimizer, _GradexMixin) or getattr(optimizer, "_gradex_legacy", False):
        raise _errors.InvalidArgumentError("gradex: the optimizer is already a gxk.DistributedOptimizer")
    legacy = _legacy.is_legacy_optimizer(optimizer)
    if not legacy and not isinstance(optimizer, keras.optimizers.Optimizer):
        raise _errors.InvalidArgumentError(
            f"gradex: gxk.DistributedOptimizer wraps Keras 3 (or tf-keras) optimizers, not "
            f"{type(optimizer).__name__}")
    if legacy and int(local_sgd_period) > 0:
        raise _errors.InvalidArgumentError("gradex: LocalSGD is offered for Keras 3 optimizers only")
    merged = dict(config or {})
    local_sgd = int(local_sgd_period) > 0
    if local_sgd:
        merged.update(GRADEX_LOCALSGD_PERIOD=int(local_sgd_period),
                      GRADEX_LOCALSGD_WARMUP_STEPS=int(local_sgd_warmup_steps))
    elif int(local_sgd_period) < 0:
        raise _errors.ConfigError(f"gradex: local_sgd_period must be >= 0, got {local_sgd_period}")
    ref = _runtime.gradient_engine(merged or None)
    if legacy:
        _warn_momentum(ref, optimizer)
        return _legacy.wrap(optimizer, ref, local_sgd)

    loss_scale = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    if not loss_scale and keras.config.dtype_policy().name == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        loss_scale = True
    if loss_scale:
        inner = optimizer.inner_optimizer
        _warn_momentum(ref, inner)
        cls = _subclass(type(optimizer), _DistributedLossScaleApply)
        wrapped = cls(inner, initial_scale=optimizer.initial_scale,
                      dynamic_growth_steps=optimizer.dynamic_growth_steps, name=optimizer.name)
    else:
        _warn_momentum(ref, optimizer)
        cls = _subclass(type(optimizer), _DistributedApply)
        wrapped = cls.from_config(optimizer.get_config())
    wrapped._gradex_setup(ref, local_sgd)
    return wrapped
