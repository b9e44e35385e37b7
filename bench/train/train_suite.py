#!/usr/bin/env python3
"""The time-to-accuracy race of bench/run: methods of methods.py train tasks of task.py on the emulated
cluster, one rank per host, for the same number of steps with the same data, initial weights (per seed),
learning-rate schedule and target, at one or more link rates; per rate, task and method, the median and
spread over seeds of the time and steps to the target, steps per second, final accuracy and bytes per host
go to one results file (then bench/report.py).

Expects the cluster to be up (bench/run creates and removes it) unless --root-loopback is given.

    train_suite.py --out train.json --rates 1gbit,100mbit --mode quick

Rates: the first is the reference, where every method runs in full. At every other rate only the methods
whose arithmetic depends on the link (LINK_ADAPTIVE: gradex's auto policy, which picks codecs from the
link's measured cost) train in full; every other method computes exactly what it computes at the
reference rate, so it runs RATE_ONLY_STEPS steps without evaluation (train_rank.py --no-eval) for its
steps per second there, and the report derives its time to target as its steps to target at the
reference rate divided by those steps per second (marked "derived"). nocomm runs at the reference only.

Modes (the race's size; --tasks/--methods/--seeds override):
  quick   the short and MLP tasks; ddp, gradex_auto and nocomm, 1 seed (fits bench/run --quick)
  full    the short, MLP and convnet tasks, every method, 3 seeds (the compute bound, nocomm, measured
          once per round)
  smoke   a harness check in seconds (tiny model, a few steps; what the test suite runs)
The long task (`long`, > 1,000 steps) is in no mode: add it with --tasks (about 10 minutes per seed of
ddp + gradex_auto at 1 Gbit/s on a quiet 2-core machine). Neither are the held-out tasks `cnn` and `tfm`
(task.py: judged on, never tuned on): add them with --tasks (a few minutes per seed and method).

Optimizer: --optimizer sgd (the default: SGD momentum 0.9, TASK_SETTINGS' learning rates) or adamw (AdamW,
weight decay 0.01, in every method, at ADAMW_LR's peak learning rates; the same targets). Under adamw a
method that exists only for SGD (optimizers.py: gradex_dgc) or another framework's program is
rejected when named in --methods and left out of a mode's methods, with a line saying so.

A method that is not a methods.py method runs the program named in PROGRAMS (same command line and
output contract as train_rank.py): other frameworks' ranks. The Keras row (keras_rank.py:
keras_gradex_default, keras_gradex_dense) runs on the MLP task only, at the reference rate only.
"""
import argparse
import json
import os
import pathlib
import signal
import statistics
import sys
import time
from typing import Any, Dict

HERE = pathlib.Path(__file__).resolve().parent
from bench.harness import machine, results  # noqa: E402
from bench.harness.network import Cluster, RootLoopback  # noqa: E402
from bench.harness.wan import Wan, WanSpec  # noqa: E402
from bench.harness.launcher import RankFailure, print_progress_line, run_ranks  # noqa: E402
from bench.cluster.exchange_suite import rate_bits  # noqa: E402
from bench.train.optimizers import ADAMW_UNSUPPORTED, OPTIMIZERS  # noqa: E402

# methods.py's DELAYED (not imported: methods.py imports torch, which this driver never needs).
DELAYED = ("gradex_delay", "gradex_delay1", "gradex_delay4", "gradex_delay8", "gradex_stale1")
METHODS = ("ddp", "torch_fp16", "powersgd_r1", "powersgd_r4", "gradex_auto", "gradex_default", "gradex_dgc",
           "gradex_localsgd", "nocomm", "keras_gradex_default", "keras_gradex_dense") + DELAYED
