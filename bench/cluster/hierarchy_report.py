"""The hierarchical-exchange part of bench/report.py: the table, the targets and the RESULT values
of hierarchy_suite.py's hierarchy.json."""
import math
from typing import Any, Dict

# The targets at 2 hosts x 2 ranks (100 Mbit/s and 1 Gbit/s), hierarchical against flat:
# (policy, what is compared, bound, "max" or "min").
TARGETS = [("default", "bytes", 0.6, "max"), ("dense16", "bytes", 0.75, "max"), ("dense16", "speedup", 1.2, "min")]
TARGET_LAYOUT = (2, 2)


def _tag(rate):
    for suffix, short in (("gbit", "g"), ("mbit", "m"), ("kbit", "k")):
        if rate.endswith(suffix):
            return rate[:-len(suffix)] + short
    return rate


def _fmt(x, digits=2):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{digits}f}"


def pairs(hier):
    """{(hosts, ranks_per_host, rate, policy): {"flat": run, "hierarchical": run}} in run order."""
    out: Dict[Any, Dict[str, Any]] = {}
    for run in (hier or {}).get("runs", []):
        key = (run["hosts"], run["ranks_per_host"], run["rate"], run["policy"])
        out.setdefault(key, {})[run["exchange"]] = run
    return out


def bytes_ratio(flat, hier):
    """The worst host's bytes sent over its link, hierarchical ÷ flat (per step), or None."""
    a, b = (hier or {}).get("host_tx_bytes"), (flat or {}).get("host_tx_bytes")
    if not a or not b or len(a) != len(b) or not all(b):
        return None
    return max(x / y for x, y in zip(a, b))


def speedup(flat, hier):
    """Steps per second, hierarchical ÷ flat, or None."""
    a, b = (hier or {}).get("step_ms"), (flat or {}).get("step_ms")
    return b / a if a and b else None


def values(hier):
    """{RESULT key: value}: hier_bytes_<policy>_<H>x<L>_<rate> (worst host's bytes sent, hierarchical ÷
    flat) and hier_speedup_<policy>_<H>x<L>_<rate> (steps/s, hierarchical ÷ flat) for every layout, rate
    and policy measured; nan while only the flat exchange exists. Empty without results."""
    out = {}
    for (hosts, local, rate, policy), runs in pairs(hier).items():
        suffix = f"{policy}_{hosts}x{local}_{_tag(rate)}"
        r = bytes_ratio(runs.get("flat"), runs.get("hierarchical"))
        s = speedup(runs.get("flat"), runs.get("hierarchical"))
        out[f"hier_bytes_{suffix}"] = math.nan if r is None else r
        out[f"hier_speedup_{suffix}"] = math.nan if s is None else s
    return out


def tables(hier):
    m = hier.get("machine", {})
    lines = [f"{hier.get('note', '')}. Model profile `{hier.get('model')}`, ranks placed host by host, intra-host "
             f"transport {hier.get('intra_host', 'tcp')}; run {m.get('date', '?')}, gradex {m.get('commit', '?')}, "
             f"load average at start {_fmt(m.get('load_average_at_start'), 1)} on {m.get('cores', '?')} cores. "
             "Bytes are the kernel's counters of each host's veth (payload, headers and ACKs) per measured step; "
             "gradex's own count is per rank.", "",
             "| hosts × ranks | rate | policy | exchange | step ms | steps/s | MB sent per host (veth) | "
             "MB received per host (veth) | gradex's own MB/rank |",
             "|---|---|---|---|---:|---:|---|---|---:|"]
    for run in hier.get("runs", []):
        tx, rx = run.get("host_tx_bytes") or [], run.get("host_rx_bytes") or []
        own = run.get("self_wire_bytes")
        lines.append(f"| {run['hosts']} × {run['ranks_per_host']} | {run['rate']} | {run['policy']} | "
                     f"{run['exchange']} | {_fmt(run.get('step_ms'), 1)} | {_fmt(run.get('steps_per_s'))} | "
                     f"{' / '.join(_fmt(b / 1e6) for b in tx) or '–'} | {' / '.join(_fmt(b / 1e6) for b in rx) or '–'} | "
                     f"{_fmt(own / 1e6 if own is not None else None)} |")
    lines.append("")
    found = pairs(hier)
    rows = []
    for (hosts, local, rate, policy), runs in found.items():
        for target_policy, what, bound, kind in TARGETS:
            if policy != target_policy:
                continue
            v = (bytes_ratio if what == "bytes" else speedup)(runs.get("flat"), runs.get("hierarchical"))
            binding = (hosts, local) == TARGET_LAYOUT
            required = ("≤ " if kind == "max" else "≥ ") + f"{bound:g}×" if binding else "reported"
            met = "–" if v is None or not binding else (
                "yes" if (v <= bound if kind == "max" else v >= bound) else "**no**")
            label = "worst host's bytes sent" if what == "bytes" else "steps/s"
            rows.append(f"| {hosts} × {local} at {rate}, {policy}: {label}, hierarchical ÷ flat | {required} | "
                        f"{_fmt(v)}{'' if v is None else '×'} | {met} |")
    if rows:
        lines += ["Targets (hierarchical ÷ flat; `–`: not measured on this build):", "",
                  "| target | required | measured | met |", "|---|---:|---:|:---:|"] + rows + [""]
    for failure in hier.get("failures", []):
        lines += [f"Failed: {failure}", ""]
    return lines
