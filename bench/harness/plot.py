"""The one plotting module of bench/: every PNG under docs/ is drawn here, in one style (Agg backend,
matplotlib imported on first use so that rank programs never load it).

    fig, ax = plot.figure()                        one axes (or rows x cols with figure(rows, cols))
    plot.lines(ax, {"ddp": [(x, y), ...], ...})     one line per series, markers at the points
    plot.finish(ax, title=..., xlabel=..., ylabel=..., logy=True)
    plot.save(fig, "docs/wan/steps_per_s_rtt.png")

COLORS gives each method the same colour in every figure.
"""
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

# Same method, same colour, in every figure of the docs.
COLORS: Dict[str, str] = {
    "ddp": "black", "torch_fp16": "tab:gray", "powersgd_r1": "tab:brown", "powersgd_r4": "tab:pink",
    "gradex_auto": "tab:red", "gradex_default": "tab:olive", "gradex_dgc": "tab:orange",
    "gradex_localsgd": "tab:blue", "nocomm": "tab:green", "keras_gradex_default": "tab:purple",
    "keras_gradex_dense": "tab:cyan",
}
Point = Tuple[float, float]


def _pyplot() -> Any:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def figure(rows: int = 1, cols: int = 1, size: Optional[Tuple[float, float]] = None) -> Tuple[Any, Any]:
    """A figure and its axes: one axes object for 1 x 1, else a rows x cols array (always 2-D)."""
    plt = _pyplot()
    size = size or (8.0 * cols if cols > 1 else 8.0, 4.5 * rows)
    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=(rows == 1 and cols == 1))
    return fig, axes


def color(name: str) -> Optional[str]:
    return COLORS.get(name)


def lines(ax: Any, series: Mapping[str, Sequence[Point]], styles: Optional[Mapping[str, str]] = None,
          marker: str = "o", **kwargs: Any) -> None:
    """One line per series, in COLORS' colour where the series has one; styles: linestyle per name."""
    for name, points in series.items():
        if not points:
            continue
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker=marker, color=COLORS.get(name), label=name,
                linestyle=(styles or {}).get(name, "-"), **kwargs)


def bars(ax: Any, values: Mapping[str, Optional[float]], hatched: Iterable[str] = (),
         missing: str = "none") -> None:
    """One bar per name (a missing value is a label on the axis instead of a bar)."""
    hatched = set(hatched)
    names = list(values)
    for i, name in enumerate(names):
        value = values[name]
        if value is None:
            ax.text(i, 0, missing, rotation=90, ha="center", va="bottom", fontsize=8)
            continue
        ax.bar(i, value, color=COLORS.get(name), hatch="//" if name in hatched else None)
    ax.set_xticks(range(len(names)), names, rotation=20 if len(names) > 4 else 0, fontsize=8)


def finish(ax: Any, title: str = "", xlabel: str = "", ylabel: str = "", logx: bool = False,
           logy: bool = False, legend: Union[bool, str] = True, grid_axis: str = "both") -> None:
    """Titles, scales, a light grid and the legend (legend: False, True or a matplotlib location)."""
    if title:
        ax.set_title(title, fontsize=10)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.grid(True, which="both", axis=grid_axis, alpha=0.3)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, **({"loc": legend} if isinstance(legend, str) else {}))


def save(fig: Any, path: Union[str, "os.PathLike[str]"], dpi: int = 100) -> str:
    """Writes the figure as PNG and closes it; returns the path."""
    plt = _pyplot()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return os.fspath(path)


def label_points(ax: Any, points: List[Point], fmt: str = "{:.2f}") -> None:
    """Writes each point's y value beside it (small figures where a reader wants the number)."""
    for x, y in points:
        ax.annotate(fmt.format(y), (x, y), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=7)
