"""bench/experiments/delay_rules.py: the exact-arithmetic simulation of the delayed exchange's rules trains what
the rules say (small models, a few steps, one process)."""
import pytest
import torch

from bench.experiments.delay_rules import Case, simulate, summarize
from bench.train import task

STEPS = 6


@pytest.fixture(scope="module")
def data():
    return {name: task.load(name) for name in ("mlp", "cnn")}


def _run(data, name, case, **kw):
    return simulate(name, 0, Case.parse(case), STEPS, lr=0.05, batch=8, hidden=64, data=data[name], test=False,
                    **kw)


def _gap(a, b):
    return max(float((x - y).abs().max()) for pa, pb in zip(a.params, b.params) for x, y in zip(pa, pb))


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_with_every_rank_on_the_same_batches_the_delayed_rules_train_the_synchronous_model(data, name):
    # The ranks' gradients then differ only through their parameters: the correction (and the carried estimate)
    # makes every step the synchronous one, whatever D; plain staleness does not.
    sync = _run(data, name, "sync", same_data=True)
    for case in ("correct:1", "correct:2", "correct:3", "carried:2"):
        assert _gap(_run(data, name, case, same_data=True), sync) < 1e-5, case
    assert _gap(_run(data, name, "stale:1", same_data=True), sync) > 1e-3


def test_correct_ranks_differ_by_their_last_d_local_momenta(data):
    # With a constant rate the correction telescopes: rank r's parameters are the ranks' mean less
    # rate * sum over the last D steps of (u_r - mean u).
    rate, d = 0.05, 2
    run = simulate("mlp", 0, Case.parse(f"correct:{d}"), STEPS, lr=rate, batch=8, hidden=64, data=data["mlp"],
                   constant_lr=True, test=False)
    world = len(run.params)
    mean = [torch.stack([run.params[r][i] for r in range(world)]).mean(0) for i in range(len(run.params[0]))]
    assert len(run.recent_u[0]) == d
    spread = 0.0
    for r in range(world):
        for i, m in enumerate(mean):
            local = sum(run.recent_u[r][k][i] - torch.stack([run.recent_u[q][k][i] for q in range(world)]).mean(0)
                        for k in range(d))
            assert torch.allclose(run.params[r][i] - m, -rate * local, atol=2e-6)
            spread = max(spread, float((run.params[r][i] - m).abs().max()))
    assert spread > 1e-4  # the ranks do differ (different batches)


def test_cases_are_parsed_and_bad_ones_named():
    assert Case.parse("correct:2") == Case("correct", 2, 0.9)
    assert Case.parse("sync:0:0.8").label() == "sync:0:0.8"
    assert Case.parse(Case.parse("carried:3").label()) == Case("carried", 3)
    for bad, words in (("adam:2", "RULE"), ("stale:0", "D must be >= 1"), ("correct:x", "integer"),
                       ("correct:2:1.0", "MOMENTUM")):
        with pytest.raises(ValueError, match=words):
            Case.parse(bad)


def test_summary_compares_each_seed_with_its_own_sync_run():
    rows = [{"task": "cnn", "case": "sync", "seed": 0, "accuracy": 0.70},
            {"task": "cnn", "case": "sync", "seed": 1, "accuracy": 0.68},
            {"task": "cnn", "case": "correct:2", "seed": 0, "accuracy": 0.69},
            {"task": "cnn", "case": "correct:2", "seed": 1, "accuracy": 0.66}]
    line = [s for s in summarize(rows) if s["case"] == "correct:2"][0]
    assert line["points_vs_sync"] == pytest.approx(-1.5) and line["worst_points_vs_sync"] == pytest.approx(-2.0)


def test_batchnorm_models_are_also_tested_with_statistics_of_their_own(data):
    cnn = simulate("cnn", 0, Case.parse("correct:1"), 2, lr=0.05, batch=8, hidden=64, data=data["cnn"])
    mlp = simulate("mlp", 0, Case.parse("correct:1"), 2, lr=0.05, batch=8, hidden=64, data=data["mlp"])
    assert cnn.accuracy is not None and cnn.accuracy_own_statistics is not None
    assert mlp.accuracy is not None and mlp.accuracy_own_statistics is None
