#!/usr/bin/env python3
"""The LM race: every method trains the same ~10.8 M-parameter word-level transformer (model.py) with AdamW
on the standard library's .py files (corpus.py) for the same wall-clock budget, on P emulated hosts
(bench/cluster/cluster.sh) at each link rate. Held-out loss is plotted against training time and against
bytes on the wire.

    sudo .venv/bin/python -m bench.lm.race --rates 100mbit,1gbit --budget 300
    sudo .venv/bin/python -m bench.lm.race --short      # 100 Mbit/s, 4 methods, 240 s each: ~25 min

Methods (lm_rank.METHODS): ddp, the PyTorch hooks fp16 and powersgd, gradex_default (the gradex hook as
this gradex configures it for AdamW), gradex_auto (the same under GRADEX_POLICY=auto), gradex_localsgd, gradex_diloco8 and gradex_diloco4 (streaming), and
nocomm (no exchange at all: the compute bound). The target at each rate is DDP's held-out loss at the end
of its budget (times 1 + --tolerance): ddp runs first and the others get it as --target-loss. RESULT keys,
<rate> as 100m / 1g (loopback: loopback):
  ttt_<method>_<rate>              clock seconds to the first snapshot at or below the target (nan: never;
                                   lm_rank.py bisects its snapshots to it)
  bytes_to_target_<method>_<rate>  bytes all hosts had sent by then (nan: never, or not counted)
  final_loss_<method>_<rate>       held-out loss at the end of the budget
  ddp_over_best_gradex_ttt_<rate>  DDP's ttt / the smallest gradex ttt (> 1: gradex sooner; nan: no gradex
                                   method reached the target)
  best_gradex_over_best_hook_ttt_<rate>  the speed-up of the best gradex method over the best PyTorch hook:
                                   the hooks' smallest ttt / gradex's smallest ttt (> 1: gradex sooner; inf:
                                   no hook reached the target; nan: no gradex method did)

The cluster: GX_CLUSTER_NAME / GX_CLUSTER_SUBNET name it (cluster.sh). The race brings it up and takes it
down itself (needs root), unless --use-running-cluster (bench/run, which owns one already). --loopback
runs every rank in this namespace on 127.0.0.1 instead: no shaping and no byte counters (tests).
"""
import argparse
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import time
from typing import Any, Dict

HERE = pathlib.Path(__file__).resolve().parent
from bench.lm import corpus  # noqa: E402
from bench.lm import lm_rank  # noqa: E402
from bench.harness import network  # noqa: E402
from bench.harness.launcher import run_ranks  # noqa: E402
from bench.harness import plot as figures  # noqa: E402
from bench.harness import results as result_files  # noqa: E402

GRADEX = ("gradex_default", "gradex_auto", "gradex_localsgd", "gradex_diloco8", "gradex_diloco4")
HOOKS = ("fp16", "powersgd")
DEFAULT_METHODS = ("ddp", "fp16", "powersgd", *GRADEX, "nocomm")
# --short: one rate, DDP (the target), the PyTorch hook that sends least, gradex's two local methods; about
# 4 x (240 s + start-up and evaluations) on 4 hosts.
SHORT = {"rates": "100mbit", "methods": "ddp,powersgd,gradex_diloco4,gradex_localsgd", "budget": 240.0}


def rate_tag(rate):
    return rate.replace("gbit", "g").replace("mbit", "m").replace("kbit", "k")


def run_method(net, method, args, data_path, log_dir, target=None):
    curve_out = os.path.join(log_dir, f"lm.{net.label}.{method}.json")
    argv = [args.python, "-m", "bench.lm.lm_rank", "--method", method, "--data", data_path,
            "--budget", str(args.budget), "--curve-out", curve_out,
            *([f"--target-loss={target!r}"] if target is not None else []),
            *(["--switch", net.switch] if getattr(net, "switch", None) else []), *args.rank_args.split()]
    # The launcher bounds the run (a method's budget plus its slack), kills every rank on a failure and
    # raises RankFailure (a RuntimeError) with the failed ranks' log tails.
    run_ranks(net, args.hosts, argv, warmup=0, steps=1, timeout_s=args.budget + args.method_slack,
              log_dir=log_dir, label=f"lm.{net.label}.{method}")
    with open(curve_out) as f:
        return json.load(f)


def first_reaching(curve, target):
    """(clock, bytes) of the first evaluation at or below target, else (nan, nan); bytes nan if uncounted."""
    for clock, _step, loss, b in curve:
        if loss <= target:
            return clock, (math.nan if b is None else b)
    return math.nan, math.nan


