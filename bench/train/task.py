"""The learnable tasks of the training race (bench/train/): generated data (a fixed random teacher network
or a fixed random mixture), so the test set can be as large as the race needs and nothing is downloaded.

Four tasks with different horizons (how many steps plain DDP needs to reach the target) and different
students, so that a gradient-exchange policy is judged on more than one shape of model:

  short  32 gaussian features from a mixture of 60 clusters (3 per class, 20 classes, clusters that
         overlap); the student is the MLP 32-2048-2048-20 (4.3 M parameters). DDP reaches its target
         in about 50 of 100 steps.
  mlp    64 gaussian features -> a teacher MLP (64-128-10, tanh); the student is the wide MLP
         64-2048-2048-10 (4.3 M parameters, 17 MB of fp32 gradients per step). About 170 of 250 steps.
  conv   3x8x8 smooth random images -> a teacher convnet (3x3 conv 3->8, tanh, 2x2 average pooling,
         linear); the student is a small VGG-style network:
         two 3x3 convolutions with BatchNorm, max-pooling, and a BatchNorm MLP head that holds most of
         the 5.3 M parameters (as VGG's classifier does). About 200 of 250 steps.
  long   64 gaussian features -> a deeper, sharper teacher (64-256-256-50, tanh; 50 classes); the student
         is the three-hidden-layer MLP 64-1536-1536-1536-50 (4.9 M parameters). Its fine-grained labels
         keep improving for well over 1,000 steps: about 1,100-1,300 of 1,600 steps.

Two more tasks are held out from tuning (no setting of gradex's policy was chosen by looking at them; they
judge whether what was tuned on the four above carries over to other kinds of model):

  cnn    3x8x8 smooth random images -> a teacher convnet of its own (the conv task's kind, other weights);
         the student is a small all-convolutional network whose parameters are in its convolutions
         (3x3 conv 3->32 at 8x8, 32->128 at 4x4, 128->512 and 512->512 at 2x2, each with BatchNorm,
         global average pooling,
         a linear layer to 10 classes: 3.0 M parameters), so it computes several times more per parameter
         than the MLPs. About 2/3 of 150 steps.
  tfm    sequences of 8 tokens from a 64-token vocabulary -> a teacher that scores every (position, token)
         pair (mostly the token's, partly its position's) and sums them over the sequence (10 classes); the student is a small transformer
         classifier: token and position embeddings of width 256, two pre-norm encoder layers (4 heads,
         feed-forward 1024), mean pooling, a linear layer (1.6 M parameters). About 2/3 of 150 steps.

Every student is large enough that, with 16 examples per rank and step, exchanging its gradients over a
1 Gbit/s link (a dense fp32 ring: about 0.2-0.25 s per step for 4 hosts) costs several times more than
computing them on this machine (tens of ms): the exchange method then decides the time to accuracy.

The task (teacher, training and test sets) depends only on the task's name: every seed and every method
sees the same data. The race's seed changes the student's initial weights and the data order.
"""
import torch
from typing import Any, Dict

TRAIN_SIZE, TEST_SIZE, CLASSES = 40_000, 5_000, 10
_DATA_SEED = 1234  # the teachers and the examples; fixed, so that targets mean the same in every run
# Per task: input shape, classes, training examples (the test set is TEST_SIZE for every task).
SPECS: Dict[str, Dict[str, Any]] = {
    "mlp": {"inputs": (64,), "classes": CLASSES, "train": TRAIN_SIZE},
    "conv": {"inputs": (3, 8, 8), "classes": CLASSES, "train": TRAIN_SIZE},
    "short": {"inputs": (32,), "classes": 20, "train": TRAIN_SIZE},
    "long": {"inputs": (64,), "classes": 50, "train": 100_000},
    "cnn": {"inputs": (3, 8, 8), "classes": CLASSES, "train": TRAIN_SIZE},
    "tfm": {"inputs": (8,), "classes": CLASSES, "train": TRAIN_SIZE},
}
TOKENS = 64  # the tfm task's vocabulary
TASKS = tuple(SPECS)  # the order fixes each task's data seed: new tasks go at the end


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


def _teacher_long(g):
    """Two tanh layers with gain 2 (a sharper function than mlp's teacher) onto 50 classes."""
    w1 = torch.randn(64, 256, generator=g) * (2.0 / 64 ** 0.5)
    w2 = torch.randn(256, 256, generator=g) * (2.0 / 256 ** 0.5)
    w3 = torch.randn(256, 50, generator=g) * (3.0 / 256 ** 0.5)
    return lambda x: torch.tanh(torch.tanh(x @ w1) @ w2) @ w3


