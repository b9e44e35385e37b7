"""Data-parallel Keras 3 training of a small MLP on scikit-learn's bundled digits, through gradex.

The changes from single-process Keras are marked "gradex:". Run on 4 local ranks with:

    .venv/bin/python -m gradex.tensorflow.run -np 4 examples/keras_digits.py --mode dgc

(or under torchrun / mpirun, which set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT the same way).
--mode dense: gradients averaged in fp32 (GRADEX_SPARSITY=0); dgc: DGC at 99% after a warm-up, gradex
applying the momentum; localsgd: parameters averaged every 4 steps after 40 synchronous ones.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import gradex.tensorflow as gxt  # noqa: E402
import gradex.tensorflow.keras as gxk  # noqa: E402


def load_digits(rank, world):
    """This rank's shard of a fixed 80/20 split (inputs scaled to [0, 1]) and the whole test set."""
    from sklearn.datasets import load_digits as sk_digits
    x, y = sk_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order].astype(np.int64)
    cut = int(0.8 * len(x))
    return x[:cut][rank::world], y[:cut][rank::world], x[cut:], y[cut:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("dense", "dgc", "localsgd"), default="dgc")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()

    gxt.init()                                                        # gradex: join the job
    x, y, x_test, y_test = load_digits(gxt.rank(), gxt.size())
    keras.utils.set_random_seed(gxt.rank())  # ranks start different: the broadcast callback aligns them
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10)])

    # DGC's momentum correction is gradex's (GRADEX_MOMENTUM=0.9): the optimizer then runs without one.
    if args.mode == "dense":
        config, momentum, period = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0", "GRADEX_MOMENTUM": "0"}, 0.9, 0
    elif args.mode == "dgc":
        config, momentum, period = {"GRADEX_SPARSITY": "0.99", "GRADEX_WARMUP_STEPS": "20",
                                    "GRADEX_DENSE_THRESHOLD": "4000", "GRADEX_MOMENTUM": "0.9"}, 0.0, 0
    else:
        config, momentum, period = {"GRADEX_SPARSITY": "0", "GRADEX_MOMENTUM": "0"}, 0.9, 4
    opt = gxk.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=momentum), config=config,  # gradex
                                   local_sgd_period=period, local_sgd_warmup_steps=40 if period else 0)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)  # gradex: custom ops cannot run under XLA
    model.fit(x, y, batch_size=args.batch, epochs=args.epochs, verbose=0,
              callbacks=[gxk.callbacks.BroadcastGlobalVariablesCallback(0),   # gradex: same start
                         gxk.callbacks.MetricAverageCallback()])              # gradex: averaged logs
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    stats = opt.gradex_engine.stats()
    if gxt.rank() == 0:
        print(f"mode={args.mode} ranks={gxt.size()} test_accuracy={100 * accuracy:.2f}% "
              f"compression={stats['compression_ratio']:.1f}x bytes_sent={stats['bytes_sent']}")
    gxt.shutdown()


if __name__ == "__main__":
    main()
