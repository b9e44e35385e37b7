#!/usr/bin/env python3
"""One rank of the training race of bench/run: data-parallel training (SGD momentum, or AdamW) on one task
(task.py) with one gradient-exchange method (methods.py), for a fixed number of steps, once per seed, noting
when the test accuracy first reaches the target.

Started once per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GLOO_SOCKET_IFNAME set:

    train_rank.py --task mlp --method gradex_default --seeds 0,1,2 --steps 250 --target 0.7 --out r.json

--optimizer picks SGD with momentum 0.9 (the default) or AdamW in every method (methods.py); the record
states it, with the momentum and optimizer family gradex's engine ran with.

Every seed trains from its own initial weights and data order with the same cosine learning-rate
schedule over --steps steps (so every method and seed ends with the same schedule, and "final accuracy"
compares equal numbers of steps and examples).

Clock: the sum of rank 0's training-step times (forward, backward with its exchange, optimizer step,
LocalSGD's averaging); evaluations pause it. Every --eval-every steps (3x that while the accuracy is more
than --coarse-margin below the target) the ranks measure the test accuracy of the model they share, each
on a share of the test set (with rank 0's BatchNorm statistics); LocalSGD is evaluated at the first step
at or after that where its parameters were averaged. The delayed exchange's ranks differ by their last D
local gradients: its evaluations test each rank's own model, except the last, after gx.synchronize.

Bytes per host: with --count-iface, each rank adds up the transmit counter of that interface
(/sys/class/net/<iface>/statistics/tx_bytes: payload, headers and ACKs, as the kernel counts them) over
its training steps only; the mean over ranks is reported.

Rank 0 writes every seed's record to --out and prints one line per seed:
"RESULT seed=... steps=... train_s=... time_to_target_s=... steps_to_target=... final_accuracy=...".
"""
import argparse
import datetime
import math
import os
import sys
import time

import torch
import torch.distributed as dist

from bench.harness.machine import cpu_times  # noqa: E402
from bench.train import task  # noqa: E402
from bench.train.seed_runs import run_seeds  # noqa: E402
from bench.train.tx_counter import TxCounter  # noqa: E402
from bench.train.methods import METHODS, Method  # noqa: E402
from bench.train.optimizers import OPTIMIZERS  # noqa: E402


def evaluate(model, x_test, y_test, rank, world):
    """Test accuracy of the model every rank holds, evaluated in shards with rank 0's buffers (BatchNorm
    running statistics, which DDP would broadcast from rank 0 at the next forward anyway); each rank's own
    buffers are restored afterwards."""
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    own = [b.clone() for b in buffers]
    for b in buffers:
        dist.broadcast(b, src=0)
    hits = torch.tensor([task.correct(model, x_test[rank::world], y_test[rank::world])], dtype=torch.float64)
    for b, saved in zip(buffers, own):
        b.copy_(saved)
    dist.all_reduce(hits)
    return hits.item() / len(x_test)


