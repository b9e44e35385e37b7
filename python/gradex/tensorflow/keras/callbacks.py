"""Keras callbacks for gradex (Horovod's names).

    callbacks=[gxk.callbacks.BroadcastGlobalVariablesCallback(0), gxk.callbacks.MetricAverageCallback()]
"""
import keras
import tensorflow as tf

from ... import tensorflow as gxt
from .. import _exchange, _runtime


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of training, gives every rank root_rank's model variables (trainable and not) and, when
    the optimizer is built, its variables: differently initialised ranks start identical."""

    def __init__(self, root_rank=0):
        super().__init__()
        self.root_rank = int(root_rank)
        self._done = False

    def on_train_begin(self, logs=None):
        if self._done:
            return
        variables = list(self.model.variables)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and optimizer.built:
            variables += [v for v in optimizer.variables if v not in variables]
        gxt.broadcast_variables(variables, root_rank=self.root_rank)
        self._done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of every epoch, replaces each numeric entry of `logs` (loss, metrics, val_*) by its average
    over the ranks (exact fp32), in one exchange. Place it before callbacks that read the logs."""

    def on_epoch_end(self, epoch, logs=None):
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
