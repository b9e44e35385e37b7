"""gradex for Keras 3 (TensorFlow backend), with Horovod's names.

    import gradex.tensorflow as gxt
    import gradex.tensorflow.keras as gxk
    gxt.init()
    opt = gxk.DistributedOptimizer(keras.optimizers.SGD(0.05))
    model.compile(optimizer=opt, loss=..., jit_compile=False)
    model.fit(x, y, callbacks=[gxk.callbacks.BroadcastGlobalVariablesCallback(0),
                               gxk.callbacks.MetricAverageCallback()])

LocalSGD: gxk.DistributedOptimizer(opt, local_sgd_period=4, local_sgd_warmup_steps=100). Compressor state
for checkpoints: gxt.state_dict() / gxt.load_state_dict(). See docs/tensorflow.md.
"""
from . import callbacks
from ._optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer", "callbacks"]
