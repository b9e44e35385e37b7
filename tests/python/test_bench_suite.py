"""Tests of bench/run's pieces that need no benchmark run: the emulated cluster's lifecycle (as root,
where namespaces exist; skipped otherwise with the reason), the gradient recipe of the baselines,
the per-mode byte metering, and the report's splicing and RESULT line."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_PATHS = [str(ROOT / sub) for sub in ("bench", "bench/cluster", "bench/baselines")]
_before = set(sys.modules)
sys.path[:0] = _PATHS
try:
    import report  # noqa: E402
    from gradients import GradientGenerator  # noqa: E402
    from model_profile import Profile, load_profile  # noqa: E402
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