# Methods whose arithmetic (and so their steps to target) may depend on the link: they train in full at
# every rate. gradex_default and keras_gradex_default follow GRADEX_POLICY's default, auto once it exists.
LINK_ADAPTIVE = ("gradex_auto", "gradex_default", "keras_gradex_default") + DELAYED
RATE_ONLY_STEPS = 10  # steps timed, without evaluation, of a link-independent method at a non-reference rate
# Per task: steps (the cosine schedule's length), the peak learning rate, and the target test accuracy:
# the value plain DDP reaches after about 2/3 of those steps (calibrated on DDP's curves, the same peak
# learning rate for every task: the settings are not tuned to any gradex policy).
TASK_SETTINGS: Dict[str, Dict[str, Any]] = {
    "short": {"steps": 100, "lr": 0.05, "target": 0.88},
    "mlp": {"steps": 250, "lr": 0.05, "target": 0.72},
    "conv": {"steps": 250, "lr": 0.05, "target": 0.64},
    "long": {"steps": 1600, "lr": 0.05, "target": 0.40},
    # Held out from tuning (task.py): no gradex setting was chosen by looking at these two.
    "cnn": {"steps": 150, "lr": 0.05, "target": 0.65},
    "tfm": {"steps": 150, "lr": 0.05, "target": 0.60},
}
# AdamW's peak learning rate per task: AdamW's customary 1e-3 everywhere, not tuned on any task (the
# targets and step counts stay TASK_SETTINGS').
ADAMW_LR = {task: 1e-3 for task in TASK_SETTINGS}
NOCOMM_STEPS = 60  # the compute bound needs no accuracy: a short run
QUICK_METHODS = ("ddp", "gradex_auto", "nocomm")
MODES: Dict[str, Dict[str, Any]] = {
    "quick": {"tasks": ("short", "mlp"), "methods": QUICK_METHODS, "seeds": {}, "default_seeds": 1},
    "full": {"tasks": ("short", "mlp", "conv"), "seeds": {}, "default_seeds": 3, "nocomm_seeds": 3},
    "smoke": {"tasks": ("mlp",), "seeds": {}, "default_seeds": 1, "steps": 6, "hidden": 64, "eval_every": 3,
              "coarse_margin": 1.0, "rate_only_steps": 4},
}
MODE_NOTES = {
    "quick": "quick mode, cut to fit bench/run --quick: the short and MLP tasks; ddp, gradex_auto and nocomm, "
             "1 seed (the full race, bench/run without --quick, runs the short, MLP and convnet tasks, every "
             "method, 3 seeds; the long task is opt-in)",
    "full": "full mode: the short, MLP and convnet tasks, every method, 3 seeds",
    "smoke": "smoke mode: a harness check at toy size, not a measurement",
}
# Rank programs of methods that methods.py does not know, with the same command line and --out contract
# as train_rank.py, and the tasks each one has a student for (other tasks skip the method).
# The Keras row: Keras 3 + gradex's default policy vs Keras + dense fp32 gradex (keras_rank.py).
PROGRAMS = {"keras_gradex_default": "keras_rank.py", "keras_gradex_dense": "keras_rank.py"}
PROGRAM_TASKS = {"keras_gradex_default": ("mlp",), "keras_gradex_dense": ("mlp",)}


def task_settings(task, optimizer="sgd"):
    """TASK_SETTINGS[task] for this optimizer: its peak learning rate, and the optimizer's name."""
    settings = dict(TASK_SETTINGS[task], optimizer=optimizer)
    if optimizer == "adamw":
        settings["lr"] = ADAMW_LR[task]
    return settings


def unsupported(method, optimizer):
    """Why `method` cannot run under `optimizer`, or None when it can."""
    if optimizer == "sgd":
        return None
    if method in PROGRAMS:
        return f"{method} runs {PROGRAMS[method]}, which trains with SGD only"
    return ADAMW_UNSUPPORTED.get(method)


def summarize(records):
    """Median and spread (min, max) over seeds; a seed that missed the target counts as infinitely late
    for time and steps to target (a median or maximum that is infinite is stored as None)."""
    def stat(key, missing_is_inf=False):
        values = [r[key] for r in records if r.get(key) is not None]
        if missing_is_inf:
            values += [float("inf")] * (len(records) - len(values))
        if not values:
            return None
        finite = lambda v: v if v != float("inf") else None  # noqa: E731  (JSON has no infinity)
        return {"median": finite(statistics.median(values)), "min": finite(min(values)),
                "max": finite(max(values)), "n": len(values)}
    return {"seeds": len(records), "reached": sum(r.get("time_to_target_s") is not None for r in records),
            "time_to_target_s": stat("time_to_target_s", True), "steps_to_target": stat("steps_to_target", True),
            "steps_per_s": stat("steps_per_s"), "final_accuracy": stat("final_accuracy"),
            "wire_bytes_per_host": stat("wire_bytes_per_host")}


