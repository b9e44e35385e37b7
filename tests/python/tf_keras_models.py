"""Shared by the Keras tests and the example: the digits data set, split per rank, and a small MLP."""
import numpy as np


def digits(rank, world, test_size=397):
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))  # the same split on every rank
    x, y = x[order], y[order]
    x_train, y_train, x_test, y_test = x[test_size:], y[test_size:], x[:test_size], y[:test_size]
    return x_train[rank::world], y_train[rank::world], x_test, y_test


def mlp(seed, hidden=128):
    import keras
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(hidden, activation="relu", name="hidden"),
                             keras.layers.Dense(10, name="logits")], name="mlp")
