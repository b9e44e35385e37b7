"""The figures of the benchmark pages, drawn from stored result files (nothing is run):

    python -m bench.experiments.docs_figures auto docs/benchmarks/exchange.json docs/benchmarks/auto_over_best_fixed.png
    python -m bench.experiments.docs_figures race docs/wan/train_all_tasks.json docs/wan/race_curves.png
    python -m bench.experiments.docs_figures rtt docs/wan/rtt_sweep.json docs/wan/rtt_steps_per_s.png \\
        [--methods ddp,torch_fp16,gradex_default]

auto: the auto policy's step time ÷ the best fixed mode's, per link rate and model, with the 1.05 target.
race: test accuracy against training time, one panel per task, every method's seeds (bench/train/ results).
rtt: steady steps/s against the round trip (bench/experiments/wan_rtt.py's figure, redrawn with --methods).
"""
import argparse
import math
import sys
from typing import Any, Dict, List, Optional

from bench import report
from bench.experiments import wan_rtt
from bench.harness import plot, results
from bench.train import race_report


def auto_figure(data: Dict[str, Any], path: str) -> str:
    fig, ax = plot.figure()
    models = list(data["exchange"])
    width = 0.8 / max(1, len(models))
    labels: List[str] = []
    top = report.AUTO_SLACK
    for index, model in enumerate(models):
        by_rate = sorted(data["exchange"][model].items(), key=lambda kv: report.rate_gbit(kv[0]) or math.inf)
        labels = labels or [label for label, _ in by_rate]
        for i, (label, modes) in enumerate(by_rate):
            best, auto = report.best_fixed(modes), report.pick(modes, report.AUTO)
            if not best or not auto:
                continue
            ratio = modes[auto]["step_ms"] / modes[best]["step_ms"]
            top = max(top, ratio)
            x = i + (index - (len(models) - 1) / 2) * width
            ax.bar(x, ratio, width=width * 0.9, color="tab:red" if ratio > report.AUTO_SLACK else "tab:olive",
                   label=model if i == 0 and len(models) > 1 else None)
            ax.annotate(f"{ratio:.2f}\n({best})", (x, ratio), textcoords="offset points", xytext=(0, 3),
                        ha="center", fontsize=7)
    ax.axhline(report.AUTO_SLACK, color="gray", linestyle=":", label=f"target ≤ {report.AUTO_SLACK}")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylim(0, top * 1.3)  # room for the labels above the bars and the target line
    plot.finish(ax, title=f"auto policy ÷ best fixed mode, step time, {data.get('hosts', 4)} hosts "
                f"({', '.join(models)})", xlabel="link rate per host", ylabel="auto ÷ best fixed (lower is better)",
                grid_axis="y")
    return plot.save(fig, path)


def race_figure(data: Dict[str, Any], path: str, methods: Optional[List[str]] = None) -> str:
    nets = race_report.networks(data)
    panels = [(label, task, entry) for label, net in nets[:1] for task, entry in net["tasks"].items()]
    cols = 2 if len(panels) > 1 else 1
    rows = -(-len(panels) // cols)
    fig, axes = plot.figure(rows, cols, size=(6.0 * cols, 3.6 * rows))
    flat = [axes] if rows == cols == 1 else [a for row in axes for a in row]
    for ax, (label, task, entry) in zip(flat, panels):
        for name, method in entry["methods"].items():
            if name == "nocomm" or method.get("rate_only") or (methods and name not in methods):
                continue
            for i, seed in enumerate(method["seeds"]):
                curve = seed["curve"]
                ax.plot([c[0] for c in curve], [c[2] for c in curve], color=plot.color(name),
                        linewidth=1.4 if i == 0 else 0.7, alpha=1.0 if i == 0 else 0.5, label=name if i == 0 else None)
        ax.axhline(entry["target"], color="gray", linestyle=":", label=f"target {entry['target']:.2f}")
        ax.set_ylim(max(0.0, entry["target"] - 0.4), min(1.0, entry["target"] + 0.15))
        plot.finish(ax, title=f"{task} at {label}", xlabel="training time, s", ylabel="test accuracy",
                    legend="lower right")
    for ax in flat[len(panels):]:
        ax.set_visible(False)
    return plot.save(fig, path)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=("auto", "race", "rtt"))
    p.add_argument("results")
    p.add_argument("png")
    p.add_argument("--methods", default="", help="the methods drawn (default: every one in the file)")
    args = p.parse_args(argv)
    data = results.load(args.results)
    methods = args.methods.split(",") if args.methods else None
    if args.kind == "auto":
        print(auto_figure(data, args.png))
    elif args.kind == "race":
        print(race_figure(data, args.png, methods))
    else:
        print(wan_rtt.draw(data, methods or data["methods"], args.png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
