"""The time-to-accuracy part of bench/report.py: tables, target checks, plots and RESULT values of the
race's results file (bench/train/train_suite.py's train.json: one entry per link rate, the first being the
reference; a file of the older one-rate format is read as one rate)."""
import math

from bench.harness import plot

AUTO, DEFAULT = "gradex_auto", "gradex_default"
BASELINE = "ddp"
TORCH_HOOKS = ("torch_fp16", "powersgd_r1", "powersgd_r4")
TASK_TITLES = {"short": "short horizon: gaussian mixture, MLP 32-2048-2048-20 (4.3 M parameters)",
               "mlp": "MLP 64-2048-2048-10 (4.3 M parameters)",
               "conv": "convnet with BatchNorm (2 conv + 2 FC layers, 5.3 M parameters)",
               "long": "long horizon: 50-class teacher, MLP 64-1536-1536-1536-50 (4.9 M parameters)",
               "cnn": "held out: all-convolutional net (4 conv layers, 3.0 M parameters)",
               "tfm": "held out: transformer classifier on 8-token sequences (2 layers, 1.6 M parameters)"}
OPTIMIZER_TITLES = {"sgd": "SGD momentum 0.9", "adamw": "AdamW (weight decay 0.01)"}  # train_suite.py --optimizer
COLORS = plot.COLORS
# The Keras row (bench/train/keras_rank.py): Keras 3 + gradex's default policy vs Keras + dense gradex.
KERAS_GRADEX, KERAS_DENSE = "keras_gradex_default", "keras_gradex_dense"
# The race targets: gradex auto's steps to target <= 1.2x DDP's, final accuracy within 0.3 points of
# DDP's, and its time to target >= 4x sooner than DDP's at 1 Gbit/s.
STEPS_RATIO_MAX, ACCURACY_POINTS_MIN, TTT_RATIO_MIN, TTT_RATE = 1.2, -0.3, 4.0, "1gbit"


def networks(train):
    """[(label, {"tasks": ...})] of a results file, the reference rate first."""
    if not train:
        return []
    if "networks" in train:
        ref = train.get("reference")
        return sorted(train["networks"].items(), key=lambda kv: kv[0] != ref)
    return [(train.get("network", "?"), {"tasks": train.get("tasks", {})})] if train.get("tasks") else []


def tag(label):
    """Short rate tag of a network label for RESULT keys: 1gbit -> 1g, 100mbit -> 100m, loopback."""
    for suffix, short in (("gbit", "g"), ("mbit", "m"), ("kbit", "k")):
        if label.endswith(suffix):
            return label[:-len(suffix)] + short
    return label


def subject(methods):
    """The gradex method the race's targets judge: gradex_auto, or gradex_default in older results."""
    return AUTO if AUTO in methods else DEFAULT


def _median(method, key):
    s = (method or {}).get("summary", {}).get(key)
    return s["median"] if s else None


def _ratio(a, b):
    return a / b if a is not None and b else None


def time_to_target(methods, name, reference_methods):
    """(median seconds to target, derived?) of one method at one rate: measured where it trained in full;
    for a rate-only run (same arithmetic as at the reference rate), its median steps to target at the
    reference rate divided by its steps per second here."""
    m = methods.get(name)
    if not m:
        return None, False
    if not m.get("rate_only"):
        return _median(m, "time_to_target_s"), False
    steps, sps = _median((reference_methods or {}).get(name), "steps_to_target"), _median(m, "steps_per_s")
    return (steps / sps if steps and sps else None), True


def steps_to_target(methods, name, reference_methods):
    m = methods.get(name)
    if m and m.get("rate_only"):
        return _median((reference_methods or {}).get(name), "steps_to_target")
    return _median(m, "steps_to_target")


def final_accuracy(methods, name, reference_methods):
    m = methods.get(name)
    if m and m.get("rate_only"):
        return _median((reference_methods or {}).get(name), "final_accuracy")
    return _median(m, "final_accuracy")


