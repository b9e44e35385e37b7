"""Scalars where users look: gx.log_scalars into a torch SummaryWriter, gradex.torch.lightning.Scalars into the
Trainer's TensorBoard logger, and gxk.callbacks.ScalarsCallback into a tf.summary writer, each on real ranks with
DGC at 99 %: the event files must hold gradex's tags with values that agree with its counters. Lightning's callback is
checked in test_lightning.py's run with the default launcher (scalars_in and check_scalars from here)."""
import glob
import math
import os
import subprocess
import sys
import types

import pytest
import tf_ranks
import torch_ranks as ranks


def no_tensorflow_in_tensorboard():
    """TensorBoard imports TensorFlow when it can, and TF beside torch in one interpreter aborts (each brings its
    own LLVM): tensorboard.compat.notf, when importable, makes TensorBoard use its own stub instead."""
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))


_TAGS = {"gradex/sent_mb_per_step", "gradex/compression_ratio", "gradex/codec_mix/sparse",
         "gradex/codec_mix/dense_fallback", "gradex/codec_mix/dense", "gradex/exposed_ms_per_step",
         "gradex/exchange_ms_per_step", "gradex/encode_ms_per_step", "gradex/decode_ms_per_step",
         "gradex/plan_changes"}


def scalars_in(log_dir):
    """{tag: [(step, value), ...]} from every event file under log_dir (TF2 tensor summaries or scalars)."""
    no_tensorflow_in_tensorboard()  # the test process holds torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    import numpy as np
    out = {}
    for path in glob.glob(os.path.join(log_dir, "**", "events.out.tfevents.*"), recursive=True):
        acc = EventAccumulator(path, size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
        for tag in acc.Tags().get("tensors", []):
            for e in acc.Tensors(tag):
                value = float(np.frombuffer(e.tensor_proto.tensor_content, np.float32)[0]) \
                    if e.tensor_proto.tensor_content else float(e.tensor_proto.float_val[0])
                out.setdefault(tag, []).append((e.step, value))
    return out


def check_scalars(values, sparse_expected=True):
    assert _TAGS <= set(values), set(values)
    for tag in _TAGS:
        assert all(math.isfinite(v) and v >= 0 for _, v in values[tag]), (tag, values[tag])
    last = max(values["gradex/compression_ratio"])[1]
    assert last > 2, values["gradex/compression_ratio"]
    for step, _ in values["gradex/codec_mix/sparse"]:
        total = sum(v for t in ("sparse", "dense_fallback", "dense")
                    for s, v in values[f"gradex/codec_mix/{t}"] if s == step)
        assert abs(total - 1) < 1e-5, (step, total)
    if sparse_expected:
        assert max(v for _, v in values["gradex/codec_mix/sparse"]) > 0


def _torch_job(rank, world, log_dir):
    no_tensorflow_in_tensorboard()
    import torch
    from torch.utils.tensorboard import SummaryWriter
    import gradex.torch as gx
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.Tanh(), torch.nn.Linear(128, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = gx.State(ddp, optimizer=opt)
    ddp.register_comm_hook(state, gx.hook)
    writer = SummaryWriter(log_dir) if rank == 0 else None
    returned = []
    gen = torch.Generator().manual_seed(rank)
    for step in range(1, 13):
        opt.zero_grad()
        ddp(torch.randn(16, 256, generator=gen)).square().mean().backward()
        opt.step()
        if step % 4 == 0 and writer is not None:
            returned.append(gx.log_scalars(writer, step, state))
    if writer is not None:
        writer.close()
    stats = gx.stats(state)
    state.close()
    return {"returned": returned, "stats": stats}


def test_log_scalars_writes_a_summary_writer(tmp_path):
    out = ranks.run(_torch_job, 2, args=(str(tmp_path),), timeout=240,
                    env={"GRADEX_SPARSITY": "0.99", "GRADEX_WARMUP_STEPS": "2", "GRADEX_TIMEOUT_S": "60"})
    values = scalars_in(str(tmp_path))
    check_scalars(values)
    assert sorted(s for s, _ in values["gradex/sent_mb_per_step"]) == [4, 8, 12]
    returned, stats = out[0]["returned"], out[0]["stats"]
    # The three windows add up to the counters: 12 steps' bytes.
    sent = sum(r["gradex/sent_mb_per_step"] * 4 for r in returned) * 1e6
    assert abs(sent - stats["bytes_sent"]) < 1e-3 * stats["bytes_sent"], (sent, stats["bytes_sent"])


def _keras_job(rank, world, log_dir):
    import keras
    import numpy as np
    import gradex.tensorflow as gxt
    import gradex.tensorflow.keras as gxk
    gxt.init({"GRADEX_TIMEOUT_S": "60"})
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(128), keras.layers.Dense(4)])
    opt = gxk.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                   config={"GRADEX_SPARSITY": "0.99", "GRADEX_WARMUP_STEPS": "2"})
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    x = np.random.default_rng(rank).normal(size=(96, 256)).astype(np.float32)
    y = np.zeros((96, 4), np.float32)
    callbacks = [gxk.callbacks.ScalarsCallback(log_dir, every_n_steps=4)] if rank == 0 else []
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
    stats = gxt.stats(opt)
    gxt.shutdown()
    return stats


def test_keras_scalars_callback_writes_tf_summaries(tmp_path):
    out = tf_ranks.run("test_scalars:_keras_job", 2, args=(str(tmp_path),), timeout=240)
    values = scalars_in(str(tmp_path))
    check_scalars(values)
    assert sorted(s for s, _ in values["gradex/sent_mb_per_step"]) == [4, 8, 12]
    assert out[0]["steps"] == 12


@pytest.mark.parametrize("bad", [0, -3])
def test_scalars_callbacks_refuse_a_bad_period(bad):
    import gradex
    from gradex.torch.lightning import Scalars
    with pytest.raises(gradex.InvalidArgumentError):
        Scalars(every_n_steps=bad)
