#!/usr/bin/env python3
"""One rank of the LM race (bench/lm/race.py): the race's transformer (model.py) trained with AdamW on the
standard library's .py files (corpus.py) with one synchronisation method, for a wall-clock budget.

Clock: rank 0's elapsed wall time of training (steps, exchanges, waits, the per-step stop signal). After
every step rank 0 broadcasts whether to stop, so every rank runs the same number of steps; the broadcast is a
few bytes and counts towards the clock and the bytes of every method alike. Every --eval-every seconds of
clock (the same interval for every method of a race) rank 0 takes a snapshot of the model it is judged by
(DiLoCo: the global model; LocalSGD and no-communication: its own) and reads the bytes all hosts have put on
the wire (the switch ports' kernel counters, --switch; null without one). Nothing pauses: the snapshot (a
copy of the parameters and one counter read, a few tens of ms) is in the clock, charged to every method
alike per second of clock, and no rank, no background exchange and no link gets time off the clock. The
held-out losses of the snapshots are computed after training ends, so the interval can be short (it bounds
how much the time to a target is rounded up) without making the run pay for the evaluations. With --steps N
the run ends after N steps instead (snapshots every --eval-steps steps): equal-step comparisons of methods or
settings (bench/lm/diloco_grid.py). Rank 0 writes the curve, [(clock_s, step, held_out_loss, bytes)], to
--curve-out as JSON.

PyTorch's PowerSGD hook runs with its buckets serialized (serialized_hook): over gloo a bucket's second and
third allreduces are issued from the completion callbacks of the first, on gloo's threads, so with two or more
DDP buckets in flight the ranks issue their collectives in different orders and gloo fails ("Received data
size doesn't match expected size"). Serialized, bucket i+1's hook starts when bucket i's last allreduce is done (in
bucket order, the same on every rank): the arithmetic is the hook's own, only the overlap between
buckets is given up. PyTorch's
callbacks cannot reorder collectives there; the hook is written and tested for NCCL.
"""
import argparse
import datetime
import inspect
import json
import os
import subprocess
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
from bench.lm import corpus  # noqa: E402
from bench.lm import model as lm  # noqa: E402
from bench.lm import muon_adamw  # noqa: E402


def _wrap_ddp(model, args):
    return torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)


def serialized_hook(hook):
    """A DDP communication hook that runs `hook` for one bucket at a time: bucket i+1's call starts when
    bucket i's future is done (DDP launches buckets in index order on every rank), so every collective the
    hook issues, also from its own future callbacks, is issued in the same order on every rank. A failure of
    one bucket fails every later bucket's future with it (never a hang)."""
    previous = [None]

    def run(state, bucket):
        before = previous[0]
        if before is None:  # a step's first bucket (DDP waited for the last step's before it ended)
            out = hook(state, bucket)
            previous[0] = None if bucket.is_last() else out
            return out
        out = torch.futures.Future()

        def forward(done):
            try:
                out.set_result(done.value())
            except Exception as e:  # noqa: BLE001 (the hook's failure goes to DDP through the future)
                out.set_exception(e)

        def start(done):
            try:
                done.value()  # the previous bucket's failure
                hook(state, bucket).add_done_callback(forward)
            except Exception as e:  # noqa: BLE001
                out.set_exception(e)

        previous[0] = None if bucket.is_last() else out
        before.add_done_callback(start)
        return out

    return run


def _ddp(model, args, opt):
    return _wrap_ddp(model, args), "DDP, gloo fp32 allreduce"


def _fp16(model, args, opt):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    net = _wrap_ddp(model, args)
    net.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
    return net, "DDP + torch fp16_compress_hook"


def _powersgd(model, args, opt):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    net = _wrap_ddp(model, args)
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                        start_powerSGD_iter=2)
    net.register_comm_hook(state, serialized_hook(powerSGD_hook.powerSGD_hook))
    return net, f"DDP + torch powerSGD_hook (rank {args.powersgd_rank}, error feedback, buckets serialized)"


def _gradex_default(model, args, opt):
    import gradex.torch as gx
    net = _wrap_ddp(model, args)
    if "optimizer" in inspect.signature(gx.State).parameters:
        state = gx.State(net, optimizer=opt)
        label = f"gx.State(ddp, optimizer={type(opt).__name__}) + gx.hook"
    else:
        # This gradex has no optimizer-aware State: the plain hook's defaults, with the momentum AdamW
        # already keeps switched off (GRADEX_MOMENTUM=0), as docs/pytorch.md asks for Adam-family optimizers.
        state = gx.State(net, config={"GRADEX_MOMENTUM": 0})
        label = "gx.State(ddp) + gx.hook, GRADEX_MOMENTUM=0 (no optimizer= in this gradex)"
    net.register_comm_hook(state, gx.hook)
    return net, label


