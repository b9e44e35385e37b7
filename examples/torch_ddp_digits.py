"""Data-parallel training of a small CNN on scikit-learn's bundled digits, with and without gradex.

The two-line change from plain DDP is marked "gradex:" below. Run on 4 local processes with:

    .venv/bin/torchrun --nproc-per-node 4 examples/torch_ddp_digits.py --mode dgc

(--mode ddp: plain DDP over gloo; dgc: gradex DGC via the comm hook; localsgd: gradex LocalSGD with H=4).
The tests (tests/python/test_convergence.py) call train() from here.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import gradex.torch as gx


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 4 * 4, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def load_digits():
    """(train_x, train_y, test_x, test_y): 8x8 images scaled to [0, 1], a fixed 80/20 split."""
    from sklearn.datasets import load_digits as sk_digits
    data = sk_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    cut = int(0.8 * len(y))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def accuracy(model, x, y):
    with torch.no_grad():
        return 100.0 * (model(x).argmax(1) == y).float().mean().item()


def train(mode, steps=300, batch=16, lr=0.05, warmup=40, period=4, config=None, on_step=None):
    """Trains on this rank's shard; returns (test accuracy in %, the gradex object or None).

    mode "ddp": DDP over the default (gloo) group, SGD with momentum 0.9.
    mode "dgc": the same model through gx.hook with DGC at 99.9% after `warmup` steps; the State is given the
      optimizer, so gradex takes SGD's momentum 0.9 over (DGC's momentum correction).
    mode "localsgd": gx.LocalSGD averages parameters every `period` steps after `warmup` synchronous ones;
      the optimizer owns momentum in both phases (LocalSGD's default is GRADEX_MOMENTUM=0), so SGD keeps 0.9.
    on_step(step, gradex_object) is called after every step (the tests read gx.stats() there)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    train_x, train_y, test_x, test_y = load_digits()
    shard_x, shard_y = train_x[rank::world], train_y[rank::world]
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    helper = None
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if mode == "dgc":
        settings = {"GRADEX_SPARSITY": "0.999", "GRADEX_WARMUP_STEPS": str(warmup)}
        settings.update(config or {})
        helper = gx.State(ddp, config=settings, optimizer=opt)  # gradex: line 1 (takes SGD's momentum over)
        ddp.register_comm_hook(helper, gx.hook)                   # gradex: line 2
    elif mode == "localsgd":
        settings = {"GRADEX_SPARSITY": "0"}  # dense (fp16) gradients during the synchronous warm-up
        settings.update(config or {})
        helper = gx.LocalSGD(ddp, period=period, warmup_steps=warmup, config=settings)
        # LocalSGD leaves momentum to the optimizer (GRADEX_MOMENTUM=0 unless set): SGD keeps momentum 0.9.
    elif mode != "ddp":
        raise ValueError(f"unknown mode {mode!r}")
    gen = torch.Generator().manual_seed(1 + rank)
    for step in range(steps):
        index = torch.randint(0, len(shard_y), (batch,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(ddp(shard_x[index]), shard_y[index]).backward()
        opt.step()
        if mode == "localsgd":
            helper.step()
        if on_step is not None:
            on_step(step, helper)
    return accuracy(model, test_x, test_y), helper


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["ddp", "dgc", "localsgd"], default="dgc")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    acc, helper = train(args.mode, steps=args.steps)
    if dist.get_rank() == 0:
        line = f"{args.mode}: test accuracy {acc:.2f}% after {args.steps} steps on {dist.get_world_size()} ranks"
        if helper is not None:
            s = gx.stats(helper)
            line += (f"; gradex sent {s['bytes_sent']} B vs {s['dense_bytes']} B dense "
                     f"(ratio {s['compression_ratio']:.1f})")
        print(line, flush=True)
    if helper is not None:
        helper.close()
    dist.destroy_process_group()


if __name__ == "__main__" and "RANK" in os.environ:
    main()
elif __name__ == "__main__":
    raise SystemExit("launch with torchrun, e.g. torchrun --nproc-per-node 4 examples/torch_ddp_digits.py")
