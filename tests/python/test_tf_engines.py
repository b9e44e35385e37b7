"""Engines of gradex.tensorflow: cached by configuration (a tape built every step creates one engine),
engine= shares one explicitly, stats(source) reports that source's engine, and config= is checked at
construction (an unknown name or a bad value raises there, naming it)."""
import tf_ranks

_DENSE = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0"}


def _tapes(rank, world):
    import numpy as np
    import tensorflow as tf
    import gradex
    import gradex.tensorflow as gxt
    from gradex.tensorflow import _runtime

    gxt.init({"GRADEX_TIMEOUT_S": "60"})
    state = _runtime.state()
    created_at_init = state.engines_created
    w = tf.Variable(tf.zeros([5]), name="w")
    data = tf.constant(np.arange(5, dtype=np.float32) * (rank + 1))
    engines = set()
    grads = None
    for _ in range(100):  # a tape built every step, with a config of its own
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * data)
        tape = gxt.DistributedGradientTape(tape, config=dict(_DENSE))
        engines.add(id(tape.engine))
        grads = tape.gradient(loss, [w])
    created_by_tapes = state.engines_created - created_at_init
    default = gxt.DistributedGradientTape(tf.GradientTape())
    shared = gxt.engine(dict(_DENSE))
    explicit = gxt.DistributedGradientTape(tf.GradientTape(), engine=shared)
    out = {"created_by_tapes": created_by_tapes, "distinct_engines": len(engines),
           "grad": grads[0].numpy().tolist(),
           "engine_is_cached": shared is tape.engine and explicit.engine is shared,
           "default_is_init_engine": default.engine is state.gradients,
           "created_total": state.engines_created - created_at_init}

    # stats(source): the tape's engine ran 100 steps, the default engine none.
    out["tape_steps"] = gxt.stats(tape)["steps"]
    out["engine_steps"] = gxt.stats(shared)["steps"]
    out["default_steps"] = gxt.stats()["steps"]
    out["last_step_tensors"] = gxt.stats(tape, last_step=True)["tensors"]
    for bad in (object(), True):
        try:
            gxt.stats(bad)
            out[f"stats({type(bad).__name__})"] = "accepted"
        except gradex.InvalidArgumentError as exc:
            out[f"stats({type(bad).__name__})"] = str(exc)
    try:
        gxt.DistributedGradientTape(tf.GradientTape(), config=dict(_DENSE), engine=shared)
        out["both"] = "accepted"
    except gradex.InvalidArgumentError as exc:
        out["both"] = str(exc)
    gxt.shutdown()
    return out


def test_a_tape_built_every_step_creates_one_engine_and_stats_follow_the_source():
    out = tf_ranks.run("test_tf_engines:_tapes", 2, timeout=240)
    for o in out:
        assert o["created_by_tapes"] == 1, o
        assert o["created_total"] == 1, o  # gxt.engine() and engine= reuse it
        assert o["distinct_engines"] == 1, o
        assert o["engine_is_cached"] and o["default_is_init_engine"], o
        assert o["grad"] == [0.0, 1.5, 3.0, 4.5, 6.0], o  # the average of 1x and 2x
        assert o["tape_steps"] == o["engine_steps"] == 100, o
        assert o["default_steps"] == 0, o
        assert o["last_step_tensors"] == 1, o
        assert "not object" in o["stats(object)"], o
        assert "last_step by keyword" in o["stats(bool)"], o
        assert "config= or engine=, not both" in o["both"], o


def _bad_configs(rank, world):
    import keras
    import tensorflow as tf
    import gradex
    import gradex.tensorflow as gxt
    import gradex.tensorflow.keras as gxk
    from gradex.tensorflow import _runtime

    out = {}
    try:
        gxt.init({"GRADEX_SPARSTY": "0"})
        out["init"] = "accepted"
    except gradex.ConfigError as exc:
        out["init"] = str(exc)
    gxt.init()
    before = _runtime.state().engines_created
    attempts = {
        "tape_unknown": lambda: gxt.DistributedGradientTape(tf.GradientTape(), config={"GRADEX_SPARSTY": "0"}),
        "tape_bad_value": lambda: gxt.DistributedGradientTape(tf.GradientTape(), config={"GRADEX_SPARSITY": "2"}),
        "optimizer_unknown": lambda: gxk.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                              config={"GRADEX_BOGUS": "1"}),
        "engine_unknown": lambda: gxt.engine({"GRADEX_MOMENTUN": "0.9"}),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
            out[name] = "accepted"
        except gradex.ConfigError as exc:
            out[name] = str(exc)
    out["created"] = _runtime.state().engines_created - before
    gxt.shutdown()
    return out


def test_bad_config_keys_and_values_raise_at_construction():
    (o,) = tf_ranks.run("test_tf_engines:_bad_configs", 1, timeout=180)
    assert "GRADEX_SPARSTY" in o["init"], o
    assert "GRADEX_SPARSTY" in o["tape_unknown"], o
    assert "GRADEX_SPARSITY" in o["tape_bad_value"] and "range" in o["tape_bad_value"], o
    assert "GRADEX_BOGUS" in o["optimizer_unknown"], o
    assert "GRADEX_MOMENTUN" in o["engine_unknown"], o
    assert o["created"] == 0, o  # refused before any engine was created