def _ratio(num, den):
    if math.isnan(den):
        return math.nan
    return math.inf if math.isnan(num) else num / den


def summarize(curves_by_rate, tolerance=0.0):
    """{rate: {method: curve}} -> ({rate: {"target", "reach"}}, RESULT items {key: value}). A rate without a
    ddp curve (its run failed) has no target and no items."""
    summary, items = {}, {}
    for rate, curves in curves_by_rate.items():
        tag = rate_tag(rate)
        if "ddp" not in curves:
            continue
        target = curves["ddp"][-1][2] * (1 + tolerance)
        reach = {m: first_reaching(c, target) for m, c in curves.items()}
        for m, c in curves.items():
            items[f"ttt_{m}_{tag}"] = reach[m][0]
            items[f"bytes_to_target_{m}_{tag}"] = reach[m][1]
            items[f"final_loss_{m}_{tag}"] = c[-1][2]
        best_gradex = min((reach[m][0] for m in curves if m in GRADEX), default=math.nan,
                          key=lambda t: math.inf if math.isnan(t) else t)
        best_hook = min((reach[m][0] for m in curves if m in HOOKS), default=math.nan,
                        key=lambda t: math.inf if math.isnan(t) else t)
        if any(m in GRADEX for m in curves):
            items[f"ddp_over_best_gradex_ttt_{tag}"] = _ratio(reach["ddp"][0], best_gradex)
            if any(m in HOOKS for m in curves):
                items[f"best_gradex_over_best_hook_ttt_{tag}"] = _ratio(best_hook, best_gradex)
        summary[rate] = {"target": target, "reach": reach}
    return summary, items


def _json_number(v):
    """nan -> None, inf -> "inf": strict JSON has neither."""
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else str(v)
    return v


def result_line(items):
    def fmt(v):
        if isinstance(v, float) and not math.isfinite(v):
            return str(v)
        return str(int(v)) if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and v > 1e4) \
            else f"{v:.4g}"
    return "RESULT " + " ".join(f"{k}={fmt(v)}" for k, v in items.items())


def plot(curves_by_rate, summary, path):
    rates = list(curves_by_rate)
    fig, axes = figures.figure(len(rates), 2, size=(12, 4.2 * len(rates)))
    for row, rate in enumerate(rates):
        for method, curve in curves_by_rate[rate].items():
            loss = [c[2] for c in curve]
            axes[row][0].plot([c[0] for c in curve], loss, marker=".", label=method)
            counted = [(c[3], c[2]) for c in curve[1:] if c[3]]  # step 0 has sent nothing (log axis)
            if counted:
                axes[row][1].plot([b / 1e6 for b, _ in counted], [l for _, l in counted], marker=".", label=method)
        axes[row][0].set(title=f"{rate}: held-out loss vs wall-clock", xlabel="s of training clock (rank 0)",
                         ylabel="loss (nats/token)")
        axes[row][1].set(title=f"{rate}: held-out loss vs bytes on the wire", xlabel="MB (all hosts)",
                         xscale="log")
        for ax in axes[row]:
            if rate in summary:
                ax.axhline(summary[rate]["target"], color="grey", linestyle=":", linewidth=1)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
    figures.save(fig, path, dpi=90)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="100mbit,1gbit", help="tc rates, comma-separated (e.g. 100mbit,1gbit)")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS), help="comma-separated; must include ddp")
    p.add_argument("--budget", type=float, default=300, help="seconds of training clock per method and rate")
    p.add_argument("--tolerance", type=float, default=0.0, help="target: DDP's final loss x (1 + this)")
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--corpus-bytes", type=int, default=8 << 20, help="training text to read (held out: 1/8)")
    p.add_argument("--rank-args", default="", help="extra lm_rank.py options, e.g. '--period 64 --lr 2e-3'")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--method-slack", type=float, default=600, help="seconds a method may run past its budget")
    p.add_argument("--loopback", action="store_true", help="ranks on 127.0.0.1 here: no shaping, no counters")
    p.add_argument("--use-running-cluster", action="store_true", help="the cluster is up already (bench/run)")
    p.add_argument("--short", action="store_true",
                   help=f"the reduced race (~25 min): {SHORT['rates']}, methods {SHORT['methods']}, "
                        f"{SHORT['budget']:g} s each (overrides --rates, --methods, --budget)")
    p.add_argument("--out", default="docs/benchmarks/lm_race.json")
    p.add_argument("--plot", default="docs/benchmarks/lm_race.png")
    p.add_argument("--log-dir", default=str(HERE.parents[1] / "build" / "bench-lm"))
    args = p.parse_args(argv)
    if args.short:
        args.rates, args.methods, args.budget = SHORT["rates"], SHORT["methods"], SHORT["budget"]
    args.methods = [m for m in args.methods.split(",") if m]
    if "ddp" in args.methods:  # first: every other method's evaluation searches for DDP's final loss
        args.methods = ["ddp"] + [m for m in args.methods if m != "ddp"]
    unknown = [m for m in args.methods if m not in lm_rank.METHODS]
    if unknown:
        p.error(f"unknown method(s) {','.join(unknown)}; known: {','.join(lm_rank.METHODS)}")
    if "ddp" not in args.methods:
        p.error("--methods must include ddp: its final loss is every method's target")
    args.rates = [r for r in args.rates.split(",") if r]
    bad = [r for r in args.rates if not re.fullmatch(r"[1-9][0-9]*[kmg]?bit", r)]
    if bad or not args.rates:
        p.error(f"bad --rates {','.join(bad) or '(none)'}: expected tc rates such as 100mbit,1gbit")
    if args.loopback:
        args.rates = ["loopback"]
    if args.hosts < 2:
        p.error(f"--hosts must be at least 2, got {args.hosts}")
    if args.budget <= 0:
        p.error(f"--budget must be positive seconds, got {args.budget}")
    if args.tolerance < 0:
        p.error(f"--tolerance must be >= 0, got {args.tolerance}")
    return args


