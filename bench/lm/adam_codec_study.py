#!/usr/bin/env python3
"""Which sparse exchange trains like AdamW? Equal-steps comparison on the LM race's model.

P ranks are simulated in one process, each with its own batches (seed 1000 + rank, as lm_rank.py): every
rank's gradient is computed, the method under test turns the P gradients into the one averaged gradient
that every rank would receive, and one AdamW (the replicas stay identical: they apply the same average)
steps on it. Equal steps and the same batches for every method, so the comparison is independent of this
machine's load. The selection is the exact top-k (gradex's threshold selection keeps 0.8-1.3x k); tensors
under GRADEX_DENSE_THRESHOLD (16,384 elements) are averaged dense, as the engine does.

Methods (density d: the fraction of a large tensor's elements each rank sends per step):
  ddp              the plain average (AdamW + DDP)
  ef:D             top-k of the gradient with error feedback: e += g; send topk(e); e -= sent (gradex's DGC
                   with GRADEX_MOMENTUM=0, what AdamW runs on today)
  mom:D:B          top-k of a local first-moment buffer with error feedback (DeMo without the DCT):
                   m = B*m + g; send topk(m); m -= sent
  track:D          the average gradient tracked by a reference every rank holds: e += g - ref; send topk(e);
                   e -= sent; ref += average(sent); AdamW receives ref (dense, identical on every rank)
  dct:D:B[+chunk=C]  DeMo's transmission: m = B*m + DCT(g) (2-D DCT-II of blocks of at most C x C of the
                   [rows, cols] view, C = 64), top-k of each block's coefficients (D of each block), m -= sent;
                   the receiver inverts the average
  dctg:D:B         the same with one top-k over all of the tensor's coefficients (gradex's DCT Adam codec,
                   GRADEX_ADAM_TRANSFORM=dct)
  Modifiers, appended with +: ramp:N (density max(D, 25%) for N/2 steps, then max(D, 6.25%) until N),
             sign (kept values sent as sign x their mean magnitude, SparseLoCo-style; dct, dctg and the
             element methods), floor (at least one value per row of a 2-D tensor; dctg: at least one
             coefficient per block, the same count in all), dense=NAME (tensors whose name contains NAME averaged dense in
             16 bits), elem=NAME (dct/dctg: such tensors stay in the element domain).
  Suffix ~C: the receiver spreads what arrives over the next steps: R += average(sent); AdamW receives C*R;
             R -= C*R (R identical on every rank; nothing is lost, bursts are smoothed for AdamW's second
             moment). Suffix @W: the first W steps dense (a warm-up of AdamW's moments).

Bytes are estimated from the selection: 16-bit values (1 bit + a scale with sign), indices at their entropy,
dense tensors in 16 bits (DDP: 32); bench/lm/adam_codec_bytes.py measures the real wire bytes of the
implemented codec through gradex's statistics.

  python -m bench.lm.adam_codec_study --steps 300 --methods ddp ef:0.01 mom:0.01:0.9 track:0.01
"""
import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
from bench.lm import corpus  # noqa: E402
from bench.lm import model as lm  # noqa: E402

DENSE_THRESHOLD = 16384


def topk_indices(flat, k):
    """The exact top-k of |flat| (ties aside), found the way DGC does for large tensors: a sampled threshold
    a little below the k-th value, then the exact top-k among the candidates above it."""
    mag = flat.abs()
    n = mag.numel()
    if n >= (1 << 18) and k < n // 8:
        gen = torch.Generator().manual_seed(n)
        sample = mag[torch.randint(0, n, (16384,), generator=gen)]
        q = max(1, int(16384 * (1.0 - 2.0 * k / n)))
        thr = torch.kthvalue(sample, q).values
        cand = torch.nonzero(mag >= thr).reshape(-1)
        if cand.numel() >= k:
            return cand[torch.topk(mag[cand], k, sorted=False).indices]
    return torch.topk(mag, k, sorted=False).indices


