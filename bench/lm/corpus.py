"""The race's text: the Python standard library's own .py files (they ship with every Python; nothing is
downloaded), as word-level tokens with a byte fallback.

Split: files are assigned by a hash of their name, about one in ten to the held-out set, so the held-out
loss measures generalisation to unseen files, not memorisation. Tokens: the text is cut into words
(identifiers and numbers), runs of whitespace (indentation is frequent in Python) and single punctuation
characters; the `vocab - 256` most frequent pieces of the training split are whole tokens (ties broken by
the piece itself, so the vocabulary is deterministic), and every other piece is spelled as its UTF-8 bytes
(ids 0..255). Encoding is therefore lossless and has no unknown token. The vocabulary is built from the
training split only.
"""
import collections
import hashlib
import pathlib
import re
import sysconfig

import torch

_PIECE = re.compile(r"\w+|[ \t]+|\n[ \t]*|[^\w\s]|\s")


def _files():
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    skip = ("site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__")
    return sorted(p for p in root.rglob("*.py") if not any(part in skip for part in p.parts))


def _held_out(path):
    return hashlib.sha256(str(path.name).encode()).digest()[0] % 10 == 0


def _texts(max_bytes):
    """(train, held_out) texts: whole files, train capped near max_bytes, held out near max_bytes / 8."""
    train, held, n_train, n_held = [], [], 0, 0
    for p in _files():
        text = p.read_text(encoding="utf-8", errors="replace") + "\n"
        if _held_out(p):
            if n_held < max_bytes // 8:
                held.append(text)
                n_held += len(text)
        elif n_train < max_bytes:
            train.append(text)
            n_train += len(text)
        if n_train >= max_bytes and n_held >= max_bytes // 8:
            break
    return "".join(train), "".join(held)


def build_vocab(text, vocab):
    """{piece: id} of the `vocab - 256` most frequent pieces of `text`, ids from 256 on."""
    if vocab <= 256:
        raise ValueError(f"corpus: vocab must exceed the 256 byte tokens, got {vocab}")
    counts = collections.Counter(_PIECE.findall(text))
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:vocab - 256]
    return {piece: 256 + i for i, (piece, _) in enumerate(ranked)}


def encode(text, table):
    out = []
    for piece in _PIECE.findall(text):
        tid = table.get(piece)
        if tid is None:
            out.extend(piece.encode("utf-8"))
        else:
            out.append(tid)
    return torch.tensor(out, dtype=torch.int32)


def decode(ids, table):
    inverse = {v: k for k, v in table.items()}
    out, pending = [], bytearray()
    for t in ids.tolist():
        if t < 256:
            pending.append(t)
            continue
        out.append(pending.decode("utf-8", errors="replace"))
        pending = bytearray()
        out.append(inverse[t])
    out.append(pending.decode("utf-8", errors="replace"))
    return "".join(out)


def build(vocab=8192, max_bytes=8 << 20):
    """{"train", "held_out": int32 token tensors, "table": {piece: id}, "vocab": vocab}."""
    train, held = _texts(max_bytes)
    table = build_vocab(train, vocab)
    return {"train": encode(train, table), "held_out": encode(held, table), "table": table, "vocab": vocab}


def save(data, path):
    torch.save(data, path)


def load(path):
    return torch.load(path, weights_only=False)


class Sampler:
    """Random windows of `context + 1` tokens: (inputs, next-token targets). Each rank draws its own."""

    def __init__(self, tokens, context, batch, seed):
        if len(tokens) <= context + 1:
            raise ValueError(f"corpus: {len(tokens)} tokens cannot fill a window of {context + 1}")
        self.tokens, self.context, self.batch = tokens, context, batch
        self.gen = torch.Generator().manual_seed(seed)

    def next(self):
        starts = torch.randint(0, len(self.tokens) - self.context - 1, (self.batch,), generator=self.gen)
        w = self.tokens[starts[:, None] + torch.arange(self.context + 1)].long()
        return w[:, :-1], w[:, 1:]


def eval_batches(tokens, context, count, batch, seed=1234):
    """Fixed held-out windows, the same for every method."""
    s = Sampler(tokens, context, batch, seed)
    return [s.next() for _ in range(count)]
