"""Momentum ownership follows the Keras optimizer: through gxk.DistributedOptimizer at sparsity 0 (dense, fp32
wire), AdamW equals AdamW on the exact average of the ranks' gradients (gradex adds no momentum even when
GRADEX_MOMENTUM is set), and SGD(momentum) equals SGD(momentum) on the exact average (gradex took the momentum
over: the optimizer runs without it, its config still says it). A raw tape adds no momentum unless
GRADEX_MOMENTUM is set, and says so once."""
import pytest

import tf_ranks

_DENSE = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0", "GRADEX_TIMEOUT_S": "60"}
_STEPS = 30


def _model(keras, seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(4)])
    return model


def _batch(np, step, rank):
    rng = np.random.default_rng(100 * step + rank)
    return rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal((6, 4)).astype(np.float32)


def _make(keras, kind, nesterov):
    if kind == "adamw":
        return keras.optimizers.AdamW(learning_rate=0.01, weight_decay=0.05)
    return keras.optimizers.SGD(learning_rate=0.05, momentum=0.9, nesterov=nesterov)


def _train(rank, world, kind, nesterov):
    import keras
    import numpy as np
    import tensorflow as tf
    import gradex.tensorflow as gxt
    import gradex.tensorflow.keras as gxk

    gxt.init()
    distributed = _model(keras, 7)
    reference = _model(keras, 7)
    opt = gxk.DistributedOptimizer(_make(keras, kind, nesterov), config=dict(_DENSE))
    plain = _make(keras, kind, nesterov)
    loss_fn = keras.losses.MeanSquaredError()

    def gradients(model, x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    for step in range(_STEPS):
        x, y = _batch(np, step, rank)
        opt.apply_gradients(zip(gradients(distributed, x, y), distributed.trainable_variables))
        # The reference sees every rank's batch and averages exactly (fp32, as the wire carries it).
        per_rank = [gradients(reference, *_batch(np, step, r)) for r in range(world)]
        mean = [tf.add_n([g[i] for g in per_rank]) / float(world) for i in range(len(per_rank[0]))]
        plain.apply_gradients(zip(mean, reference.trainable_variables))
    out = {"distributed": [v.numpy() for v in distributed.trainable_variables],
           "reference": [v.numpy() for v in reference.trainable_variables],
           "config_momentum": opt.get_config().get("momentum"),
           "running_momentum": getattr(opt, "momentum", None),
           "slots": len(opt.variables), "plain_slots": len(plain.variables),
           "engine_config": gxt.describe_config(opt)}
    gxt.shutdown()
    return out


def _setting(text, name):
    for line in text.splitlines():
        if line.strip().startswith(name + "="):
            return line.strip().split("=", 1)[1].split()[0]
    raise AssertionError(f"{name} not in the description:\n{text}")


def _assert_equivalent(out):
    import numpy as np
    for o in out:
        for got, want in zip(o["distributed"], o["reference"]):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    for a, b in zip(out[0]["distributed"], out[1]["distributed"]):
        np.testing.assert_array_equal(a, b)  # ranks stay bit-identical


def test_keras_adamw_through_gradex_is_adamw_on_the_exact_average():
    # GRADEX_MOMENTUM set explicitly in the environment: still no momentum for an Adam-family optimizer.
    out = tf_ranks.run("test_tf_momentum:_train", 2, env={"GRADEX_MOMENTUM": "0.9"}, args=("adamw", False),
                       timeout=300)
    _assert_equivalent(out)
    assert float(_setting(out[0]["engine_config"], "GRADEX_MOMENTUM")) == 0.0


@pytest.mark.parametrize("nesterov", [False, True])
def test_keras_sgd_momentum_through_gradex_is_sgd_momentum_on_the_exact_average(nesterov):
    out = tf_ranks.run("test_tf_momentum:_train", 2, args=("sgd", nesterov), timeout=300)
    _assert_equivalent(out)
    for o in out:
        assert float(_setting(o["engine_config"], "GRADEX_MOMENTUM")) == pytest.approx(0.9)
        assert _setting(o["engine_config"], "GRADEX_NESTEROV") in (("1", "true") if nesterov else ("0", "false"))
        assert o["running_momentum"] == 0.0 and o["config_momentum"] == pytest.approx(0.9), o
        assert o["slots"] < o["plain_slots"], o  # no optimizer momentum slots: gradex holds the velocity


def _raw_tape(rank, world):
    import logging

    import gradex.tensorflow as gxt

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("gradex").addHandler(Keep())
    logging.getLogger("gradex").setLevel(logging.INFO)
    import tensorflow as tf

    gxt.init()
    out = {"default": _setting(gxt.describe_config(), "GRADEX_MOMENTUM"),
           "explicit": _setting(gxt.describe_config(gxt.engine({"GRADEX_MOMENTUM": "0.5"})), "GRADEX_MOMENTUM"),
           "said_before": sum("adds no momentum" in r for r in records)}
    gxt.DistributedGradientTape(tf.GradientTape())  # a tape without GRADEX_MOMENTUM: said
    out["said"] = sum("adds no momentum" in r for r in records)
    gxt.engine({"GRADEX_SPARSITY": "0"})  # another engine without the optimizer: not said again
    out["said_after"] = sum("adds no momentum" in r for r in records)

    import keras
    import gradex.tensorflow.keras as gxk

    def decided(optimizer, **kwargs):
        wrapped = gxk.DistributedOptimizer(optimizer, **kwargs)
        return (float(_setting(gxt.describe_config(wrapped), "GRADEX_MOMENTUM")),
                float(getattr(wrapped, "momentum", -1.0)))

    # LocalSGD: the optimizer keeps its momentum; gradex adds none.
    out["localsgd"] = decided(keras.optimizers.SGD(0.1, momentum=0.9), local_sgd_period=2)
    # Optimizers with their own first moment: no gradex momentum even when GRADEX_MOMENTUM is set.
    out["first_moment"] = [decided(o, config={"GRADEX_MOMENTUM": "0.9"})[0] for o in (
        keras.optimizers.Adam(), keras.optimizers.Nadam(), keras.optimizers.Adamax(), keras.optimizers.Lion(),
        keras.optimizers.RMSprop(momentum=0.5), keras.optimizers.Adafactor())]
    # SGD without momentum: GRADEX_MOMENTUM when set, else none.
    out["plain_sgd"] = [decided(keras.optimizers.SGD(0.1))[0],
                        decided(keras.optimizers.SGD(0.1), config={"GRADEX_MOMENTUM": "0.8"})[0]]
    gxt.shutdown()
    return out


def test_momentum_decisions_raw_tape_localsgd_and_optimizer_families():
    (o,) = tf_ranks.run("test_tf_momentum:_raw_tape", 1, env={"GRADEX_MOMENTUM": None}, timeout=180)
    assert float(o["default"]) == 0.0 and float(o["explicit"]) == 0.5, o
    assert (o["said_before"], o["said"], o["said_after"]) == (0, 1, 1), o
    assert o["localsgd"] == (0.0, 0.9), o
    assert o["first_moment"] == [0.0] * 6, o
    assert o["plain_sgd"] == [0.0, 0.8], o
