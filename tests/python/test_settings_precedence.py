"""Settings a user writes are honoured on every plugin, under the shipped default (GRADEX_POLICY unset): the
settings that earlier docs told users to write (GRADEX_SPARSITY, GRADEX_WARMUP_STEPS, GRADEX_DENSE_THRESHOLD)
select the fixed policy they describe, so an explicit sparsity gives its compression ratio after the warm-up
(>= 20x at 0.99) through the DDP hook, Lightning's DDPStrategy, Keras model.fit and DistributedGradientTape;
"everything dense fp32, momentum in gradex" trains like momentum SGD; and a contradiction (GRADEX_POLICY=auto
with a fixed-policy setting) fails where the object is built, naming both settings."""
import json
import os
import subprocess
import sys

import pytest

import tf_ranks
import torch_ranks as ranks

# The README's old tuning lines, with a warm-up short enough for a test.
_TUNED = {"GRADEX_SPARSITY": "0.99", "GRADEX_WARMUP_STEPS": "3", "GRADEX_DENSE_THRESHOLD": "4096",
          "GRADEX_TIMEOUT_S": "60"}
_HERE = os.path.dirname(os.path.abspath(__file__))


def _shipped_default():
    """conftest.py pins GRADEX_POLICY=fixed for the other files; these ranks run what a user gets."""
    os.environ.pop("GRADEX_POLICY", None)


def _torch_ranks(rank, world):
    import torch
    import torch.nn.functional as F
    import gradex.torch as gx

    _shipped_default()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = gx.State(ddp)
    ddp.register_comm_hook(state, gx.hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(8):
        x = torch.randn(16, 64, generator=gen)
        opt.zero_grad()
        F.cross_entropy(ddp(x), x[:, :10].argmax(1)).backward()
        opt.step()
    out = {"last": gx.stats(state, last_step=True), "plan": gx.explain(state)}
    state.close()
    return out


def test_ddp_hook_explicit_sparsity_gives_its_ratio():
    out = ranks.run(_torch_ranks, 2, env=_TUNED, timeout=180)
    for r in out:
        assert r["plan"].startswith("GRADEX_POLICY=fixed"), r["plan"][:300]
        # 75,776 values at 99% beside 1,034 small ones in fused 16-bit: about 38x.
        assert r["last"]["compression_ratio"] >= 20, r["last"]
        assert r["last"]["sparse_exchanges"] >= 1, r["last"]


def _dense_momentum(rank, world):
    import torch
    import torch.nn.functional as F
    import gradex.torch as gx

    _shipped_default()

    def train(hooked):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 4))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        if hooked:  # momentum in gradex, a plain SGD step
            state = gx.State(ddp)
            ddp.register_comm_hook(state, gx.hook)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
        else:  # the dense method: DDP's average, SGD with momentum
            state = None
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        gen = torch.Generator().manual_seed(10 + rank)
        for _ in range(30):
            x = torch.randn(16, 32, generator=gen)
            opt.zero_grad()
            F.cross_entropy(ddp(x), x[:, :4].argmax(1)).backward()
            opt.step()
        plan = gx.explain(state) if state else ""
        if state:
            state.close()
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), plan

    dense, _ = train(False)
    gradex, plan = train(True)
    torch.manual_seed(0)
    start = torch.cat([p.detach().reshape(-1) for p in torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 4)).parameters()])
    return {"gap": float((gradex - dense).abs().max()), "moved": float((dense - start).abs().max()), "plan": plan}


def test_ddp_hook_explicit_dense_fp32_momentum_trains_like_momentum_sgd():
    env = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0", "GRADEX_MOMENTUM": "0.9", "GRADEX_TIMEOUT_S": "60"}
    out = ranks.run(_dense_momentum, 2, env=env, timeout=180)
    for r in out:
        assert r["plan"].startswith("GRADEX_POLICY=fixed"), r["plan"][:300]
        assert r["moved"] > 0.05, r  # training moved the parameters: the comparison means something
        assert r["gap"] <= 1e-5, r  # float noise (the average of u against u of the average)


def test_contradiction_fails_where_the_state_is_built(monkeypatch):
    import torch
    import gradex
    import gradex.torch as gx

    monkeypatch.setenv("GRADEX_POLICY", "auto")
    monkeypatch.setenv("GRADEX_SPARSITY", "0.99")
    with pytest.raises(gradex.ConfigError) as info:
        gx.State(torch.nn.Linear(4, 4))
    assert "GRADEX_SPARSITY=0.99 (environment)" in str(info.value), info.value
    assert "GRADEX_POLICY=auto (environment)" in str(info.value), info.value
    # Through config= as through the environment.
    monkeypatch.delenv("GRADEX_SPARSITY")
    with pytest.raises(gradex.ConfigError) as info:
        gx.State(torch.nn.Linear(4, 4), config={"GRADEX_WARMUP_STEPS": "10"})
    assert "GRADEX_WARMUP_STEPS=10 (api)" in str(info.value), info.value


def test_lightning_explicit_sparsity_gives_its_ratio(tmp_path):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ranks.free_port()), **_TUNED)
    env.pop("GRADEX_POLICY", None)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, os.path.join(_HERE, "lightning_train.py"), str(tmp_path), "popen",
                           "hook"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["identical"], result
        assert result["plan"].startswith("GRADEX_POLICY=fixed"), result["plan"][:300]
        assert result["last"]["compression_ratio"] >= 20, result["last"]


def _keras_and_tape(rank, world):
    import keras
    import numpy as np
    import tensorflow as tf
    import gradex.tensorflow as gxt
    import gradex.tensorflow.keras as gxk
    import tf_keras_models as data

    _shipped_default()
    gxt.init()
    x, y, _, _ = data.digits(rank, world)
    model = data.mlp(seed=0, hidden=1024)  # 64x1024 and 1024x10 above the threshold of 4,096
    opt = gxk.DistributedOptimizer(keras.optimizers.SGD(0.1))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    model.fit(x[:256], y[:256], batch_size=32, epochs=1, verbose=0, shuffle=False)
    fit = {"last": opt.gradex_engine.stats(last_step=True), "plan": gxt.explain(opt.gradex_engine)}

    w = tf.Variable(np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32))
    tape_stats = None
    for step in range(6):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.sin(w * float(rank + step + 1)))
        tape = gxt.DistributedGradientTape(tape)
        (grad,) = tape.gradient(loss, [w])
        w.assign_sub(0.01 * grad)
        tape_stats = gxt.stats(tape, last_step=True)
    out = {"fit": fit, "tape": {"last": tape_stats, "plan": gxt.explain(tape)}}
    gxt.shutdown()
    return out


def test_keras_fit_and_tape_explicit_sparsity_give_their_ratio():
    out = tf_ranks.run("test_settings_precedence:_keras_and_tape", 2, env=_TUNED, timeout=300)
    for r in out:
        for how in ("fit", "tape"):
            assert r[how]["plan"].startswith("GRADEX_POLICY=fixed"), (how, r[how]["plan"][:300])
            assert r[how]["last"]["compression_ratio"] >= 20, (how, r[how]["last"])
