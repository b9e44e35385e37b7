#!/usr/bin/env python3
"""One rank of the LM race (bench/lm/race.py): a small byte-level transformer trained on the standard
library's .py files with one synchronisation method, for a fixed number of steps.

Methods: ddp (DistributedDataParallel, gloo fp32 allreduce of gradients every step), dgc (DDP with gradex's
hook: DGC top-k at --sparsity, error feedback, no momentum correction since AdamW keeps its own moments),
localsgd (gx.LocalSGD: parameters averaged every --localsgd-period steps), diloco (gx.DiLoCo, 8-bit
pseudo-gradients, --fragments fragments with merges --delay steps after their exchange starts).
Inner optimizer: AdamW for every method. Clock: rank 0's training-step wall time (forward, backward,
exchange, optimizer step, DiLoCo/LocalSGD step); evaluations pause it. Every --eval-every steps rank 0
measures the held-out loss (DiLoCo: of the global copy) and reads the bytes every host has put on the wire
(kernel counters of the switch ports, --switch). Rank 0 writes the curve to --curve-out as JSON.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import corpus  # noqa: E402
import model as lm  # noqa: E402

METHODS = ("ddp", "dgc", "localsgd", "diloco")


def wire_bytes(switch, hosts):
    if not switch:
        return 0
    total = 0
    for i in range(hosts):
        out = subprocess.run(["ip", "netns", "exec", switch, "cat", f"/sys/class/net/p{i}/statistics/rx_bytes"],
                             check=True, capture_output=True, text=True, timeout=30)
        total += int(out.stdout)
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", choices=METHODS, required=True)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--eval-every", type=int, default=16)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--sparsity", type=float, default=0.99)
    p.add_argument("--localsgd-period", type=int, default=8)
    p.add_argument("--period", type=int, default=16, help="DiLoCo's H")
    p.add_argument("--fragments", type=int, default=2)
    p.add_argument("--delay", type=int, default=1)
    p.add_argument("--bits", type=int, default=8)
    p.add_argument("--switch", default="")
    p.add_argument("--curve-out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    train, held = corpus.load()
    sampler = corpus.Sampler(train, args.context, args.batch, seed=1000 + rank)
    evals = corpus.eval_batches(held, args.context, count=6, batch=16)
    model = lm.make(seed=0, d=args.d_model, layers=args.layers, context=args.context)
    eval_model = lm.make(seed=0, d=args.d_model, layers=args.layers, context=args.context)
    net, after_step, diloco = model, (lambda: None), None
    if args.method in ("ddp", "dgc"):
        net = torch.nn.parallel.DistributedDataParallel(model)
        if args.method == "dgc":
            import gradex.torch as gx
            net.register_comm_hook(gx.State(config={"GRADEX_SPARSITY": args.sparsity, "GRADEX_MOMENTUM": 0,
                                                    "GRADEX_WARMUP_STEPS": 8}), gx.hook)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    if args.method == "localsgd":
        import gradex.torch as gx
        lsgd = gx.LocalSGD(model, period=args.localsgd_period, warmup_steps=0,
                           config={"GRADEX_FP16": 0})
        after_step = lsgd.step
    elif args.method == "diloco":
        import gradex.torch as gx
        diloco = gx.DiLoCo(model, opt, period=args.period, fragments=args.fragments, delay=args.delay,
                           bits=args.bits, outer_lr=0.7, outer_momentum=0.9)
        after_step = diloco.step

    def evaluate():
        if diloco is not None:
            eval_model.load_state_dict(diloco.global_parameters(), strict=False)
            return lm.held_out_loss(eval_model, evals)
        return lm.held_out_loss(model, evals)

    hosts = world
    curve = []
    if rank == 0:
        curve.append((0.0, 0, evaluate(), 0))
    base_bytes = wire_bytes(args.switch, hosts) if rank == 0 else 0
    dist.barrier()
    clock = 0.0
    for step in range(1, args.steps + 1):
        x, y = sampler.next()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(net(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()
        opt.step()
        after_step()
        clock += time.perf_counter() - t0
        if step % args.eval_every == 0 or step == args.steps:
            if rank == 0:
                b = wire_bytes(args.switch, hosts) - base_bytes
                curve.append((clock, step, evaluate(), b))
                sys.stderr.write(f"[lm] {args.method} step {step}/{args.steps} loss {curve[-1][2]:.4f} "
                                 f"t {clock:.1f}s\n")
            dist.barrier()  # outside the clock
    if diloco is not None:
        # The exchange launched at the last step completes (no further inner steps): the final point is
        # the global model every rank holds after synchronize(), its wait included in the clock.
        t0 = time.perf_counter()
        diloco.synchronize()
        clock += time.perf_counter() - t0
        if rank == 0:
            curve.append((clock, args.steps, evaluate(), wire_bytes(args.switch, hosts) - base_bytes))
        diloco.close()
    if rank == 0:
        with open(args.curve_out, "w") as f:
            json.dump({"method": args.method, "curve": curve, "args": vars(args)}, f)
        print(f"RESULT method={args.method} steps={args.steps} train_s={clock:.6g} final_loss={curve[-1][2]:.6g} "
              f"bytes={curve[-1][3]}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
