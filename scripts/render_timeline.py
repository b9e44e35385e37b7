#!/usr/bin/env python3
"""Renders a gradex timeline (GRADEX_TIMELINE's rank<r>.json, or `gradex-bench timeline DIR`'s merged.json) to
a PNG: one bar per span, one line per row (each rank's framework wait, threads and peers), coloured by phase,
for one step or a range of them.

    .venv/bin/python scripts/render_timeline.py DIR/merged.json --step 5 -o step5.png [--ranks 0,1] [--title "..."]

--step N shows from rank 0's end of step N-1 to its end of step N ("step end" instants); without it, the whole
trace. Rows of peers show each unit's traffic with that peer (its bytes in the label when the bar is wide
enough). It also prints how much of the shown window each rank's named phases cover.
"""
import argparse
import json
import sys

_COLOURS = {"coalesce": "#dadaeb", "inspect": "#fdd0a2", "negotiate": "#8c6bb1", "encode": "#41ab5d", "transfer": "#2171b5", "decode": "#fd8d3c",
            "framework waits on gradex": "#cb181d", "wait": "#fcbba1", "send": "#6baed6", "recv": "#9ecae1",
            "link probe": "#bdbdbd"}


def _colour(name):
    for prefix, colour in _COLOURS.items():
        if name == prefix or name.startswith(prefix + " "):
            return colour
    return "#969696"


def load(path):
    with open(path) as f:
        text = f.read()
    if not text.rstrip().endswith("]"):  # a rank that did not shut down: the array is still open
        text = text.rstrip().rstrip(",") + "\n]"
    return json.loads(text)


def window(events, step):
    """(start, end) in microseconds: rank 0's step `step` (from the end of step-1), or the whole trace."""
    spans = [e for e in events if e.get("ph") == "X"]
    if step is None:
        return min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)
    ends = sorted((e["args"]["step"], e["ts"]) for e in events if e.get("name") == "step end" and e["pid"] == 0)
    by_step = dict(ends)
    if step not in by_step:
        raise SystemExit(f"render_timeline: rank 0 has no step {step} (steps {ends[0][0]}..{ends[-1][0]})")
    start = by_step.get(step - 1, min(e["ts"] for e in spans))
    return start, by_step[step]


_OWN_PHASES = ("coalesce", "inspect", "negotiate", "encode", "transfer", "decode", "link probe")


def exchange_window(events, pid, start, end):
    """(first submission, last completion) of rank `pid` inside [start, end], or None."""
    submits = [e["ts"] for e in events if e.get("name") == "submit" and e["pid"] == pid and start <= e["ts"] < end]
    completes = [e["ts"] for e in events if e.get("name") == "complete" and e["pid"] == pid and start <= e["ts"] <= end]
    return (min(submits), max(completes)) if submits and completes else None


def coverage(events, start, end, pid_filter=None, names=None):
    """Per rank: the share of [start, end] (per rank: a (start, end) pair in a dict) that its spans cover (any
    row; `names`: only spans of those phases)."""
    out = {}
    for pid in sorted({e["pid"] for e in events}):
        if pid_filter is not None and pid not in pid_filter:
            continue
        lo, hi = (start[pid] if isinstance(start, dict) else (start, end))
        pieces = sorted((max(e["ts"], lo), min(e["ts"] + e["dur"], hi)) for e in events
                        if e.get("ph") == "X" and e["pid"] == pid and e["ts"] < hi and e["ts"] + e["dur"] > lo
                        and (names is None or e["name"] in names))
        covered, reach = 0.0, lo
        for a, b in pieces:
            if b > reach:
                covered += b - max(a, reach)
                reach = b
        out[pid] = covered / (hi - lo) if hi > lo else 0.0
    return out


def render(events, start, end, out, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X" and e["ts"] < end and e["ts"] + e["dur"] > start]
    rows = sorted({(e["pid"], e["tid"]) for e in spans})
    index = {row: i for i, row in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(13, 0.32 * len(rows) + 1.6))
    scale = 1e3  # ms
    for e in spans:
        y = index[(e["pid"], e["tid"])]
        a, b = max(e["ts"], start), min(e["ts"] + e["dur"], end)
        ax.broken_barh([((a - start) / scale, max((b - a) / scale, 0.02))], (y - 0.38, 0.76),
                       facecolors=_colour(e["name"]), edgecolor="none")
        nbytes = e.get("args", {}).get("bytes")
        if nbytes and (b - a) > 0.06 * (end - start):
            label = f"{nbytes / 1e3:.1f} kB" if nbytes >= 1000 else f"{nbytes} B"
            ax.text((a + b - 2 * start) / 2 / scale, y, label, ha="center", va="center", fontsize=6)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {p}: {names.get((p, t), f'row {t}')}" for p, t in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, (end - start) / scale)
    ax.set_xlabel("ms")
    ax.set_title(title, fontsize=10)
    ax.legend(handles=[Patch(color=c, label=n) for n, c in _COLOURS.items()], fontsize=7, ncol=5,
              loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.3 / max(len(rows), 1)))
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--step", type=int, default=None)
    parser.add_argument("-o", "--out", required=True)
    parser.add_argument("--title", default="")
    parser.add_argument("--ranks", default="", help="comma-separated ranks (pids) to draw (default: all)")
    args = parser.parse_args(argv)
    events = load(args.trace)
    if args.ranks:
        keep = {int(r) for r in args.ranks.split(",")}
        events = [e for e in events if e.get("pid") in keep or e.get("name") == "step end" and e.get("pid") == 0]
    start, end = window(events, args.step)
    for pid, share in coverage(events, start, end).items():
        print(f"rank {pid}: named phases cover {100 * share:.1f} % of {(end - start) / 1e3:.2f} ms")
    windows = {}
    for pid in sorted({e["pid"] for e in events}):
        lo, hi = start, end
        if args.step is not None:  # the rank's own step: between its own step ends
            ends = {e["args"]["step"]: e["ts"] for e in events if e.get("name") == "step end" and e["pid"] == pid}
            if args.step in ends:
                lo, hi = ends.get(args.step - 1, start), ends[args.step]
        w = exchange_window(events, pid, lo, hi)
        if w is not None:
            windows[pid] = w
    for pid, share in coverage(events, windows, None, set(windows), _OWN_PHASES).items():
        lo, hi = windows[pid]
        print(f"rank {pid}: gradex's own phases ({', '.join(_OWN_PHASES)}) cover {100 * share:.1f} % of its "
              f"exchange, {(hi - lo) / 1e3:.2f} ms from the first submission to the last completion")
    render(events, start, end, args.out, args.title or args.trace)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