def cluster_sh(*argv):
    subprocess.run([str(network.CLUSTER_SH), *argv], check=True, timeout=120)


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.log_dir, exist_ok=True)
    data_path = os.path.join(args.log_dir, f"lm.corpus.{args.vocab}.{args.corpus_bytes}.pt")
    if not os.path.exists(data_path):
        corpus.save(corpus.build(args.vocab, args.corpus_bytes), data_path + ".tmp")
        os.replace(data_path + ".tmp", data_path)
    own_cluster = not args.loopback and not args.use_running_cluster
    if own_cluster:
        cluster_sh("up", "--hosts", str(args.hosts), "--rate", args.rates[0], "--owner", str(os.getpid()),
                   "--max-s", str(int((args.budget + args.method_slack) * len(args.methods) * len(args.rates))))
    curves: Dict[str, Any] = {}
    runs: Dict[str, Any] = {}
    failed: Dict[str, Any] = {}
    try:
        for rate in args.rates:
            net: Any
            if args.loopback:
                net = network.RootLoopback()
            else:
                net = network.Cluster(args.hosts, rate)
                net.shape()
            curves[rate], runs[rate] = {}, {}
            for method in args.methods:  # ddp first: its final loss is the target the others bisect to
                ddp = curves[rate].get("ddp")
                target = ddp[-1][2] * (1 + args.tolerance) if ddp else None
                try:
                    run = run_method(net, method, args, data_path, args.log_dir, target)
                except RuntimeError as e:  # one method's failure must not lose the others' results
                    failed.setdefault(rate, {})[method] = str(e)
                    print(f"[lm] {rate} {method}: FAILED: {e}", file=sys.stderr, flush=True)
                    continue
                curves[rate][method], runs[rate][method] = run["curve"], run
                last = run["curve"][-1]
                print(f"[lm] {rate} {method}: loss {last[2]:.4f} after {last[0]:.1f} s, {last[1]} steps, "
                      f"{'-' if last[3] is None else f'{last[3] / 1e6:.1f}'} MB ({run['label']})",
                      file=sys.stderr, flush=True)
    finally:
        if own_cluster:
            cluster_sh("down")
    summary, items = summarize(curves, args.tolerance)
    labels = {m: r["label"] for rate_runs in runs.values() for m, r in rate_runs.items()}
    parameters = next((r["parameters"] for rate_runs in runs.values() for r in rate_runs.values()), None)
    result_files.write(args.out, {"hosts": args.hosts, "budget_s": args.budget, "tolerance": args.tolerance,
                                  "parameters": parameters, "labels": labels, "curves": curves, "failed": failed,
                                  "targets": {r: s["target"] for r, s in summary.items()},
                                  "result": {k: _json_number(v) for k, v in items.items()}},
                       link="loopback" if args.loopback else list(args.rates))
    plot(curves, summary, args.plot)
    print(result_line(items))
    if failed:
        sys.exit(f"race: failed: {'; '.join(f'{m} at {r}' for r, ms in failed.items() for m in ms)} "
                 f"(the others' results are in {args.out})")


if __name__ == "__main__":
    main()
