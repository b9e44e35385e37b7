#!/usr/bin/env python3
"""The WAN stage of bench/run (--wan): gradex-bench exchange over an emulated wide-area network
(wan.py), reported in round trips per step beside the bytes.

For each topology: build the WAN, measure it (UDP round trips between every pair of hosts, one TCP
flow's goodput along the farthest pair, the kernel's socket-buffer limits against that path's
bandwidth-delay product), run gradex's modes (exchange_suite.py's programs: the fixed modes under
GRADEX_POLICY=fixed, auto alone under GRADEX_POLICY=auto), remove the WAN. Per mode:

  step_ms          median step time (gradex-bench)
  rtts_per_step    step_ms / the measured round trip of the farthest pair (its median)
  wire_bytes       IP bytes per step and rank on the hosts' TUN devices (kernel counters)
  bytes_ms         the time those bytes take at the bottleneck rate (the slowest link of the path)
  line_fraction    bytes_ms / step_ms: the share of the line rate the exchange reaches

    wan_suite.py --out docs/wan/results.json --topologies flat,regions --steps 3 --warmup 1

Topologies: flat = --hosts hosts in one region (--rate, --delay: each host's NIC and the one-way
delay between any two); regions = 2 regions of --hosts/2 hosts (--region-rate, --region-delay inside
a region; --rate, --delay between them, on one pipe per direction shared by the region's hosts);
custom = --regions (the region of each host) with --rate, --delay between regions and --inter-pairs
for the region pairs that differ, e.g. --regions 0,0,1,2 --inter-pairs '0-2:1gbit,75ms;1-2:1gbit,150ms'.
"""
import argparse
import json
import os
import signal
import sys
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import exchange_suite  # noqa: E402
import gradex_vars  # noqa: E402
import machine  # noqa: E402
import wan  # noqa: E402
from ranks import RankFailure  # noqa: E402

MODES = "dense_fp32,dense_fp16,dgc99,dgc999,fixed,auto"


def topology(args: argparse.Namespace, kind: str) -> wan.WanSpec:
    common = dict(hosts=args.hosts, mtu=args.mtu, loss=args.loss, name=args.name, subnet=args.subnet,
                  tcp_buffer_mib=args.tcp_buffer_mib, sysctls=args.host_sysctl)
    if kind == "flat":
        return wan.WanSpec(rate=args.rate, delay=args.delay, **common)
    if kind == "regions":
        if args.hosts < 4 or args.hosts % 2:
            raise ValueError("the regions topology needs an even --hosts >= 4")
        half = args.hosts // 2
        return wan.WanSpec(rate=args.region_rate, delay=args.region_delay, regions=[0] * half + [1] * half,
                           inter_rate=args.rate, inter_delay=args.delay, **common)
    if kind == "custom":
        if not args.regions:
            raise ValueError("the custom topology needs --regions (and --inter-rate/--inter-delay)")
        return wan.WanSpec(rate=args.region_rate, delay=args.region_delay,
                           regions=[int(r) for r in args.regions.split(",")], inter_rate=args.rate,
                           inter_delay=args.delay, inter_pairs=args.inter_pairs, **common)
    raise ValueError(f"unknown topology {kind!r} (flat, regions, custom)")


def derive(modes: Dict[str, dict], rtt_ms: float, line_bits: float) -> None:
    """Adds rtts_per_step, bytes_ms and line_fraction to every mode that has a step time."""
    for metrics in modes.values():
        step = metrics.get("step_ms")
        if not step:
            continue
        metrics["rtts_per_step"] = step / rtt_ms if rtt_ms > 0 else None
        wire = metrics.get("wire_bytes")
        if wire is not None:
            metrics["bytes_ms"] = wire * 8 / line_bits * 1e3
            metrics["line_fraction"] = metrics["bytes_ms"] / step


def table(entry: dict) -> List[str]:
    """Markdown rows of one topology's results."""
    lines = ["| mode | step (ms) | RTTs per step | wire MB per step and host | bytes at line rate (ms) | "
             "fraction of line rate |", "|---|---:|---:|---:|---:|---:|"]
    for mode, m in entry["modes"].items():
        def fmt(key, spec):
            return format(m[key], spec) if m.get(key) is not None else "–"
        wire = f"{m['wire_bytes'] / 1e6:.2f}" if m.get("wire_bytes") is not None else "–"
        lines.append(f"| {mode} | {fmt('step_ms', '.0f')} | {fmt('rtts_per_step', '.1f')} | {wire} | "
                     f"{fmt('bytes_ms', '.1f')} | {fmt('line_fraction', '.2f')} |")
    return lines