def _teacher_tokens(g):
    """Class scores summed over the sequence from a random score of every (position, token) pair: the label
    depends mostly on which tokens occur and partly on where, which a transformer learns through its
    position embeddings."""
    seq = SPECS["tfm"]["inputs"][0]
    # Mostly a score per token wherever it sits (quickly learnt), plus one per position (learnt later).
    w = torch.randn(TOKENS, CLASSES, generator=g).repeat(seq, 1) + 0.5 * torch.randn(seq * TOKENS, CLASSES,
                                                                                     generator=g)

    def teacher(tokens):
        return torch.nn.functional.one_hot(tokens, TOKENS).float().flatten(1) @ w
    return teacher


def _mixture(n, g, dim=32, classes=20, per_class=3, spread=0.55):
    """(x, y): n points of a mixture of classes*per_class gaussian clusters in `dim` dimensions, each class
    owning per_class of them: unit-variance noise around centres whose coordinates are N(0, (2*spread)^2),
    close enough that clusters overlap, so that the Bayes accuracy is below 1 and a student's accuracy rises
    over tens of steps, not one. Inputs are rescaled to unit variance."""
    centres = torch.randn(classes * per_class, dim, generator=g) * spread * 2.0
    owner = torch.arange(classes * per_class) % classes
    pick = torch.randint(0, classes * per_class, (n,), generator=g)
    x = centres[pick] + torch.randn(n, dim, generator=g)
    return x / x.std(), owner[pick]


def _inputs(name, n, g):
    if name in ("mlp", "long"):
        return torch.randn(n, 64, generator=g)
    if name == "tfm":
        return torch.randint(0, TOKENS, (n, SPECS["tfm"]["inputs"][0]), generator=g)
    # Smooth images: white noise blurred by a fixed 3x3 kernel, rescaled to unit variance per pixel.
    noise = torch.randn(n, 3, 10, 10, generator=g)
    blur = torch.full((3, 1, 3, 3), 1.0 / 9)
    images = torch.nn.functional.conv2d(noise, blur, groups=3)
    return images / images.std()


def classes(name):
    return SPECS[name]["classes"]


def load(name):
    """(x_train, y_train, x_test, y_test) of task `name`: its training examples and TEST_SIZE test
    examples; labels = the teacher's argmax (the mixture's cluster owner for `short`). Deterministic (same
    tensors in every process)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r} (expected one of {', '.join(TASKS)})")
    g = torch.Generator().manual_seed(_DATA_SEED + TASKS.index(name))
    n_train = SPECS[name]["train"]
    if name == "short":
        x, y = _mixture(n_train + TEST_SIZE, g)
        return x[:n_train], y[:n_train], x[n_train:], y[n_train:]
    teacher = {"mlp": _teacher_mlp, "conv": _teacher_conv, "long": _teacher_long, "cnn": _teacher_conv,
               "tfm": _teacher_tokens}[name](g)
    x = _inputs(name, n_train + TEST_SIZE, g)
    with torch.no_grad():
        y = teacher(x).argmax(dim=1)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def make_model(name, seed=0, hidden=2048):
    """The student for task `name`, with initial weights from `seed` (the same on every rank). `hidden`
    is the width of the widest layers (smaller in smoke runs; `long` uses 3/4 of it)."""
    torch.manual_seed(seed)
    nn = torch.nn
    if name == "mlp":
        return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                             nn.Linear(hidden, CLASSES))
    if name == "short":
        return nn.Sequential(nn.Linear(32, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                             nn.Linear(hidden, classes(name)))
    if name == "long":
        width = hidden * 3 // 4
        return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                             nn.Linear(width, width), nn.ReLU(), nn.Linear(width, classes(name)))
    if name == "conv":
        return nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(32 * 4 * 4, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, CLASSES))
    if name == "cnn":
        c = hidden // 4  # 512 at the default width
        return nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, c // 4, 3, padding=1), nn.BatchNorm2d(c // 4), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c // 4, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
            nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, CLASSES))
    if name == "tfm":
        return TokenClassifier(width=hidden // 8, layers=2, heads=4)
    raise ValueError(f"unknown task {name!r} (expected one of {', '.join(TASKS)})")


class TokenClassifier(torch.nn.Module):
    """The tfm task's student: token + position embeddings, pre-norm transformer encoder layers (no dropout:
    every method must compute the same function), mean pooling over the sequence, a linear classifier."""

    def __init__(self, width, layers, heads):
        super().__init__()
        nn = torch.nn
        seq = SPECS["tfm"]["inputs"][0]
        self.tokens = nn.Embedding(TOKENS, width)
        self.positions = nn.Parameter(torch.randn(seq, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, tokens):
        h = self.encoder(self.tokens(tokens) + self.positions)
        return self.head(self.norm(h).mean(dim=1))


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
