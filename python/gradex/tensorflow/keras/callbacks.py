"""Keras callbacks for gradex (Horovod's names).

    callbacks=[gxk.callbacks.BroadcastGlobalVariablesCallback(0), gxk.callbacks.MetricAverageCallback(),
               gxk.callbacks.LearningRateWarmupCallback(initial_lr=0.1 * gxt.size(), warmup_epochs=5)]

DiLoCo (no gradient exchange; an outer optimizer every `period` batches): callbacks=[gxk.callbacks.DiLoCoCallback(
period=32, fragments=4, delay=2)] with the model compiled with its plain optimizer (_diloco.py).

The training horizon of GRADEX_POLICY=auto (the default; GRADEX_POLICY_HORIZON_STEPS): model.fit knows how many
steps it will run (epochs x steps per epoch), so BroadcastGlobalVariablesCallback passes it to the engine of a
gxk.DistributedOptimizer at the first epoch of every fit, and TrainingHorizonCallback does only that.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import keras
import tensorflow as tf

from ... import _errors
from ... import tensorflow as gxt
from .. import _exchange, _runtime
from ._diloco import DiLoCoCallback  # noqa: F401  (gxk.callbacks.DiLoCoCallback)


def pass_training_horizon(model: object, params: Optional[Mapping[str, Optional[int]]],
                          first_epoch: int) -> Optional[int]:
    """Gives the engine of `model`'s gxk.DistributedOptimizer the steps this fit will still run,
    (epochs - first_epoch) x steps per epoch from model.fit's `params` (GRADEX_POLICY=auto's horizon rule,
    gradex_set_policy_horizon). Returns the steps passed, or None when the optimizer is not gradex's or
    model.fit does not know its steps per epoch (an unsized dataset without steps_per_epoch: never guessed).
    Every rank runs the same fit, so every rank passes the same number before its first step."""
    optimizer = getattr(model, "optimizer", None)
    ref = getattr(optimizer, "_gradex_ref", None)
    if ref is None:
        return None
    params = params or {}
    epochs, steps = params.get("epochs"), params.get("steps")
    if not epochs or not steps:
        _runtime.say_once("horizon-unknown",
                          "gradex: model.fit does not know its steps per epoch (pass steps_per_epoch=): the auto "
                          "policy runs without a training horizon", level=20)
        return None
    horizon = max(int(epochs) - int(first_epoch), 0) * int(steps)
    ref.engine.set_policy_horizon(horizon)
    return horizon


class _HorizonOnce:
    """Passes the training horizon at the first epoch of each model.fit (on_train_begin re-arms it)."""

    model: Any  # keras.callbacks.Callback's
    params: Any
    horizon_steps: Optional[int]

    def _horizon_arm(self) -> None:
        self._horizon_pending = True
        self.horizon_steps = None

    def _horizon_pass(self, epoch: int) -> None:
        if getattr(self, "_horizon_pending", False):
            self._horizon_pending = False
            self.horizon_steps = pass_training_horizon(self.model, self.params, epoch)


class TrainingHorizonCallback(_HorizonOnce, keras.callbacks.Callback):
    """Passes model.fit's remaining steps ((epochs - initial epoch) x steps per epoch) to the engine of the
    model's gxk.DistributedOptimizer as GRADEX_POLICY=auto's training horizon (GRADEX_POLICY_HORIZON_STEPS), at
    the first epoch of every fit. BroadcastGlobalVariablesCallback does the same; use this one without it."""

    def on_train_begin(self, logs: Optional[Dict[str, object]] = None) -> None:
        self._horizon_arm()

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, object]] = None) -> None:
        self._horizon_pass(epoch)


class BroadcastGlobalVariablesCallback(_HorizonOnce, keras.callbacks.Callback):
    """At the start of training, gives every rank root_rank's model variables (trainable and not) and, when
    the optimizer is built, its variables: differently initialised ranks start identical. It also passes
    model.fit's remaining steps to a gxk.DistributedOptimizer's engine as GRADEX_POLICY=auto's training
    horizon, as TrainingHorizonCallback does (`horizon=False`: not)."""

    def __init__(self, root_rank: int = 0, horizon: bool = True) -> None:
        super().__init__()
        self.root_rank = int(root_rank)
        self._done = False
        self._horizon = bool(horizon)

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, object]] = None) -> None:
        self._horizon_pass(epoch)

    def on_train_begin(self, logs: Optional[Dict[str, object]] = None) -> None:
        if self._horizon:
            self._horizon_arm()
        if self._done:
            return
        variables = list(self.model.variables)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and optimizer.built:
            # By identity: `in` would compare variables by value (elementwise ==).
            seen = {id(v) for v in variables}
            variables += [v for v in optimizer.variables if id(v) not in seen]
        gxt.broadcast_variables(variables, root_rank=self.root_rank)
        self._done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of every epoch, replaces each numeric entry of `logs` (loss, metrics, val_*) by its average
    over the ranks (exact fp32), in one exchange. Place it before callbacks that read the logs."""

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, object]] = None) -> None:
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if isinstance(v, (int, float)) or hasattr(v, "dtype"))
        if not names:
            return
        values = [tf.reshape(tf.cast(logs[k], tf.float32), []) for k in names]
        keys = [f"metric/{k}" for k in names]
        averaged = _exchange.exchange(values, keys, _runtime.state().collective)
        for k, v in zip(names, averaged):
            logs[k] = float(v.numpy())