def _gradex_auto(ramp_steps=None):
    """gradex_default under the cost model (GRADEX_POLICY=auto): per tensor fp32, 16-bit or the Adam ladder's
    compressed rung (8-bit with error feedback unless the Adam codec is asked for), the least compression the
    measured link needs. No GRADEX_POLICY_HORIZON_STEPS (a
    wall-clock budget has no known step count). ramp_steps: GRADEX_POLICY_RAMP_STEPS (None: its default)."""
    def make(model, args, opt):
        import gradex.torch as gx
        net = _wrap_ddp(model, args)
        config = {"GRADEX_POLICY": "auto"}
        if ramp_steps is not None:
            config["GRADEX_POLICY_RAMP_STEPS"] = ramp_steps
        state = gx.State(net, optimizer=opt, config=config)
        net.register_comm_hook(state, gx.hook)
        ramp = "" if ramp_steps is None else f", GRADEX_POLICY_RAMP_STEPS={ramp_steps}"
        return net, f"gx.State(ddp, optimizer={type(opt).__name__}, GRADEX_POLICY=auto{ramp}) + gx.hook"
    return make


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
    "gradex_auto": _gradex_auto(),
    "gradex_auto_noramp": _gradex_auto(ramp_steps=0),  # the fidelity ramp's cost, measured
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