def run_topology(args: argparse.Namespace, kind: str, names: set, data: dict) -> None:
    spec = topology(args, kind)
    key = kind + (f"_tcp{args.tcp_buffer_mib}m" if args.tcp_buffer_mib else "") + \
        "".join("_" + x.split("=")[0].rsplit(".", 1)[1] for x in args.host_sysctl) + \
        "".join("_" + x.replace("=", "_").lower() for x in args.env)
    entry = data["topologies"].setdefault(key, {"spec": {k: v for k, v in vars(spec).items()}, "modes": {}})
    print(f"[wan {kind}] {spec.label()}: {args.hosts} hosts, {args.steps} steps after {args.warmup} warm-up",
          flush=True)
    with wan.Wan(spec, log_dir=args.log_dir) as network:
        measured = wan.check(network, seconds=args.flow_s)
        entry["measured"] = measured
        rtt = measured["rtt_ms_max"]
        print(f"  rtt {rtt:.2f} ms h{measured['farthest']} (configured {measured['configured_rtt_ms']:.2f}); one flow "
              f"{measured['flow_bits'] / 1e6:.0f} Mbit/s of {measured['line_bits'] / 1e6:.0f}\n"
              f"  {measured['kernel_limits']}", flush=True)
        suite_args = argparse.Namespace(hosts=args.hosts, run_timeout_s=args.run_timeout_s, bench=args.bench,
                                        auto_extra_warmup=args.auto_extra_warmup, auto_ramp_steps=0)
        modes = [m for m in args.modes.split(",") if m]
        runs = exchange_suite.gradex_runs(suite_args, modes, names, args.steps, args.warmup)
        if args.baselines:  # the PyTorch baselines over the same WAN, in the same run
            warm = max(args.warmup, 2)
            runs.append(("torch", [args.python, str(exchange_suite.BASELINE), "--modes", args.baselines,
                                   "--model", "{model}", "--steps", str(args.steps), "--warmup", str(warm)],
                         {}, args.steps, warm, None))
        for tool, argv, env, steps, warmup, sentinel in runs:
            argv = [a.replace("{model}", args.model) for a in argv]
            env = {**env, **dict(item.split("=", 1) for item in args.env)}
            try:
                found, _ = exchange_suite.run_tool(tool, argv, network, suite_args, args.model, args.log_dir,
                                                   steps=steps, warmup=warmup, extra_env=env)
                found.pop(sentinel, None)
                derive(found, rtt, measured["line_bits"])
                entry["modes"].update(found)
            except (RankFailure, OSError) as e:
                message = f"wan {kind} {tool}: {e}"
                print("  FAILED: " + message, file=sys.stderr, flush=True)
                data["failures"].append(message.splitlines()[0])
            save(args.out, data)
        entry["relay"] = network.stats()
        entry["relay"]["cpu_s"] = network.relay_cpu_s()
        gb = entry["relay"]["delivered_bytes"] / 1e9
        print(f"  delay line: {gb:.2f} GB relayed with {entry['relay']['cpu_s']:.1f} CPU s, "
              f"{entry['relay']['queue_drops']} queue drops", flush=True)
    entry["targets"] = targets(entry["modes"])
    print("\n".join(table(entry)), flush=True)
    print("  targets: " + ", ".join(f"{k} {v:.2f}" for k, v in entry["targets"].items() if v is not None),
          flush=True)
    if kind != "flat":
        # The region-hierarchical exchange's target (WAN bytes <= 0.55x flat, steps/s >= 1.5x) needs the
        # regions (comm/topology/regions.h) as the hierarchical exchange's upper tier, which it does not use yet.
        entry["targets"]["region_hierarchical_over_flat"] = None
        print("  targets: region-hierarchical over flat: not measured (the exchange has no region tier yet)",
              flush=True)
    save(args.out, data)