def plan(args):
    """[(rate, task, method, seed, rate_only)] in run order: rate by rate (the reference first), and within a
    rate round by round (seed 0 of every task and method, then seed 1 of those that have one, ...), so that
    every method meets the same spread of machine load, which on a shared machine drifts over minutes."""
    mode = MODES[args.mode]
    tasks = args.tasks.split(",") if args.tasks else mode["tasks"]
    for t in tasks:
        if t not in TASK_SETTINGS:
            raise ValueError(f"unknown task {t!r} (expected one of {', '.join(TASK_SETTINGS)})")
    optimizer = getattr(args, "optimizer", "sgd")
    if args.methods:
        methods = args.methods.split(",")
        for m in methods:
            if unsupported(m, optimizer):
                raise ValueError(f"--optimizer {optimizer}: {unsupported(m, optimizer)}")
    else:
        methods = [m for m in mode.get("methods", METHODS) if not unsupported(m, optimizer)]
    seeds = {}
    for m in methods:
        if args.seeds:
            seeds[m] = [int(s) for s in args.seeds.split(",")]
        else:
            n = mode.get("nocomm_seeds", 1) if m == "nocomm" else mode["seeds"].get(m, mode["default_seeds"])
            seeds[m] = list(range(n))
    rounds = max(len(v) for v in seeds.values())
    out = []
    for index, rate in enumerate(rates_of(args)):
        for r in range(rounds):
            for t in tasks:
                for m in methods:
                    if r >= len(seeds[m]) or t not in PROGRAM_TASKS.get(m, (t,)):
                        continue
                    if index == 0 or m in LINK_ADAPTIVE:
                        out.append((rate, t, m, seeds[m][r], False))
                    elif m != "nocomm" and m not in PROGRAMS and r == 0:
                        out.append((rate, t, m, seeds[m][r], True))  # one timing run per task is enough
    return out


def wan_spec(args):
    rate, _, delay = args.wan.partition(",")
    return WanSpec(hosts=args.hosts, rate=rate, delay=delay, sysctls=list(getattr(args, "host_sysctl", None) or []),
                   queue_ms=getattr(args, "queue_ms", 10.0))


def rates_of(args):
    if getattr(args, "wan", ""):
        return [wan_spec(args).label()]  # the one network, named as its results will be
    return [r for r in args.rates.split(",") if r] if not args.root_loopback else ["loopback"]


def rank_argv(args, task, method, seeds, out_path, counted, rate_only=False, iface="eth0"):
    optimizer = getattr(args, "optimizer", "sgd")
    mode, settings = MODES[args.mode], task_settings(task, optimizer)
    steps = mode.get("steps", NOCOMM_STEPS if method == "nocomm" else settings["steps"])
    if rate_only:
        steps = mode.get("rate_only_steps", RATE_ONLY_STEPS)
    program = PROGRAMS.get(method, "train_rank.py")
    argv = [args.python, "-m", "bench.train." + program.removesuffix(".py"), "--task", task, "--method", method,
            "--seeds", ",".join(map(str, seeds)), "--steps", str(steps), "--lr", str(settings["lr"]),
            "--target", str(settings["target"]), "--out", out_path]
    if program == "train_rank.py":
        argv += ["--optimizer", optimizer]
    if "hidden" in mode:
        argv += ["--hidden", str(mode["hidden"])]
    for key in ("eval_every", "coarse_margin"):
        if key in mode:
            argv += ["--" + key.replace("_", "-"), str(mode[key])]
    if counted:
        argv += ["--count-iface", iface]
    if rate_only:
        argv += ["--no-eval"]
    if not getattr(args, "broadcast_buffers", 1):
        argv += ["--no-broadcast-buffers"]
    return argv, steps


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--rates", "--rate", default="1gbit",
                   help="comma-separated link rates; the first is the reference (every method in full)")
    p.add_argument("--delay", default="")
    p.add_argument("--root-loopback", action="store_true")
    p.add_argument("--wan", default="", metavar="RATE,DELAY",
                   help="race on an emulated WAN instead (bench/harness/wan.py: --hosts hosts, each pair DELAY "
                        "apart one way, RATE NICs, e.g. 1gbit,25ms); --rates and --delay are then unused")
    p.add_argument("--host-sysctl", action="append", default=[], metavar="KEY=VALUE",
                   help="a sysctl inside every emulated host's namespace (repeatable), e.g. "
                        "net.ipv4.tcp_slow_start_after_idle=0: what a result would be with the log's advice applied")
    p.add_argument("--queue-ms", type=float, default=10.0,
                   help="each emulated pipe's drop-tail queue in ms at its rate (the WAN's default: 10)")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--mode", choices=MODES, default="quick")
    p.add_argument("--tasks", default="", help=f"override the mode's tasks ({','.join(TASK_SETTINGS)})")
    p.add_argument("--methods", default="", help="override the mode's methods")
    p.add_argument("--seeds", default="", help="override every method's seeds, e.g. 0,1,2")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd",
                   help="sgd: SGD momentum 0.9 (the race's default); adamw: AdamW in every method")
    p.add_argument("--broadcast-buffers", type=int, choices=(0, 1), default=1,
                   help="DDP's broadcast_buffers in every method (1: its default, rank 0's BatchNorm statistics sent "
                        "to every rank at every forward, one latency a step that no comm hook hides; 0: as a "
                        "user on a slow link sets it)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--log-dir", default=str(HERE.parents[1] / "build" / "bench-run" / "logs"))
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: kill the ranks, keep results

    try:
        runs = plan(args)
    except ValueError as e:
        p.error(str(e))
    if args.optimizer != "sgd" and not args.methods:
        left_out = [m for m in MODES[args.mode].get("methods", METHODS) if unsupported(m, args.optimizer)]
        for m in left_out:
            print(f"--optimizer {args.optimizer}: {m} left out: {unsupported(m, args.optimizer)}", flush=True)
    rates = rates_of(args)
    networks: Dict[str, Any]
    if args.wan:
        wan = Wan(wan_spec(args), log_dir=args.log_dir)
        networks = {wan.label: wan}
        wan.up()  # removed below, whatever happens
        print(f"WAN {wan.label}: MTU {wan.spec.link_mtu()}", flush=True)
        try:
            return race(args, runs, rates, networks)
        finally:
            wan.down()
    networks = {rate: RootLoopback() if args.root_loopback else Cluster(args.hosts, rate, args.delay)
                for rate in rates}
    return race(args, runs, rates, networks)


