#!/usr/bin/env python3
"""One rank of the training race of bench/run: data-parallel SGD on the digits task (task.py) with one
gradient-exchange method, for a fixed budget of training time (or steps), noting when the test
accuracy first reaches the target.

Started once per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GLOO_SOCKET_IFNAME set:

    train_rank.py --method gradex_dgc --target 0.92 --max-steps 400 --max-train-s 60 --curve-out c.json

Methods: ddp_gloo (DDP's default fp32 allreduce), torch_fp16 (fp16_compress_hook), powersgd (PowerSGD
hook, rank 4), gradex_dgc (gx.hook: DGC with momentum correction), gradex_localsgd (gx.LocalSGD,
H=4, after synchronous warm-up steps).

Clock: the sum of rank 0's training-step times (forward, backward with its exchange, optimizer
step, LocalSGD's averaging); evaluations pause it. Every --eval-every steps rank 0 measures the test
accuracy of its model (for LocalSGD: as it stands, averaged or not) and tells the others whether the
budget is spent. Training goes on after the target, so that "final accuracy" compares the methods
at equal training time. Rank 0 writes the accuracy curve to --curve-out and prints
"RESULT method=... steps=... train_s=... time_to_target_s=... final_accuracy=... reached=0|1".
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "baselines"))
import task  # noqa: E402
from modes import serialized_hook  # noqa: E402

METHODS = ("ddp_gloo", "torch_fp16", "powersgd", "gradex_dgc", "gradex_localsgd")


def setup(method, model, args):
    """(ddp model, optimizer, after-step callback) for one method."""
    ddp = DistributedDataParallel(model)
    momentum, after_step = 0.9, (lambda: None)
    if method == "torch_fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif method == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                            start_powerSGD_iter=args.sync_warmup)
        ddp.register_comm_hook(state, serialized_hook(powerSGD_hook.powerSGD_hook))
    elif method == "gradex_dgc":
        import gradex.torch as gx
        # gradex applies DGC's momentum correction itself (GRADEX_MOMENTUM), so the optimizer runs
        # without momentum; the first steps ramp the sparsity up (DGC's warm-up).
        state = gx.State(config={"GRADEX_SPARSITY": args.sparsity,
                                 "GRADEX_WARMUP_STEPS": args.sync_warmup, "GRADEX_MOMENTUM": 0.9})
        ddp.register_comm_hook(state, gx.hook)
        momentum = 0.0
    elif method == "gradex_localsgd":
        import gradex.torch as gx
        # Synchronous warm-up steps average dense fp16 gradients (no DGC: every tensor below the
        # dense threshold), then ranks step locally and average parameters every H steps.
        lsgd = gx.LocalSGD(ddp, period=args.period, warmup_steps=args.sync_warmup,
                           config={"GRADEX_DENSE_THRESHOLD": 1 << 40, "GRADEX_MOMENTUM": 0})
        after_step = lsgd.step
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=momentum)
    return ddp, optimizer, after_step


class Progress:
    def __init__(self, enabled):
        self.enabled, self.tty = enabled, sys.stderr.isatty()

    def update(self, method, step, total):
        if self.enabled and self.tty:
            sys.stderr.write(f"\r[train] {method} step {step + 1}/{total}   ")
            sys.stderr.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", choices=METHODS, required=True)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--target", type=float, default=0.92)
    p.add_argument("--max-steps", type=int, default=400)
    p.add_argument("--max-train-s", type=float, default=60)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--sync-warmup", type=int, default=10,
                   help="PowerSGD's start iteration, DGC's sparsity warm-up, LocalSGD's synchronous steps")
    p.add_argument("--sparsity", type=float, default=0.99)
    p.add_argument("--period", type=int, default=4, help="LocalSGD's H")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--curve-out", required=True)
    p.add_argument("--timeout-s", type=float, default=120)
    args = p.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    x_train, y_train, x_test, y_test = task.split(args.seed)
    shard = task.Shard(x_train, y_train, rank, world, args.batch, args.seed)
    model = task.make_model(args.hidden, args.seed)
    ddp, optimizer, after_step = setup(args.method, model, args)
    loss_fn = torch.nn.CrossEntropyLoss()
    progress = Progress(rank == 0)

    clock, curve, time_to_target, step = 0.0, [(0.0, 0, task.accuracy(model, x_test, y_test))], None, 0
    stop = torch.zeros(1)
    while step < args.max_steps:
        progress.update(args.method, step, args.max_steps)
        x, y = shard.next()
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss_fn(ddp(x), y).backward()
        optimizer.step()
        after_step()
        clock += time.perf_counter() - t0
        step += 1
        if step % args.eval_every == 0 or step == args.max_steps:
            if rank == 0:
                acc = task.accuracy(model, x_test, y_test)
                curve.append((clock, step, acc))
                if acc >= args.target and time_to_target is None:
                    time_to_target = clock
                stop[0] = 1.0 if clock >= args.max_train_s else 0.0
            dist.broadcast(stop, src=0)  # outside the clock, like the evaluation
            if stop[0] > 0:
                break
    if rank == 0:
        sys.stderr.write("\r\033[K" if sys.stderr.isatty() else "")
        final = curve[-1][2]
        with open(args.curve_out, "w") as f:
            json.dump({"method": args.method, "curve": curve, "target": args.target,
                       "time_to_target_s": time_to_target, "steps": step, "train_s": clock,
                       "final_accuracy": final, "config": vars(args)}, f)
        print(f"RESULT method={args.method} steps={step} train_s={clock:.6g} "
              f"time_to_target_s={time_to_target if time_to_target is not None else 'nan'} "
              f"final_accuracy={final:.6g} reached={int(time_to_target is not None)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
