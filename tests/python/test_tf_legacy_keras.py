"""tf-keras 2.21 (TF_USE_LEGACY_KERAS=1, installed --no-deps beside Keras 3): gxk.DistributedOptimizer
exchanges through aggregate_gradients, which tf-keras's LossScaleOptimizer calls before its Inf/NaN check:
with mixed_float16 and an Inf on one rank, every rank skips the step and the weights stay identical."""
import hashlib

import numpy as np

import tf_ranks


def _legacy_mixed(rank, world, steps, bad_step):
    import tensorflow as tf
    import gradex.tensorflow as gxt
    import gradex.tensorflow.keras as gxk
    import tf_keras_models as data

    assert tf.keras.__name__.startswith("tf_keras"), tf.keras.__name__
    gxt.init()
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    x, y, _, _ = data.digits(rank, world)
    x, y = x[: 16 * steps].copy(), y[: 16 * steps]
    if rank == 1:
        x[16 * bad_step] = 1e5  # Inf in float16 on this rank only
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu", input_shape=(64,)),
                                 tf.keras.layers.Dense(10)])
    opt = gxk.DistributedOptimizer(tf.keras.optimizers.SGD(0.05))
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    lso = model.optimizer
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).tobytes())
    out = {"lso": type(lso).__name__, "inner": type(lso.inner_optimizer).__name__,
           "scale": float(tf.convert_to_tensor(lso.loss_scale).numpy()), "final": h.hexdigest(),
           "finite": bool(all(np.isfinite(w).all() for w in model.get_weights())),
           "tensors": opt.gradex_engine.stats()["tensors"], "steps": opt.gradex_engine.stats()["steps"]}
    gxt.shutdown()
    return out


def test_tf_keras_loss_scale_exchanges_before_the_finiteness_check():
    results = tf_ranks.run("test_tf_legacy_keras:_legacy_mixed", 2, args=(8, 3),
                           env={"TF_USE_LEGACY_KERAS": "1", "GRADEX_TIMEOUT_S": "30", "GRADEX_SPARSITY": "0"})
    for r in results:
        assert r["lso"].startswith("LossScaleOptimizer") and r["inner"] == "DistributedSGD", r
        assert r["finite"] and r["steps"] == 8 and r["tensors"] == 8 * 4, r
    assert results[0]["final"] == results[1]["final"]
    assert results[0]["scale"] == results[1]["scale"] < 2.0**15  # halved at least once, the same everywhere
