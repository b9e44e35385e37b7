"""Tests of bench/run's pieces that need no benchmark run: the emulated cluster's lifecycle (as root,
where namespaces exist; skipped otherwise with the reason), the gradient recipe of the baselines,
the per-mode byte metering, the report's splicing and RESULT line, and the training race's harness
(its summaries and targets, and a smoke run of a few steps with tiny models on the loopback)."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_PATHS = [str(ROOT / sub) for sub in ("bench", "bench/cluster", "bench/baselines", "bench/train")]
_before = set(sys.modules)
sys.path[:0] = _PATHS
try:
    import report  # noqa: E402
    from gradients import GradientGenerator  # noqa: E402
    from model_profile import Profile, load_profile  # noqa: E402
    import race_report  # noqa: E402
    import task as race_task  # noqa: E402
    import train_suite  # noqa: E402
    from ranks import PROGRESS, WireMeter, parse_result  # noqa: E402
finally:
    # The bench scripts' modules have plain names (ranks, network, report): keep them out of the
    # other test modules' way once imported here.
    del sys.path[:len(_PATHS)]
    for _name in set(sys.modules) - _before:
        if getattr(sys.modules[_name], "__file__", "") and any(
                str(sys.modules[_name].__file__).startswith(p) for p in _PATHS):
            del sys.modules[_name]


def test_cluster_lifecycle():
    script = ROOT / "tests" / "bench" / "cluster_test.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120)
    if done.returncode == 77:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout + done.stderr
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(line.startswith("gx-") for line in listed.splitlines())


def test_profiles_match_their_headers():
    profile = load_profile("resnet50")
    assert len(profile.tensors) == 161 and profile.total_numel == 25557032


def test_gradients_have_the_recipe_statistics():
    profile = Profile("toy", [("w", (256, 1024)), ("b", (4096,))])
    gens = [GradientGenerator(profile, r) for r in range(2)]
    a, b, again = (np.empty(profile.total_numel, np.float32) for _ in range(3))
    gens[0].generate(3, a)
    gens[1].generate(3, b)
    gens[0].generate(3, again)
    assert np.array_equal(a, again)  # deterministic per (seed, rank, step)
    w0, w1 = a[:256 * 1024], b[:256 * 1024]
    assert 0.8 / 32 < w0.std() < 1.25 / 32  # 1/sqrt(fan_in = 1024), jittered
    assert 0.2 < np.corrcoef(w0, w1)[0, 1] < 0.4  # 30 % of the variance shared across ranks
    z = (w0 - w0.mean()) / w0.std()
    assert (z ** 4).mean() > 4  # heavier tails than a gaussian (kurtosis 3)
    other = np.empty(profile.total_numel, np.float32)
    gens[0].generate(4, other)
    assert abs(np.corrcoef(a, other)[0, 1]) < 0.1  # a fresh gradient every step


class FakeNetwork:
    counted = True

    def __init__(self):
        self.total = 0

    def bytes_sent(self):
        return self.total


def test_wire_meter_counts_only_measured_steps():
    net = FakeNetwork()
    meter = WireMeter(net, warmup=2, steps=3, ranks=4)
    for mode, per_step in (("dense", 1200), ("sparse", 12)):
        for step in range(1, 6):
            meter.on_progress(mode, step)
            net.total += per_step if step > 2 else 10 * per_step  # warm-up steps cost more
    meter.finish()
    assert meter.per_step == {"dense": 300, "sparse": 3}


def test_progress_and_result_parsing():
    assert PROGRESS.search("\r[exchange] dgc999 step 4/13   ").groups() == ("exchange", "dgc999", "4", "13")
    assert parse_result("table\nRESULT a=1 b_step_ms=2.5\n") == {"a": "1", "b_step_ms": "2.5"}


def test_report_keeps_other_sections_and_prints_targets(tmp_path):
    exchange = {"hosts": 4, "steps": 10, "warmup": 3, "exchange": {"resnet50": {
        "1gbit": {"gloo_fp32": {"step_ms": 1300.0, "tool": "torch"},
                  "powersgd_r1": {"step_ms": 300.0, "tool": "torch"},
                  "dgc999": {"step_ms": 50.0, "cpu_ms": 40.0, "wire_bytes": 4e5, "tool": "gradex"}}}}}
    (tmp_path / "exchange.json").write_text(json.dumps(exchange))
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Compression microbenchmarks\n\nkept\n\n"
                   f"{report.BEGIN}\nold\n{report.END}\n\n## After\n\nalso kept\n")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "report.py"), "--results", str(tmp_path),
                           "--report", str(doc)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr
    text = doc.read_text()
    assert "kept" in text and "also kept" in text and "\nold\n" not in text
    assert text.count(report.BEGIN) == 1 and (tmp_path / "step_time_resnet50.png").exists()
    result = done.stdout.strip().splitlines()[-1]
    assert result.startswith("RESULT gloo_over_dgc999_1g=26 powersgd_over_dgc999_1g=6 ")
    assert "dense_over_auto_loopback=nan" in result


def _seed(seed, ttt, steps, accuracy, steps_per_s=10.0, wire=1e6):
    return {"seed": seed, "time_to_target_s": ttt, "steps_to_target": steps, "final_accuracy": accuracy,
            "steps_per_s": steps_per_s, "wire_bytes_per_host": wire, "curve": [(0.0, 0, 0.1), (1.0, 10, accuracy)]}


def test_race_summary_counts_a_missed_target_as_late():
    summary = train_suite.summarize([_seed(0, 10.0, 100, 0.8), _seed(1, None, None, 0.7), _seed(2, 12.0, 120, 0.9)])
    assert summary["reached"] == 2 and summary["seeds"] == 3
    assert summary["time_to_target_s"] == {"median": 12.0, "min": 10.0, "max": None, "n": 3}
    assert summary["final_accuracy"]["median"] == 0.8
    missed = train_suite.summarize([_seed(0, None, None, 0.5), _seed(1, None, None, 0.6), _seed(2, 5.0, 50, 0.9)])
    assert missed["time_to_target_s"]["median"] is None and missed["steps_to_target"]["min"] == 50


def test_race_plan_follows_the_mode():
    class Args:
        mode, tasks, methods, seeds = "quick", "", "", ""
    plan = train_suite.plan(Args)
    assert plan[:len(train_suite.METHODS)] == [("mlp", m, 0) for m in train_suite.METHODS]  # round 0 first
    assert plan[len(train_suite.METHODS):] == [("mlp", "ddp", 1), ("mlp", "gradex_default", 1),
                                               ("mlp", "ddp", 2), ("mlp", "gradex_default", 2)]
    Args.mode, Args.seeds = "full", "4,5"
    plan = train_suite.plan(Args)
    keras = [m for m in train_suite.METHODS if m.startswith("keras_")]  # the Keras row: MLP task only
    assert {t for t, _, _ in plan} == {"mlp", "conv"} and len(plan) == 2 * (2 * len(train_suite.METHODS) - len(keras))
    assert not any(t == "conv" and m in keras for t, m, _ in plan)
    assert [s for _, _, s in plan] == sorted(s for _, _, s in plan)


def test_race_targets_and_result_values():
    def method(ttt, steps, accuracy):
        records = [_seed(s, ttt, steps, accuracy) for s in range(3)]
        return {"seeds": records, "summary": train_suite.summarize(records)}
    train = {"tasks": {"mlp": {"target": 0.7, "steps": 250, "lr": 0.05, "methods": {
        "ddp": method(60.0, 180, 0.750), "torch_fp16": method(30.0, 180, 0.751),
        "gradex_default": method(15.0, 200, 0.742), "nocomm": method(None, None, 0.5)}}}}
    rows = {what: (v, met) for what, _, v, met in race_report.targets(train["tasks"]["mlp"])}
    assert rows["DDP's time to target ÷ gradex default's"] == (4.0, True)
    assert rows["fastest PyTorch hook's time to target ÷ gradex default's"] == (2.0, True)
    accuracy, met = rows["final accuracy, gradex default − DDP (points)"]
    assert abs(accuracy - (-0.8)) < 1e-9 and met is False
    steps, met = rows["steps to target, gradex default ÷ DDP"]
    assert abs(steps - 200 / 180) < 1e-9 and met is True
    values = race_report.values(train)
    assert values["ttt_mlp_ddp_s"] == 60.0 and values["steps_to_target_mlp_gradex_default"] == 200
    assert values["ddp_over_gradex_ttt_mlp"] == 4.0 and "ttt_mlp_nocomm_s" not in values


def test_race_task_is_deterministic_and_learnable_sized():
    x_train, y_train, x_test, y_test = race_task.load("mlp")
    again = race_task.load("mlp")
    assert len(x_test) >= 5000 and torch_equal(x_test, again[2]) and torch_equal(y_train, again[1])
    counts = np.bincount(y_test.numpy(), minlength=race_task.CLASSES)
    assert counts.min() > 0.03 * len(y_test)  # every class present: accuracy is not one class's share
    conv = race_task.make_model("conv", seed=0)
    assert any(isinstance(m, race_task.torch.nn.BatchNorm2d) for m in conv.modules())
    assert sum(p.numel() for p in conv.parameters()) > 4_000_000


def torch_equal(a, b):
    return bool((a == b).all())


def test_race_smoke_run_and_report(tmp_path):
    """The whole harness at toy size: 2 ranks on the loopback, a few steps of a 64-wide MLP with DDP,
    then the report's race section and RESULT keys."""
    results = tmp_path / "results"
    results.mkdir()
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "train" / "train_suite.py"), "--out", str(results / "train.json"),
         "--root-loopback", "--hosts", "2", "--mode", "smoke", "--methods", "ddp",
         "--log-dir", str(tmp_path / "logs")], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    train = json.loads((results / "train.json").read_text())
    (record,) = train["tasks"]["mlp"]["methods"]["ddp"]["seeds"]
    assert record["steps"] == 6 and [c[1] for c in record["curve"]] == [0, 3, 6]
    assert all(0.0 <= c[2] <= 1.0 for c in record["curve"]) and record["train_s"] > 0
    assert record["wire_bytes_per_host"] is None  # the root loopback has no counters of its own
    doc = tmp_path / "benchmarks.md"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "report.py"), "--results", str(results),
                           "--report", str(doc)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr
    assert "### Time to accuracy" in doc.read_text() and (results / "race_mlp_time.png").exists()
    result = done.stdout.strip().splitlines()[-1]
    assert "ttt_mlp_ddp_s=" in result and "steps_to_target_mlp_ddp=" in result


