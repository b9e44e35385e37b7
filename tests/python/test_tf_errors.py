"""gradex.tensorflow's failure paths on real processes: a bad GRADEX_* value raises at gxt.init(); an op
library built for another TF is refused with a clear message; jit_compile=True gets a clear error; a
DistributedOptimizer that model.compile wrapped in a LossScaleOptimizer is refused; compressor state
round-trips; a killed peer raises within GRADEX_TIMEOUT_S instead of hanging."""
import time

import tf_ranks


def _single_process_errors(rank, world, fake_library):
    import os

    import keras
    import numpy as np
    import tensorflow as tf
    import gradex
    import gradex.tensorflow as gxt
    import gradex.tensorflow.keras as gxk
    import tf_keras_models as data

    out = {}
    # An op library recorded as built for another TensorFlow is refused before it is loaded.
    os.environ["GRADEX_TF_OPS_LIBRARY"] = fake_library
    try:
        gxt.init()
        out["version"] = None
    except ImportError as exc:
        out["version"] = str(exc)
    del os.environ["GRADEX_TF_OPS_LIBRARY"]

    os.environ["GRADEX_SPARSITY"] = "1.5"
    try:
        gxt.init()
        out["config"] = None
    except gradex.ConfigError as exc:
        out["config"] = str(exc)
    out["initialized_after_failure"] = gxt.is_initialized()
    os.environ["GRADEX_SPARSITY"] = "0.99"
    gxt.init()

    x, y, _, _ = data.digits(0, 1)
    x, y = x[:64], y[:64]
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model = data.mlp(seed=0)
    model.compile(optimizer=gxk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=loss, jit_compile=True)
    try:
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
        out["jit"] = None
    except Exception as exc:  # noqa: BLE001 - whatever Keras wraps it in, the message must say what to do
        out["jit"] = f"{type(exc).__name__}: {exc}"

    # A plain DistributedOptimizer inside a LossScaleOptimizer (what model.compile does for a mixed_float16
    # model): the local finiteness check would run before the exchange.
    mixed = data.mlp(seed=0)
    lso = keras.optimizers.LossScaleOptimizer(gxk.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    mixed.compile(optimizer=lso, loss=loss, jit_compile=False)
    try:
        mixed.fit(x, y, batch_size=32, epochs=1, verbose=0)
        out["wrapped"] = None
    except gradex.InvalidArgumentError as exc:
        out["wrapped"] = str(exc)

    # Momentum is never applied twice: SGD(momentum) hands it to gradex (GRADEX_MOMENTUM set or not); an
    # explicit GRADEX_MOMENTUM=0 leaves it with the optimizer.
    taken = gxk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), config={"GRADEX_MOMENTUM": "0.9"})
    kept = gxk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), config={"GRADEX_MOMENTUM": "0"})
    out["momentum"] = [(o.momentum, o.get_config()["momentum"],
                        gxt.describe_config(o).split("GRADEX_MOMENTUM=", 1)[1].split()[0]) for o in (taken, kept)]

    # Compressor state round-trips: a DGC tape step leaves residuals; loading restores them exactly.
    v = tf.Variable(tf.random.stateless_normal([200, 100], seed=[1, 2]))
    with tf.GradientTape() as tape:
        l2 = tf.reduce_sum(v * v)
    gxt.DistributedGradientTape(tape).gradient(l2, [v])
    saved = gxt.state_dict()
    with tf.GradientTape() as tape:
        l2 = tf.reduce_sum(v * v)
    gxt.DistributedGradientTape(tape).gradient(l2, [v])
    changed = gxt.state_dict()
    gxt.load_state_dict(saved)
    out["state"] = (saved["engines"][0] != changed["engines"][0], gxt.state_dict()["engines"][0] == saved["engines"][0],
                    len(saved["engines"]))
    try:
        gxt.load_state_dict({"format": "something else"})
        out["bad_state"] = None
    except gradex.StateError as exc:
        out["bad_state"] = str(exc)
    gxt.shutdown()
    del np
    return out


def test_single_process_errors(tmp_path):
    import shutil

    import gradex
    import os
    package = os.path.dirname(gradex.__file__)
    fake = tmp_path / "_gradex_tf_ops.so"
    shutil.copy(os.path.join(package, "_gradex_tf_ops.so"), fake)
    (tmp_path / "_gradex_tf_ops.version").write_text("1.0.0\n")
    # fresh: which op library the interpreter loads is what this job checks.
    (r,) = tf_ranks.run("test_tf_errors:_single_process_errors", 1, args=(str(fake),), fresh=True)
    assert r["version"] and "built for TensorFlow 1.0.0" in r["version"], r["version"]
    assert r["config"] and "GRADEX_SPARSITY" in r["config"], r["config"]
    assert not r["initialized_after_failure"]
    assert r["jit"] and "jit_compile=False" in r["jit"], r["jit"]
    assert r["wrapped"] and "LossScaleOptimizer" in r["wrapped"], r["wrapped"]
    (taken_running, taken_config, taken_engine), (kept_running, kept_config, kept_engine) = r["momentum"]
    assert (taken_running, taken_config, float(taken_engine)) == (0.0, 0.9, 0.9), r["momentum"]
    assert (kept_running, kept_config, float(kept_engine)) == (0.9, 0.9, 0.0), r["momentum"]
    # Engines: init's (which the GRADEX_MOMENTUM=0 wrapper shares: an equal configuration) and the
    # momentum-owning one.
    assert r["state"] == (True, True, 2)
    assert r["bad_state"]