def topk_mask_values(x, k):
    flat = x.reshape(-1)
    idx = topk_indices(flat, k)
    out = torch.zeros_like(flat)
    out[idx] = flat[idx]
    return out.view_as(x)


def dct_matrix(n):
    """The orthonormal DCT-II matrix: row f is frequency f."""
    i = torch.arange(n, dtype=torch.float64)
    d = torch.cos(torch.pi * (2 * i[None, :] + 1) * i[:, None] / (2 * n)) * (2.0 / n) ** 0.5
    d[0] /= 2 ** 0.5
    return d.float()


def chunk_of(size, limit):
    return max(c for c in range(1, min(size, limit) + 1) if size % c == 0)


class ChunkedDct:
    """DeMo's transform: a 2-D view (rows, cols) cut into blocks of (cr, cc), a 2-D DCT-II per block."""

    def __init__(self, shape, limit):
        self.rows = shape[0]
        self.cols = 1
        for s in shape[1:]:
            self.cols *= s
        self.cr, self.cc = chunk_of(self.rows, limit), chunk_of(self.cols, limit)
        self.dr, self.dc = dct_matrix(self.cr), dct_matrix(self.cc)
        self.blocks = (self.rows // self.cr) * (self.cols // self.cc)

    def forward(self, x):
        b = x.reshape(self.rows // self.cr, self.cr, self.cols // self.cc, self.cc).permute(0, 2, 1, 3)
        return (self.dr @ b @ self.dc.T).reshape(self.blocks, self.cr * self.cc)

    def inverse(self, c, shape):
        b = c.reshape(self.rows // self.cr, self.cols // self.cc, self.cr, self.cc)
        x = self.dr.T @ b @ self.dc
        return x.permute(0, 2, 1, 3).reshape(shape)


def index_bits(n, k):
    """Bits to name k of n positions (the binary entropy bound; gradex's Golomb-Rice code is ~0.1-0.5 bit
    per index above it)."""
    if k <= 0 or k >= n:
        return 0.0
    import math
    p = k / n
    return n * (-p * math.log2(p) - (1 - p) * math.log2(1 - p))


class Method:
    def __init__(self, spec, params, ranks, names=None):
        spec, *mods = spec.split("+")
        self.ramp = 0
        self.sign = False
        self.floor = False
        self.dense_names = []
        self.elem_names = []  # dct/dctg: tensors whose names contain one of these stay in elements
        self.dct_chunk = 64
        for m in mods:
            key, _, val = m.partition("=") if "=" in m else m.partition(":")
            if key == "ramp":
                self.ramp = int(val)
            elif key == "sign":
                self.sign = True
            elif key == "floor":
                self.floor = True
            elif key == "dense":
                self.dense_names.append(val)
            elif key == "elem":
                self.elem_names.append(val)
            elif key == "chunk":
                self.dct_chunk = int(val)
            else:
                raise ValueError(f"unknown modifier {m}")
        self.names = names or [str(i) for i in range(len(params))]
        spec, _, smooth = spec.partition("~")
        self.smooth = float(smooth) if smooth else 0.0
        parts = spec.split("@")
        self.warmup = int(parts[1]) if len(parts) > 1 else 0
        fields = parts[0].split(":")
        self.kind = fields[0]
        self.density = float(fields[1]) if len(fields) > 1 else 1.0
        self.beta = float(fields[2]) if len(fields) > 2 else 0.9
        self.ranks = ranks
        self.buf = [[torch.zeros_like(p) for p in params] for _ in range(ranks)]
        self.ref = [torch.zeros_like(p) for p in params]
        self.pending = [torch.zeros_like(p) for p in params]
        self.sent_values = 0
        self.dense_values = 0
        self.sent_bits = 0.0
        self.dense_bits = 0.0
        self.dct = {}
        if self.kind in ("dct", "dctg"):
            for i, p in enumerate(params):
                if p.numel() >= DENSE_THRESHOLD and not any(e in self.names[i] for e in self.elem_names):
                    self.dct[i] = ChunkedDct(p.shape, self.dct_chunk)
            self.buf = [[torch.zeros(self.dct[i].blocks, self.dct[i].cr * self.dct[i].cc) if i in self.dct
                         else torch.zeros_like(p) for i, p in enumerate(params)] for _ in range(ranks)]

    def density_at(self, step):
        if step < self.ramp // 2:
            return max(self.density, 0.25)
        if step < self.ramp:
            return max(self.density, 0.0625)
        return self.density

    def quantise(self, s, idx_count):
        """SparseLoCo-style: the kept values as sign x their mean magnitude (one scale per tensor)."""
        nz = s != 0
        scale = s[nz].abs().mean() if idx_count > 0 else s.new_zeros(())
        return torch.where(nz, s.sign() * scale, s)

    def average_dct(self, i, gs, density, dense):
        """DeMo's transmission: m (kept in the DCT domain, the transform being orthonormal and linear) <-
        b*m + DCT(g); the top kb coefficients of every block are sent; m -= sent."""
        t = self.dct[i]
        per_block = t.cr * t.cc
        kb = max(1, int(round(density * per_block)))
        total = None
        for r in range(self.ranks):
            b = self.buf[r][i]
            b.mul_(self.beta).add_(t.forward(gs[r]))
            if dense:
                s = b.clone()
            elif self.kind == "dctg":  # one top-k over all of the tensor's coefficients
                if self.floor:  # at least one coefficient of every block: its largest
                    s = topk_mask_values(b, max(0, kb * t.blocks - t.blocks))
                    rest = b - s
                    col = rest.abs().argmax(dim=1)
                    ar = torch.arange(t.blocks)
                    s[ar, col] += rest[ar, col]
                else:
                    s = topk_mask_values(b, kb * t.blocks)
                if self.sign:
                    s = self.quantise(s, kb * t.blocks)
            else:
                idx = torch.topk(b.abs(), kb, dim=1, sorted=False).indices
                s = torch.zeros_like(b)
                s.scatter_(1, idx, b.gather(1, idx))
                if self.sign:
                    mag = b.gather(1, idx).abs().mean(dim=1, keepdim=True)
                    s.scatter_(1, idx, b.gather(1, idx).sign() * mag)
            b.sub_(s)
            total = s if total is None else total + s
            n = gs[r].numel()
            self.sent_values += n if dense else kb * t.blocks
            if self.kind == "dctg" and not dense:
                kept = kb * t.blocks
                self.sent_bits += index_bits(n, kept) + (kept + 32 if self.sign else 16 * kept)
            else:
                self.sent_bits += 16.0 * n if dense else t.blocks * (
                    index_bits(per_block, kb) + (kb + 16 if self.sign else 16 * kb))
        return t.inverse(total / self.ranks, gs[0].shape)

    def average(self, step, grads):
        """grads[r][i]: rank r's gradient of parameter i -> the averaged gradient of each parameter."""
        out = []
        for i in range(len(grads[0])):
            gs = [grads[r][i] for r in range(self.ranks)]
            n = gs[0].numel()
            self.dense_values += n * self.ranks
            self.dense_bits += 32.0 * n * self.ranks
            if self.kind == "ddp" or n < DENSE_THRESHOLD or any(d in self.names[i] for d in self.dense_names):
                self.sent_values += n * self.ranks
                self.sent_bits += (32.0 if self.kind == "ddp" else 16.0) * n * self.ranks
                out.append(sum(gs) / self.ranks)
                continue
            density = self.density_at(step)
            k = max(1, int(round(density * n)))
            dense = step < self.warmup
            if i in self.dct:
                out.append(self.average_dct(i, gs, density, dense))
                continue
            sent = []
            for r in range(self.ranks):
                b = self.buf[r][i]
                if self.kind == "ef":
                    b.add_(gs[r])
                elif self.kind in ("mom", "dct", "dctg"):
                    b.mul_(self.beta).add_(gs[r])
                elif self.kind == "track":
                    b.add_(gs[r] - self.ref[i])
                else:
                    raise ValueError(f"unknown method {self.kind}")
                if dense:
                    s = b.clone()
                elif self.floor and b.dim() == 2 and b.shape[0] < k:
                    rows = b.shape[0]
                    s = topk_mask_values(b, k - rows)
                    rest = b - s
                    col = rest.abs().argmax(dim=1)
                    ar = torch.arange(rows)
                    s[ar, col] += rest[ar, col]
                else:
                    s = topk_mask_values(b, k)
                if self.sign and not dense:
                    s = self.quantise(s, k)
                b.sub_(s)
                sent.append(s)
                self.sent_values += n if dense else k
                self.sent_bits += 16.0 * n if dense else (
                    index_bits(n, k) + (k + 32 if self.sign else 16 * k))
            avg = sum(sent) / self.ranks
            if self.kind == "track":
                self.ref[i].add_(avg)
                avg = self.ref[i].clone()
            if self.smooth > 0:
                pending = self.pending[i]
                pending.add_(avg)
                avg = pending * self.smooth
                pending.sub_(avg)
            out.append(avg)
        return out


def run(spec, args, data):
    model = lm.make(seed=0, vocab=data["vocab"], d=args.d_model, layers=args.layers, heads=args.heads,
                    context=args.context)
    names = [n for n, _ in model.named_parameters()]
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    method = Method(spec, params, args.ranks, names)
    samplers = [corpus.Sampler(data["train"], args.context, args.batch, seed=1000 + r) for r in range(args.ranks)]
    evals = corpus.eval_batches(data["held_out"], args.context, count=args.eval_batches, batch=16)
    curve, train_tail = [], []
    t0 = time.perf_counter()
    for step in range(args.steps):
        grads, losses = [], []
        for r in range(args.ranks):
            x, y = samplers[r].next()
            model.zero_grad(set_to_none=True)
            loss = lm.loss_of(model, x, y)
            loss.backward()
            losses.append(loss.item())
            grads.append([p.grad.detach().clone() for p in params])
        with torch.no_grad():
            for p, g in zip(params, method.average(step, grads)):
                p.grad = g
        opt.step()
        if step >= args.steps - 20:
            train_tail.append(sum(losses) / len(losses))
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            curve.append((step + 1, lm.held_out_loss(model, evals)))
            sys.stderr.write(f"[study] {spec} step {step + 1} held-out {curve[-1][1]:.4f} "
                             f"({time.perf_counter() - t0:.0f}s, load {os.getloadavg()[0]:.1f})\n")
            sys.stderr.flush()
    ratio = method.dense_values / max(1, method.sent_values)
    return {"method": spec, "curve": curve, "final_held_out": curve[-1][1],
            "train_loss_last20": sum(train_tail) / len(train_tail),
            "value_ratio_vs_dense": ratio, "est_bytes_ratio_vs_fp32": method.dense_bits / method.sent_bits,
            "steps": args.steps, "d_model": args.d_model, "layers": args.layers}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", nargs="+", default=["ddp", "ef:0.01", "mom:0.01:0.9", "track:0.01"])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--corpus-bytes", type=int, default=8 << 20)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data", default="/tmp/adamcodec_lm_corpus.pt")
    p.add_argument("--out", default="", help="JSON results (one line per method appended)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if not os.path.exists(args.data):
        corpus.save(corpus.build(args.vocab, args.corpus_bytes), args.data + ".tmp")
        os.replace(args.data + ".tmp", args.data)
    data = corpus.load(args.data)
    for spec in args.methods:
        torch.manual_seed(0)
        res = run(spec, args, data)
        line = json.dumps(res)
        print(f"RESULT method={spec} held_out={res['final_held_out']:.4f} train20={res['train_loss_last20']:.4f} "
              f"values_ratio={res['value_ratio_vs_dense']:.1f} est_bytes_ratio={res['est_bytes_ratio_vs_fp32']:.1f}",
              flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
