#!/usr/bin/env python3
"""The per-step gradient exchange part of bench/run: for every model and every network (link rates
of the emulated cluster, then unshaped loopback), `gradex-bench exchange` and the PyTorch baselines
exchange the same model's gradients on the same ranks; each mode's step time, CPU time and bytes on
the wire (kernel counters, network.py) are merged into one results file.

Expects the cluster to be up already (bench/run creates and always removes it) unless
--root-loopback is given (no namespaces: loopback in the root namespace only, no byte counters).

    exchange_suite.py --out results.json --rates 100mbit,1gbit,10gbit --loopback --models resnet50 \
        --rate-steps 100mbit=3/1

gradex's modes run as two programs per network: the fixed modes (dense fp32, dense 16-bit, DGC 99 %,
DGC 99.9 %, LocalSGD) under GRADEX_POLICY=fixed, and the `auto` mode alone under GRADEX_POLICY=auto,
so that the auto policy is judged against the best fixed mode of the same run. A build without
GRADEX_POLICY runs both without it (auto = today's default policy; the results file says which).
The auto program warms up --auto-extra-warmup steps longer than the others: a policy that measures
before it decides is judged on the steps after its decision.
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
from typing import Any, Dict, List

from bench.harness import machine, results  # noqa: E402
from bench.cluster import gradex_vars  # noqa: E402
from bench.harness.network import Cluster, NamespaceLoopback, RootLoopback  # noqa: E402
from bench.harness.launcher import RankFailure, parse_result, print_progress_line, run_ranks  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASELINE = "bench.baselines.rank"  # the PyTorch baselines' rank program, run as a module
NOT_MODES = {"model", "params", "tensors", "ranks", "steps", "dense_bytes"}
AUTO = "auto"
# The fixed modes the auto policy is judged against (bench/report.py's auto_over_best_fixed_<rate>).
BEST_FIXED = ("dense_fp32", "dense_fp16", "dgc99", "dgc999")
RAMP = "GRADEX_POLICY_RAMP_STEPS"


def modes_of(result):
    """{mode: {metric: float}} from a RESULT dict whose keys are <mode>_<metric>."""
    modes: Dict[str, Dict[str, float]] = {}
    for key, value in result.items():
        for metric in ("step_ms", "mean_ms", "cpu_ms", "wire_bytes", "ratio", "check"):
            if key.endswith("_" + metric) and key not in NOT_MODES:
                modes.setdefault(key[:-len(metric) - 1], {})[metric] = float(value)
    return modes


def run_tool(tool, argv, network, args, model, log_dir, *, steps, warmup, extra_env=None):
    label = f"{model}.{network.label}.{tool}"

    def display(mode, step, total):
        print_progress_line(f"[{model} {network.label}] {tool} {mode} step {step}/{total}")

    started = time.monotonic()
    wan_wire: Dict[str, float] = {}
    stdout, wire = run_ranks(network, args.hosts, argv, warmup=warmup, steps=steps,
                             timeout_s=args.run_timeout_s, log_dir=log_dir, label=label,
                             display=display, extra_env=extra_env, wan_wire=wan_wire)
    print_progress_line("")
    result = parse_result(stdout)
    modes = modes_of(result)
    for mode, metrics in modes.items():
        own = metrics.pop("wire_bytes", None)  # what the tool itself counted, for comparison
        metrics["tool"] = "torch" if tool == "torch" else "gradex"
        metrics["self_wire_bytes"] = own
        metrics["wire_bytes"] = wire.get(mode)
        if mode in wan_wire:  # networks that count what crosses between regions (wan.py)
            metrics["wan_bytes"] = wan_wire[mode]
        metrics["steps"], metrics["warmup"] = steps, warmup
        if extra_env:
            metrics["env"] = dict(extra_env)
    print(f"  {tool}: {len(modes)} modes in {time.monotonic() - started:.0f} s", flush=True)
    return modes, stdout


def rate_steps(text):
    """{network label: (steps, warmup)} from "100mbit=3/1,25gbit=10/2"; ValueError on a bad entry."""
    out = {}
    for item in filter(None, text.split(",")):
        label, _, value = item.partition("=")
        steps, _, warmup = value.partition("/")
        if not label or not steps.isdigit() or not warmup.isdigit() or int(steps) < 1:
            raise ValueError(f"bad --rate-steps entry {item!r} (expected e.g. 100mbit=3/1)")
        out[label] = (int(steps), int(warmup))
    return out


def gradex_runs(args, modes, names, steps, warmup):
    """[(tool, argv, env, steps, warmup, sentinel)] of gradex-bench for one network: the fixed modes in one
    program under GRADEX_POLICY=fixed, `auto` alone under GRADEX_POLICY=auto with a longer warm-up
    (each env empty when the build has no GRADEX_POLICY).

    Each program ends with a sentinel mode whose results are dropped: the kernel's counters of a mode are
    read when the next mode starts, so the last mode of a program would also be charged with what the
    program sends after its steps (gathering the results, shutting down)."""
    common = ["--model", "{model}", "--steps", str(steps), "--idle-s", "0"]
    fixed = [m for m in modes if m != AUTO]
    runs = []
    if fixed:
        sentinel = AUTO
        runs.append(("gradex", [args.bench, "exchange", "--modes", ",".join(fixed + [sentinel]), *common,
                                "--warmup", str(warmup)],
                     gradex_vars.policy_env(names, "fixed"), steps, warmup, sentinel))
    if AUTO in modes:
        auto_warmup = warmup + args.auto_extra_warmup
        sentinel = "dgc999"
        env = dict(gradex_vars.policy_env(names, "auto"))
        # The cost model's choice is what this stage judges: the fidelity ramp of early training
        # (dense for its first quarter at 4 ranks) would cover every measured step here, and the fixed
        # modes run without DGC's warm-up (GRADEX_WARMUP_STEPS=0) too. The ramp's price is measured
        # where it buys something, in the time-to-accuracy race.
        ramp = getattr(args, "auto_ramp_steps", None)
        if RAMP in names and ramp is not None:
            env[RAMP] = str(ramp)
        runs.append(("gradex_auto", [args.bench, "exchange", "--modes", f"{AUTO},{sentinel}", *common,
                                     "--warmup", str(auto_warmup)],
                     env, steps, auto_warmup, sentinel))
    return runs


def mode_descriptions(bench):
    """{mode: one-line description} from `gradex-bench exchange --help` and the baselines' table."""
    described = {}
    try:
        text = subprocess.run([bench, "exchange", "--help"], capture_output=True, text=True,
                              timeout=30).stdout
        in_modes = False
        for line in text.splitlines():
            if line.strip().startswith("Modes run only when named"):
                break  # comparison modes: not part of the suite
            in_modes = in_modes or line.strip() == "Modes:"
            match = re.match(r"^\s+([a-z0-9_]+): (.+)$", line) if in_modes else None
            if match:
                described[match.group(1)] = match.group(2)
    except (OSError, subprocess.TimeoutExpired):
        pass
    from bench.baselines.modes import MODES
    described.update({name: entry[0] for name, entry in MODES.items()})
    return described