def seconds_per_step(network, rate_only):
    """A run's time allowance per step: 2 s on links of 1 Gbit/s and more, 20 s on slower ones (DDP's fp32
    step of the 4.3M-parameter MLP takes ~2.7 s at 100 Mbit/s) and where only the rate is measured; on a WAN
    30 one-way delays more a step, for the collectives' round trips (DDP's step at 1 Gbit/s and 75 ms one way
    took ~2.6 s and the run outlived a 2 s allowance)."""
    bits = rate_bits(getattr(network, "rate", None))
    base = 20.0 if rate_only or (bits is not None and bits < 1e9) else 2.0
    spec = getattr(network, "spec", None)
    return base + (30.0 * spec.max_one_way_s() if spec is not None else 0.0)


def network_links(networks):
    """Every network of the race as the results' link: a WAN's spec, else the cluster's label."""
    links = {}
    for label, network in networks.items():
        spec = getattr(network, "spec", None)
        links[label] = dict(vars(spec), link_mtu=spec.link_mtu()) if spec is not None else label
    return links


def race(args, runs, rates, networks):
    """Runs every planned run on its network; writes args.out after each; 1 if any failed."""
    data = {"reference": rates[0], "hosts": args.hosts, "mode": args.mode, "machine": machine.describe(),
            "optimizer": args.optimizer,
            "command": " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                if (k in ("rates", "delay", "wan", "hosts", "mode", "tasks", "methods", "seeds")
                                    and v) or (k == "optimizer" and v != "sgd")
                                or (k == "broadcast_buffers" and v == 0)),
            "note": MODE_NOTES[args.mode], "networks": {}, "failures": []}
    os.makedirs(args.log_dir, exist_ok=True)
    started_all, shaped = time.monotonic(), None
    for rate, task, method, seed, rate_only in runs:
        network = networks[rate]
        if shaped != rate:
            network.shape()
            shaped = rate
        tasks = data["networks"].setdefault(network.label, {"tasks": {}})["tasks"]
        entry = tasks.setdefault(task, {**task_settings(task, args.optimizer), "methods": {}})
        label = f"train.{network.label}.{task}.{method}.s{seed}"
        out_path = os.path.join(args.log_dir, f"{label}.json")
        if os.path.exists(out_path):
            os.remove(out_path)
        argv, steps = rank_argv(args, task, method, [seed], out_path, network.counted, rate_only,
                                network.iface)

        def display(mode, step, total):
            print_progress_line(f"[train {network.label}] {mode} step {step}/{total}")

        counters = getattr(network, "loss_counters", None)  # an emulated WAN's drops and TCP recoveries
        before = counters() if counters else None
        relay_cpu = getattr(network, "relay_cpu_s", None)  # the emulated WAN's delay line: CPU the ranks share
        cpu_before, relay_before = machine.cpu_times(), relay_cpu() if relay_cpu else None
        started = time.monotonic()
        try:
            run_ranks(network, args.hosts, argv, warmup=0, steps=1, display=display, log_dir=args.log_dir,
                      label=label, timeout_s=180 + steps * seconds_per_step(network, rate_only))
            print_progress_line("")
            with open(out_path) as f:
                (record,) = json.load(f)["seeds"]
        except (RankFailure, OSError, ValueError, KeyError) as e:
            print_progress_line("")
            print(f"  FAILED: {network.label} {task} {method} seed {seed}: {e}", file=sys.stderr, flush=True)
            data["failures"].append(f"{network.label} {task} {method} seed {seed}: {str(e).splitlines()[0]}")
            record = None
        if record is not None:
            record["run_s"] = time.monotonic() - started
            record["load_average"] = os.getloadavg()[0]
            if counters is not None and before is not None:
                record["network_losses"] = {k: v - before[k] for k, v in counters().items()}
            record["machine_cpu"] = machine_cpu(cpu_before, relay_before, relay_cpu, record["run_s"])
            result = entry["methods"].setdefault(method, {"seeds": [], "steps": steps, "rate_only": rate_only})
            result["seeds"].append(record)
            result["summary"] = summarize(result["seeds"])
            print(f"  {network.label} {task} {method} seed {seed}: "
                  f"{describe(record, entry['target'])} ({record['run_s']:.0f} s, "
                  f"load {record['load_average']:.1f}{cpu_note(record)}{losses_note(record)})", flush=True)
        data["race_s"] = time.monotonic() - started_all
        results.write(args.out, data, link=network_links(networks))
    return 1 if data["failures"] else 0