class ScalarsCallback(keras.callbacks.Callback):
    """Writes gradex's scalars (bytes sent, compression, codec mix, exposed exchange time, plan changes over the
    last `every_n_steps` batches: gradex/_scalars.py) as TensorBoard summaries every `every_n_steps` batches, into
    `log_dir` (a tf.summary file writer of its own; Keras' TensorBoard callback may use the same directory) or a
    given `writer`. source: whose counters (a gxk.DistributedOptimizer, a DistributedGradientTape or an engine;
    default: the model's gxk.DistributedOptimizer, else init's gradient engine). Every rank counts its own: give
    rank 0 the callback, or each rank its own log_dir."""

    def __init__(self, log_dir: Optional[str] = None, every_n_steps: int = 50, source: object = None,
                 writer: Any = None) -> None:
        super().__init__()
        if (log_dir is None) == (writer is None):
            raise _errors.InvalidArgumentError("gradex: ScalarsCallback takes log_dir or writer (one of them)")
        if every_n_steps < 1:
            raise _errors.InvalidArgumentError(f"gradex: ScalarsCallback(every_n_steps={every_n_steps}) must be >= 1")
        from ... import _scalars
        self._writer = writer if writer is not None else tf.summary.create_file_writer(log_dir)
        self._every, self._source = every_n_steps, source
        self._window = _scalars.Window()
        self._step = 0

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, object]] = None) -> None:
        self._step += 1
        if self._step % self._every != 0:
            return
        source = self._source
        if source is None and getattr(getattr(self.model, "optimizer", None), "_gradex_ref", None) is not None:
            source = self.model.optimizer
        values = self._window.take(gxt.stats(source))
        if not values:
            return
        with self._writer.as_default():
            for tag, value in values.items():
                tf.summary.scalar(tag, value, step=self._step)
        self._writer.flush()


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Horovod's warm-up (Goyal et al., "Accurate, large minibatch SGD"): the learning rate rises linearly
    from initial_lr / size to initial_lr over the first `warmup_epochs` epochs, updated every batch
    (lr = initial_lr / size * (e * (size - 1) / warmup_epochs + 1) at fractional epoch e), then stays at
    initial_lr. `steps_per_epoch` defaults to what model.fit reports; unknown, the rate changes per epoch.

    momentum_correction: Horovod scales the optimizer's momentum by new_lr / old_lr for the batch where the
    rate changes, because a Keras velocity holds learning-rate-scaled steps. A momentum gradex owns (SGD
    wrapped by gxk.DistributedOptimizer) holds gradients, not steps, so it needs no correction; a Keras 3
    optimizer's own momentum is a constant of its traced step and cannot be changed per batch, so the
    correction is never applied (said once when it would have been)."""

    def __init__(self, initial_lr: float, warmup_epochs: float = 5, momentum_correction: bool = True,
                 steps_per_epoch: Optional[int] = None, verbose: int = 0) -> None:
        super().__init__()
        if float(initial_lr) <= 0:
            raise _errors.InvalidArgumentError(f"gradex: initial_lr must be > 0, got {initial_lr}")
        if float(warmup_epochs) <= 0:
            raise _errors.InvalidArgumentError(f"gradex: warmup_epochs must be > 0, got {warmup_epochs}")
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = float(warmup_epochs)
        self.momentum_correction = bool(momentum_correction)
        self.steps_per_epoch = steps_per_epoch
        self.verbose = int(verbose)
        self._epoch = 0
        self._done = False

    def learning_rate_at(self, epoch: float) -> float:
        """The rate at fractional epoch `epoch` (initial_lr once the warm-up is over)."""
        if epoch >= self.warmup_epochs:
            return self.initial_lr
        size = gxt.size()
        return self.initial_lr / size * (epoch * (size - 1) / self.warmup_epochs + 1)

    def _set(self, value: float) -> None:
        optimizer = self.model.optimizer
        lr = optimizer.learning_rate
        if not hasattr(lr, "assign"):
            raise _errors.InvalidArgumentError(
                "gradex: LearningRateWarmupCallback needs an optimizer with a plain learning rate, not a "
                "LearningRateSchedule")
        lr.assign(value)
        if self.momentum_correction and _own_momentum(optimizer) > 0 and value != self.initial_lr:
            _runtime.say_once("warmup-momentum",
                              "gradex: LearningRateWarmupCallback cannot apply momentum correction to a Keras 3 "
                              "optimizer's own momentum (a constant of its traced step); use SGD through "
                              "gxk.DistributedOptimizer, whose momentum gradex owns and which needs none")

    def _steps(self) -> Optional[int]:
        return self.steps_per_epoch or (self.params or {}).get("steps")

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, object]] = None) -> None:
        self._epoch = epoch
        if self._done:
            return
        if epoch >= self.warmup_epochs:
            self._set(self.initial_lr)
            self._done = True
            if self.verbose:
                print(f"Epoch {epoch + 1}: finished gradual learning rate warmup to {self.initial_lr:g}.")
        elif not self._steps():
            self._set(self.learning_rate_at(epoch))

    def on_train_batch_begin(self, batch: int, logs: Optional[Dict[str, object]] = None) -> None:
        steps = self._steps()
        if self._done or not steps:
            return
        self._set(self.learning_rate_at(self._epoch + batch / steps))


def _own_momentum(optimizer: object) -> float:
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    try:
        return float(getattr(inner, "momentum", 0) or 0)
    except (TypeError, ValueError):
        return 0.0
