"""The time-to-accuracy part of bench/report.py: tables, target checks, plots and RESULT values of the
race's results file (bench/train/train_suite.py's train.json)."""
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GRADEX = "gradex_default"
BASELINE = "ddp"
TORCH_HOOKS = ("torch_fp16", "powersgd_r1", "powersgd_r4")
TASK_TITLES = {"mlp": "MLP 64-2048-2048-10 (4.3 M parameters)",
               "conv": "convnet with BatchNorm (2 conv + 2 FC layers, 5.3 M parameters)"}
COLORS = {"ddp": "black", "torch_fp16": "tab:gray", "powersgd_r1": "tab:brown", "powersgd_r4": "tab:pink",
          "gradex_default": "tab:red", "gradex_dgc": "tab:orange", "gradex_localsgd": "tab:blue",
          "nocomm": "tab:green", "keras_gradex_default": "tab:purple", "keras_gradex_dense": "tab:olive"}
# The Keras row (bench/train/keras_rank.py): Keras 3 + gradex's default policy vs Keras + dense gradex.
KERAS_GRADEX, KERAS_DENSE = "keras_gradex_default", "keras_gradex_dense"


def _median(method, key):
    s = (method or {}).get("summary", {}).get(key)
    return s["median"] if s else None


def _ratio(a, b):
    return a / b if a is not None and b else None


def values(train):
    """{RESULT key: value}: per task and method the median time (ttt_<task>_<method>_s) and steps
    (steps_to_target_<task>_<method>) to the target (nan when the median seed missed it), and the ratio
    of DDP's median time to gradex's default policy's (ddp_over_gradex_ttt_<task>)."""
    out = {}
    for task, entry in (train or {}).get("tasks", {}).items():
        for method, m in entry["methods"].items():
            if method == "nocomm":
                continue
            ttt, steps = _median(m, "time_to_target_s"), _median(m, "steps_to_target")
            out[f"ttt_{task}_{method}_s"] = math.nan if ttt is None else ttt
            out[f"steps_to_target_{task}_{method}"] = math.nan if steps is None else steps
        ratio = _ratio(_median(entry["methods"].get(BASELINE), "time_to_target_s"),
                       _median(entry["methods"].get(GRADEX), "time_to_target_s"))
        out[f"ddp_over_gradex_ttt_{task}"] = math.nan if ratio is None else ratio
        for method in (KERAS_GRADEX, KERAS_DENSE):
            if method in entry["methods"]:
                out[f"ms_per_step_{task}_{method}"] = _ms_per_step(entry["methods"][method])
    return out


def _ms_per_step(method):
    """Median training time per step in ms (1000 / the median of steps/s over seeds), nan if unknown."""
    sps = _median(method, "steps_per_s")
    return 1000.0 / sps if sps else math.nan


def keras_row(entry, network):
    """The Keras row's paragraph: ms/step (at the race's link rate) and time to target of Keras + gradex's
    default policy against Keras + dense gradex, with DDP's ms/step for reference."""
    methods = entry["methods"]
    gx, dense = methods.get(KERAS_GRADEX), methods.get(KERAS_DENSE)
    if not gx and not dense:
        return []
    parts = []
    for name, m in ((KERAS_GRADEX, gx), (KERAS_DENSE, dense), (BASELINE, methods.get(BASELINE))):
        if m:
            medians = [s["step_ms_median"] for s in m["seeds"] if s.get("step_ms_median") is not None]
            median = f", median step {_fmt(sorted(medians)[len(medians) // 2], 0)} ms" if medians else ""
            ttt = _spread(m, "time_to_target_s")
            parts.append(f"`{name}` {_fmt(_ms_per_step(m), 0)} ms/step{median}, time to target "
                         f"{ttt}{'' if ttt.startswith('not') else ' s'}")
    text = (f"Keras row (Keras 3 + gradex, bench/train/keras_rank.py; same data, initial weights and schedule) "
            f"at {network}: " + "; ".join(parts))
    step_ratio = _ratio(_ms_per_step(dense) if dense else None, _ms_per_step(gx) if gx else None)
    ttt_ratio = _ratio(_median(dense, "time_to_target_s"), _median(gx, "time_to_target_s"))
    if step_ratio is not None and not math.isnan(step_ratio):
        text += f". Dense ÷ default: {step_ratio:.2f}× per step"
        if ttt_ratio is not None:
            text += f", {ttt_ratio:.2f}× in time to target"
    return [text + ".", ""]


def _fmt(x, digits=1):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{digits}f}"


def _spread(method, key, digits=1, scale=1.0):
    """"median (min–max)" over seeds; a median or maximum that missed the target reads "not reached"."""
    s = method["summary"].get(key)
    if s is None:
        return "–"
    med = "not reached" if s["median"] is None else _fmt(s["median"] * scale, digits)
    if s["n"] < 2:
        return med
    hi = "∞" if s["max"] is None else _fmt(s["max"] * scale, digits)
    return f"{med} ({_fmt(s['min'] * scale, digits) if s['min'] is not None else '∞'}–{hi})"


