"""Steps per second against the WAN's round trip, per method (issue 53's figure): 4 hosts on the emulated WAN
(bench/harness/wan.py: TCP cubic, MTU by rate) at one NIC rate, each pair DELAY apart one way, for every
delay of --delays; every method of --methods trains the race's task (bench/train/task.py) for --steps
steps without evaluation (steps per second only, as the race times a method on another link), and the
results file keeps, per delay and method, the steps per second over all steps and over the steady part
(the last two thirds: after probes, calibration and ramps).

    python -m bench.experiments.wan_rtt --delays 0.5ms,10ms,25ms,50ms,75ms \\
        --methods ddp,torch_fp16,gradex_default --steps 30 --out docs/wan/rtt_sweep.json \\
        --plot docs/wan/rtt_steps_per_s.png
    python -m bench.experiments.wan_rtt --plot-only --out docs/wan/rtt_sweep.json --plot ... [--methods ...]

A method is a bench/train/methods.py method; `nocomm` (no communication: the compute bound) runs once, at
the first delay, since it never touches the link. A method with a `+VAR=VALUE` suffix runs with that
variable set in its ranks (e.g. gradex_default+GRADEX_DELAY=1: the delayed exchange as its own line).
Needs root and /dev/net/tun (bench/harness/wan.py). On a shared machine every figure is a ratio measured in
the same run: the methods of one delay run back to back.
"""
import argparse
import json
import os
import signal
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from bench.harness import plot, results
from bench.harness.launcher import RankFailure, print_progress_line, run_ranks
from bench.harness.wan import Wan, WanSpec
from bench.train import train_suite

STEADY_FROM = 1 / 3  # the steady part of a run: its last two thirds


def parse_method(text: str) -> Tuple[str, Dict[str, str]]:
    """'gradex_default+GRADEX_DELAY=1' -> ('gradex_default', {'GRADEX_DELAY': '1'})."""
    name, *settings = text.split("+")
    env = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"bad method setting {setting!r} in {text!r} (expected VAR=VALUE)")
        env[key] = value
    if name not in train_suite.METHODS:
        raise ValueError(f"unknown method {name!r} (expected one of {', '.join(train_suite.METHODS)})")
    return name, env


def rates(step_s: List[float]) -> Dict[str, Optional[float]]:
    """Steps per second over all steps and over the steady part, from rank 0's step times."""
    first = int(len(step_s) * STEADY_FROM)
    steady = step_s[first:]
    return {"steps_per_s": len(step_s) / sum(step_s) if step_s else None,
            "steady_steps_per_s": len(steady) / sum(steady) if steady and sum(steady) > 0 else None,
            "first10_s": sum(step_s[:10]) if len(step_s) >= 10 else None}


def one_run(args: argparse.Namespace, wan: Wan, method: str) -> Dict[str, Any]:
    name, env = parse_method(method)
    label = f"rtt.{wan.label}.{method.replace('+', '.').replace('=', '')}"
    out_path = os.path.join(args.log_dir, f"{label}.json")
    if os.path.exists(out_path):
        os.remove(out_path)
    race_args = argparse.Namespace(mode="quick", optimizer="sgd", python=args.python)
    argv, _ = train_suite.rank_argv(race_args, args.task, name, [args.seed], out_path, wan.counted,
                                    rate_only=True, iface=wan.iface)
    argv[argv.index("--steps") + 1] = str(args.steps)

    def display(mode: str, step: int, total: int) -> None:
        print_progress_line(f"[rtt {wan.label}] {method} step {step}/{total}")

    started = time.monotonic()
    run_ranks(wan, args.hosts, argv, warmup=0, steps=1, display=display, log_dir=args.log_dir, label=label,
              timeout_s=180 + args.steps * 20.0, extra_env=env)
    print_progress_line("")
    with open(out_path) as f:
        (record,) = json.load(f)["seeds"]
    summary = rates(record["step_s"])
    return {**summary, "method": name, "env": env, "steps": record["steps"], "step_s": record["step_s"],
            "wire_bytes_per_host": record.get("wire_bytes_per_host"), "policy": record.get("policy"),
            "run_s": time.monotonic() - started, "load_average": os.getloadavg()[0]}