def save(path, data):
    """The results so far, with their provenance (bench/harness/results.py): the links are the networks."""
    results.write(path, data, link=data.get("networks") or data.get("layouts") or "cluster")


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
    p.add_argument("--rate-steps", default="",
                   help="measured steps and warm-up per network instead of --steps/--warmup, "
                        "e.g. 100mbit=3/1 (slow links: a dense step takes seconds)")
    p.add_argument("--auto-extra-warmup", type=int, default=4,
                   help="extra warm-up steps of the auto mode, so that its measured steps follow the "
                        "plan it refines at step 4 from measured steps (its first plan is at step 0)")
    p.add_argument("--auto-ramp-steps", type=int, default=0,
                   help="GRADEX_POLICY_RAMP_STEPS of the auto program (default 0: the cost model's "
                        "steady-state choice, as the fixed modes run without DGC's warm-up; -1: the "
                        "library's default ramp)")
    p.add_argument("--no-baselines", action="store_true", help="gradex's modes only, no PyTorch baseline")
    p.add_argument("--gradex-modes", default="all",
                   help="gradex-bench modes ('all': every mode it lists); auto runs in its own program")
    p.add_argument("--baseline-modes", default="gloo_fp32,torch_fp16,powersgd_r1,powersgd_r4,ddp_nocomm")
    p.add_argument("--baselines-at", default=None,
                   help="the network that runs --baseline-modes (default: the first); the others run "
                        "--other-baseline-modes, or --slow-baseline-modes below 1 Gbit/s")
    p.add_argument("--other-baseline-modes", default=None,
                   help="baselines on every other network (default: --baseline-modes)")
    p.add_argument("--slow-baseline-modes", default=None,
                   help="baselines on networks slower than 1 Gbit/s (default: as the others; '' for none)")
    p.add_argument("--bench", default=str(ROOT / "build" / "bin" / "gradex-bench"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--run-timeout-s", type=float, default=300)
    p.add_argument("--log-dir", default=str(ROOT / "build" / "bench-run" / "logs"))
    args = p.parse_args()
    if args.auto_ramp_steps is not None and args.auto_ramp_steps < 0:
        args.auto_ramp_steps = None
    per_network_steps = rate_steps(args.rate_steps)
    # bench/run stops a stage with SIGTERM: unwind (killing every rank) instead of dying at once.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    networks: List[Any]
    if args.root_loopback:
        networks = [RootLoopback()]
    else:
        networks = [Cluster(args.hosts, r, args.delay) for r in args.rates.split(",") if r]
        networks += [NamespaceLoopback()] if args.loopback else []
    descriptions = mode_descriptions(args.bench)
    gradex_modes = ([m for m in descriptions if m not in baseline_names()] if args.gradex_modes == "all"
                    else [m for m in args.gradex_modes.split(",") if m])
    names = gradex_vars.declared(args.bench)
    data = {"hosts": args.hosts, "steps": args.steps, "warmup": args.warmup, "delay": args.delay,
            "networks": [n.label for n in networks], "machine": machine.describe(), "exchange": {},
            "descriptions": descriptions, "failures": [],
            "steps_by_network": {n.label: per_network_steps.get(n.label, (args.steps, args.warmup))
                                 for n in networks},
            "policy": {"variable": gradex_vars.POLICY in names, "best_fixed": list(BEST_FIXED),
                       "auto_extra_warmup": args.auto_extra_warmup,
                       "auto_ramp_steps": args.auto_ramp_steps if RAMP in names else None,
                       "note": ("auto ran under GRADEX_POLICY=auto, the fixed modes under GRADEX_POLICY=fixed"
                                if gradex_vars.POLICY in names else
                                "this build has no GRADEX_POLICY: auto is today's default (fixed) policy")}}
    print(f"exchange_suite: {data['policy']['note']}", flush=True)
    for model in args.models.split(","):
        for network in networks:
            baselines = baseline_modes(args, network, networks)
            steps, warmup = data["steps_by_network"][network.label]
            print(f"[{model} {network.label}] {args.hosts} ranks, {steps} steps after {warmup} warm-up",
                  flush=True)
            network.shape()
            runs = gradex_runs(args, gradex_modes, names, steps, warmup)
            if baselines:  # PowerSGD starts at DDP's step 2: the baselines warm up at least 2 steps
                runs.append(("torch", [args.python, "-m", BASELINE, "--modes", baselines, "--model", "{model}",
                                       "--steps", str(steps), "--warmup", str(max(warmup, 2))], {}, steps,
                             max(warmup, 2), None))
            entry = data["exchange"].setdefault(model, {}).setdefault(network.label, {})
            for tool, argv, env, tool_steps, tool_warmup, sentinel in runs:
                argv = [a.replace("{model}", model) for a in argv]
                try:
                    modes, stdout = run_tool(tool, argv, network, args, model, args.log_dir,
                                             steps=tool_steps, warmup=tool_warmup, extra_env=env)
                    modes.pop(sentinel, None)
                    entry.update(modes)
                    print("\n".join("    " + line for line in stdout.splitlines()
                                    if not line.startswith("RESULT")), flush=True)
                except (RankFailure, OSError) as e:
                    message = f"{model} {network.label} {tool}: {e}"
                    print("  FAILED: " + message, file=sys.stderr, flush=True)
                    data["failures"].append(message.splitlines()[0])
                save(args.out, data)
    return 1 if data["failures"] else 0


def baseline_modes(args, network, networks):
    """The PyTorch baselines to run on one network (see --baselines-at)."""
    if getattr(args, "no_baselines", False):
        return ""
    if network.label == (args.baselines_at or networks[0].label):
        return args.baseline_modes
    slow = getattr(network, "rate", None) and (rate_bits(network.rate) or 1e9) < 1e9
    if slow and args.slow_baseline_modes is not None:
        return args.slow_baseline_modes
    return args.other_baseline_modes if args.other_baseline_modes is not None else args.baseline_modes


def rate_bits(rate):
    """Bits per second of a tc rate ('100mbit' -> 1e8); None for anything else."""
    match = re.fullmatch(r"(\d+)([kmg]?)bit", rate or "")
    if not match:
        return None
    return int(match.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9, "": 1}[match.group(2)]


def baseline_names():
    from bench.baselines.modes import MODES
    return set(MODES)


if __name__ == "__main__":
    sys.exit(main())