def targets(entry):
    """[(what, required, measured, met)] of issue #10's race targets on one task; measured None when a
    method was not run or missed the target."""
    methods = entry["methods"]
    gx, ddp = methods.get(GRADEX), methods.get(BASELINE)
    if not gx or not ddp:
        return []
    gx_t, ddp_t = _median(gx, "time_to_target_s"), _median(ddp, "time_to_target_s")
    rows = [("DDP's time to target ÷ gradex default's", "≥ 3×", _ratio(ddp_t, gx_t), lambda v: v >= 3)]
    hooks = [_median(methods[h], "time_to_target_s") for h in TORCH_HOOKS if h in methods]
    if hooks:
        best = min((h for h in hooks if h is not None), default=None)
        measured = _ratio(best, gx_t) if best is not None or gx_t is None else math.inf
        rows.append(("fastest PyTorch hook's time to target ÷ gradex default's", "> 1×", measured,
                     lambda v: v > 1))
    gx_a, ddp_a = _median(gx, "final_accuracy"), _median(ddp, "final_accuracy")
    rows.append(("final accuracy, gradex default − DDP (points)", "≥ −0.5",
                 None if gx_a is None or ddp_a is None else 100 * (gx_a - ddp_a), lambda v: v >= -0.5))
    rows.append(("steps to target, gradex default ÷ DDP", "≤ 1.2×",
                 _ratio(_median(gx, "steps_to_target"), _median(ddp, "steps_to_target")), lambda v: v <= 1.2))
    return [(what, req, v, None if v is None else check(v)) for what, req, v, check in rows]


def causes(entry):
    """Where gradex default's step time goes, against the compute bound (nocomm), and the best time to
    target that bound allows: the measured cause when the time target is missed."""
    methods = entry["methods"]
    gx, nocomm, ddp = methods.get(GRADEX), methods.get("nocomm"), methods.get(BASELINE)
    gx_sps, bound = _median(gx, "steps_per_s"), _median(nocomm, "steps_per_s")
    if not gx_sps or not bound:
        return []
    step, floor = 1 / gx_sps, 1 / bound
    text = (f"`{GRADEX}` takes {step * 1e3:.0f} ms per step; the compute bound (`nocomm`) is {floor * 1e3:.0f} ms, "
            f"so {(step - floor) * 1e3:.0f} ms per step go to the exchange")
    timers = [s["gradex_stats"] for s in gx["seeds"] if s.get("gradex_stats") and s["gradex_stats"].get("steps")]
    if timers:
        per = {k: sum(t[f"{k}_seconds"] / t["steps"] for t in timers) / len(timers) * 1e3
               for k in ("compress", "communicate", "decode")}
        text += (f" (gradex's own timers per step and rank: compress {per['compress']:.0f} ms, communicate "
                 f"{per['communicate']:.0f} ms, decode {per['decode']:.0f} ms, on {len(timers)} seed(s))")
    steps, ddp_t = _median(gx, "steps_to_target"), _median(ddp, "time_to_target_s")
    if steps and ddp_t:
        best = steps * floor
        text += (f". At the compute bound its {steps:.0f} steps to target would take {best:.1f} s: "
                 f"{ddp_t / best:.1f}× sooner than DDP, the most this machine allows for that many steps")
    return [text + "."]