def sweep(args: argparse.Namespace) -> int:
    data: Dict[str, Any] = {"task": args.task, "hosts": args.hosts, "rate": args.rate, "steps": args.steps,
                            "steady_from": STEADY_FROM, "methods": args.methods.split(","), "delays": {},
                            "failures": []}
    links: Dict[str, Any] = {}
    for index, delay in enumerate(args.delays.split(",")):
        spec = WanSpec(hosts=args.hosts, rate=args.rate, delay=delay, cc=args.cc)
        with Wan(spec, log_dir=args.log_dir) as wan:
            links[delay] = dict(vars(spec), link_mtu=spec.link_mtu())
            entry = data["delays"].setdefault(delay, {"rtt_ms": 2 * spec.max_one_way_s() * 1e3, "methods": {}})
            cc = spec.cc or "the machine's"
            print(f"WAN {wan.label}: MTU {spec.link_mtu()}, congestion control {cc}", flush=True)
            for method in data["methods"]:
                if method.startswith("nocomm") and index > 0:
                    continue  # the compute bound does not depend on the link
                try:
                    run = one_run(args, wan, method)
                except (RankFailure, OSError, ValueError, KeyError) as e:
                    print_progress_line("")
                    print(f"  FAILED: {delay} {method}: {e}", file=sys.stderr, flush=True)
                    data["failures"].append(f"{delay} {method}: {str(e).splitlines()[0]}")
                    continue
                entry["methods"][method] = run
                print(f"  {delay} one way {method}: {run['steps_per_s']:.2f} steps/s, steady "
                      f"{run['steady_steps_per_s']:.2f} ({run['run_s']:.0f} s, load {run['load_average']:.1f})",
                      flush=True)
                results.write(args.out, data, link=links)
    return 1 if data["failures"] else 0


def series(data: Dict[str, Any], methods: List[str], key: str) -> Dict[str, List[Tuple[float, float]]]:
    """{method: [(rtt_ms, value)]} of the stored sweep, in --methods' order."""
    out: Dict[str, List[Tuple[float, float]]] = {m: [] for m in methods}
    for entry in data["delays"].values():
        for method in methods:
            value = entry["methods"].get(method, {}).get(key)
            if value is not None:
                out[method].append((entry["rtt_ms"], value))
    return {m: sorted(points) for m, points in out.items() if points}


def draw(data: Dict[str, Any], methods: List[str], path: str) -> str:
    """Steady steps per second against RTT per method (log y), the compute bound as a line when measured."""
    fig, ax = plot.figure()
    lines = series(data, [m for m in methods if not m.startswith("nocomm")], "steady_steps_per_s")
    plot.lines(ax, lines)
    for points in lines.values():
        plot.label_points(ax, points)
    bound = next((e["methods"][m]["steady_steps_per_s"] for e in data["delays"].values() for m in methods
                  if m.startswith("nocomm") and m in e["methods"]), None)
    if bound:
        ax.axhline(bound, color=plot.color("nocomm"), linestyle=":", label=f"no communication ({bound:.1f})")
    plot.finish(ax, title=f"{data['task']} task, {data['hosts']} hosts, {data['rate']} NICs, TCP cubic: steady "
                f"steps/s (last 2/3 of {data['steps']} steps)", xlabel="round-trip time, ms",
                ylabel="steps per second (log)", logy=True)
    return plot.save(fig, path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="results JSON (rewritten after every run)")
    p.add_argument("--plot", default="", help="the figure (PNG)")
    p.add_argument("--plot-only", action="store_true", help="draw --plot from --out, run nothing")
    p.add_argument("--delays", default="0.5ms,10ms,25ms,50ms,75ms", help="one-way delays")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--cc", default="cubic", help="the hosts' TCP congestion control")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--task", default="mlp", choices=train_suite.TASK_SETTINGS)
    p.add_argument("--methods", default="ddp,torch_fp16,gradex_default",
                   help="methods.py methods, each optionally with +VAR=VALUE settings; nocomm: the bound")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--log-dir", default=os.path.join("build", "bench-run", "logs"))
    args = p.parse_args()
    try:
        for method in args.methods.split(","):
            parse_method(method)
    except ValueError as e:
        p.error(str(e))
    if args.plot_only:
        if not args.plot:
            p.error("--plot-only needs --plot")
        print(draw(results.load(args.out), args.methods.split(","), args.plot))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the WAN is removed, results kept
    os.makedirs(args.log_dir, exist_ok=True)
    status = sweep(args)
    if args.plot:
        print(draw(results.load(args.out), args.methods.split(","), args.plot))
    return status


if __name__ == "__main__":
    sys.exit(main())