def test_race_keras_row_smoke_run_and_report(tmp_path):
    """The Keras row at toy size: both Keras methods (bench/train/keras_rank.py) on 2 ranks on the loopback
    through train_suite.py, each rank a subprocess; then the report's Keras paragraph and RESULT keys."""
    pytest.importorskip("tensorflow")
    pytest.importorskip("keras")
    results = tmp_path / "results"
    results.mkdir()
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "train" / "train_suite.py"), "--out", str(results / "train.json"),
         "--root-loopback", "--hosts", "2", "--mode", "smoke", "--methods", "keras_gradex_default,keras_gradex_dense",
         "--log-dir", str(tmp_path / "logs")], capture_output=True, text=True, timeout=300)
    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("*")) if p.is_file())
    assert done.returncode == 0, done.stdout + done.stderr + logs
    train = json.loads((results / "train.json").read_text())
    assert train["failures"] == []
    methods = train["tasks"]["mlp"]["methods"]
    for name in ("keras_gradex_default", "keras_gradex_dense"):
        (record,) = methods[name]["seeds"]
        assert record["steps"] == 6 and [c[1] for c in record["curve"]] == [0, 3, 6]
        assert all(0.0 <= c[2] <= 1.0 for c in record["curve"]) and record["train_s"] > 0
        assert record["steps_per_s"] > 0 and record["step_ms_median"] > 0
        assert record["wire_bytes_per_host"] is None  # the root loopback has no counters of its own
        assert record["gradex_stats"]["steps"] == 6  # every step went through gradex's engine
    # The same initial weights as task.make_model: the accuracy before training is the PyTorch student's.
    x_test, y_test = race_task.load("mlp")[2:]
    before = race_task.correct(race_task.make_model("mlp", 0, 64), x_test, y_test) / len(x_test)
    assert all(abs(methods[n]["seeds"][0]["curve"][0][2] - before) <= 2 / len(x_test) for n in methods)
    doc = tmp_path / "benchmarks.md"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "report.py"), "--results", str(results),
                           "--report", str(doc)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr
    text = doc.read_text()
    assert "Keras row" in text and "`keras_gradex_default`" in text and "ms/step" in text
    result = done.stdout.strip().splitlines()[-1]
    assert "ms_per_step_mlp_keras_gradex_default=" in result and "ttt_mlp_keras_gradex_dense_s=" in result