def machine_cpu(before, relay_before, relay_cpu, run_s):
    """The machine's cores a run kept busy on average (every process, the kernel's network work, the delay
    line) and the delay line's and the network softirq's shares of them: where ranks share cores, the
    steps/s a method loses to its own CPU shows here, beside what it loses to its link."""
    after = machine.cpu_times()
    cores = {"busy_cores": (after["busy"] - before["busy"]) / run_s,
             "softirq_cores": (after["softirq"] - before["softirq"]) / run_s,
             "machine_cores": os.cpu_count()}
    if relay_cpu is not None and relay_before is not None:
        cores["relay_cores"] = (relay_cpu() - relay_before) / run_s
    return {k: round(v, 3) for k, v in cores.items()}


def cpu_note(record):
    cpu = record.get("machine_cpu")
    if not cpu:
        return ""
    steady = steady_busy_cores(record)
    steady = f"; steady steps {steady:.2f} cores busy" if steady is not None else ""
    relay = f", the delay line {cpu['relay_cores']:.2f}" if "relay_cores" in cpu else ""
    return (f"; CPU {cpu['busy_cores']:.2f} of {cpu['machine_cores']} cores busy (network softirq "
            f"{cpu['softirq_cores']:.2f}{relay}){steady}")


def steady_busy_cores(record, skip=20):
    """The machine's cores kept busy during rank 0's steps after the first `skip` (the start's), None
    without those steps: where it is near the machine's cores, the steps are bound by CPU, not by waiting."""
    wall, busy = record.get("step_s", [])[skip:], record.get("step_busy_s", [])[skip:]
    return sum(busy) / sum(wall) if busy and len(busy) == len(wall) and sum(wall) > 0 else None


def losses_note(record):
    losses = record.get("network_losses")
    if not losses:
        return ""
    return (f"; WAN drops {losses['queue_drops'] + losses['loss_drops']}, TCP retransmitted "
            f"{losses['TcpRetransSegs']} segments, {losses['TcpExtTCPTimeouts']} timeouts")


def describe(record, target):
    def show(key, fmt):
        return "–" if record.get(key) is None else fmt.format(record[key])
    return (f"target {target:.2f} after {show('time_to_target_s', '{:.1f} s')} / "
            f"{show('steps_to_target', '{:.0f} steps')}; {show('steps_per_s', '{:.2f}')} steps/s; "
            f"final accuracy {show('final_accuracy', '{:.3f}')}")


if __name__ == "__main__":
    sys.exit(main())
