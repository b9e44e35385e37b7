#!/usr/bin/env python3
"""One rank of the LM race (bench/lm/race.py): the race's transformer (model.py) trained with AdamW on the
standard library's .py files (corpus.py) with one synchronisation method, for a wall-clock budget.

Clock: rank 0's elapsed wall time of training (steps, exchanges, waits, the per-step stop signal), with the
held-out evaluations paused out of it. After every step rank 0 broadcasts (stop, evaluate) to the other ranks,
so every rank runs the same number of steps; the broadcast is a few bytes and counts towards the clock and the
bytes of every method alike. Every --eval-every seconds of clock, and at the end, rank 0 measures the held-out
loss (DiLoCo: of the global model; LocalSGD and no-communication: of its own model) and reads the bytes all
hosts have put on the wire (the switch ports' kernel counters, --switch; null without one). With --steps N the
run ends after N steps instead (evaluations every --eval-steps steps): equal-step comparisons of methods or
settings (bench/lm/diloco_grid.py). Rank 0 writes the curve, [(clock_s, step, held_out_loss, bytes)], to
--curve-out as JSON.
"""
import argparse
import datetime
import inspect
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


def _ddp(model, args, opt):
    return torch.nn.parallel.DistributedDataParallel(model), "DDP, gloo fp32 allreduce"


def _fp16(model, args, opt):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    net = torch.nn.parallel.DistributedDataParallel(model)
    net.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
    return net, "DDP + torch fp16_compress_hook"


def _powersgd(model, args, opt):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    net = torch.nn.parallel.DistributedDataParallel(model)
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                        start_powerSGD_iter=2)
    net.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return net, f"DDP + torch powerSGD_hook (rank {args.powersgd_rank}, error feedback)"


def _gradex_default(model, args, opt):
    import gradex.torch as gx
    net = torch.nn.parallel.DistributedDataParallel(model)
    if "optimizer" in inspect.signature(gx.State).parameters:
        state, label = gx.State(net, optimizer=opt), "gx.State(ddp, optimizer=AdamW) + gx.hook"
    else:
        # This gradex has no optimizer-aware State: the plain hook's defaults, with the momentum AdamW
        # already keeps switched off (GRADEX_MOMENTUM=0), as docs/pytorch.md asks for Adam-family optimizers.
        state = gx.State(net, config={"GRADEX_MOMENTUM": 0})
        label = "gx.State(ddp) + gx.hook, GRADEX_MOMENTUM=0 (no optimizer= in this gradex)"
    net.register_comm_hook(state, gx.hook)
    return net, label


def _gradex_localsgd(model, args, opt):
    import gradex.torch as gx
    lsgd = gx.LocalSGD(model, period=args.localsgd_period)
    return model, f"gx.LocalSGD(period={args.localsgd_period})", lsgd.step


def _diloco(bits):
    def make(model, args, opt):
        import gradex.torch as gx
        if bits == "topk":
            codec, what = dict(compression="topk", density=args.density), f"top-k {args.density:g}"
        else:
            codec, what = dict(bits=bits), f"{bits}-bit"
        d = gx.DiLoCo(model, opt, period=args.period, fragments=args.fragments, delay=args.delay,
                      outer_lr=args.outer_lr, outer_momentum=args.outer_momentum, **codec)
        return model, (f"gx.DiLoCo({what}, H={args.period}, {args.fragments} fragments, delay {args.delay}, "
                       f"outer lr {args.outer_lr:g} momentum {args.outer_momentum:g})"), d
    return make


def _nocomm(model, args, opt):
    return model, "no communication (each rank trains alone: the compute bound)"


# name -> builder(model, args, optimizer) returning (module to call, label[, per-step callable or DiLoCo]).
# Add a method here and (if it is a gradex or a PyTorch hook method) to race.py's GRADEX / HOOKS.
METHODS = {
    "ddp": _ddp,
    "fp16": _fp16,
    "powersgd": _powersgd,
    "gradex_default": _gradex_default,
    "gradex_localsgd": _gradex_localsgd,
    "gradex_diloco8": _diloco(8),
    "gradex_diloco4": _diloco(4),
    "gradex_diloco32": _diloco(32),
    "gradex_diloco_topk": _diloco("topk"),
    "nocomm": _nocomm,
}


