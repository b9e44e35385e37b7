#!/usr/bin/env python3
"""One rank of the PyTorch baselines of `bench/run`: stock DDP over gloo exchanging the same model's
gradients as `gradex-bench exchange` (same profile from bench/models/, same gradient recipe).

Started once per rank by a launcher that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and
GLOO_SOCKET_IFNAME to pin gloo to the host's interface):

    .venv/bin/python -m bench.baselines.rank --model resnet50 --modes gloo_fp32,powersgd_r4 \\
        --steps 10 --warmup 3

Output mirrors gradex-bench exchange so that one parser reads both: rank 0 prints a table and a last
line "RESULT model=... ranks=... steps=... <mode>_step_ms=... <mode>_mean_ms=... <mode>_cpu_ms=...
<mode>_check=..."; progress "[baselines] <mode> step <k>/<n>" goes to stderr (rewritten in place on a
terminal, one line per mode otherwise).

Per mode: step time = the slowest rank's backward() (gradient injection, DDP bucketing, hooks,
waiting, write-back), median over the measured steps after warm-up; CPU time = this process's CPU
time over the same interval (gloo's threads included), mean over ranks and steps. Modes whose
output is the exact average are checked against it on the first measured step: check = worst
|error| / max|average| over tensors (0 for modes that are not an average).
"""
import argparse
import datetime
import os
import statistics
import sys
import time
from typing import Any, List

import numpy as np
import torch
import torch.distributed as dist

from bench.baselines.gradients import GradientGenerator  # noqa: E402
from bench.baselines.modes import MODES, make_ddp  # noqa: E402
from bench.baselines.model_profile import load_profile  # noqa: E402

TOLERANCE = {"gloo_fp32": 1e-5, "torch_fp16": 4e-3}  # check limits; fp16 rounds to 11 bits


class Progress:
    def __init__(self, enabled):
        self.enabled = enabled
        self.tty = sys.stderr.isatty()

    def update(self, mode, step, total):
        if not self.enabled:
            return
        if self.tty:
            sys.stderr.write(f"\r[baselines] {mode} step {step + 1}/{total}   ")
            sys.stderr.flush()
        elif step == 0:
            print(f"[baselines] {mode}: {total} steps", file=sys.stderr, flush=True)

    def done(self):
        if self.enabled and self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def tensor_views(profile, flat):
    views, offset = [], 0
    for (_, shape), numel in zip(profile.tensors, profile.numels):
        views.append(torch.from_numpy(flat[offset:offset + numel]).view(shape))
        offset += numel
    return views


def check_average(profile, generators, step, ddp):
    """Worst |error| / max|exact average| over the tensors, one tensor at a time (bounded memory)."""
    worst = 0.0
    for t, (param, numel) in enumerate(zip(ddp.module.params, profile.numels)):
        exact = np.zeros(numel, np.float64)
        part = np.empty(numel, np.float32)
        for gen in generators:
            gen.tensor(step, t, part)
            exact += part
        exact /= len(generators)
        error = np.abs(param.grad.reshape(-1).numpy() - exact).max()
        worst = max(worst, float(error / max(np.abs(exact).max(), 1e-30)))
    return worst


def run_mode(mode, args, profile, generators, flat, progress):
    rank = dist.get_rank()
    ddp = make_ddp(profile, mode)
    times, cpus, check = [], [], 0.0
    total = args.warmup + args.steps
    for step in range(total):
        progress.update(mode, step, total)
        generators[rank].generate(step, flat)  # not timed: this is what backward would produce
        grads = tensor_views(profile, flat)
        ddp.zero_grad(set_to_none=True)
        dist.barrier()
        cpu0, t0 = time.process_time(), time.perf_counter()
        ddp(grads).backward()
        t1, cpu1 = time.perf_counter(), time.process_time()
        if step == args.warmup and mode in TOLERANCE:
            check = check_average(profile, generators, step, ddp) / TOLERANCE[mode]
        if step >= args.warmup:
            times.append(t1 - t0)
            cpus.append(cpu1 - cpu0)
    progress.done()
    gathered: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (times, cpus, check))
    del ddp
    step_times = [max(r[0][i] for r in gathered) for i in range(args.steps)]  # slowest rank per step
    return {
        "step_ms": statistics.median(step_times) * 1e3,
        "mean_ms": statistics.fmean(step_times) * 1e3,
        "cpu_ms": statistics.fmean(c for r in gathered for c in r[1]) * 1e3,
        "check": max(r[2] for r in gathered),
    }


def number(x):
    return f"{x:.6g}"


def report(profile, args, results):
    print(f"{'mode':<12} {'median_ms':>10} {'mean_ms':>10} {'cpu_ms':>10} {'check':>9}")
    items = [("model", profile.name), ("params", profile.total_numel),
             ("tensors", len(profile.tensors)), ("ranks", dist.get_world_size()),
             ("steps", args.steps)]
    for mode, r in results.items():
        print(f"{mode:<12} {r['step_ms']:10.2f} {r['mean_ms']:10.2f} {r['cpu_ms']:10.2f} "
              f"{r['check']:9.3f}")
        items += [(f"{mode}_{k}", number(v)) for k, v in r.items()]
    print("(per step; check = worst error / tolerance vs the exact average, 0: not an average)")
    print("RESULT " + " ".join(f"{k}={v}" for k, v in items), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--modes", default=",".join(m for m in MODES if m != "ddp_nocomm"),
                        help="comma-separated, from: " + ", ".join(MODES))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shared-fraction", type=float, default=0.3)
    parser.add_argument("--timeout-s", type=float, default=300)
    args = parser.parse_args()
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown or args.steps < 1 or args.warmup < 2:
        parser.error(f"unknown modes {unknown} (known: {', '.join(MODES)})" if unknown else
                     "--steps must be >= 1 and --warmup >= 2 (PowerSGD starts at DDP's step 2)")

    # Ranks share the machine's cores: one intra-op thread each, like gradex-bench's ranks.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    profile = load_profile(args.model)
    generators = [GradientGenerator(profile, r, args.seed, args.shared_fraction)
                  for r in range(world)]
    flat = np.empty(profile.total_numel, np.float32)
    if rank == 0:
        print(f"baselines: {profile.name} ({len(profile.tensors)} tensors, {profile.total_numel} "
              f"parameters), {world} ranks on {os.cpu_count()} cores, torch {torch.__version__}, "
              f"{args.steps} steps after {args.warmup} warm-up", flush=True)
    progress = Progress(rank == 0)
    results = {mode: run_mode(mode, args, profile, generators, flat, progress) for mode in modes}
    if rank == 0:
        report(profile, args, results)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
