"""The learnable task of the training race: scikit-learn's digits (1,797 8x8 images of handwritten
digits, bundled with scikit-learn: nothing is downloaded) and a wide MLP, wide enough (4.3 M
parameters, 17 MB of fp32 gradients per step) that, with 16 images per rank and step, exchanging its
gradients over a 1 Gbit/s link (about 0.2 s for a dense fp32 ring) costs several times more than
computing them on this machine: the exchange methods then decide the time to accuracy.
"""
import numpy as np
import torch
from sklearn.datasets import load_digits

INPUTS, CLASSES = 64, 10


def split(seed=0, test_fraction=0.2):
    """(x_train, y_train, x_test, y_test) as tensors; pixel values scaled to [0, 1]. The split is
    stratified and the same on every rank (it depends on the seed only)."""
    x, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in range(CLASSES):
        members = rng.permutation(np.flatnonzero(y == label))
        cut = int(round(len(members) * test_fraction))
        test.extend(members[:cut])
        train.extend(members[cut:])
    train, test = rng.permutation(train), np.sort(test)
    as_x = lambda idx: torch.from_numpy((x[idx] / 16.0).astype(np.float32))  # noqa: E731
    as_y = lambda idx: torch.from_numpy(y[idx].astype(np.int64))  # noqa: E731
    return as_x(train), as_y(train), as_x(test), as_y(test)


def make_model(hidden, seed=0):
    """The same initial weights on every rank (seeded)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(INPUTS, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, CLASSES))


class Shard:
    """This rank's share of the training set (every world-th example), reshuffled every epoch with a
    seed shared by all ranks, served in batches; never runs out (epochs follow each other)."""

    def __init__(self, x, y, rank, world, batch, seed=0):
        self.x, self.y = x[rank::world], y[rank::world]
        self.batch, self.seed, self.epoch, self.position = batch, seed, 0, 0
        self.order = self._order()

    def _order(self):
        generator = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        return torch.randperm(len(self.x), generator=generator)

    def next(self):
        if self.position + self.batch > len(self.order):
            self.epoch, self.position = self.epoch + 1, 0
            self.order = self._order()
        idx = self.order[self.position:self.position + self.batch]
        self.position += self.batch
        return self.x[idx], self.y[idx]


@torch.no_grad()
def accuracy(model, x, y):
    return (model(x).argmax(dim=1) == y).float().mean().item()
