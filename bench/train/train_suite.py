#!/usr/bin/env python3
"""The time-to-accuracy part of bench/run: every method of train_rank.py trains the digits task on the
emulated cluster at one link rate (default 1 Gbit/s), one rank per host, with the same data, model,
initial weights, target and budget of training time; the curves, times to target, final
accuracies and bytes on the wire (kernel counters) go to one results file.

Expects the cluster to be up (bench/run creates and removes it) unless --root-loopback is given.

    train_suite.py --out train.json --rate 1gbit --mode quick
"""
import argparse
import json
import os
import pathlib
import signal
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "cluster"))
import machine  # noqa: E402
from network import Cluster, RootLoopback  # noqa: E402
from ranks import RankFailure, parse_result, print_progress_line, run_ranks  # noqa: E402

METHODS = ("ddp_gloo", "torch_fp16", "powersgd", "gradex_dgc", "gradex_localsgd")
# The budgets per method: quick fits bench/run --quick's ten minutes on a 2-core machine.
BUDGETS = {
    "quick": {"max_train_s": 15, "max_steps": 1000},
    "full": {"max_train_s": 60, "max_steps": 5000},
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--delay", default="")
    p.add_argument("--root-loopback", action="store_true")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--mode", choices=BUDGETS, default="quick")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--target", type=float, default=0.92)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--log-dir", default=str(HERE.parents[1] / "build" / "bench-run" / "logs"))
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: kill the ranks, keep results

    network = RootLoopback() if args.root_loopback else Cluster(args.hosts, args.rate, args.delay)
    network.shape()
    budget = BUDGETS[args.mode]
    data = {"network": network.label, "hosts": args.hosts, "target": args.target,
            "budget": budget, "machine": machine.describe(), "methods": {}, "failures": []}
    os.makedirs(args.log_dir, exist_ok=True)
    for method in args.methods.split(","):
        curve_path = os.path.join(args.log_dir, f"train.{method}.curve.json")
        argv = [args.python, str(HERE / "train_rank.py"), "--method", method,
                "--target", str(args.target), "--max-steps", str(budget["max_steps"]),
                "--max-train-s", str(budget["max_train_s"]), "--curve-out", curve_path]

        def display(_, step, total, method=method):
            print_progress_line(f"[train {network.label}] {method} step {step}/{total}")

        before = network.bytes_sent()
        started = time.monotonic()
        try:
            stdout, _ = run_ranks(network, args.hosts, argv, warmup=0, steps=1,
                                  timeout_s=budget["max_train_s"] * 3 + 120, log_dir=args.log_dir,
                                  label=f"train.{method}", display=display)
            print_progress_line("")
            result = parse_result(stdout)
            with open(curve_path) as f:
                record = json.load(f)
            after = network.bytes_sent()
            record["wire_bytes_per_host"] = (after - before) / args.hosts if before is not None else None
            record["run_s"] = time.monotonic() - started
            data["methods"][method] = record
            ttt = result["time_to_target_s"]
            print(f"  {method}: accuracy {float(result['final_accuracy']):.3f} after {result['steps']} "
                  f"steps, {float(result['train_s']):.1f} s of training; time to {args.target:.2f}: "
                  f"{'not reached' if ttt == 'nan' else f'{float(ttt):.1f} s'}", flush=True)
        except (RankFailure, OSError, ValueError, KeyError) as e:
            print_progress_line("")
            print(f"  FAILED: {method}: {e}", file=sys.stderr, flush=True)
            data["failures"].append(f"{method}: {str(e).splitlines()[0]}")
        with open(args.out, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
    return 1 if data["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
