"""gxk.callbacks on real ranks: BroadcastGlobalVariablesCallback gives every rank root's model and optimizer
variables (collected by identity: comparing variables by value would evaluate tensors elementwise), and LearningRateWarmupCallback follows Horovod's
schedule batch by batch."""
import numpy as np

import tf_ranks


def _broadcast(rank, world):
    import keras
    import gradex.tensorflow as gxt
    import gradex.tensorflow.keras as gxk

    gxt.init({"GRADEX_TIMEOUT_S": "60"})
    keras.utils.set_random_seed(10 + rank)  # different weights on every rank
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    opt = gxk.DistributedOptimizer(keras.optimizers.Adam(0.01))
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    opt.build(model.trainable_variables)
    # Rank-dependent optimizer state (a built optimizer: `v in list` would compare these elementwise).
    for i, v in enumerate(opt.variables):
        if len(v.shape) and v.dtype == "float32":
            v.assign(np.full(v.shape, rank + i, np.float32))
    callback = gxk.callbacks.BroadcastGlobalVariablesCallback(0)
    callback.set_model(model)
    callback.on_train_begin()
    out = {"model": [v.numpy() for v in model.variables], "optimizer": [np.asarray(v) for v in opt.variables]}
    gxt.shutdown()
    return out


def test_broadcast_callback_gives_every_rank_root_model_and_optimizer_variables():
    out = tf_ranks.run("test_tf_callbacks:_broadcast", 2, timeout=180)
    assert len(out[0]["optimizer"]) > 2
    for a, b in zip(out[0]["model"] + out[0]["optimizer"], out[1]["model"] + out[1]["optimizer"]):
        np.testing.assert_array_equal(a, b)


def _warmup(rank, world):
    import keras
    import gradex.tensorflow as gxt
    import gradex.tensorflow.keras as gxk

    gxt.init({"GRADEX_TIMEOUT_S": "60"})
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    opt = gxk.DistributedOptimizer(keras.optimizers.SGD(0.05), config={"GRADEX_SPARSITY": "0"})
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(self.model.optimizer.learning_rate.numpy()))

    x = np.ones((16, 2), np.float32)
    y = np.ones((16, 1), np.float32)
    model.fit(x, y, batch_size=4, epochs=3, verbose=0,
              callbacks=[gxk.callbacks.LearningRateWarmupCallback(initial_lr=0.2, warmup_epochs=2), Record()])
    gxt.shutdown()
    return seen


def test_learning_rate_warmup_follows_horovods_schedule():
    out = tf_ranks.run("test_tf_callbacks:_warmup", 2, timeout=180)
    # 4 batches per epoch, 2 ranks: 0.2 / 2 * (e * (2 - 1) / 2 + 1) at fractional epoch e, then 0.2.
    want = [0.1 * (e / 2 + 1) for e in (0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75)] + [0.2] * 4
    for seen in out:
        np.testing.assert_allclose(seen, want, rtol=1e-6)


def _horizon(rank, world):
    import keras
    import gradex.tensorflow as gxt
    import gradex.tensorflow.keras as gxk

    gxt.init({"GRADEX_TIMEOUT_S": "60"})
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    opt = gxk.DistributedOptimizer(keras.optimizers.SGD(0.05), config={"GRADEX_POLICY": "auto"})
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    x = np.ones((16, 2), np.float32)
    y = np.ones((16, 1), np.float32)
    broadcast = gxk.callbacks.BroadcastGlobalVariablesCallback(0)
    model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[broadcast])
    first = gxt.explain(opt)
    # A second fit resuming at epoch 3 of 5: 2 more epochs of 4 steps from exchange step 12.
    horizon = gxk.callbacks.TrainingHorizonCallback()
    model.fit(x, y, batch_size=4, epochs=5, initial_epoch=3, verbose=0, callbacks=[horizon])
    second = gxt.explain(opt)
    gxt.shutdown()
    return {"first": first, "second": second, "passed": [broadcast.horizon_steps, horizon.horizon_steps]}


def test_fit_passes_its_training_horizon_to_the_auto_policy():
    out = tf_ranks.run("test_tf_callbacks:_horizon", 2, timeout=180)
    for r in out:
        assert r["passed"] == [12, 8], r
        # The engine received it (gradex_set_policy_horizon): absolute from the step it was set at.
        assert "training horizon 12 steps" in r["first"].splitlines()[0], r["first"]
        assert "training horizon 20 steps" in r["second"].splitlines()[0], r["second"]
