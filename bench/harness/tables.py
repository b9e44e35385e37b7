"""Markdown tables rendered from stored result files, so that a table in docs/ holds exactly what its file
says (the docs name the file and the command beside each table):

    python -m bench.harness.tables race docs/wan/train_all_tasks.json [--methods ddp,torch_fp16,gradex_auto]
    python -m bench.harness.tables rtt docs/wan/rtt_sweep.json [--methods ddp,torch_fp16,gradex_default]
    python -m bench.harness.tables auto docs/benchmarks/exchange.json

race: per network and task, each method's steps/s, time and steps to target, final accuracy and DDP's time
÷ its own (medians over seeds; time to target of a rate-only run derived as the race report derives it).
racesum: one row per task: each method's time to target (steps; steps/s) and DDP's time ÷ each method's.
rtt: steady steps/s per one-way delay and method, with the compute bound and gradex ÷ DDP.
auto: per link rate, the auto policy's step against the best fixed mode's (bench/report.py's ratio).
wan: per WAN topology (bench/cluster/wan_suite.py), each mode's step, round trips and line-rate fraction.
"""
import argparse
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

from bench.harness import results
from bench.train import race_report


def fmt(value: Optional[float], digits: int = 2) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> List[str]:
    """A Markdown table; align: one character per column, l or r (default: first left, others right)."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---" if a == "l" else "---:" for a in align]
    return ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"] + ["| " + " | ".join(r) + " |" for r in rows]


def race(data: Dict[str, Any], methods: Optional[List[str]] = None) -> List[str]:
    out: List[str] = []
    nets = race_report.networks(data)
    reference = nets[0][1]["tasks"] if nets else {}
    for label, net in nets:
        for task, entry in net["tasks"].items():
            ms = entry["methods"]
            ref_ms = reference.get(task, entry)["methods"]
            ddp_time, _ = race_report.time_to_target(ms, "ddp", ref_ms)
            names = [m for m in (methods or list(ms)) if m in ms]
            rows = []
            for name in names:
                ttt, derived = race_report.time_to_target(ms, name, ref_ms)
                steps = race_report.steps_to_target(ms, name, ref_ms)
                ratio = ddp_time / ttt if ddp_time and ttt and name != "nocomm" else None
                rows.append([f"`{name}`" + (" (derived)" if derived else ""),
                             fmt(race_report._median(ms[name], "steps_per_s")),
                             "–" if name == "nocomm" else fmt(ttt, 1),
                             "–" if name == "nocomm" or steps is None else f"{steps:.0f}",
                             "–" if name == "nocomm" else fmt(race_report.final_accuracy(ms, name, ref_ms), 3),
                             fmt(ratio)])
            out += [f"**{task}** at {label} (target {entry['target']:.2f}, {entry['steps']} steps)", ""]
            out += markdown(["method", "steps/s", "s to target", "steps to target", "final accuracy",
                             "DDP's time ÷ this"], rows)
            out.append("")
    return out[:-1]


def race_summary(data: Dict[str, Any], methods: Optional[List[str]] = None) -> List[str]:
    """One row per network and task: each method's time to target (steps to it; steps/s), and DDP's
    time ÷ each other method's."""
    nets = race_report.networks(data)
    reference = nets[0][1]["tasks"] if nets else {}
    names = methods or sorted({m for _, net in nets for e in net["tasks"].values() for m in e["methods"]})
    others = [m for m in names if m not in ("ddp", "nocomm")]
    rows = []
    for label, net in nets:
        for task, entry in net["tasks"].items():
            ms, ref_ms = entry["methods"], reference.get(task, entry)["methods"]
            cells = []
            for name in names:
                if name not in ms:
                    cells.append("–")
                elif name == "nocomm":
                    cells.append(f"{fmt(race_report._median(ms[name], 'steps_per_s'))} steps/s")
                else:
                    ttt, derived = race_report.time_to_target(ms, name, ref_ms)
                    steps = race_report.steps_to_target(ms, name, ref_ms)
                    sps = race_report._median(ms[name], "steps_per_s")
                    cells.append(f"{fmt(ttt, 1)} s ({'–' if steps is None else f'{steps:.0f}'}; {fmt(sps)})"
                                 + (" derived" if derived else ""))
            ddp, _ = race_report.time_to_target(ms, "ddp", ref_ms)
            for name in others:
                ttt, _ = race_report.time_to_target(ms, name, ref_ms)
                cells.append(fmt(ddp / ttt if ddp and ttt else None))
            rows.append([f"{task} ({entry['target']:.2f}){'' if len(nets) == 1 else ', ' + label}"] + cells)
    header = ["task (target)"] + [f"`{m}`" for m in names] + [f"DDP ÷ `{m}`" for m in others]
    return markdown(header, rows)