def values(train):
    """{RESULT key: value}. At the reference rate, per task and method: the median time
    (ttt_<task>_<method>_s) and steps (steps_to_target_<task>_<method>) to the target (nan when the median
    seed missed it), DDP's median time over gradex's (ddp_over_gradex_ttt_<task>: gradex_auto, or
    gradex_default in older results), and the targets: steps_ratio_<task> (gradex ÷ DDP),
    accuracy_diff_<task> (gradex − DDP final accuracy, points). At every other rate the same keys with the
    rate's tag after the task (ttt_<task>_<tag>_<method>_s, ddp_over_gradex_ttt_<task>_<tag>, ...); DDP's
    time there is derived when it ran for its rate only (see time_to_target)."""
    out = {}
    nets = networks(train)
    reference = nets[0][1]["tasks"] if nets else {}
    for index, (label, net) in enumerate(nets):
        suffix = "" if index == 0 else "_" + tag(label)
        for task, entry in net["tasks"].items():
            methods, ref = entry["methods"], reference.get(task, {}).get("methods", {})
            for method in methods:
                if method == "nocomm":
                    continue
                ttt, _ = time_to_target(methods, method, ref)
                steps = steps_to_target(methods, method, ref)
                out[f"ttt_{task}{suffix}_{method}_s"] = math.nan if ttt is None else ttt
                out[f"steps_to_target_{task}{suffix}_{method}"] = math.nan if steps is None else steps
            gx = subject(methods)
            ratio = _ratio(time_to_target(methods, BASELINE, ref)[0], time_to_target(methods, gx, ref)[0])
            out[f"ddp_over_gradex_ttt_{task}{suffix}"] = math.nan if ratio is None else ratio
            if BASELINE in methods and gx in methods:
                steps = _ratio(steps_to_target(methods, gx, ref), steps_to_target(methods, BASELINE, ref))
                out[f"steps_ratio_{task}{suffix}"] = math.nan if steps is None else steps
                a, b = final_accuracy(methods, gx, ref), final_accuracy(methods, BASELINE, ref)
                out[f"accuracy_diff_{task}{suffix}"] = math.nan if a is None or b is None else 100 * (a - b)
            for method in (KERAS_GRADEX, KERAS_DENSE):
                if method in methods:
                    out[f"ms_per_step_{task}{suffix}_{method}"] = _ms_per_step(methods[method])
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


def targets(entry, label="1gbit", reference_entry=None):
    """[(what, required, measured, met)] of the race targets on one task at one rate; measured
    None when a method was not run or missed the target. The time target applies at 1 Gbit/s."""
    methods = entry["methods"]
    ref = (reference_entry or entry)["methods"]
    gx = subject(methods)
    if gx not in methods or BASELINE not in methods:
        return []
    gx_t, _ = time_to_target(methods, gx, ref)
    ddp_t, derived = time_to_target(methods, BASELINE, ref)
    rows = [(f"DDP's time to target ÷ {gx}'s{' (DDP derived)' if derived else ''}",
             f"≥ {TTT_RATIO_MIN:g}×" if label == TTT_RATE else "reported", _ratio(ddp_t, gx_t),
             (lambda v: v >= TTT_RATIO_MIN) if label == TTT_RATE else None)]
    hooks = [time_to_target(methods, h, ref)[0] for h in TORCH_HOOKS if h in methods]
    if hooks:
        best = min((h for h in hooks if h is not None), default=None)
        measured = _ratio(best, gx_t) if best is not None or gx_t is None else math.inf
        rows.append((f"fastest PyTorch hook's time to target ÷ {gx}'s", "> 1×", measured, lambda v: v > 1))
    gx_a, ddp_a = final_accuracy(methods, gx, ref), final_accuracy(methods, BASELINE, ref)
    rows.append((f"final accuracy, {gx} − DDP (points)", f"≥ {ACCURACY_POINTS_MIN:g}",
                 None if gx_a is None or ddp_a is None else 100 * (gx_a - ddp_a),
                 lambda v: v >= ACCURACY_POINTS_MIN))
    rows.append((f"steps to target, {gx} ÷ DDP", f"≤ {STEPS_RATIO_MAX:g}×",
                 _ratio(steps_to_target(methods, gx, ref), steps_to_target(methods, BASELINE, ref)),
                 lambda v: v <= STEPS_RATIO_MAX))
    return [(what, req, v, None if v is None or check is None else check(v)) for what, req, v, check in rows]