def train_one_seed(args, seed, data, rank, world):
    x_train, y_train, x_test, y_test = data
    shard = task.Shard(x_train, y_train, rank, world, args.batch, seed)
    model = task.make_model(args.task, seed, args.hidden)
    set_up = time.perf_counter()  # the method's construction and the first evaluation, outside the clock
    method = Method(args.method, model, args)
    optimizer, ddp = method.optimizer, method.ddp
    loss_fn = torch.nn.CrossEntropyLoss()
    tx = TxCounter(args.count_iface)
    evaluating = args.method != "nocomm" and not args.no_eval
    clock, step, due = 0.0, 0, False
    # method.synchronize() ran after the last step, before its evaluation (it averages the parameters only where
    # the ranks differ: LocalSGD between averages, a delayed exchange with D > 0)
    synchronized_at_end = False
    step_s = []  # rank 0's training-step times (the clock's parts), for where a method's time goes
    # rank 0's process CPU seconds per step, every thread (gradex's progress threads, its lanes, torch's
    # intra-op pool): with ranks sharing cores, a method's CPU per step bounds its steps/s as the link does
    step_cpu_s = []
    # the whole machine's busy core-seconds during each of rank 0's steps (every rank, the kernel's network
    # work, the delay line): beside step_s, how much of the cores the ranks share a method's steps keep busy
    step_busy_s = []
    phase_s = []  # rank 0's (forward, backward) seconds of each step; the step's rest is the optimizer's
    curve = [(0.0, 0, evaluate(model, x_test, y_test, rank, world))] if evaluating else []
    reached = None  # (clock, step) of the first evaluation at or above the target
    # Outside the clock, as DDP's construction is: where a method starts its engine at construction in the
    # background (gx.State given the DDP module and optimizer), what of its start this hid is here.
    setup_s = time.perf_counter() - set_up
    tty = rank == 0 and sys.stderr.isatty()
    while step < args.steps:
        if tty:  # bench/harness/launcher.py reads "[train] <mode> step k/n" from rank 0's terminal
            sys.stderr.write(f"\r[train] {args.task}_{args.method}_s{seed} step {step + 1}/{args.steps}   ")
            sys.stderr.flush()
        lr = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = shard.next()
        tx.start()
        busy0 = cpu_times()["busy"]  # read outside the step's clock
        t0, cpu0 = time.perf_counter(), time.process_time()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        t1 = time.perf_counter()
        loss.backward()  # DDP's end of backward waits for every bucket's hook future: a method's exposed exchange
        t2 = time.perf_counter()
        optimizer.step()
        synced = method.after_step()
        phase_s.append((t1 - t0, t2 - t1))
        step_s.append(time.perf_counter() - t0)
        step_cpu_s.append(time.process_time() - cpu0)
        step_busy_s.append(cpu_times()["busy"] - busy0)
        clock += step_s[-1]
        tx.stop()
        step += 1
        # The final model is the ranks' average: LocalSGD's, and the delayed exchange's (gx.synchronize, as a user
        # does before evaluating or saving; the evaluations before it test each rank's own model, its last D local
        # gradients included).
        if step == args.steps and (not synced or method.delayed):
            tx.start()
            t0 = time.perf_counter()
            synced = method.synchronize()
            synchronized_at_end = True
            clock += time.perf_counter() - t0
            tx.stop()
        # Far below the target (by more than --coarse-margin), evaluations come 3x less often: they cost
        # as much as many training steps, and only those near the target decide the time to it.
        far = curve and curve[-1][2] < args.target - args.coarse_margin
        due = due or step % (args.eval_every * (3 if far else 1)) == 0 or step == args.steps
        if evaluating and due and synced:
            due = False
            accuracy = evaluate(model, x_test, y_test, rank, world)
            curve.append((clock, step, accuracy))
            if reached is None and accuracy >= args.target:
                reached = (clock, step)
    sent = torch.tensor([float(tx.total)], dtype=torch.float64)
    dist.all_reduce(sent)
    record = {
        "seed": seed, "steps": step, "train_s": clock, "steps_per_s": step / clock if clock > 0 else None,
        "curve": curve, "final_accuracy": curve[-1][2] if curve else None,
        "time_to_target_s": reached[0] if reached else None, "steps_to_target": reached[1] if reached else None,
        "wire_bytes_per_host": sent.item() / world if args.count_iface else None,
        "setup_s": round(setup_s, 5), "step_s": [round(t, 5) for t in step_s], "step_cpu_s": [round(t, 5) for t in step_cpu_s],
        "step_busy_s": [round(t, 3) for t in step_busy_s],
        "step_forward_s": [round(f, 5) for f, _ in phase_s], "step_backward_s": [round(b, 5) for _, b in phase_s],
        "synchronized_at_end": synchronized_at_end,
        "gradex_stats": method.stats(), "policy": method.policy, "rate_only": not evaluating,
        **method.settings(),
    }
    method.close()
    dist.barrier()
    return record


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=task.TASKS, default="mlp")
    p.add_argument("--method", choices=METHODS, required=True)
    p.add_argument("--seeds", default="0", help="comma-separated")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd",
                   help="sgd: SGD momentum 0.9; adamw: AdamW, weight decay 0.01 (methods.py)")
    p.add_argument("--lr", type=float, default=0.05, help="peak of the cosine schedule")
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--target", type=float, required=True)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--coarse-margin", type=float, default=0.05,
                   help="evaluate every 3*eval-every steps while this far below the target")
    p.add_argument("--sync-warmup", type=int, default=10,
                   help="PowerSGD's plain-allreduce iterations, LocalSGD's synchronous steps")
    p.add_argument("--period", type=int, default=4, help="LocalSGD's H")
    p.add_argument("--count-iface", default="", help="count this interface's transmitted bytes")
    p.add_argument("--no-eval", action="store_true",
                   help="steps per second only: no evaluation, no accuracy (a method whose accuracy does not "
                        "depend on the link, timed on another link)")
    p.add_argument("--no-broadcast-buffers", dest="broadcast_buffers", action="store_false",
                   help="DDP(broadcast_buffers=False) in every method: no per-forward broadcast of rank 0's buffers")
    p.add_argument("--out", required=True)
    p.add_argument("--timeout-s", type=float, default=300)
    args = p.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    data = task.load(args.task)
    run_seeds(args, data, rank, world, train_one_seed)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # The results are written and flushed; skip the interpreter's teardown, where torch's gloo threads
    # can abort the process after destroy_process_group ("terminate called without an active
    # exception", seen on a loaded machine) and turn a finished rank into a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