def targets(modes: Dict[str, dict]) -> Dict[str, float]:
    """The WAN targets' ratios from one run's modes (None where a mode is missing): dense 16-bit's
    fraction of the line rate; gradex's dense ring over gloo's (the same fp32 gradients: gloo's step over
    gradex's, i.e. throughput); gloo's step over gradex's dense 16-bit step (the same gradients, each
    in its own format); DGC 99.9 %'s round trips per step."""
    def get(mode, key):
        return modes.get(mode, {}).get(key)

    def ratio(a, b):
        return a / b if a and b else None

    return {"dense_fp16_line_fraction": get("dense_fp16", "line_fraction"),
            "dense_fp32_over_gloo_fp32": ratio(get("gloo_fp32", "step_ms"), get("dense_fp32", "step_ms")),
            "dense_fp16_over_gloo_fp32": ratio(get("gloo_fp32", "step_ms"), get("dense_fp16", "step_ms")),
            "gloo_fp32_line_fraction": get("gloo_fp32", "line_fraction"),
            "dgc999_rtts_per_step": get("dgc999", "rtts_per_step")}


def save(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="results JSON, rewritten after every run")
    p.add_argument("--topologies", default="flat", help="flat, regions or flat,regions")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--rate", default="1gbit", help="flat: each host's NIC; regions: between regions")
    p.add_argument("--delay", default="25ms", help="flat: one way between hosts; regions: between regions")
    p.add_argument("--region-rate", default="10gbit", help="regions: inside a region")
    p.add_argument("--region-delay", default="0.25ms", help="regions: one way inside a region")
    p.add_argument("--regions", default="", help="custom: the region of each host, e.g. 0,0,1,2")
    p.add_argument("--inter-pairs", default="", help="custom: region pairs that differ, e.g. 0-2:1gbit,75ms")
    p.add_argument("--loss", type=float, default=0.0)
    p.add_argument("--mtu", type=int, default=65000)
    p.add_argument("--tcp-buffer-mib", type=int, default=0,
                   help="tcp_rmem/tcp_wmem max inside the emulated hosts (0: as the machine is set up)")
    p.add_argument("--host-sysctl", action="append", default=[],
                   help="net.ipv4.KEY=VALUE inside the emulated hosts, e.g. net.ipv4.tcp_slow_start_after_idle=0")
    p.add_argument("--env", action="append", default=[],
                   help="KEY=VALUE for every rank, e.g. GRADEX_SPARSE_COLLECTIVE=direct (what-ifs)")
    p.add_argument("--name", default=os.environ.get("GX_WAN_NAME", "gxw"))
    p.add_argument("--subnet", default=os.environ.get("GX_WAN_SUBNET", "198.19.0"))
    p.add_argument("--model", default="resnet50")
    p.add_argument("--modes", default=MODES)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--auto-extra-warmup", type=int, default=4)
    p.add_argument("--flow-s", type=float, default=3.0, help="seconds of the one-flow goodput test")
    p.add_argument("--baselines", default="gloo_fp32",
                   help="PyTorch baselines (bench/baselines/rank.py modes) run over the same WAN; '' for none")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--bench", default=str(exchange_suite.ROOT / "build" / "bin" / "gradex-bench"))
    p.add_argument("--run-timeout-s", type=float, default=300)
    p.add_argument("--log-dir", default=str(exchange_suite.ROOT / "build" / "bench-run" / "logs"))
    args = p.parse_args()
    if any("=" not in item for item in args.env):
        p.error("--env takes KEY=VALUE")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the WAN is always removed
    names = gradex_vars.declared(args.bench)
    data = {"machine": machine.describe(), "model": args.model, "hosts": args.hosts, "steps": args.steps,
            "warmup": args.warmup, "topologies": {}, "failures": [],
            "note": "rtts_per_step = step_ms / measured RTT; line_fraction = bytes at the bottleneck rate / "
                    "step time; wire bytes per step and rank from the TUN devices' counters"}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    started = time.monotonic()
    for kind in filter(None, args.topologies.split(",")):
        try:
            run_topology(args, kind, names, data)
        except (RuntimeError, ValueError, OSError) as e:
            print(f"  FAILED: wan {kind}: {e}", file=sys.stderr, flush=True)
            data["failures"].append(f"wan {kind}: {e}")
            save(args.out, data)
    print(f"wan_suite: {time.monotonic() - started:.0f} s, results in {args.out}", flush=True)
    return 1 if data["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
