"""The learnable tasks of the training race (bench/train/): labels from a fixed random teacher network,
so the test set can be as large as the race needs and nothing is downloaded.

Two tasks, one per student model:

  mlp   64 gaussian features -> a teacher MLP (64-128-10, tanh); the student is the wide MLP
        64-2048-2048-10 (4.3 M parameters, 17 MB of fp32 gradients per step).
  conv  3x8x8 smooth random images -> a teacher convnet (3x3 conv 3->8, tanh, 2x2 average pooling,
        linear); the student is a small VGG-style network:
        two 3x3 convolutions with BatchNorm, max-pooling, and a BatchNorm MLP head that holds most of
        the 5.3 M parameters (as VGG's classifier does).

Both students are large enough that, with 16 examples per rank and step, exchanging their gradients
over a 1 Gbit/s link (a dense fp32 ring: about 0.2-0.25 s per step for 4 hosts) costs several times
more than computing them on this machine: the exchange method then decides the time to accuracy.

The task (teacher, training and test sets) depends only on the task's name: every seed and every method
sees the same data. The race's seed changes the student's initial weights and the data order.
"""
import torch

TRAIN_SIZE, TEST_SIZE, CLASSES = 40_000, 5_000, 10
_DATA_SEED = 1234  # the teacher and the examples; fixed, so that targets mean the same in every run


def _teacher_mlp(g):
    w1 = torch.randn(64, 128, generator=g) / 64 ** 0.5
    w2 = torch.randn(128, CLASSES, generator=g) * (3.0 / 128 ** 0.5)
    return lambda x: torch.tanh(x @ w1) @ w2


def _teacher_conv(g):
    c1 = torch.randn(8, 3, 3, 3, generator=g) / 27 ** 0.5
    w = torch.randn(8 * 4 * 4, CLASSES, generator=g) * (3.0 / 128 ** 0.5)

    def teacher(x):
        h = torch.tanh(torch.nn.functional.conv2d(x, c1, padding=1))
        return torch.nn.functional.avg_pool2d(h, 2).flatten(1) @ w
    return teacher


def _inputs(name, n, g):
    if name == "mlp":
        return torch.randn(n, 64, generator=g)
    # Smooth images: white noise blurred by a fixed 3x3 kernel, rescaled to unit variance per pixel.
    noise = torch.randn(n, 3, 10, 10, generator=g)
    blur = torch.full((3, 1, 3, 3), 1.0 / 9)
    images = torch.nn.functional.conv2d(noise, blur, groups=3)
    return images / images.std()


TASKS = ("mlp", "conv")


def load(name):
    """(x_train, y_train, x_test, y_test) of task `name`: TRAIN_SIZE and TEST_SIZE examples, labels = the
    teacher's argmax. Deterministic (same tensors in every process)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r} (expected one of {', '.join(TASKS)})")
    g = torch.Generator().manual_seed(_DATA_SEED + TASKS.index(name))
    teacher = _teacher_mlp(g) if name == "mlp" else _teacher_conv(g)
    x = _inputs(name, TRAIN_SIZE + TEST_SIZE, g)
    with torch.no_grad():
        y = teacher(x).argmax(dim=1)
    return x[:TRAIN_SIZE], y[:TRAIN_SIZE], x[TRAIN_SIZE:], y[TRAIN_SIZE:]


def make_model(name, seed=0, hidden=2048):
    """The student for task `name`, with initial weights from `seed` (the same on every rank)."""
    torch.manual_seed(seed)
    nn = torch.nn
    if name == "mlp":
        return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                             nn.Linear(hidden, CLASSES))
    if name == "conv":
        return nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(32 * 4 * 4, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, CLASSES))
    raise ValueError(f"unknown task {name!r} (expected one of {', '.join(TASKS)})")


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
def correct(model, x, y, batch=1000):
    """How many of (x, y) the model classifies correctly, in eval mode (BatchNorm's running
    statistics); the model's training mode is restored afterwards."""
    was_training = model.training
    model.eval()
    hits = sum(int((model(x[i:i + batch]).argmax(dim=1) == y[i:i + batch]).sum())
               for i in range(0, len(x), batch))
    model.train(was_training)
    return hits