def wire_bytes(switch, hosts):
    """Bytes all hosts have transmitted (the switch ports' receive counters), or None without a switch."""
    if not switch:
        return None
    out = subprocess.run(["ip", "-j", "-n", switch, "-s", "link", "show"], check=True, capture_output=True,
                         text=True, timeout=30)
    stats = {link["ifname"]: link["stats64"]["rx"]["bytes"] for link in json.loads(out.stdout)}
    return sum(stats[f"p{i}"] for i in range(hosts))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", choices=sorted(METHODS), required=True)
    p.add_argument("--data", required=True, help="the corpus file race.py wrote (corpus.save)")
    p.add_argument("--budget", type=float, default=0, help="seconds of training clock (or --steps)")
    p.add_argument("--eval-every", type=float, default=0, help="seconds of clock (default budget / 12)")
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--context", type=int, default=lm.DEFAULTS["context"])
    p.add_argument("--d-model", type=int, default=lm.DEFAULTS["d"])
    p.add_argument("--layers", type=int, default=lm.DEFAULTS["layers"])
    p.add_argument("--heads", type=int, default=lm.DEFAULTS["heads"])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--localsgd-period", type=int, default=16)
    p.add_argument("--period", type=int, default=32, help="DiLoCo's H (inner steps per outer step)")
    p.add_argument("--fragments", type=int, default=4, help="DiLoCo's streaming fragments")
    p.add_argument("--delay", type=int, default=2, help="DiLoCo: inner steps a fragment's exchange overlaps")
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.5,
                   help="0.5: the best at the race's H=32 (bench/lm/diloco_grid.py, docs/benchmarks.md)")
    p.add_argument("--density", type=float, default=0.01, help="gradex_diloco_topk: fraction sent per sync")
    p.add_argument("--steps", type=int, default=0,
                   help="stop after this many steps instead of the budget (equal-step comparisons); "
                        "evaluations every --eval-steps steps")
    p.add_argument("--eval-steps", type=int, default=0, help="with --steps: steps between evaluations "
                                                             "(default steps / 4)")
    p.add_argument("--switch", default="", help="the emulated cluster's switch namespace (byte counters)")
    p.add_argument("--curve-out", required=True)
    args = p.parse_args(argv)
    if args.steps < 0 or args.eval_steps < 0:
        p.error(f"--steps and --eval-steps must be >= 0, got {args.steps} and {args.eval_steps}")
    if args.steps == 0 and args.budget <= 0:
        p.error(f"--budget must be positive seconds (or give --steps), got {args.budget}")
    if args.steps:
        args.budget = float("inf")
        args.eval_steps = args.eval_steps or max(1, args.steps // 4)
    args.eval_every = args.eval_every or args.budget / 12
    return args


def main():
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    data = corpus.load(args.data)
    shape = dict(vocab=data["vocab"], d=args.d_model, layers=args.layers, heads=args.heads, context=args.context)
    sampler = corpus.Sampler(data["train"], args.context, args.batch, seed=1000 + rank)
    evals = corpus.eval_batches(data["held_out"], args.context, count=args.eval_batches, batch=16)
    model = lm.make(seed=0, **shape)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    built = METHODS[args.method](model, args, opt)
    net, label = built[0], built[1]
    extra = built[2] if len(built) > 2 else None
    diloco = extra if extra is not None and hasattr(extra, "global_parameters") else None
    after_step = diloco.step if diloco is not None else (extra or (lambda: None))
    eval_model = lm.make(seed=0, **shape) if diloco is not None else model

    def evaluate():
        if diloco is not None:
            eval_model.load_state_dict(diloco.global_parameters(), strict=False)
        return lm.held_out_loss(eval_model, evals)

    curve = []
    base_bytes = wire_bytes(args.switch, world) if rank == 0 else None

    def record(clock, step):
        b = wire_bytes(args.switch, world)
        curve.append((clock, step, evaluate(), None if b is None else b - base_bytes))
        sys.stderr.write(f"[lm] {args.method} step {step} t {clock:.1f}s loss {curve[-1][2]:.4f}\n")

    if rank == 0:
        record(0.0, 0)
    dist.barrier()
    signal = torch.zeros(2, dtype=torch.int32)  # (stop, evaluate), rank 0's decision
    clock, next_eval, step = 0.0, args.eval_every, 0
    started = time.perf_counter()
    while True:
        x, y = sampler.next()
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(x).reshape(-1, data["vocab"]), y.reshape(-1)).backward()
        opt.step()
        after_step()
        step += 1
        if rank == 0:
            now = clock + time.perf_counter() - started
            if args.steps:
                signal[0], signal[1] = int(step >= args.steps), int(step % args.eval_steps == 0)
            else:
                signal[0], signal[1] = int(now >= args.budget), int(now >= next_eval)
        dist.broadcast(signal, 0)
        stop, due = bool(signal[0]), bool(signal[1])
        if stop or due:
            clock += time.perf_counter() - started
            if diloco is not None and stop:
                # The exchanges still in flight complete (there are no more inner steps to overlap them
                # with); the wait is training time. The final point is the global model.
                t0 = time.perf_counter()
                diloco.synchronize()
                clock += time.perf_counter() - t0
            if rank == 0:
                record(clock, step)
                next_eval = clock + args.eval_every
            dist.barrier()  # evaluation: outside the clock
            if stop:
                break
            started = time.perf_counter()
    sent = None
    if diloco is not None:
        sent = diloco.stats()["bytes_sent"]  # this rank's, counted by gradex (also without a switch)
        diloco.close()
    if rank == 0:
        with open(args.curve_out, "w") as f:
            json.dump({"method": args.method, "label": label, "curve": curve, "world": world,
                       "gradex_bytes_sent_rank0": sent,
                       "parameters": lm.parameter_count(model), "args": vars(args)}, f)
        print(f"RESULT method={args.method} steps={step} train_s={clock:.6g} final_loss={curve[-1][2]:.6g} "
              f"bytes={curve[-1][3]}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