def _killed_peer(rank, world, timeout_s):
    import os
    import signal

    import tensorflow as tf
    import gradex
    import gradex.tensorflow as gxt

    gxt.init()
    v = tf.Variable(tf.ones([50000]))

    @tf.function(jit_compile=False)
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * v)
        (g,) = gxt.DistributedGradientTape(tape).gradient(loss, [v])
        v.assign_sub(0.01 * g)

    for i in range(200):
        if rank == 1 and i == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        last_ok = time.monotonic()
        try:
            step()
        except tf.errors.OpError as exc:  # inside tf.function: a TF error carrying the engine's message
            elapsed = time.monotonic() - last_ok
            try:
                gxt.shutdown()
            except gradex.GradexError:
                pass
            return {"step": i, "elapsed": elapsed, "error": f"{type(exc).__name__}: {exc.message}"}
    return {"step": None}


def test_killed_peer_raises_within_timeout():
    timeout_s = 15
    start = time.monotonic()
    results = tf_ranks.run("test_tf_errors:_killed_peer", 2, env={"GRADEX_TIMEOUT_S": str(timeout_s)},
                           args=(timeout_s,), may_die=(1,), timeout=240)
    r = results[0]
    print(f"killed peer: rank 0 failed {r.get('elapsed', float('nan')):.2f} s after its last good step "
          f"(GRADEX_TIMEOUT_S={timeout_s}): {r.get('error', '').split(':')[0]}: "
          f"{r.get('error', '')[r.get('error', '').find('gradex['):][:240]}")
    assert results[1] is None
    assert r["step"] is not None and r["step"] >= 3, r
    assert "gradex[" in r["error"] and ("PEER" in r["error"] or "TIMEOUT" in r["error"]), r["error"]
    # Detection within the timeout (plus scheduling slack on a loaded machine), never a hang.
    assert r["elapsed"] < timeout_s + 10, r
    assert time.monotonic() - start < 240


def _cancelled_step(rank, world, late_s):
    import threading
    import time as clock

    import tensorflow as tf
    from tensorflow.python.eager import cancellation  # TF's own way to cancel a running function
    import gradex.tensorflow as gxt

    gxt.init()
    x = tf.constant([1.0, 2.0, 3.0, 4.0]) * (rank + 1)
    out = {}
    if rank == 0:
        # The allreduce waits for rank 1, which comes late; cancelling the step must finish the pending
        # op at once with CANCELLED (not when rank 1 arrives, nor after GRADEX_TIMEOUT_S).
        step = tf.function(lambda: gxt.allreduce(x, name="pending"), jit_compile=False).get_concrete_function()
        manager = cancellation.CancellationManager()
        cancelable = manager.get_cancelable_function(step)
        outcome = {}

        def run():
            try:
                cancelable()
                outcome["error"] = None
            except tf.errors.OpError as exc:
                outcome["error"] = type(exc).__name__
            outcome["end"] = clock.monotonic()

        thread = threading.Thread(target=run)
        thread.start()
        clock.sleep(2.0)
        cancelled_at = clock.monotonic()
        manager.start_cancel()
        thread.join()
        out["error"], out["elapsed"] = outcome["error"], outcome["end"] - cancelled_at
    else:
        clock.sleep(late_s)
        gxt.allreduce(x, name="pending")  # completes rank 0's abandoned submission in the background
    # The engine is unharmed: the next exchanges work on both ranks.
    out["after"] = gxt.allreduce(tf.constant([10.0, 20.0]) * (rank + 1), name="after").numpy()
    gxt.shutdown()
    return out


def test_cancelled_step_finishes_a_pending_exchange_at_once():
    timeout_s = 60
    late_s = 20
    results = tf_ranks.run("test_tf_errors:_cancelled_step", 2, env={"GRADEX_TIMEOUT_S": str(timeout_s)},
                           args=(late_s,))
    r = results[0]
    print(f"cancelled step: rank 0 got {r['error']} {r['elapsed']:.3f} s after the cancellation "
          f"(rank 1 submits {late_s} s later; GRADEX_TIMEOUT_S={timeout_s})")
    assert r["error"] == "CancelledError", r
    assert r["elapsed"] < 5, r  # not waiting for rank 1's late submission, nor the timeout
    for res in results:
        assert list(res["after"]) == [15.0, 30.0]