def causes(entry):
    """Where gradex's step time goes, against the compute bound (nocomm), and the best time to target that
    bound allows: the measured cause when the time target is missed."""
    methods = entry["methods"]
    name = subject(methods)
    gx, nocomm, ddp = methods.get(name), methods.get("nocomm"), methods.get(BASELINE)
    gx_sps, bound = _median(gx, "steps_per_s"), _median(nocomm, "steps_per_s")
    if not gx_sps or not bound:
        return []
    step, floor = 1 / gx_sps, 1 / bound
    text = (f"`{name}` takes {step * 1e3:.0f} ms per step; the compute bound (`nocomm`) is {floor * 1e3:.0f} ms, "
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
    nets = networks(train)
    loads = [r["load_average"] for _, net in nets for e in net["tasks"].values() for x in e["methods"].values()
             for r in x["seeds"] if r.get("load_average") is not None]
    load = f"{min(loads):.1f}–{max(loads):.1f}" if loads else _fmt(m.get("load_average_at_start"))
    lines += [f"Run: `bench/train/train_suite.py {train.get('command', '')}` ({train.get('note', train.get('mode'))}), "
              f"{m.get('date', '?')}, gradex {m.get('commit', '?')}; the race took {_fmt(train.get('race_s', 0) / 60)} "
              f"min. Load average (1 min) at the end of each run: {load} on {m.get('cores', '?')} cores: the "
              "machine was shared with other work, so step rates carry that noise; the methods of one seed run "
              "back to back (rounds), so they meet similar load.", ""]
    policies = {r.get("policy") for _, net in nets for e in net["tasks"].values()
                for x in e["methods"].values() for r in x["seeds"] if r.get("policy")}
    if AUTO in {n for _, net in nets for e in net["tasks"].values() for n in e["methods"]} and \
            "auto" not in policies:
        lines += ["`gradex_auto` ran without GRADEX_POLICY (this gradex build does not declare it): it is "
                  "gradex's default policy here, not the cost model's choice.", ""]
    reference = nets[0][1]["tasks"] if nets else {}
    for index, (label, net) in enumerate(nets):
        for task, entry in net["tasks"].items():
            lines += _task_lines(train, rel, label, task, entry, reference.get(task), index == 0)
    for failure in train.get("failures", []):
        lines += [f"Failed: {failure}", ""]
    return lines


def _task_lines(train, rel, label, task, entry, reference_entry, is_reference):
    methods = entry["methods"]
    ref = (reference_entry or entry)["methods"]
    nocomm = methods.get("nocomm")
    plot = f"race_{task}" if is_reference else f"race_{task}_{tag(label)}"
    lines = [f"#### {TASK_TITLES.get(task, task)}, {label}", "",
             f"{train['hosts']} hosts at {label}; target test accuracy {entry['target']:.2f} "
             f"(5,000 test examples); {entry['steps']} steps per seed, "
             f"{OPTIMIZER_TITLES[entry.get('optimizer', 'sgd')]}, cosine learning rate from {entry['lr']:g}. "
             "Median over seeds, (min–max) when there are several."
             + ("" if is_reference else " Rows marked *derived* ran only to time their steps here: their "
                "arithmetic does not depend on the link, so their steps to target and accuracy are those of "
                "the reference rate, and their time to target is those steps ÷ their steps/s here."), "",
             f"![accuracy vs time]({rel}/{plot}_time.png) ![accuracy vs steps]({rel}/{plot}_steps.png)"
             f" ![time to target]({rel}/{plot}_ttt.png)", "",
             "| method | seeds reaching target | time to target, s | steps to target | steps/s | "
             "final accuracy | MB/host | DDP's time ÷ this |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    ddp_t, _ = time_to_target(methods, BASELINE, ref)
    for name, r in methods.items():
        if name == "nocomm":
            continue
        wire = r["summary"].get("wire_bytes_per_host")
        ttt, derived = time_to_target(methods, name, ref)
        if derived:
            lines.append(f"| `{name}` (*derived*) | – | {_fmt(ttt)} | {_fmt(steps_to_target(methods, name, ref), 0)} | "
                         f"{_spread(r, 'steps_per_s', 2)} | {_fmt(final_accuracy(methods, name, ref), 3)} | – | "
                         f"{_fmt(_ratio(ddp_t, ttt), 2)} |")
            continue
        lines.append(
            f"| `{name}` | {r['summary']['reached']}/{r['summary']['seeds']} | "
            f"{_spread(r, 'time_to_target_s')} | {_spread(r, 'steps_to_target', 0)} | "
            f"{_spread(r, 'steps_per_s', 2)} | {_spread(r, 'final_accuracy', 3)} | "
            f"{_fmt(wire['median'] / 1e6) if wire else '–'} | {_fmt(_ratio(ddp_t, ttt), 2)} |")
    if nocomm:
        wire = nocomm["summary"].get("wire_bytes_per_host")
        lines.append(f"| `nocomm` (compute bound) | – | – | – | {_spread(nocomm, 'steps_per_s', 2)} | – | "
                     f"{_fmt(wire['median'] / 1e6) if wire else '–'} | – |")
    lines.append("")
    rows = targets(entry, label, reference_entry)
    if rows:
        lines += ["Targets (reported, not asserted):", "",
                  "| target | required | measured | met |", "|---|---:|---:|:---:|"]
        for what, req, v, met in rows:
            verdict = "–" if met is None else ("yes" if met else "**no**")
            lines.append(f"| {what} | {req} | {_fmt(v, 2)} | {verdict} |")
        lines.append("")
        if rows[0][3] is False and causes(entry):
            lines += ["Where the time goes: " + causes(entry)[0], ""]
    lines += keras_row(entry, label)
    return lines


def plots(train, folder):
    """Per rate and task: accuracy vs training time and vs steps, every seed (thin) in its method's colour,
    and the time-to-target bars."""
    paths = []
    for index, (label, net) in enumerate(networks(train)):
        for task, entry in net["tasks"].items():
            stem = f"race_{task}" if index == 0 else f"race_{task}_{tag(label)}"
            for axis, column, xlabel in (("time", 0, "training time, s (evaluations excluded)"), ("steps", 1, "step")):
                fig, ax = plot.figure(size=(8, 5))
                for name, r in entry["methods"].items():
                    if name == "nocomm" or r.get("rate_only"):
                        continue
                    for i, seed in enumerate(r["seeds"]):
                        curve = seed["curve"]
                        ax.plot([c[column] for c in curve], [c[2] for c in curve], color=COLORS.get(name),
                                linewidth=1.4 if i == 0 else 0.7, alpha=1.0 if i == 0 else 0.5,
                                label=name if i == 0 else None)
                ax.axhline(entry["target"], color="gray", linestyle=":", label=f"target {entry['target']:.2f}")
                ax.set_xlabel(xlabel)
                ax.set_ylabel("test accuracy (5,000 examples)")
                ax.set_ylim(max(0.0, entry["target"] - 0.4), min(1.0, entry["target"] + 0.15))
                ax.set_title(f"{task}: {train['hosts']} hosts at {label}")
                plot.finish(ax, legend="lower right")
                path = folder / f"{stem}_{axis}.png"
                plot.save(fig, path)
                paths.append(path)
            reference = networks(train)[0][1]["tasks"].get(task)
            paths.append(_bars(task, label, entry, reference, folder / f"{stem}_ttt.png"))
    return paths


def _bars(task, label, entry, reference_entry, path):
    """Median time to target per method (derived ones hatched), whiskers from the fastest to the slowest
    seed (to the top of the axis when a seed missed), and the compute bound's time for DDP's median steps."""
    methods, ref = entry["methods"], (reference_entry or entry)["methods"]
    names = [n for n in methods if n != "nocomm"]
    fig, ax = plot.figure()
    top = 0.0
    for i, name in enumerate(names):
        ttt, derived = time_to_target(methods, name, ref)
        if ttt is None:
            ax.text(i, 0, "not reached", rotation=90, ha="center", va="bottom", fontsize=8)
            continue
        ax.bar(i, ttt, color=COLORS.get(name), hatch="//" if derived else None)
        s = methods[name]["summary"].get("time_to_target_s") or {}
        hi = ttt
        if not derived and s.get("min") is not None:
            hi = s["max"] if s.get("max") is not None else ttt * 1.5
            ax.plot([i, i], [s["min"], hi], color="black", linewidth=1)
        top = max(top, hi)
    bound = _median(ref.get("nocomm"), "steps_per_s")
    ddp_steps = steps_to_target(methods, BASELINE, ref)
    if bound and ddp_steps:
        ax.axhline(ddp_steps / bound, color="tab:green", linestyle="--",
                   label=f"compute bound for DDP's {ddp_steps:.0f} steps")
        ax.legend(fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
    ax.set_ylabel(f"time to {entry['target']:.2f} test accuracy, s")
    ax.set_ylim(0, top * 1.1 if top else 1)
    ax.set_title(f"{task} at {label}: median over seeds (hatched: derived)")
    plot.finish(ax, legend=False, grid_axis="y")
    plot.save(fig, path)
    return path