def curve_points(count, coarse, target, loss_at):
    """The snapshots worth evaluating (an evaluation costs seconds; snapshots are taken every few): the first,
    the last and `coarse` evenly spaced ones for the curve, then a bisection between the last coarse point
    above `target` and the first at or below it, which finds the first snapshot at or below the target where
    the loss falls monotonically between those two points (elsewhere it may find a later one: the time to
    target can only come out later, never sooner). loss_at(i) evaluates snapshot i (memoized by the caller)."""
    step = max(1, -(-(count - 1) // max(1, coarse)))
    grid = sorted({*range(0, count, step), count - 1})
    for i in grid:
        loss_at(i)
    below = next((k for k, i in enumerate(grid) if loss_at(i) <= target), None)
    if below:  # not None and not the first snapshot
        lo, hi = grid[below - 1], grid[below]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if loss_at(mid) <= target:
                hi = mid
            else:
                lo = mid
    return grid


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", choices=sorted(METHODS), required=True)
    p.add_argument("--data", required=True, help="the corpus file race.py wrote (corpus.save)")
    p.add_argument("--budget", type=float, default=0, help="seconds of training clock (or --steps)")
    p.add_argument("--eval-every", type=float, default=0,
                   help="seconds of clock between snapshots (default min(4, budget / 12))")
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--curve-points", type=int, default=6,
                   help="snapshots evaluated evenly for the curve (plus the bisection to the target)")
    p.add_argument("--target-loss", type=float, default=0,
                   help="the race's target (race.py: DDP's final loss); 0: this run's own final loss")
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--context", type=int, default=lm.DEFAULTS["context"])
    p.add_argument("--d-model", type=int, default=lm.DEFAULTS["d"])
    p.add_argument("--layers", type=int, default=lm.DEFAULTS["layers"])
    p.add_argument("--heads", type=int, default=lm.DEFAULTS["heads"])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--optimizer", choices=("adamw", "muon"), default="adamw",
                   help="muon: Muon for the blocks' weight matrices, AdamW for the rest (muon_adamw.py)")
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--bucket-cap-mb", type=float, default=25, help="DDP's bucket size (ddp, hooks, gradex_default)")
    p.add_argument("--localsgd-period", type=int, default=16)
    p.add_argument("--period", type=int, default=32, help="DiLoCo's H (inner steps per outer step)")
    p.add_argument("--fragments", type=int, default=4, help="DiLoCo's streaming fragments")
    p.add_argument("--delay", type=int, default=2, help="DiLoCo: inner steps a fragment's exchange overlaps")
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.5,
                   help="0.5: the best at the race's H=32 (bench/lm/diloco_grid.py, docs/benchmarks.md)")
    p.add_argument("--density", type=float, default=0.01, help="gradex_diloco_topk: fraction sent per sync")
    p.add_argument("--keep-local", type=int, choices=(0, 1), default=1,
                   help="DiLoCo's final synchronize(): 1 merges every rank's steps since each fragment's last sync "
                        "(one last outer step), 0 resets to the global copy (drops them)")
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
    if args.eval_every < 0 or args.bucket_cap_mb <= 0:
        p.error(f"--eval-every must be >= 0 and --bucket-cap-mb > 0, got {args.eval_every}, {args.bucket_cap_mb}")
    args.eval_every = args.eval_every or min(4.0, args.budget / 12)
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
    opt: Any  # MuonWithAuxAdam or AdamW: both step, zero_grad and hold param_groups
    if args.optimizer == "muon":
        opt = muon_adamw.MuonWithAuxAdam(model, lr=args.lr, adam_lr=args.lr)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    built = METHODS[args.method](model, args, opt)
    net, label = built[0], built[1]
    extra = built[2] if len(built) > 2 else None
    diloco = extra if extra is not None and hasattr(extra, "global_parameters") else None
    after_step = diloco.step if diloco is not None else (extra or (lambda: None))
    eval_model = lm.make(seed=0, **shape) if diloco is not None else model

    snapshots = []  # (clock, step, {name: tensor}, bytes); evaluated after training

    def snapshot(clock, step):
        if diloco is not None:
            params = diloco.global_parameters()
        else:
            params = {n: t.detach().clone() for n, t in model.state_dict().items()}
        b = wire_bytes(args.switch, world)
        snapshots.append((clock, step, params, None if b is None else b - base_bytes))

    base_bytes = wire_bytes(args.switch, world) if rank == 0 else None
    if rank == 0:
        snapshot(0.0, 0)
    dist.barrier()
    signal = torch.zeros(1, dtype=torch.int32)  # stop: rank 0's decision
    next_eval, step = args.eval_every, 0
    started = time.perf_counter()
    while True:
        x, y = sampler.next()
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(x).reshape(-1, data["vocab"]), y.reshape(-1)).backward()
        opt.step()
        after_step()
        step += 1
        now = time.perf_counter() - started
        if rank == 0:
            signal[0] = int(step >= args.steps) if args.steps else int(now >= args.budget)
        dist.broadcast(signal, 0)
        stop = bool(signal[0])
        if stop and diloco is not None:
            # The exchanges still in flight complete (there are no more inner steps to overlap them
            # with) and one last outer step merges every rank's steps since each fragment's last sync;
            # the wait is training time. The final point is the global model.
            diloco.synchronize(keep_local=bool(args.keep_local))
        if rank == 0:
            now = time.perf_counter() - started
            due = step % args.eval_steps == 0 if args.steps else now >= next_eval
            if stop or due:
                snapshot(now, step)  # in the clock: every method pays it alike per second of clock
                while next_eval <= now:
                    next_eval += args.eval_every
        if stop:
            break
    sent = waited = None
    if diloco is not None:
        stats = diloco.stats()
        sent = stats["bytes_sent"]  # this rank's, counted by gradex (also without a switch)
        waited = stats.get("decode_seconds")  # time the loop waited on exchanges (not hidden by delay)
        diloco.close()
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return
    # Training is over on every rank: rank 0 evaluates its snapshots with the machine to itself.
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    losses = {}

    def loss_at(i):
        if i not in losses:
            eval_model.load_state_dict(snapshots[i][2], strict=False)
            losses[i] = lm.held_out_loss(eval_model, evals)
            sys.stderr.write(f"[lm] {args.method} step {snapshots[i][1]} t {snapshots[i][0]:.1f}s "
                             f"loss {losses[i]:.4f}\n")
        return losses[i]

    target = args.target_loss or loss_at(len(snapshots) - 1)
    for i in curve_points(len(snapshots), args.curve_points, target, loss_at):
        loss_at(i)
    curve = [(snapshots[i][0], snapshots[i][1], losses[i], snapshots[i][3]) for i in sorted(losses)]
    snapshots.clear()
    with open(args.curve_out, "w") as f:
        json.dump({"method": args.method, "label": label, "curve": curve, "world": world,
                   "gradex_bytes_sent_rank0": sent, "gradex_wait_s_rank0": waited,
                   "parameters": lm.parameter_count(model), "args": vars(args)}, f)
    print(f"RESULT method={args.method} steps={step} train_s={curve[-1][0]:.6g} final_loss={curve[-1][2]:.6g} "
          f"bytes={curve[-1][3]}")


if __name__ == "__main__":
    main()
    # The results are written and flushed; skip the interpreter's teardown, where torch's gloo threads
    # can abort the process after destroy_process_group ("terminate called without an active
    # exception", seen on a loaded machine) and turn a finished rank into a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
