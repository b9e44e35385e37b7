#!/usr/bin/env python3
"""The per-step gradient exchange part of bench/run: for every model and every network (link rates
of the emulated cluster, then unshaped loopback), `gradex-bench exchange` and the PyTorch baselines
exchange the same model's gradients on the same ranks; each mode's step time, CPU time and bytes on
the wire (kernel counters, network.py) are merged into one results file.

Expects the cluster to be up already (bench/run creates and always removes it) unless
--root-loopback is given (no namespaces: loopback in the root namespace only, no byte counters).

    exchange_suite.py --out results.json --rates 1gbit,10gbit --loopback --models resnet50
"""
import argparse
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402
from network import Cluster, NamespaceLoopback, RootLoopback  # noqa: E402
from ranks import RankFailure, parse_result, print_progress_line, run_ranks  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASELINE = ROOT / "bench" / "baselines" / "rank.py"
NOT_MODES = {"model", "params", "tensors", "ranks", "steps", "dense_bytes"}


def modes_of(result):
    """{mode: {metric: float}} from a RESULT dict whose keys are <mode>_<metric>."""
    modes = {}
    for key, value in result.items():
        for metric in ("step_ms", "mean_ms", "cpu_ms", "wire_bytes", "ratio", "check"):
            if key.endswith("_" + metric) and key not in NOT_MODES:
                modes.setdefault(key[:-len(metric) - 1], {})[metric] = float(value)
    return modes


def run_tool(tool, argv, network, args, model, log_dir):
    label = f"{model}.{network.label}.{tool}"

    def display(mode, step, total):
        print_progress_line(f"[{model} {network.label}] {tool} {mode} step {step}/{total}")

    started = time.monotonic()
    stdout, wire = run_ranks(network, args.hosts, argv, warmup=args.warmup, steps=args.steps,
                             timeout_s=args.run_timeout_s, log_dir=log_dir, label=label,
                             display=display)
    print_progress_line("")
    result = parse_result(stdout)
    modes = modes_of(result)
    for mode, metrics in modes.items():
        own = metrics.pop("wire_bytes", None)  # what the tool itself counted, for comparison
        metrics["tool"] = tool
        metrics["self_wire_bytes"] = own
        metrics["wire_bytes"] = wire.get(mode)
    print(f"  {tool}: {len(modes)} modes in {time.monotonic() - started:.0f} s", flush=True)
    return modes, stdout


def mode_descriptions(bench):
    """{mode: one-line description} from `gradex-bench exchange --help` and the baselines' table."""
    described = {}
    try:
        text = subprocess.run([bench, "exchange", "--help"], capture_output=True, text=True,
                              timeout=30).stdout
        in_modes = False
        for line in text.splitlines():
            in_modes = in_modes or line.strip() == "Modes:"
            match = re.match(r"^\s+([a-z0-9_]+): (.+)$", line) if in_modes else None
            if match:
                described[match.group(1)] = match.group(2)
    except (OSError, subprocess.TimeoutExpired):
        pass
    sys.path.insert(0, str(BASELINE.parent))
    from modes import MODES
    described.update({name: entry[0] for name, entry in MODES.items()})
    return described


def save(path, data):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="results JSON, rewritten after every run")
    p.add_argument("--rates", default="1gbit,10gbit", help="comma-separated tc rates ('' for none)")
    p.add_argument("--delay", default="", help="netem delay per link, e.g. 0.2ms")
    p.add_argument("--loopback", action="store_true", help="also run on unshaped loopback")
    p.add_argument("--root-loopback", action="store_true",
                   help="no namespaces: loopback in the root namespace only")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--models", default="resnet50")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--gradex-modes", default="all")
    p.add_argument("--baseline-modes", default="gloo_fp32,torch_fp16,powersgd_r1,powersgd_r4,ddp_nocomm")
    p.add_argument("--other-baseline-modes", default=None,
                   help="baselines on every network after the first (default: --baseline-modes)")
    p.add_argument("--bench", default=str(ROOT / "build" / "bin" / "gradex-bench"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--run-timeout-s", type=float, default=300)
    p.add_argument("--log-dir", default=str(ROOT / "build" / "bench-run" / "logs"))
    args = p.parse_args()
    # bench/run stops a stage with SIGTERM: unwind (killing every rank) instead of dying at once.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    if args.root_loopback:
        networks = [RootLoopback()]
    else:
        networks = [Cluster(args.hosts, r, args.delay) for r in args.rates.split(",") if r]
        networks += [NamespaceLoopback()] if args.loopback else []
    data = {"hosts": args.hosts, "steps": args.steps, "warmup": args.warmup, "delay": args.delay,
            "networks": [n.label for n in networks], "machine": machine.describe(), "exchange": {},
            "descriptions": mode_descriptions(args.bench), "failures": []}
    common = ["--model", "{model}", "--steps", str(args.steps), "--warmup", str(args.warmup)]
    for model in args.models.split(","):
        for index, network in enumerate(networks):
            baselines = args.baseline_modes if index == 0 else (args.other_baseline_modes or
                                                                args.baseline_modes)
            print(f"[{model} {network.label}] {args.hosts} ranks", flush=True)
            network.shape()
            runs = {
                "gradex": [args.bench, "exchange", "--modes", args.gradex_modes, *common],
                "torch": [args.python, str(BASELINE), "--modes", baselines, *common],
            }
            entry = data["exchange"].setdefault(model, {}).setdefault(network.label, {})
            for tool, argv in runs.items():
                argv = [a.replace("{model}", model) for a in argv]
                try:
                    modes, stdout = run_tool(tool, argv, network, args, model, args.log_dir)
                    entry.update(modes)
                    print("\n".join("    " + line for line in stdout.splitlines()
                                    if not line.startswith("RESULT")), flush=True)
                except (RankFailure, OSError) as e:
                    message = f"{model} {network.label} {tool}: {e}"
                    print("  FAILED: " + message, file=sys.stderr, flush=True)
                    data["failures"].append(message.splitlines()[0])
                save(args.out, data)
    return 1 if data["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
