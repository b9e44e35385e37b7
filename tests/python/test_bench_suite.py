"""Tests of bench/run's pieces that need no benchmark run: the emulated cluster's lifecycle (as root,
where namespaces exist; skipped otherwise with the reason; GX_CLUSTER_NAME/GX_CLUSTER_SUBNET pick the
cluster's names), the gradient recipe of the baselines, the per-mode and per-host byte metering, the
exchange suite's runs (auto against the fixed modes, per-rate steps), the report's splicing and RESULT
keys (auto_over_best_fixed_<rate>), the hierarchical-exchange stage's layouts and ratios, and
the training race's harness (its tasks, plan over rates, summaries and targets, and smoke runs of a few
steps with tiny models on the loopback)."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# bench is a package run from the repository root (python -m bench...; pyproject's pytest pythonpath).
from bench import report  # noqa: E402
from bench.baselines.gradients import GradientGenerator  # noqa: E402
from bench.baselines.model_profile import Profile, load_profile  # noqa: E402
from bench.cluster import exchange_suite, gradex_vars, hierarchy_report, hierarchy_suite, wan_suite  # noqa: E402
from bench.harness.launcher import PROGRESS, WireMeter, parse_result, run_ranks  # noqa: E402
from bench.harness.network import Cluster, RootLoopback  # noqa: E402
from bench.train import race_report, train_suite  # noqa: E402
from bench.train import task as race_task  # noqa: E402


def test_cluster_lifecycle():
    script = ROOT / "tests" / "bench" / "cluster_test.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120)
    if done.returncode == 77:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout + done.stderr
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    name = os.environ.get("GX_CLUSTER_NAME", "gx")
    assert not any(line.startswith(name + "-") for line in listed.splitlines())


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


class FakeHosts(FakeNetwork):
    def __init__(self, hosts):
        super().__init__()
        self.links = [[0, 0] for _ in range(hosts)]

    def host_bytes(self):
        return [tuple(link) for link in self.links]


def test_wire_meter_counts_each_hosts_link():
    net = FakeHosts(2)
    meter = WireMeter(net, warmup=1, steps=2, ranks=4)
    for step in range(1, 4):
        meter.on_progress("auto", step)
        net.links[0][0] += 100 if step > 1 else 1000  # host 0 sends, host 1 receives
        net.links[1][1] += 100 if step > 1 else 1000
    meter.on_progress("sentinel", 1)
    net.links[0][0] += 10 ** 6  # after the mode: not charged to it
    meter.finish()
    assert meter.per_host["auto"] == [(100, 0), (0, 100)]
    assert meter.per_step["auto"] == 200 / 2 / 4


class FakeWan(FakeNetwork):
    def __init__(self):
        super().__init__()
        self.wan = 0

    def wan_bytes(self):
        return self.wan


def test_wire_meter_counts_wan_bytes_over_whole_measured_steps():
    net = FakeWan()
    meter = WireMeter(net, warmup=1, steps=3, ranks=4)
    for step in range(1, 5):
        meter.on_progress("engine16", step)
        net.wan += 50 if step > 1 else 5000  # the warm-up step costs more
    net.wan += 7000  # after the last step: results, shutdown, the next engine's start-up
    meter.on_progress("sentinel", 1)
    meter.finish()
    assert meter.per_wan["engine16"] == 50  # steps 2..4: two whole steps between their starts


def test_region_comparison_ratios_and_layout_check():
    rounds = [{"flat": {"modes": {"engine16": {"step_ms": 900.0, "wan_bytes": 150.0}}}, "region": {
                  "modes": {"engine16": {"step_ms": 600.0, "wan_bytes": 100.0}}}},
              {"flat": {"modes": {"engine16": {"step_ms": 1000.0, "wan_bytes": 150.0}}}},  # no region run
              {"flat": {"modes": {"engine16": {"step_ms": 800.0, "wan_bytes": 160.0}}}, "region": {
                  "modes": {"engine16": {"step_ms": 800.0, "wan_bytes": 80.0}}}}]
    summary = wan_suite.region_summary(rounds)
    assert summary["engine16"]["steps_per_s_ratio"] == [1.5, 1.0]
    assert summary["engine16"]["wan_bytes_ratio"] == [100 / 150, 0.5]
    targets = wan_suite.region_targets(summary, "engine16")
    assert targets["region_over_flat_steps_per_s"] == 1.25
    assert abs(targets["region_over_flat_wan_bytes"] - (100 / 150 + 0.5) / 2) < 1e-12
    assert wan_suite.region_targets(summary, "dgc999")["region_over_flat_wan_bytes"] is None
    assert wan_suite.layout_ok("region", ["hierarchical over regions (measured, nearest 50.1 ms apart): "
                                          "rank -> region 0 0 1 1"])
    assert not wan_suite.layout_ok("region", ["hierarchical over 4 host(s) as groups"])
    assert not wan_suite.layout_ok("region", [])
    assert wan_suite.layout_ok("flat", ["flat (GRADEX_HIERARCHICAL=0)"])


def test_cluster_places_ranks_host_by_host(monkeypatch):
    monkeypatch.setenv("GX_CLUSTER_NAME", "zz")
    monkeypatch.setenv("GX_CLUSTER_SUBNET", "198.19.7")
    net = Cluster(2, "1gbit", ranks_per_host=2)
    assert [net.command(r, ["x"])[3] for r in range(4)] == ["zz-h0", "zz-h0", "zz-h1", "zz-h1"]
    assert [net.local_rank(r) for r in range(4)] == [0, 1, 0, 1] and net.local_world(4) == 2
    assert net.master_addr == "198.19.7.1" and net.switch == "zz-sw"


def test_gradex_vars_and_exchange_runs():
    listing = "GRADEX_TIMEOUT_S=300    [default]\n    help\nGRADEX_POLICY=auto    [default]\n"
    assert gradex_vars.parse(listing) == {"GRADEX_TIMEOUT_S", "GRADEX_POLICY"}
    assert gradex_vars.policy_env({"GRADEX_POLICY"}, "fixed") == {"GRADEX_POLICY": "fixed"}
    assert gradex_vars.policy_env(set(), "auto") == {}
    assert exchange_suite.rate_steps("100mbit=3/1,25gbit=10/2") == {"100mbit": (3, 1), "25gbit": (10, 2)}
    for bad in ("100mbit=3", "100mbit=0/1", "=3/1"):
        with pytest.raises(ValueError):
            exchange_suite.rate_steps(bad)

    class Args:
        bench, auto_extra_warmup = "gx-bench", 2
    modes = ["dense_fp32", "dense_fp16", "auto", "dgc99", "dgc999"]
    fixed, auto = exchange_suite.gradex_runs(Args, modes, {"GRADEX_POLICY"}, steps=3, warmup=1)
    assert fixed[0] == "gradex" and fixed[2] == {"GRADEX_POLICY": "fixed"} and fixed[3:] == (3, 1, "auto")
    assert fixed[1][fixed[1].index("--modes") + 1] == "dense_fp32,dense_fp16,dgc99,dgc999,auto"
    assert auto[0] == "gradex_auto" and auto[2] == {"GRADEX_POLICY": "auto"} and auto[3:] == (3, 3, "dgc999")
    assert auto[1][auto[1].index("--modes") + 1] == "auto,dgc999" and auto[1][auto[1].index("--warmup") + 1] == "3"
    # The auto program runs the cost model's steady-state choice (no fidelity ramp) when the build has it.
    Args.auto_ramp_steps = 0
    _, ramped = exchange_suite.gradex_runs(Args, modes, {"GRADEX_POLICY", exchange_suite.RAMP}, steps=3, warmup=1)
    assert ramped[2] == {"GRADEX_POLICY": "auto", exchange_suite.RAMP: "0"}
    old_build = exchange_suite.gradex_runs(Args, modes, set(), steps=3, warmup=1)
    assert [run[2] for run in old_build] == [{}, {}]  # no GRADEX_POLICY: today's default, nothing set
    assert exchange_suite.rate_bits("100mbit") == 1e8 and exchange_suite.rate_bits("loopback") is None


def test_bench_run_options():
    """bench/run's new options are documented and bad values are refused before anything is built."""
    run = ROOT / "bench" / "run"
    text = subprocess.run([str(run), "--help"], capture_output=True, text=True, timeout=30).stdout
    for option in ("--train-rates", "--train-tasks", "--hierarchy", "--cluster-name", "--subnet", "--steps",
                   "--lm-race-short"):
        assert option in text
    for argv in (["--steps", "two"], ["--quick", "--hierarchy", "--hosts", "2"], ["--bogus"]):
        done = subprocess.run([str(run), *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (argv, done.stderr)


def test_baselines_per_network():
    class Args:
        baselines_at, baseline_modes, other_baseline_modes, slow_baseline_modes = "1gbit", "all5", "gloo", ""
    nets = [Cluster(4, "100mbit"), Cluster(4, "1gbit"), Cluster(4, "10gbit")]
    assert [exchange_suite.baseline_modes(Args, n, nets) for n in nets] == ["", "all5", "gloo"]
    Args.baselines_at, Args.slow_baseline_modes = None, None  # the first network, whatever its rate
    assert [exchange_suite.baseline_modes(Args, n, nets) for n in nets] == ["all5", "gloo", "gloo"]


def test_auto_over_best_fixed_keys_and_targets():
    def modes(**ms):
        return {m: {"step_ms": v, "cpu_ms": 10.0, "wire_bytes": 1e6, "tool": "gradex"} for m, v in ms.items()}
    exchange = {"resnet50": {
        "100mbit": modes(dense_fp32=12000.0, dense_fp16=6000.0, dgc99=400.0, dgc999=100.0, auto=104.0),
        "1gbit": modes(dense_fp32=1300.0, dense_fp16=680.0, dgc99=170.0, dgc999=95.0, auto=120.0),
        "10gbit": modes(dense_fp32=320.0, dense_fp16=190.0, dgc99=230.0, auto=200.0),  # dgc999 not run
        "loopback": modes(dense_fp32=200.0, auto=80.0)}}
    values, model = report.ratios(exchange)
    assert model == "resnet50"
    assert values["auto_over_best_fixed_100m"] == pytest.approx(1.04)
    assert values["auto_over_best_fixed_1g"] == pytest.approx(120 / 95)
    assert values["auto_over_best_fixed_10g"] == pytest.approx(200 / 190)  # best of those measured
    assert values["auto_over_best_fixed_loopback"] == pytest.approx(0.4)
    assert report.best_fixed(exchange["resnet50"]["10gbit"]) == "dense_fp16"
    ex = {"hosts": 4, "exchange": exchange, "machine": {"cores": 2}}
    table = "\n".join(report.target_table(ex, values, model, report.AUTO_TARGETS))
    assert "| 100 Mbit/s: auto / best fixed mode (`auto_over_best_fixed_100m`) | ≤ 1.05× | 1.04× | yes |" in table
    assert "`auto_over_best_fixed_1g` = 1.26: `dgc999` 95.0 ms per step" in table  # the miss, with its cause
    line = report.result_line(values, None)
    assert "auto_over_best_fixed_100m=1.04 auto_over_best_fixed_1g=1.263" in line
    assert report.result_line({}, None).count("=nan") == len(report.TARGETS) + len(report.AUTO_TARGETS)


def test_hierarchy_layouts_and_ratios():
    assert hierarchy_suite.parse_configs("2x2@100mbit,4x2@1gbit") == [(2, 2, "100mbit"), (4, 2, "1gbit")]
    for bad in ("2x2", "1x2@1gbit", "2x2@fast"):
        with pytest.raises(ValueError):
            hierarchy_suite.parse_configs(bad)
    assert hierarchy_suite.variants(set()) == [("flat", {})]
    assert hierarchy_suite.variants({"GRADEX_HIERARCHICAL"}) == [("flat", {"GRADEX_HIERARCHICAL": "0"}),
                                                                 ("hierarchical", {})]

    def run(policy, exchange, step_ms, tx):
        return {"hosts": 2, "ranks_per_host": 2, "rate": "100mbit", "policy": policy, "exchange": exchange,
                "step_ms": step_ms, "steps_per_s": 1e3 / step_ms, "host_tx_bytes": tx, "host_rx_bytes": tx,
                "self_wire_bytes": 1e6}
    flat_only = {"runs": [run("default", "flat", 100.0, [1e6, 1e6])]}
    assert all(v != v for v in hierarchy_report.values(flat_only).values())  # nan: nothing to compare
    hier = {"note": "n", "model": "resnet50", "runs": [
        run("default", "flat", 100.0, [1e6, 2e6]), run("default", "hierarchical", 90.0, [0.5e6, 1.4e6]),
        run("dense16", "flat", 6000.0, [76e6, 76e6]), run("dense16", "hierarchical", 4000.0, [51e6, 60e6])]}
    values = hierarchy_report.values(hier)
    assert values["hier_bytes_default_2x2_100m"] == pytest.approx(0.7)  # the worst host, not the mean
    assert values["hier_speedup_dense16_2x2_100m"] == pytest.approx(1.5)
    assert values["hier_bytes_dense16_2x2_100m"] == pytest.approx(60 / 76)
    text = "\n".join(hierarchy_report.tables(hier))
    assert "| 2 × 2 at 100mbit, default: worst host's bytes sent, hierarchical ÷ flat | ≤ 0.6× | 0.70× | **no** |" in text
    assert "| 2 × 2 at 100mbit, dense16: steps/s, hierarchical ÷ flat | ≥ 1.2× | 1.50× | yes |" in text
    assert "hier_bytes_default_2x2_100m=0.7" in report.result_line({}, None, hier)


def test_report_keeps_other_sections_and_prints_targets(tmp_path):
    exchange = {"hosts": 4, "steps": 10, "warmup": 3, "exchange": {"resnet50": {
        "1gbit": {"gloo_fp32": {"step_ms": 1300.0, "tool": "torch"},
                  "powersgd_r1": {"step_ms": 300.0, "tool": "torch"},
                  "dgc999": {"step_ms": 50.0, "cpu_ms": 40.0, "wire_bytes": 4e5, "tool": "gradex"}}}}}
    (tmp_path / "exchange.json").write_text(json.dumps(exchange))
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Compression microbenchmarks\n\nkept\n\n"
                   f"{report.BEGIN}\nold\n{report.END}\n\n## After\n\nalso kept\n")
    done = subprocess.run([sys.executable, "-m", "bench.report", "--results", str(tmp_path),
                           "--report", str(doc)], cwd=ROOT, capture_output=True, text=True, timeout=120,
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
        mode, tasks, methods, seeds, rates, root_loopback = "quick", "", "", "", "1gbit,100mbit", False
    plan = train_suite.plan(Args)
    reference = [(t, m, s, only) for r, t, m, s, only in plan if r == "1gbit"]
    assert reference == [(t, m, 0, False) for t in ("short", "mlp") for m in train_suite.QUICK_METHODS]
    # At 100 Mbit/s: gradex_auto trains in full; ddp (whose arithmetic ignores the link) only times its
    # steps there; nocomm (the compute bound) runs at the reference rate only.
    assert [(t, m, only) for r, t, m, _, only in plan if r == "100mbit"] == [
        ("short", "ddp", True), ("short", "gradex_auto", False), ("mlp", "ddp", True), ("mlp", "gradex_auto", False)]
    Args.mode, Args.seeds, Args.rates = "full", "4,5", "1gbit"
    plan = train_suite.plan(Args)
    keras = [m for m in train_suite.METHODS if m.startswith("keras_")]  # the Keras row: MLP task only
    assert {t for _, t, _, _, _ in plan} == {"short", "mlp", "conv"}
    assert len(plan) == 2 * (3 * len(train_suite.METHODS) - 2 * len(keras))
    assert not any(t == "conv" and m in keras for _, t, m, _, _ in plan)
    assert [s for _, _, _, s, _ in plan] == sorted(s for _, _, _, s, _ in plan)
    Args.tasks = "long"
    assert {t for _, t, _, _, _ in train_suite.plan(Args)} == {"long"}  # the long task is opt-in
    Args.tasks = "huge"
    with pytest.raises(ValueError):
        train_suite.plan(Args)


def _method(ttt, steps, accuracy, steps_per_s=10.0, rate_only=False):
    records = [_seed(s, ttt, steps, accuracy, steps_per_s) for s in range(3)]
    return {"seeds": records, "summary": train_suite.summarize(records), "rate_only": rate_only}


def test_race_targets_and_result_values():
    train = {"tasks": {"mlp": {"target": 0.7, "steps": 250, "lr": 0.05, "methods": {
        "ddp": _method(60.0, 180, 0.750), "torch_fp16": _method(30.0, 180, 0.751),
        "gradex_default": _method(15.0, 200, 0.742), "nocomm": _method(None, None, 0.5)}}},
        "network": "1gbit"}  # the one-rate format of older results files
    rows = {what: (v, met) for what, _, v, met in race_report.targets(train["tasks"]["mlp"])}
    assert rows["DDP's time to target ÷ gradex_default's"] == (4.0, True)
    assert rows["fastest PyTorch hook's time to target ÷ gradex_default's"] == (2.0, True)
    accuracy, met = rows["final accuracy, gradex_default − DDP (points)"]
    assert abs(accuracy - (-0.8)) < 1e-9 and met is False
    steps, met = rows["steps to target, gradex_default ÷ DDP"]
    assert abs(steps - 200 / 180) < 1e-9 and met is True
    values = race_report.values(train)
    assert values["ttt_mlp_ddp_s"] == 60.0 and values["steps_to_target_mlp_gradex_default"] == 200
    assert values["ddp_over_gradex_ttt_mlp"] == 4.0 and "ttt_mlp_nocomm_s" not in values
    assert values["steps_ratio_mlp"] == pytest.approx(200 / 180) and values["accuracy_diff_mlp"] == pytest.approx(-0.8)


def test_race_values_over_rates_derive_ddps_time():
    """At a non-reference rate DDP ran for its steps per second only: its time to target there is its
    reference steps to target over those steps per second; gradex_auto trained in full at both rates."""
    def task(methods):
        return {"short": {"target": 0.88, "steps": 100, "lr": 0.05, "methods": methods}}
    train = {"reference": "1gbit", "hosts": 4, "networks": {
        "100mbit": {"tasks": task({"ddp": _method(None, None, None, steps_per_s=0.5, rate_only=True),
                                   "gradex_auto": _method(6.0, 55, 0.938)})},
        "1gbit": {"tasks": task({"ddp": _method(20.0, 50, 0.940), "gradex_auto": _method(4.0, 55, 0.938),
                                 "nocomm": _method(None, None, None, steps_per_s=25.0)})}}}
    assert [label for label, _ in race_report.networks(train)] == ["1gbit", "100mbit"]
    values = race_report.values(train)
    assert values["ddp_over_gradex_ttt_short"] == 5.0 and values["steps_ratio_short"] == pytest.approx(1.1)
    assert values["accuracy_diff_short"] == pytest.approx(-0.2)
    assert values["ttt_short_100m_ddp_s"] == 100.0  # 50 steps at 0.5 steps/s, derived
    assert values["ddp_over_gradex_ttt_short_100m"] == pytest.approx(100 / 6)
    assert values["steps_to_target_short_100m_ddp"] == 50 and values["steps_ratio_short_100m"] == pytest.approx(1.1)
    ref = train["networks"]["1gbit"]["tasks"]["short"]
    rows = race_report.targets(train["networks"]["100mbit"]["tasks"]["short"], "100mbit", ref)
    assert rows[0][0] == "DDP's time to target ÷ gradex_auto's (DDP derived)" and rows[0][3] is None  # 1 Gbit/s only
    rows = {what: met for what, _, _, met in race_report.targets(ref, "1gbit", ref)}
    assert rows == {"DDP's time to target ÷ gradex_auto's": True, "final accuracy, gradex_auto − DDP (points)": True,
                    "steps to target, gradex_auto ÷ DDP": True}
    text = "\n".join(race_report.tables({**train, "machine": {}}, "benchmarks"))
    assert "| `ddp` (*derived*) | – | 100.0 | 50 |" in text and "race_short_100m_time.png" in text


@pytest.mark.parametrize("name", ["short", "long"])
def test_race_new_tasks_are_deterministic_and_learnable(name):
    """The short and long tasks: the same data in every process, every class present, and a tiny student
    trained for a few hundred steps at most (one process, 64 examples a step) clearly beats chance."""
    torch = race_task.torch
    x_train, y_train, x_test, y_test = race_task.load(name)
    again = race_task.load(name)
    assert torch_equal(x_train, again[0]) and torch_equal(y_test, again[3]) and len(x_test) == race_task.TEST_SIZE
    classes = race_task.classes(name)
    counts = np.bincount(y_test.numpy(), minlength=classes)
    assert len(counts) == classes and counts.min() > 0
    model = race_task.make_model(name, seed=0, hidden=64)
    assert model(x_test[:2]).shape == (2, classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    shard = race_task.Shard(x_train, y_train, rank=0, world=1, batch=64, seed=0)
    before = race_task.correct(model, x_test, y_test) / len(x_test)
    for _ in range({"short": 60, "long": 300}[name]):  # the long task learns slowly by design
        x, y = shard.next()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    after = race_task.correct(model, x_test, y_test) / len(x_test)
    bar = {"short": 0.5, "long": 0.1}[name]  # chance: 1/20 and 1/50
    assert after > bar and after > before + 0.03, (before, after)
    wide = race_task.make_model(name, seed=0)
    assert 4_000_000 < sum(p.numel() for p in wide.parameters()) < 5_500_000  # a race-sized student


def torch_equal(a, b):
    return bool((a == b).all())


def test_race_smoke_run_and_report(tmp_path):
    """The whole harness at toy size: 2 ranks on the loopback, a few steps of a 64-wide MLP with DDP,
    then the report's race section and RESULT keys."""
    results = tmp_path / "results"
    results.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "bench.train.train_suite", "--out", str(results / "train.json"),
         "--root-loopback", "--hosts", "2", "--mode", "smoke", "--methods", "ddp",
         "--log-dir", str(tmp_path / "logs")], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    train = json.loads((results / "train.json").read_text())
    assert train["reference"] == "loopback"
    (record,) = train["networks"]["loopback"]["tasks"]["mlp"]["methods"]["ddp"]["seeds"]
    assert record["steps"] == 6 and [c[1] for c in record["curve"]] == [0, 3, 6]
    assert all(0.0 <= c[2] <= 1.0 for c in record["curve"]) and record["train_s"] > 0
    assert record["wire_bytes_per_host"] is None  # the root loopback has no counters of its own
    doc = tmp_path / "benchmarks.md"
    done = subprocess.run([sys.executable, "-m", "bench.report", "--results", str(results),
                           "--report", str(doc)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr
    assert "### Time to accuracy" in doc.read_text() and (results / "race_mlp_time.png").exists()
    result = done.stdout.strip().splitlines()[-1]
    assert "ttt_mlp_ddp_s=" in result and "steps_to_target_mlp_ddp=" in result


def _race_smoke(tmp_path, name, *options):
    """train_suite.py's smoke mode on 2 ranks on the loopback; its results file."""
    out = tmp_path / f"{name}.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.train.train_suite", "--out", str(out), "--root-loopback",
         "--hosts", "2", "--mode", "smoke", "--log-dir", str(tmp_path / "logs"), *options],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


def test_race_optimizer_reaches_the_ranks(tmp_path):
    """--optimizer adamw: every rank trains with torch.optim.AdamW at ADAMW_LR, gradex's hook learns it through
    gx.State(optimizer=) and runs without momentum of its own, for the Adam family; the results say so. Without
    --optimizer the race stays SGD, gradex taking its momentum 0.9 over (gx.State(optimizer=)). A method that exists only for SGD is
    rejected under adamw (named) or left out of the mode's methods (not named)."""
    train = _race_smoke(tmp_path, "adamw", "--optimizer", "adamw", "--methods", "ddp,gradex_default")
    assert train["optimizer"] == "adamw" and "--optimizer adamw" in train["command"]
    entry = train["networks"]["loopback"]["tasks"]["mlp"]
    assert entry["optimizer"] == "adamw" and entry["lr"] == train_suite.ADAMW_LR["mlp"] != 0.05
    records = {m: r["seeds"][0] for m, r in entry["methods"].items()}
    assert {m: (r["optimizer"], r["optimizer_class"]) for m, r in records.items()} == {
        "ddp": ("adamw", "AdamW"), "gradex_default": ("adamw", "AdamW")}
    assert records["gradex_default"]["gradex_momentum"] == 0.0
    assert records["gradex_default"]["gradex_optimizer"] == "adam"
    assert records["gradex_default"]["gradex_stats"]["steps"] == 6 and records["ddp"]["gradex_momentum"] is None
    assert "AdamW (weight decay 0.01), cosine learning rate from 0.001." in "\n".join(
        race_report.tables({**train, "machine": {}}, "benchmarks"))
    train = _race_smoke(tmp_path, "sgd", "--methods", "gradex_default")
    assert train["optimizer"] == "sgd" and "--optimizer" not in train["command"]
    entry = train["networks"]["loopback"]["tasks"]["mlp"]
    (record,) = entry["methods"]["gradex_default"]["seeds"]
    assert entry["lr"] == 0.05 and (record["optimizer"], record["optimizer_class"]) == ("sgd", "SGD")
    assert record["gradex_momentum"] == 0.9 and record["gradex_optimizer"] == "unknown"

    done = subprocess.run(
        [sys.executable, "-m", "bench.train.train_suite", "--out", str(tmp_path / "no.json"),
         "--root-loopback", "--hosts", "2", "--mode", "smoke", "--optimizer", "adamw", "--methods",
         "ddp,gradex_dgc"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--optimizer adamw: gradex_dgc is DGC" in done.stderr
    assert not (tmp_path / "no.json").exists()

    class Args:
        mode, tasks, methods, seeds, rates, root_loopback, optimizer = "full", "mlp", "", "0", "1gbit", False, "adamw"
    methods = {m for _, _, m, _, _ in train_suite.plan(Args)}
    assert methods == set(train_suite.METHODS) - {"gradex_dgc", "keras_gradex_default", "keras_gradex_dense"}
    Args.optimizer = "sgd"
    assert {m for _, _, m, _, _ in train_suite.plan(Args)} == set(train_suite.METHODS)


def test_race_delayed_method_ends_synchronized(tmp_path):
    """A delayed exchange's ranks differ by their last D local gradients: the race averages their parameters
    (gx.synchronize) after the last step and before its evaluation, as a user does before evaluating or saving;
    a method whose ranks already agree is not synchronized."""
    train = _race_smoke(tmp_path, "delay", "--methods", "nocomm,ddp,gradex_delay1")
    records = {m: r["seeds"][0] for m, r in train["networks"]["loopback"]["tasks"]["mlp"]["methods"].items()}
    delayed, ddp = records["gradex_delay1"], records["ddp"]
    assert delayed["steps"] == 6 and [c[1] for c in delayed["curve"]] == [0, 3, 6]
    assert delayed["synchronized_at_end"] is True and ddp["synchronized_at_end"] is False
    assert delayed["gradex_stats"]["steps"] == 6
    # DDP's default buffer broadcast in every method but the no-communication bound; each step's phases and the
    # machine's busy cores beside its time.
    assert {m: r["broadcast_buffers"] for m, r in records.items()} == {
        "nocomm": False, "ddp": True, "gradex_delay1": True}
    for r in records.values():
        assert len(r["step_busy_s"]) == len(r["step_forward_s"]) == len(r["step_backward_s"]) == r["steps"]
        assert all(f + b <= s + 1e-4 for f, b, s in zip(r["step_forward_s"], r["step_backward_s"], r["step_s"]))
        assert 0 < r["machine_cpu"]["busy_cores"] <= r["machine_cpu"]["machine_cores"] + 0.5
    assert "--broadcast-buffers" not in train["command"]

    class Args:
        mode, python, broadcast_buffers = "smoke", sys.executable, 0
    argv, _ = train_suite.rank_argv(Args, "mlp", "ddp", [0], str(tmp_path / "x.json"), counted=False)
    assert "--no-broadcast-buffers" in argv
    Args.broadcast_buffers = 1
    assert "--no-broadcast-buffers" not in train_suite.rank_argv(Args, "mlp", "ddp", [0], "x", counted=False)[0]


def test_race_rate_only_run(tmp_path):
    """A link-independent method at a non-reference rate: train_rank.py --no-eval times its steps and
    evaluates nothing (2 ranks on the loopback, the short task's tiny student)."""
    class Args:
        mode, python = "smoke", sys.executable
    out = tmp_path / "rate.json"
    argv, steps = train_suite.rank_argv(Args, "short", "ddp", [0], str(out), counted=False, rate_only=True)
    assert "--no-eval" in argv and steps == train_suite.MODES["smoke"]["rate_only_steps"]
    run_ranks(RootLoopback(), 2, argv, warmup=0, steps=1, timeout_s=240, log_dir=str(tmp_path / "logs"),
              label="rate")
    (record,) = json.loads(out.read_text())["seeds"]
    assert record["rate_only"] is True and record["curve"] == [] and record["final_accuracy"] is None
    assert record["steps"] == steps and record["steps_per_s"] > 0 and record["time_to_target_s"] is None


def test_race_keras_row_smoke_run_and_report(tmp_path):
    """The Keras row at toy size: both Keras methods (bench/train/keras_rank.py) on 2 ranks on the loopback
    through train_suite.py, each rank a subprocess; then the report's Keras paragraph and RESULT keys."""
    pytest.importorskip("tensorflow")
    pytest.importorskip("keras")
    results = tmp_path / "results"
    results.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "bench.train.train_suite", "--out", str(results / "train.json"),
         "--root-loopback", "--hosts", "2", "--mode", "smoke", "--methods", "keras_gradex_default,keras_gradex_dense",
         "--log-dir", str(tmp_path / "logs")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("*")) if p.is_file())
    assert done.returncode == 0, done.stdout + done.stderr + logs
    train = json.loads((results / "train.json").read_text())
    assert train["failures"] == []
    methods = train["networks"]["loopback"]["tasks"]["mlp"]["methods"]
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
    done = subprocess.run([sys.executable, "-m", "bench.report", "--results", str(results),
                           "--report", str(doc)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr
    text = doc.read_text()
    assert "Keras row" in text and "`keras_gradex_default`" in text and "ms/step" in text
    result = done.stdout.strip().splitlines()[-1]
    assert "ms_per_step_mlp_keras_gradex_default=" in result and "ttt_mlp_keras_gradex_dense_s=" in result


# The convnet's case trains for about a minute on 2 cores: left to the opt-in stage (the race runs it).
@pytest.mark.parametrize("name", [pytest.param("cnn", marks=pytest.mark.slow), "tfm"])
def test_race_held_out_tasks_are_deterministic_and_learnable(name):
    """The held-out tasks (a convnet, a transformer classifier): the same data in every process, every class
    present, and a tiny student trained for 100 steps (one process, 64 examples a step) clearly beats chance."""
    torch = race_task.torch
    x_train, y_train, x_test, y_test = race_task.load(name)
    again = race_task.load(name)
    assert torch_equal(x_train, again[0]) and torch_equal(y_test, again[3])
    assert np.bincount(y_test.numpy(), minlength=10).min() > 0
    model = race_task.make_model(name, seed=0, hidden=64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    shard = race_task.Shard(x_train, y_train, rank=0, world=1, batch=64, seed=0)
    before = race_task.correct(model, x_test, y_test) / len(x_test)
    for _ in range(100):
        x, y = shard.next()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    after = race_task.correct(model, x_test, y_test) / len(x_test)
    assert after > 0.2 and after > before + 0.1, (before, after)  # chance: 1/10
    wide = race_task.make_model(name, seed=0)
    assert 1_000_000 < sum(p.numel() for p in wide.parameters()) < 4_000_000
