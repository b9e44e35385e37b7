"""The race's text: the Python standard library's own .py files (ships with every Python, no download),
as byte tokens (vocabulary 256). Files are split by a hash of their path: about one in ten is held out for
evaluation, so the held-out loss measures generalisation to unseen files, not memorisation."""
import hashlib
import pathlib
import sysconfig

import torch


def _files():
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    skip = ("site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__")
    return sorted(p for p in root.rglob("*.py") if not any(part in skip for part in p.parts))


def _held_out(path):
    return hashlib.sha256(str(path.name).encode()).digest()[0] % 10 == 0


def load(max_bytes=8 << 20):
    """(train, held_out): uint8 tensors of concatenated files (train capped at max_bytes)."""
    train, held = bytearray(), bytearray()
    for p in _files():
        data = p.read_bytes()
        (held if _held_out(p) else train).extend(data + b"\n")
        if len(train) >= max_bytes and len(held) >= max_bytes // 8:
            break
    return (torch.frombuffer(bytearray(train), dtype=torch.uint8).long(),
            torch.frombuffer(bytearray(held), dtype=torch.uint8).long())


class Sampler:
    """Random windows of `context + 1` bytes: (inputs, next-byte targets). Each rank draws its own."""

    def __init__(self, tokens, context, batch, seed):
        self.tokens, self.context, self.batch = tokens, context, batch
        self.gen = torch.Generator().manual_seed(seed)

    def next(self):
        starts = torch.randint(0, len(self.tokens) - self.context - 1, (self.batch,), generator=self.gen)
        idx = starts[:, None] + torch.arange(self.context + 1)
        w = self.tokens[idx]
        return w[:, :-1], w[:, 1:]


def eval_batches(tokens, context, count, batch, seed=1234):
    """Fixed held-out windows, the same for every method."""
    s = Sampler(tokens, context, batch, seed)
    return [s.next() for _ in range(count)]
