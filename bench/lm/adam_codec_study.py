#!/usr/bin/env python3
"""Which sparse exchange trains like AdamW? Equal-steps comparison on the LM race's model (issue 21, item 2).

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
  Suffix ~C: the receiver spreads what arrives over the next steps: R += average(sent); AdamW receives C*R;
             R -= C*R (R identical on every rank; nothing is lost, bursts are smoothed for AdamW's second
             moment). Suffix @W: the first W steps dense (a warm-up of AdamW's moments).

Bytes per step are estimated as the selection's count x (4 value + 2 index) bytes; bench/lm/adam_codec_bytes.py
measures the real wire bytes of the implemented codec through gradex's statistics.

  python bench/lm/adam_codec_study.py --steps 300 --methods ddp ef:0.01 mom:0.01:0.9 track:0.01
"""
import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import corpus  # noqa: E402
import model as lm  # noqa: E402

DENSE_THRESHOLD = 16384


def topk_mask_values(x, k):
    flat = x.reshape(-1)
    idx = torch.topk(flat.abs(), k, sorted=False).indices
    out = torch.zeros_like(flat)
    out[idx] = flat[idx]
    return out.view_as(x)


class Method:
    def __init__(self, spec, params, ranks):
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

    def average(self, step, grads):
        """grads[r][i]: rank r's gradient of parameter i -> the averaged gradient of each parameter."""
        out = []
        for i in range(len(grads[0])):
            gs = [grads[r][i] for r in range(self.ranks)]
            n = gs[0].numel()
            self.dense_values += n * self.ranks
            if self.kind == "ddp" or n < DENSE_THRESHOLD:
                self.sent_values += n * self.ranks
                out.append(sum(gs) / self.ranks)
                continue
            k = max(1, int(round(self.density * n)))
            dense = step < self.warmup
            sent = []
            for r in range(self.ranks):
                b = self.buf[r][i]
                if self.kind == "ef":
                    b.add_(gs[r])
                elif self.kind == "mom":
                    b.mul_(self.beta).add_(gs[r])
                elif self.kind == "track":
                    b.add_(gs[r] - self.ref[i])
                else:
                    raise ValueError(f"unknown method {self.kind}")
                s = b.clone() if dense else topk_mask_values(b, k)
                b.sub_(s)
                sent.append(s)
                self.sent_values += n if dense else k
            avg = sum(sent) / self.ranks
            if self.kind == "track":
                self.ref[i].add_(avg)
                avg = self.ref[i].clone()
            if self.smooth > 0:
                r = self.pending[i]
                r.add_(avg)
                avg = r * self.smooth
                r.sub_(avg)
            out.append(avg)
        return out


def run(spec, args, data):
    model = lm.make(seed=0, vocab=data["vocab"], d=args.d_model, layers=args.layers, heads=args.heads,
                    context=args.context)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    method = Method(spec, params, args.ranks)
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
                             f"({time.perf_counter() - t0:.0f}s)\n")
    ratio = method.dense_values / max(1, method.sent_values)
    return {"method": spec, "curve": curve, "final_held_out": curve[-1][1],
            "train_loss_last20": sum(train_tail) / len(train_tail),
            "value_ratio_vs_dense": ratio, "est_bytes_ratio_vs_fp32": ratio * 4 / 6 if spec != "ddp" else 1.0}


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
