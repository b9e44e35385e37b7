#!/usr/bin/env python3
"""One rank of the Keras row of the training race: Keras 3 (TensorFlow backend) data-parallel SGD on the
digits task through gxk.DistributedOptimizer, for a fixed budget of training time (or steps), noting when
the test accuracy first reaches the target and the median time of a training step.

Self-contained (TensorFlow only; the task is task.py's: the same stratified split and wide MLP, rebuilt in
Keras). Started once per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set (and GRADEX_IFACE on
the emulated cluster), e.g. by python -m gradex.tensorflow.run or bench/run:

    keras_rank.py --method keras_gradex_default --target 0.92 --max-steps 400 --max-train-s 60 --curve-out c.json

Methods: keras_gradex_default (the engine's default policy: DGC 99.9% for tensors of >= 16,384 elements
with gradex's momentum correction, fused fp16 for the rest; SGD without momentum), keras_gradex_dense
(every tensor dense fp32 through gradex, SGD with momentum 0.9: what a plain allreduce does).

Clock: the sum of rank 0's training-step times (Keras train_on_batch: forward, backward, exchange,
update); evaluations pause it. Rank 0 writes the curve to --curve-out and prints
"RESULT method=... steps=... train_s=... time_to_target_s=... final_accuracy=... reached=0|1 ms_per_step=..."
(ms_per_step: the median step time after the first 5 steps, which include tracing and DGC's warm-up).
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

METHODS = ("keras_gradex_default", "keras_gradex_dense")
INPUTS, CLASSES = 64, 10


def split(seed=0, test_fraction=0.2):
    """task.py's split: stratified, the same on every rank; pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in range(CLASSES):
        members = rng.permutation(np.flatnonzero(y == label))
        cut = int(round(len(members) * test_fraction))
        test.extend(members[:cut])
        train.extend(members[cut:])
    train, test = rng.permutation(train), np.sort(test)
    as_x = lambda idx: (x[idx] / 16.0).astype(np.float32)  # noqa: E731
    return as_x(train), y[train].astype(np.int64), as_x(test), y[test].astype(np.int64)


def make_model(hidden, seed):
    import keras
    keras.utils.set_random_seed(seed)  # the same initial weights on every rank
    return keras.Sequential([keras.Input((INPUTS,)), keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(CLASSES)])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", choices=METHODS, required=True)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--target", type=float, default=0.92)
    p.add_argument("--max-steps", type=int, default=400)
    p.add_argument("--max-train-s", type=float, default=60)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--sync-warmup", type=int, default=10, help="DGC's sparsity warm-up steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--curve-out", required=True)
    args = p.parse_args()

    import keras
    import tensorflow as tf
    import gradex.tensorflow as gxt
    import gradex.tensorflow.keras as gxk

    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    gxt.init()
    rank, world = gxt.rank(), gxt.size()
    x_train, y_train, x_test, y_test = split(args.seed)
    x_shard, y_shard = x_train[rank::world], y_train[rank::world]
    model = make_model(args.hidden, args.seed)
    if args.method == "keras_gradex_default":
        config, momentum = {"GRADEX_WARMUP_STEPS": args.sync_warmup, "GRADEX_MOMENTUM": 0.9}, 0.0
    else:
        config, momentum = {"GRADEX_SPARSITY": 0, "GRADEX_FP16": 0, "GRADEX_MOMENTUM": 0}, 0.9
    opt = gxk.DistributedOptimizer(keras.optimizers.SGD(args.lr, momentum=momentum), config=config)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)

    def accuracy():
        logits = model.predict(x_test, batch_size=512, verbose=0)
        return float(np.mean(np.argmax(logits, axis=1) == y_test))

    rng = np.random.default_rng(args.seed)  # the same batch order on every rank (shards differ)
    order, position, epoch = rng.permutation(len(x_shard)), 0, 0
    clock, times, curve, time_to_target, step = 0.0, [], [(0.0, 0, accuracy())], None, 0
    while step < args.max_steps:
        if position + args.batch > len(order):
            order, position, epoch = rng.permutation(len(x_shard)), 0, epoch + 1
        idx = order[position:position + args.batch]
        position += args.batch
        t0 = time.perf_counter()
        model.train_on_batch(x_shard[idx], y_shard[idx])
        elapsed = time.perf_counter() - t0
        clock += elapsed
        times.append(elapsed)
        step += 1
        if step % args.eval_every == 0 or step == args.max_steps:
            stop = 0
            if rank == 0:
                acc = accuracy()
                curve.append((clock, step, acc))
                if acc >= args.target and time_to_target is None:
                    time_to_target = clock
                stop = int(clock >= args.max_train_s)
            if int(gxt.broadcast(tf.constant(stop), root_rank=0, name="stop").numpy()):
                break
    if rank == 0:
        final = curve[-1][2]
        ms = 1000.0 * float(np.median(times[5:] if len(times) > 10 else times))
        stats = opt.gradex_engine.stats()
        with open(args.curve_out, "w") as f:
            json.dump({"method": args.method, "curve": curve, "target": args.target,
                       "time_to_target_s": time_to_target, "steps": step, "train_s": clock,
                       "final_accuracy": final, "ms_per_step": ms, "gradex": stats, "config": vars(args)}, f)
        print(f"RESULT method={args.method} steps={step} train_s={clock:.6g} "
              f"time_to_target_s={time_to_target if time_to_target is not None else 'nan'} "
              f"final_accuracy={final:.6g} reached={int(time_to_target is not None)} ms_per_step={ms:.4g} "
              f"compression={stats['compression_ratio']:.4g}", flush=True)
    gxt.shutdown()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