def tables(train, rel):
    lines = []
    m = train.get("machine", {})
    loads = [r["load_average"] for e in train["tasks"].values() for x in e["methods"].values()
             for r in x["seeds"] if r.get("load_average") is not None]
    load = f"{min(loads):.1f}–{max(loads):.1f}" if loads else _fmt(m.get("load_average_at_start"))
    lines += [f"Run: `bench/train/train_suite.py {train.get('command', '')}` ({train.get('note', train.get('mode'))}), "
              f"{m.get('date', '?')}, gradex {m.get('commit', '?')}; the race took {_fmt(train.get('race_s', 0) / 60)} "
              f"min. Load average (1 min) at the end of each run: {load} on {m.get('cores', '?')} cores: the "
              "machine was shared with other work, so step rates carry that noise; the methods of one seed run "
              "back to back (rounds), so they meet similar load.", ""]
    for task, entry in train["tasks"].items():
        methods = entry["methods"]
        nocomm = methods.get("nocomm")
        lines += [f"#### {TASK_TITLES.get(task, task)}", "",
                  f"{train['hosts']} hosts at {train['network']}; target test accuracy {entry['target']:.2f} "
                  f"(5,000 test examples); {entry['steps']} steps per seed, cosine learning rate from "
                  f"{entry['lr']:g}. Median over seeds, (min–max) when there are several.", "",
                  f"![accuracy vs time]({rel}/race_{task}_time.png) ![accuracy vs steps]({rel}/race_{task}_steps.png)"
                  f" ![time to target]({rel}/race_{task}_ttt.png)",
                  "",
                  "| method | seeds reaching target | time to target, s | steps to target | steps/s | "
                  "final accuracy | MB/host | DDP's time ÷ this |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        ddp_t = _median(methods.get(BASELINE), "time_to_target_s")
        for name, r in methods.items():
            if name == "nocomm":
                continue
            wire = r["summary"].get("wire_bytes_per_host")
            lines.append(
                f"| `{name}` | {r['summary']['reached']}/{r['summary']['seeds']} | "
                f"{_spread(r, 'time_to_target_s')} | {_spread(r, 'steps_to_target', 0)} | "
                f"{_spread(r, 'steps_per_s', 2)} | {_spread(r, 'final_accuracy', 3)} | "
                f"{_fmt(wire['median'] / 1e6) if wire else '–'} | "
                f"{_fmt(_ratio(ddp_t, _median(r, 'time_to_target_s')), 2)} |")
        if nocomm:
            wire = nocomm["summary"].get("wire_bytes_per_host")
            lines.append(f"| `nocomm` (compute bound) | – | – | – | {_spread(nocomm, 'steps_per_s', 2)} | – | "
                         f"{_fmt(wire['median'] / 1e6) if wire else '–'} | – |")
        lines.append("")
        rows = targets(entry)
        if rows:
            lines += ["Targets of issue #10 (reported, not asserted):", "",
                      "| target | required | measured | met |", "|---|---:|---:|:---:|"]
            for what, req, v, met in rows:
                verdict = "–" if met is None else ("yes" if met else "**no**")
                lines.append(f"| {what} | {req} | {_fmt(v, 2)} | {verdict} |")
            lines.append("")
            if rows[0][3] is not True and causes(entry):
                lines += ["Where the time goes: " + causes(entry)[0], ""]
        lines += keras_row(entry, train["network"])
    for failure in train.get("failures", []):
        lines += [f"Failed: {failure}", ""]
    return lines


def plots(train, folder):
    """Per task: accuracy vs training time and vs steps, every seed (thin) in its method's colour."""
    paths = []
    for task, entry in train["tasks"].items():
        for axis, index, label in (("time", 0, "training time, s (evaluations excluded)"), ("steps", 1, "step")):
            fig, ax = plt.subplots(figsize=(8, 5))
            for name, r in entry["methods"].items():
                if name == "nocomm":
                    continue
                for i, seed in enumerate(r["seeds"]):
                    curve = seed["curve"]
                    ax.plot([c[index] for c in curve], [c[2] for c in curve], color=COLORS.get(name),
                            linewidth=1.4 if i == 0 else 0.7, alpha=1.0 if i == 0 else 0.5,
                            label=name if i == 0 else None)
            ax.axhline(entry["target"], color="gray", linestyle=":", label=f"target {entry['target']:.2f}")
            ax.set_xlabel(label)
            ax.set_ylabel("test accuracy (5,000 examples)")
            ax.set_ylim(max(0.0, entry["target"] - 0.4), min(1.0, entry["target"] + 0.15))
            ax.set_title(f"{task}: {train['hosts']} hosts at {train['network']}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8, loc="lower right")
            path = folder / f"race_{task}_{axis}.png"
            fig.tight_layout()
            fig.savefig(path, dpi=100)
            plt.close(fig)
            paths.append(path)
        paths.append(_bars(train, task, entry, folder))
    return paths


def _bars(train, task, entry, folder):
    """Median time to target per method, whiskers from the fastest to the slowest seed (to the top of the
    axis when a seed missed), and the compute bound's time for DDP's median steps."""
    names = [n for n in entry["methods"] if n != "nocomm"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    top = 0.0
    for i, name in enumerate(names):
        s = entry["methods"][name]["summary"]["time_to_target_s"] or {}
        if s.get("median") is None:
            ax.text(i, 0, "not reached", rotation=90, ha="center", va="bottom", fontsize=8)
            continue
        hi = s["max"] if s.get("max") is not None else s["median"] * 1.5
        ax.bar(i, s["median"], color=COLORS.get(name))
        ax.plot([i, i], [s["min"], hi], color="black", linewidth=1)
        top = max(top, hi)
    bound, ddp_steps = _median(entry["methods"].get("nocomm"), "steps_per_s"), \
        _median(entry["methods"].get(BASELINE), "steps_to_target")
    if bound and ddp_steps:
        ax.axhline(ddp_steps / bound, color="tab:green", linestyle="--",
                   label=f"compute bound for DDP's {ddp_steps:.0f} steps")
        ax.legend(fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
    ax.set_ylabel(f"time to {entry['target']:.2f} test accuracy, s")
    ax.set_ylim(0, top * 1.1 if top else 1)
    ax.set_title(f"{task}: median over seeds (whiskers: fastest to slowest seed)")
    ax.grid(True, axis="y", alpha=0.3)
    path = folder / f"race_{task}_ttt.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
