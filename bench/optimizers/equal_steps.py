"""What gradex's codecs cost an optimizer at equal steps: held-out loss and accuracy of a small classifier trained
on 2 gloo CPU ranks through gx.DistributedOptimizer, per codec, against the dense fp32 exchange.

    .venv/bin/python -m bench.optimizers.equal_steps --optimizer muon --steps 600 --lr 0.003

The task: a fixed random teacher network labels Gaussian inputs into 10 classes; each rank draws its own
batches. The model is bias-free (Muon updates 2-D matrices only). Every codec runs the fixed policy with the
dense threshold at 4096 elements, so the two hidden matrices (64x256, 256x256) are compressed and the
256x10 head is exchanged in 16 bits or fp32. Prints one line per codec and a Markdown table.
"""
import argparse
import os
import sys
import time

import torch
import torch.multiprocessing as mp

from gradex._ports import free_port

CODECS = {
    "dense fp32": {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0"},
    "16-bit": {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "1"},
    "8-bit": {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "1", "GRADEX_SPARSITY_OVERRIDES": "*.weight:int8"},
    "top-k 99% (error feedback)": {"GRADEX_SPARSITY": "0.99", "GRADEX_OPTIMIZER": "other"},
    "Adam codec 99%": {"GRADEX_ADAM_SPARSITY": "0.99", "GRADEX_OPTIMIZER": "adam"},
    "top-k 99.9% (error feedback)": {"GRADEX_SPARSITY": "0.999", "GRADEX_OPTIMIZER": "other"},
    "Adam codec 99.9%": {"GRADEX_ADAM_SPARSITY": "0.999", "GRADEX_OPTIMIZER": "adam"},
}


def _optimizer(name, params, lr):
    if name == "muon":
        return torch.optim.Muon(params, lr=lr, momentum=0.95, weight_decay=0.0, adjust_lr_fn="match_rms_adamw")
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    raise SystemExit(f"unknown optimizer {name!r} (muon, adamw, sgd)")


def _teacher():
    gen = torch.Generator().manual_seed(7)
    w1, w2 = torch.randn(64, 128, generator=gen), torch.randn(128, 10, generator=gen)
    return lambda x: (torch.tanh(x @ w1) @ w2).argmax(dim=1)


def _rank(rank, world, port, codec, args, out):
    os.environ.update({"GRADEX_POLICY": "fixed", "GRADEX_DENSE_THRESHOLD": "4096", "GRADEX_TIMEOUT_S": "60"})
    torch.set_num_threads(1)
    import torch.distributed as dist
    import gradex.torch as gx
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10, bias=False))
    inner = _optimizer(args.optimizer, model.parameters(), args.lr)
    opt = gx.DistributedOptimizer(inner, named_parameters=model.named_parameters(), config=CODECS[codec])
    teacher = _teacher()
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(args.steps):
        x = torch.randn(32, 64, generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x), teacher(x))
        opt.zero_grad()
        loss.backward()
        opt.step()
    x = torch.randn(4096, 64, generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        logits = model(x)
        y = teacher(x)
        held_out = float(torch.nn.functional.cross_entropy(logits, y))
        accuracy = float((logits.argmax(dim=1) == y).float().mean())
    stats = gx.stats(opt)
    opt.close()
    if rank == 0:
        out.put((held_out, accuracy, stats["bytes_sent"] / max(1, stats["dense_bytes"])))
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizer", default="muon")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--world", type=int, default=2)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    rows = []
    for codec in CODECS:
        out, port, start = ctx.Queue(), free_port(), time.time()
        procs = [ctx.Process(target=_rank, args=(r, args.world, port, codec, args, out)) for r in range(args.world)]
        for p in procs:
            p.start()
        held_out, accuracy, sent = out.get(timeout=600)
        for p in procs:
            p.join()
        rows.append((codec, held_out, accuracy, sent))
        print(f"{args.optimizer} {codec}: held-out loss {held_out:.4f} accuracy {accuracy:.3f} bytes sent "
              f"{sent:.3f} of dense fp32 ({time.time() - start:.0f} s)", file=sys.stderr)
    dense = rows[0][1]
    print(f"| {args.optimizer}, {args.steps} steps, {args.world} ranks | held-out loss | vs dense | accuracy | "
          f"bytes vs dense fp32 |\n|---|---|---|---|---|")
    for codec, held_out, accuracy, sent in rows:
        print(f"| {codec} | {held_out:.4f} | {100 * (held_out / dense - 1):+.1f}% | {accuracy:.3f} | {sent:.3f} |")


if __name__ == "__main__":
    main()
