#!/usr/bin/env python3
"""What sealing the data plane costs (GRADEX_SEAL, docs/security.md): gradex-bench exchange on the emulated
cluster (4 hosts, one rank each) and on loopback under one job secret, with every mode's engine open at once
and stepped in turn (--interleave), so that sealed and clear see the same machine load step by step: DGC
99.9 % (dgc999_sealed against dgc999_clear) and the engine's dense 16-bit route (engine16_sealed against
engine16_clear), ResNet-50's gradient profile.

Prints, per network and mode, the median step time sealed and in clear over the runs, the median of the
runs' ratios (and their range) and the CPU ratio, and writes the results with the command, commit and
machine to --out (default docs/benchmarks/seal.json). Needs root (network namespaces) unless
--loopback-only.

    .venv/bin/python -m bench.cluster.seal_suite [--rates 1gbit] [--reps 3] [--steps 10] [--loopback-only]

--race TASK adds the time-to-accuracy race's default method (gradex_auto, bench/train/train_suite.py, seed 0)
on TASK at the first rate, sealed and in clear in alternation, --race-reps pairs; --race-wan RATE,DELAY runs
the same race over the emulated WAN instead (train_suite.py --wan: its own namespaces and delay line).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

from bench.harness import machine, results  # noqa: E402
from bench.harness.network import CLUSTER_SH, Cluster, NamespaceLoopback, RootLoopback  # noqa: E402
from bench.harness.launcher import parse_result, run_ranks  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = "seal-suite-secret"


PAIRS = (("dgc999_sealed", "dgc999_clear"), ("engine16_sealed", "engine16_clear"))


def run_once(network, args):
    """One gradex-bench program with every mode's engine open at once, stepped in turn (--interleave): DGC
    99.9 % and the engine's dense 16-bit route, each sealed and in clear under one job secret."""
    modes = [m for pair in PAIRS for m in pair]
    argv = [args.bench, "exchange", "--modes", ",".join(modes), "--interleave", "--model", args.model,
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--idle-s", "0"]
    env = {"GRADEX_JOB_SECRET": SECRET, "GRADEX_POLICY": "fixed"}
    stdout, _ = run_ranks(network, args.hosts, argv, warmup=args.warmup, steps=args.steps, timeout_s=900,
                          log_dir=os.path.join(ROOT, "build", "seal_suite_logs"), label=f"{network.label}-seal",
                          extra_env=env)
    result = parse_result(stdout)
    return {m: {"step_ms": float(result[f"{m}_step_ms"]), "cpu_ms": float(result[f"{m}_cpu_ms"]),
                "wire_bytes": float(result[f"{m}_wire_bytes"])} for m in modes}


def measure(network, args):
    runs = []
    for rep in range(args.reps):
        modes = run_once(network, args)
        runs.append({"rep": rep, "modes": modes})
        print(f"  {network.label} rep {rep}: " + ", ".join(f"{m} {v['step_ms']:.1f} ms (cpu {v['cpu_ms']:.1f})"
                                                          for m, v in modes.items()), flush=True)
    summary = {}
    for sealed_mode, clear_mode in PAIRS:
        sealed = [r["modes"][sealed_mode]["step_ms"] for r in runs]
        clear = [r["modes"][clear_mode]["step_ms"] for r in runs]
        cpu = [r["modes"][sealed_mode]["cpu_ms"] / r["modes"][clear_mode]["cpu_ms"] for r in runs]
        pairs = [a / b for a, b in zip(sealed, clear)]
        summary[sealed_mode.replace("_sealed", "")] = {
            "sealed_ms": statistics.median(sealed), "clear_ms": statistics.median(clear),
            "ratio": statistics.median(pairs), "pair_ratio_min": min(pairs), "pair_ratio_max": max(pairs),
            "cpu_ratio": statistics.median(cpu)}
    return runs, summary


def race_once(args, seal, rate, log_dir):
    out = os.path.join(log_dir, f"seal_race_{'sealed' if seal else 'clear'}.json")
    where = ["--wan", args.race_wan] if args.race_wan else ["--rates", rate]
    argv = [sys.executable, os.path.join(ROOT, "bench", "train", "train_suite.py"), "--out", out, *where,
            "--hosts", str(args.hosts), "--mode", "quick", "--tasks", args.race, "--methods", "gradex_auto",
            "--seeds", "0", "--log-dir", log_dir]
    env = dict(os.environ, GRADEX_JOB_SECRET=SECRET, GRADEX_SEAL="on" if seal else "off")
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    with open(out) as f:
        data = json.load(f)
    (network,) = data["networks"].values()
    (record,) = network["tasks"][args.race]["methods"]["gradex_auto"]["seeds"]
    return {k: record.get(k) for k in ("time_to_target_s", "steps_to_target", "steps_per_s", "final_accuracy")}


def race(args, rate):
    log_dir = os.path.join(ROOT, "build", "seal_suite_logs")
    os.makedirs(log_dir, exist_ok=True)
    runs = []
    for rep in range(args.race_reps):
        for seal in ((False, True) if rep % 2 == 0 else (True, False)):
            r = race_once(args, seal, rate, log_dir)
            runs.append({"rep": rep, "seal": seal, **r})
            print(f"  race {args.race} rep {rep} {'sealed' if seal else 'clear '}: time to target "
                  f"{r['time_to_target_s']} s, {r['steps_to_target']} steps, {r['steps_per_s']:.2f} steps/s",
                  flush=True)
    sealed = [r["time_to_target_s"] for r in runs if r["seal"]]
    clear = [r["time_to_target_s"] for r in runs if not r["seal"]]
    summary = None
    if None not in sealed + clear:
        summary = {"sealed_s": statistics.median(sealed), "clear_s": statistics.median(clear),
                   "ratio": statistics.median(sealed) / statistics.median(clear),
                   "pair_ratios": [s / c for s, c in zip(sealed, clear)]}
        print(f"  race {args.race}: time to target sealed {summary['sealed_s']:.1f} s, clear {summary['clear_s']:.1f} s,"
              f" sealed/clear {summary['ratio']:.3f}", flush=True)
    return {"task": args.race, "where": args.race_wan or rate, "runs": runs, "summary": summary}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="1gbit", help="link rates of the emulated cluster, e.g. 1gbit,10gbit")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--reps", type=int, default=3, help="programs per network")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--loopback-only", action="store_true", help="no namespaces: unshaped loopback only")
    p.add_argument("--skip-exchange", action="store_true", help="only the race")
    p.add_argument("--race", default="", help="also the race's default method on this task (e.g. mlp)")
    p.add_argument("--race-reps", type=int, default=2)
    p.add_argument("--race-wan", default="", metavar="RATE,DELAY", help="the race over the emulated WAN")
    p.add_argument("--bench", default=os.path.join(ROOT, "build", "bin", "gradex-bench"))
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks", "seal.json"))
    args = p.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    data: Dict[str, Any] = {"command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]), "commit": commit,
            "machine": machine.describe(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "networks": {}}
    networks: List[Any] = []
    if args.race_wan:
        print(f"race over the WAN {args.race_wan}:", flush=True)
        data["race"] = race(args, None)
    if not args.loopback_only and not args.race_wan:
        for rate in args.rates.split(","):
            networks.append(Cluster(args.hosts, rate))
    if not args.race_wan:
        networks.append(RootLoopback() if args.loopback_only else NamespaceLoopback())
    up = False
    try:
        for network in networks:
            if isinstance(network, Cluster):
                if not up:
                    subprocess.run([str(CLUSTER_SH), "up", "--hosts", str(args.hosts), "--rate", network.rate,
                                    "--owner", str(os.getpid()), "--max-s", "3600"], check=True,
                                   stdout=subprocess.DEVNULL)
                    up = True
                network.shape()
            if args.race and isinstance(network, Cluster) and "race" not in data:
                print(f"race at {network.label}:", flush=True)
                data["race"] = race(args, network.rate)
            if args.skip_exchange:
                continue
            print(f"{network.label}:", flush=True)
            runs, summary = measure(network, args)
            data["networks"][network.label] = {"runs": runs, "summary": summary}
            for mode, s in summary.items():
                print(f"  {mode:10s} sealed {s['sealed_ms']:8.1f} ms  clear {s['clear_ms']:8.1f} ms  "
                      f"sealed/clear {s['ratio']:.3f} (runs {s['pair_ratio_min']:.3f}-{s['pair_ratio_max']:.3f}), "
                      f"CPU {s['cpu_ratio']:.2f}x", flush=True)
    finally:
        if up:
            subprocess.run([str(CLUSTER_SH), "down"], stdout=subprocess.DEVNULL)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    results.write(args.out, data, link=list(data["networks"]) or args.race_wan or "loopback")
    print(f"results: {os.path.relpath(args.out, ROOT)}")


if __name__ == "__main__":
    main()
