#!/usr/bin/env python3
"""One rank of the Keras row of the training race of bench/run: Keras 3 (TensorFlow backend)
data-parallel SGD through gxk.DistributedOptimizer on task.py's MLP task, with train_rank.py's command
line, clock, evaluation rule and output contract, so that train_suite.py races it beside the PyTorch
methods (its PROGRAMS entry).

Started once per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set (and GRADEX_IFACE on the
emulated cluster), by bench/harness/launcher.py (subprocesses: never forked after importing TensorFlow):

    keras_rank.py --task mlp --method keras_gradex_default --seeds 0 --steps 250 --target 0.72 --out r.json

Methods:
  keras_gradex_default  gradex's default policy, nothing overridden (as gradex_default: DGC 99.9 % for
                        large tensors, fp16 dense for small ones, momentum 0.9 inside gradex; SGD at
                        momentum 0)
  keras_gradex_dense    every tensor dense fp32 through gradex, gradex's momentum off, SGD momentum 0.9:
                        what plain DDP computes, so the pair isolates the compression policy

Same task as train_rank.py: task.py's data (teacher labels, fixed split), this rank's task.Shard (the
same batches in the same order), and the student's initial weights copied from task.make_model (torch's
Linear weight is Keras's kernel transposed): the Keras and PyTorch rows start from identical weights.
The cosine learning-rate schedule over --steps is train_rank.py's. Only the MLP task has a Keras
student (the convnet's BatchNorm is not rebuilt here).

Clock: the sum of rank 0's Keras train_on_batch times (forward, backward, exchange, update; the first
step includes tracing); evaluations pause it. Evaluation, coarse margin and --count-iface bytes as in
train_rank.py. Rank 0 writes {"seeds": [record]} to --out (train_rank.py's record keys plus
step_ms_median, the median step time after the first 5 steps) and prints per seed "RESULT seed=...
steps=... train_s=... time_to_target_s=... steps_to_target=... final_accuracy=... steps_per_s=...
step_ms_median=... wire_bytes_per_host=...".
"""
import argparse
import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from bench.train import task  # noqa: E402  (torch, for the task's data and initial weights only)
from bench.train.seed_runs import run_seeds  # noqa: E402
from bench.train.tx_counter import TxCounter  # noqa: E402

METHODS = ("keras_gradex_default", "keras_gradex_dense")
TASKS = ("mlp",)
# keras_gradex_default overrides nothing but needs an engine of its own per seed (fresh DGC residuals
# and warm-up); gradex owns SGD's momentum 0.9 (GRADEX_MOMENTUM's declared default is 0), the optimizer runs at 0.
CONFIGS = {"keras_gradex_default": ({"GRADEX_MOMENTUM": "0.9"}, 0.0),
           "keras_gradex_dense": ({"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0", "GRADEX_MOMENTUM": "0"}, 0.9)}


def keras_student(keras, name, seed, hidden):
    """task.make_model(name, seed, hidden) rebuilt in Keras with the same initial weights."""
    if name not in TASKS:
        raise ValueError(f"keras_rank.py has a Keras student for {', '.join(TASKS)} only, not {name!r}")
    torch_model = task.make_model(name, seed, hidden)
    linears = [m for m in torch_model if isinstance(m, task.torch.nn.Linear)]
    layers = [keras.layers.Dense(m.out_features, activation="relu" if i < len(linears) - 1 else None)
              for i, m in enumerate(linears)]
    model = keras.Sequential([keras.Input((linears[0].in_features,)), *layers])
    for layer, m in zip(layers, linears):
        layer.set_weights([m.weight.detach().numpy().T.copy(), m.bias.detach().numpy().copy()])
    return model


def summed(gxt, value, name):
    """The sum over ranks of a float (exact for counts: fp32 averages of integers below 2**24)."""
    import tensorflow as tf
    return float(gxt.allreduce(tf.constant([value], tf.float32), average=False, name=name).numpy()[0])


def train_one_seed(args, seed, data, rank, world):
    import keras
    import tensorflow as tf
    import gradex.tensorflow as gxt
    import gradex.tensorflow.keras as gxk

    x_train, y_train, x_test, y_test = data
    shard = task.Shard(x_train, y_train, rank, world, args.batch, seed)
    x_eval, y_eval = x_test[rank::world].numpy(), y_test[rank::world].numpy()
    model = keras_student(keras, args.task, seed, args.hidden)
    config, momentum = CONFIGS[args.method]
    optimizer = gxk.DistributedOptimizer(keras.optimizers.SGD(args.lr, momentum=momentum), config=config)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    tx = TxCounter(args.count_iface)

    def evaluate():
        hits = int(np.sum(np.argmax(model(x_eval, training=False).numpy(), axis=1) == y_eval))
        return round(summed(gxt, hits, "race_hits")) / len(x_test)

    clock, step, due, times = 0.0, 0, False, []
    curve = [(0.0, 0, evaluate())]
    reached = None  # (clock, step) of the first evaluation at or above the target
    tty = rank == 0 and sys.stderr.isatty()
    while step < args.steps:
        if tty:  # bench/harness/launcher.py reads "[train] <mode> step k/n" from rank 0's terminal
            sys.stderr.write(f"\r[train] {args.task}_{args.method}_s{seed} step {step + 1}/{args.steps}   ")
            sys.stderr.flush()
        optimizer.learning_rate = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        x, y = shard.next()
        x, y = x.numpy(), y.numpy()
        tx.start()
        t0 = time.perf_counter()
        model.train_on_batch(x, y)
        elapsed = time.perf_counter() - t0
        tx.stop()
        clock += elapsed
        times.append(elapsed)
        step += 1
        far = curve[-1][2] < args.target - args.coarse_margin
        due = due or step % (args.eval_every * (3 if far else 1)) == 0 or step == args.steps
        if due:
            due = False
            accuracy = evaluate()
            curve.append((clock, step, accuracy))
            if reached is None and accuracy >= args.target:
                reached = (clock, step)
    sent = summed(gxt, float(tx.total), "race_tx")
    stats = optimizer.gradex_engine.stats()
    return {
        "seed": seed, "steps": step, "train_s": clock, "steps_per_s": step / clock if clock > 0 else None,
        "curve": curve, "final_accuracy": curve[-1][2],
        "time_to_target_s": reached[0] if reached else None, "steps_to_target": reached[1] if reached else None,
        "wire_bytes_per_host": sent / world if args.count_iface else None,
        "step_ms_median": 1000.0 * float(np.median(times[5:] if len(times) > 10 else times)),
        "gradex_stats": {k: v for k, v in dict(stats).items() if isinstance(v, (int, float))},
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=TASKS, default="mlp")
    p.add_argument("--method", choices=METHODS, required=True)
    p.add_argument("--seeds", default="0", help="comma-separated")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.05, help="peak of the cosine schedule")
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--target", type=float, required=True)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--coarse-margin", type=float, default=0.05,
                   help="evaluate every 3*eval-every steps while this far below the target")
    p.add_argument("--count-iface", default="", help="count this interface's transmitted bytes")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import tensorflow as tf
    import gradex.tensorflow as gxt

    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))  # as the PyTorch ranks: torch.set_num_threads
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    task.torch.set_num_threads(threads)
    gxt.init()  # GRADEX_TIMEOUT_S bounds every wait on a dead or stalled peer
    rank, world = gxt.rank(), gxt.size()
    data = task.load(args.task)
    run_seeds(args, data, rank, world, train_one_seed,
              extra=("steps_per_s", "step_ms_median", "wire_bytes_per_host"))
    gxt.shutdown()


if __name__ == "__main__":
    main()
