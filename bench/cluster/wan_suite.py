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

On a topology of several regions the suite then compares the region-hierarchical exchange with the
flat one side by side (--region-modes, engine modes: the hierarchical layouts are the engine's):
each round runs the modes once under GRADEX_HIERARCHICAL=0 (flat) and once under the default layout
(regions measured at start-up and used as the hierarchical exchange's groups; rank 0's `exchange
layout:` line is checked and kept), alternating which goes first. Per mode and layout: step_ms and
wan_bytes, the IP bytes per step that crossed between regions (the delay line's count of what its
inter-region pipes accepted, both directions, over whole measured steps: bench/harness/launcher.py's WireMeter); the
targets region_over_flat_steps_per_s (flat step / region step) and region_over_flat_wan_bytes, of
--region-target-mode, medians over the rounds.

Topologies: flat = --hosts hosts in one region (--rate, --delay: each host's NIC and the one-way
delay between any two); regions = 2 regions of --hosts/2 hosts (--region-rate, --region-delay inside
a region; --rate, --delay between them, on one pipe per direction shared by the region's hosts);
custom = --regions (the region of each host) with --rate, --delay between regions and --inter-pairs
for the region pairs that differ, e.g. --regions 0,0,1,2 --inter-pairs '0-2:1gbit,75ms;1-2:1gbit,150ms'.
"""
import argparse
import json
import os
import re
import signal
import sys
import time
from typing import Any, Dict, List, Tuple

from bench.cluster import exchange_suite  # noqa: E402
from bench.cluster import gradex_vars  # noqa: E402
from bench.harness import machine, results  # noqa: E402
from bench.harness import wan  # noqa: E402
from bench.harness.launcher import RankFailure  # noqa: E402

MODES = "dense_fp32,dense_fp16,dgc99,dgc999,fixed,auto"
REGION_MODES = "engine16,dgc999,fixed"
# Ends each comparison program: the per-host byte window of the last mode closes when it starts (see
# exchange_suite.gradex_runs); LocalSGD every 8 steps sends nothing in the few steps it runs.
REGION_SENTINEL = "localsgd8"
LAYOUTS: Tuple[Tuple[str, Dict[str, str]], ...] = (("flat", {gradex_vars.HIERARCHICAL: "0"}), ("region", {}))


def topology(args: argparse.Namespace, kind: str) -> wan.WanSpec:
    common = dict(hosts=args.hosts, mtu=args.mtu, loss=args.loss, cc=args.cc, name=args.name, subnet=args.subnet,
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
    entry = data["topologies"].setdefault(key, {"spec": dict(vars(spec), link_mtu=spec.link_mtu()), "modes": {}})
    print(f"[wan {kind}] {spec.label()}: {args.hosts} hosts, {args.steps} steps after {args.warmup} warm-up, "
          f"MTU {spec.link_mtu()}", flush=True)
    with wan.Wan(spec, log_dir=args.log_dir) as network:
        measured = wan.check(network, seconds=args.flow_s)
        entry["measured"] = measured
        rtt = float(measured["rtt_ms_max"])
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
                derive(found, rtt, float(measured["line_bits"]))
                entry["modes"].update(found)
            except (RankFailure, OSError) as e:
                message = f"wan {kind} {tool}: {e}"
                print("  FAILED: " + message, file=sys.stderr, flush=True)
                data["failures"].append(message.splitlines()[0])
            save(args.out, data)
        if spec.multi_region and args.region_modes and args.region_rounds > 0:
            run_region_compare(args, kind, network, names, entry, data, rtt, measured["line_bits"])
        entry["relay"] = network.stats()
        entry["relay"]["cpu_s"] = network.relay_cpu_s()
        gb = entry["relay"]["delivered_bytes"] / 1e9
        print(f"  delay line: {gb:.2f} GB relayed with {entry['relay']['cpu_s']:.1f} CPU s, "
              f"{entry['relay']['queue_drops']} queue drops", flush=True)
    entry["targets"] = targets(entry["modes"])
    if entry["modes"]:
        print("\n".join(table(entry)), flush=True)
        print("  targets: " + ", ".join(f"{k} {v:.2f}" for k, v in entry["targets"].items() if v is not None),
              flush=True)
    if "region_compare" in entry:
        compare = entry["region_compare"]
        compare["summary"] = region_summary(compare["rounds"])
        entry["targets"].update(region_targets(compare["summary"], args.region_target_mode))
        print("\n".join(region_table(compare["summary"])), flush=True)
        print(f"  targets ({args.region_target_mode}): region over flat: WAN bytes "
              f"{fmt_ratio(entry['targets']['region_over_flat_wan_bytes'])} (<= 0.55), steps/s "
              f"{fmt_ratio(entry['targets']['region_over_flat_steps_per_s'])} (>= 1.5)", flush=True)
    save(args.out, data)


def fmt_ratio(value) -> str:
    return f"{value:.2f}" if value is not None else "–"


def layout_lines(log_path: str) -> List[str]:
    """The distinct `exchange layout: ...` lines rank 0 logged (one per engine it opened)."""
    try:
        with open(log_path, errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    found = []
    for match in re.finditer(r"exchange layout: ([^\r\n]*)", text):
        if match.group(1) not in found:
            found.append(match.group(1))
    return found


def layout_ok(label: str, lines: List[str]) -> bool:
    """Whether every engine took the layout the comparison names: flat under GRADEX_HIERARCHICAL=0,
    hierarchical over measured regions by default."""
    want = "flat (GRADEX_HIERARCHICAL=0)" if label == "flat" else "hierarchical over regions (measured"
    return bool(lines) and all(line.startswith(want) for line in lines)


def run_region_compare(args, kind, network, names, entry, data, rtt, line_bits) -> None:
    """Rounds of the region modes flat and region-hierarchical, side by side on one WAN (module doc)."""
    modes = [m for m in args.region_modes.split(",") if m]
    compare = entry.setdefault("region_compare", {"modes": modes, "rounds": [],
                                                  "target_mode": args.region_target_mode})
    suite_args = argparse.Namespace(hosts=args.hosts, run_timeout_s=args.run_timeout_s)
    user_env = dict(item.split("=", 1) for item in args.env)
    for number in range(args.region_rounds):
        layouts = LAYOUTS if number % 2 == 0 else tuple(reversed(LAYOUTS))
        result: Dict[str, Any] = {"order": [label for label, _ in layouts]}
        for label, layout_env in layouts:
            tool = f"gradex_{label}"
            argv = [args.bench, "exchange", "--modes", ",".join(modes + [REGION_SENTINEL]), "--model",
                    args.model, "--steps", str(args.steps), "--warmup", str(args.warmup), "--idle-s", "0"]
            env = {**gradex_vars.policy_env(names, "fixed"), **layout_env, "GRADEX_LOG_LEVEL": "info",
                   **user_env}
            try:
                found, _ = exchange_suite.run_tool(tool, argv, network, suite_args, args.model, args.log_dir,
                                                   steps=args.steps, warmup=args.warmup, extra_env=env)
            except (RankFailure, OSError) as e:
                message = f"wan {kind} region comparison round {number + 1} {label}: {e}"
                print("  FAILED: " + message, file=sys.stderr, flush=True)
                data["failures"].append(message.splitlines()[0])
                continue
            found.pop(REGION_SENTINEL, None)
            derive(found, rtt, line_bits)
            lines = layout_lines(os.path.join(args.log_dir,
                                              f"{args.model}.{network.label}.{tool}.rank0.stderr.log"))
            result[label] = {"modes": found, "layouts": lines, "layout_ok": layout_ok(label, lines)}
            if not result[label]["layout_ok"]:
                message = f"wan {kind} region comparison round {number + 1} {label}: layout {lines}"
                print("  WRONG LAYOUT: " + message, file=sys.stderr, flush=True)
                data["failures"].append(message)
            print(f"  {label}: " + "; ".join(f"{m} {v.get('step_ms', 0):.0f} ms, WAN "
                                             f"{(v.get('wan_bytes') or 0) / 1e6:.2f} MB/step"
                                             for m, v in found.items()) +
                  f" ({lines[0] if lines else 'no layout line'})", flush=True)
        compare["rounds"].append(result)
        save(args.out, data)


def region_summary(rounds: List[dict]) -> Dict[str, dict]:
    """Per mode over the rounds that ran both layouts: each layout's step_ms and wan_bytes, and the
    ratios region over flat of each round (steps/s: flat step / region step; WAN bytes: region / flat),
    as lists in round order."""
    out: Dict[str, dict] = {}
    for r in rounds:
        if "flat" not in r or "region" not in r:
            continue
        for mode, flat in r["flat"]["modes"].items():
            region = r["region"]["modes"].get(mode)
            if not region:
                continue
            m = out.setdefault(mode, {"flat_step_ms": [], "region_step_ms": [], "flat_wan_bytes": [],
                                      "region_wan_bytes": [], "steps_per_s_ratio": [], "wan_bytes_ratio": []})
            m["flat_step_ms"].append(flat.get("step_ms"))
            m["region_step_ms"].append(region.get("step_ms"))
            m["flat_wan_bytes"].append(flat.get("wan_bytes"))
            m["region_wan_bytes"].append(region.get("wan_bytes"))
            if flat.get("step_ms") and region.get("step_ms"):
                m["steps_per_s_ratio"].append(flat["step_ms"] / region["step_ms"])
            if flat.get("wan_bytes") and region.get("wan_bytes") is not None:
                m["wan_bytes_ratio"].append(region["wan_bytes"] / flat["wan_bytes"])
    return out


def median(values: List[float]):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def region_targets(summary: Dict[str, dict], mode: str) -> Dict[str, object]:
    """The region tier's targets (WAN bytes <= 0.55x flat, steps/s >= 1.5x) of `mode`, medians over the
    rounds, and every compared mode's medians under region_over_flat."""
    per_mode = {m: {"wan_bytes": median(v["wan_bytes_ratio"]), "steps_per_s": median(v["steps_per_s_ratio"])}
                for m, v in summary.items()}
    chosen = per_mode.get(mode, {})
    return {"region_over_flat_wan_bytes": chosen.get("wan_bytes"),
            "region_over_flat_steps_per_s": chosen.get("steps_per_s"),
            "region_over_flat_mode": mode, "region_over_flat": per_mode}


def region_table(summary: Dict[str, dict]) -> List[str]:
    """Markdown rows of the comparison: ranges over the rounds (min–max)."""
    def span(values, scale=1.0, spec=".0f"):
        values = [v * scale for v in values if v is not None]
        if not values:
            return "–"
        lo, hi = min(values), max(values)
        return format(lo, spec) if format(lo, spec) == format(hi, spec) else f"{lo:{spec}}–{hi:{spec}}"
    lines = ["| mode | flat: step (ms) | region: step (ms) | steps/s, region ÷ flat | flat: WAN MB per step | "
             "region: WAN MB per step | WAN bytes, region ÷ flat |", "|---|---:|---:|---:|---:|---:|---:|"]
    for mode, m in summary.items():
        lines.append(f"| {mode} | {span(m['flat_step_ms'])} | {span(m['region_step_ms'])} | "
                     f"{span(m['steps_per_s_ratio'], spec='.2f')} | {span(m['flat_wan_bytes'], 1e-6, '.2f')} | "
                     f"{span(m['region_wan_bytes'], 1e-6, '.2f')} | {span(m['wan_bytes_ratio'], spec='.2f')} |")
    return lines


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
    """The results so far, with their provenance (bench/harness/results.py): the link is every
    topology's WAN spec (rates, delays, MTU, congestion control)."""
    results.write(path, data, link={key: entry.get("spec") for key, entry in data.get("topologies", {}).items()})


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
    p.add_argument("--mtu", type=int, default=0, help="TUN MTU (0: by the rate, WanSpec.link_mtu)")
    p.add_argument("--tcp-buffer-mib", type=int, default=0,
                   help="tcp_rmem/tcp_wmem max inside the emulated hosts (0: as the machine is set up)")
    p.add_argument("--host-sysctl", action="append", default=[],
                   help="net.ipv4.KEY=VALUE inside the emulated hosts, e.g. net.ipv4.tcp_slow_start_after_idle=0")
    p.add_argument("--env", action="append", default=[],
                   help="KEY=VALUE for every rank, e.g. GRADEX_SPARSE_COLLECTIVE=direct (what-ifs)")
    p.add_argument("--cc", default="cubic", help="the hosts' TCP congestion control ('' keeps the machine's)")
    p.add_argument("--name", default=wan.default_name())
    p.add_argument("--subnet", default=wan.default_subnet())
    p.add_argument("--model", default="resnet50")
    p.add_argument("--modes", default=MODES)
    p.add_argument("--region-modes", default=REGION_MODES,
                   help="engine modes compared flat against region-hierarchical on topologies of several "
                        "regions ('' for none)")
    p.add_argument("--region-rounds", type=int, default=2,
                   help="rounds of that comparison (each: both layouts, alternating which goes first)")
    p.add_argument("--region-target-mode", default="engine16",
                   help="the mode whose ratios are the region tier's targets")
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