def rtt(data: Dict[str, Any], methods: Optional[List[str]] = None) -> List[str]:
    names = [m for m in (methods or data["methods"]) if not m.startswith("nocomm")]
    bound = next((e["methods"][m]["steady_steps_per_s"] for e in data["delays"].values() for m in data["methods"]
                  if m.startswith("nocomm") and m in e["methods"]), None)
    gradex = next((m for m in names if m.startswith("gradex")), None)
    rows = []
    for delay, entry in sorted(data["delays"].items(), key=lambda kv: kv[1]["rtt_ms"]):
        values = {m: entry["methods"].get(m, {}).get("steady_steps_per_s") for m in names}
        ddp = values.get("ddp")
        row = [f"{entry['rtt_ms']:g}"] + [fmt(values[m]) for m in names]
        if gradex:
            row.append(fmt(values[gradex] / ddp if values.get(gradex) and ddp else None))
            row.append(fmt(values[gradex] / bound if values.get(gradex) and bound else None))
        rows.append(row)
    header = ["RTT, ms"] + [f"`{m}`" for m in names]
    if gradex:
        header += [f"`{gradex}` ÷ DDP", f"`{gradex}` ÷ bound"]
    lines = markdown(header, rows)
    if bound:
        lines += ["", f"Compute bound (`nocomm`, no communication): {bound:.2f} steps/s."]
    return lines


def auto(data: Dict[str, Any]) -> List[str]:
    from bench import report
    rows = []
    for model, by_rate in data["exchange"].items():
        for label, modes in sorted(by_rate.items(), key=lambda kv: report.rate_gbit(kv[0]) or 1e9):
            best, a = report.best_fixed(modes), report.pick(modes, report.AUTO)
            if not best or not a:
                continue
            rows.append([model, label, f"`{best}` {modes[best]['step_ms']:.1f}", f"{modes[a]['step_ms']:.1f}",
                         fmt(modes[a]["step_ms"] / modes[best]["step_ms"])])
    return markdown(["model", "link", "best fixed mode, ms a step", "auto, ms a step", "auto ÷ best fixed"],
                    rows, "llrrr")


def wan(data: Dict[str, Any], methods: Optional[List[str]] = None) -> List[str]:
    """Per topology of a bench/cluster/wan_suite.py result: each mode's step, round trips a step, wire MB
    per step and host and fraction of the line rate."""
    out: List[str] = []
    for key, entry in data.get("topologies", {}).items():
        modes = entry.get("modes", {})
        rows = []
        for name in [m for m in (methods or list(modes)) if m in modes]:
            r = modes[name]
            rows.append([f"`{name}`", fmt(r.get("step_ms"), 0), fmt(r.get("rtts_per_step"), 1),
                         fmt((r.get("wire_bytes") or 0) / 1e6 if r.get("wire_bytes") else None),
                         fmt(r.get("line_fraction"))])
        out += [f"**{key}** (MTU {entry.get('spec', {}).get('link_mtu') or 'not recorded'})", ""]
        out += markdown(["mode", "step, ms", "RTTs a step", "wire MB a step and host", "÷ line rate"], rows)
        out.append("")
    return out[:-1]


RENDER: Dict[str, Callable[[Dict[str, Any], Optional[List[str]]], List[str]]] = {
    "race": race, "racesum": race_summary, "rtt": rtt, "wan": wan}
KINDS = [*RENDER, "auto"]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=KINDS)
    p.add_argument("path")
    p.add_argument("--methods", default="", help="the methods' rows or columns, in this order")
    args = p.parse_args(argv)
    data = results.load(args.path)
    methods = args.methods.split(",") if args.methods else None
    lines = auto(data) if args.kind == "auto" else RENDER[args.kind](data, methods)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
