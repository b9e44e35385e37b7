"""bench/lm without the full race: the model's size, the corpus's determinism and disjoint held-out split, the
RESULT arithmetic on synthetic curves, clear argument errors, and a tiny real race (2 ranks on loopback,
a few seconds per method) that writes its JSON, plot and RESULT line."""
import json
import math
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
from bench.lm import corpus, diloco_grid, race  # noqa: E402
from bench.lm import model as lm  # noqa: E402

SMALL = 256 << 10  # bytes of training text for the tests


@pytest.fixture(scope="module")
def small_corpus():
    return corpus.build(vocab=1024, max_bytes=SMALL)


def test_model_has_at_least_10m_parameters_mostly_in_the_vocabulary():
    import torch
    m = lm.make(seed=0)
    n = lm.parameter_count(m)
    assert n >= 10_000_000, n
    assert 2 * m.embed.weight.numel() > n / 2  # the embedding and output projection dominate
    out = m(torch.zeros(2, lm.DEFAULTS["context"], dtype=torch.long))
    assert out.shape == (2, lm.DEFAULTS["context"], lm.DEFAULTS["vocab"])


def test_corpus_split_is_disjoint_and_deterministic(small_corpus):
    files = corpus._files()
    held = {p for p in files if corpus._held_out(p)}
    assert 0.05 < len(held) / len(files) < 0.2
    train_text, held_text = corpus._texts(SMALL)
    held_names = {p.name for p in held}
    train_names = {p.name for p in files if p not in held}
    assert held and held_names.isdisjoint(train_names)  # split by name: a file name is on one side only
    assert held_text and held_text not in train_text
    again = corpus.build(vocab=1024, max_bytes=SMALL)
    assert again["table"] == small_corpus["table"]
    assert again["train"].equal(small_corpus["train"]) and again["held_out"].equal(small_corpus["held_out"])
    assert corpus.decode(small_corpus["held_out"], small_corpus["table"]) == held_text  # lossless
    assert int(small_corpus["train"].max()) < 1024 and int(small_corpus["train"].min()) >= 0
    x, y = corpus.Sampler(small_corpus["train"], 32, 4, seed=3).next()
    x2, _ = corpus.Sampler(small_corpus["train"], 32, 4, seed=3).next()
    assert x.equal(x2) and x[:, 1:].equal(y[:, :-1])


def test_initial_loss_is_near_uniform(small_corpus):
    m = lm.make(seed=0, vocab=1024, d=32, layers=1, heads=2, context=16)
    loss = lm.held_out_loss(m, corpus.eval_batches(small_corpus["held_out"], 16, count=2, batch=4))
    assert abs(loss - math.log(1024)) < 0.5, loss


def test_result_keys_from_synthetic_curves():
    # (clock, step, loss, bytes). DDP ends at 3.0, its target.
    curves = {"100mbit": {
        "ddp": [(0, 0, 9.0, 0), (50, 5, 4.0, 500), (100, 10, 3.0, 1000)],
        "fp16": [(0, 0, 9.0, 0), (60, 8, 3.2, 400), (100, 14, 2.9, 700)],
        "gradex_diloco8": [(0, 0, 9.0, 0), (10, 30, 3.5, 5), (20, 60, 3.0, 9), (100, 300, 2.5, 40)],
        "gradex_default": [(0, 0, 9.0, 0), (100, 20, 3.1, 80)],
        "nocomm": [(0, 0, 9.0, 0), (100, 400, 2.8, None)],
    }}
    summary, items = race.summarize(curves)
    assert summary["100mbit"]["target"] == 3.0
    assert items["ttt_ddp_100m"] == 100 and items["bytes_to_target_ddp_100m"] == 1000
    assert items["ttt_fp16_100m"] == 100 and items["bytes_to_target_fp16_100m"] == 700
    assert items["ttt_gradex_diloco8_100m"] == 20 and items["bytes_to_target_gradex_diloco8_100m"] == 9
    assert math.isnan(items["ttt_gradex_default_100m"]) and math.isnan(items["bytes_to_target_gradex_default_100m"])
    assert items["ttt_nocomm_100m"] == 100 and math.isnan(items["bytes_to_target_nocomm_100m"])
    assert items["final_loss_gradex_diloco8_100m"] == 2.5
    assert items["ddp_over_best_gradex_ttt_100m"] == 5.0
    assert items["best_gradex_over_best_hook_ttt_100m"] == 5.0
    assert "ddp_over_best_gradex_ttt_1g" not in items
    # No hook reached the target, a gradex method did: inf; no gradex method did: nan.
    curves["100mbit"]["fp16"] = [(0, 0, 9.0, 0), (100, 14, 3.4, 700)]
    assert race.summarize(curves)[1]["best_gradex_over_best_hook_ttt_100m"] == math.inf
    del curves["100mbit"]["gradex_diloco8"]
    _, items = race.summarize(curves)
    assert math.isnan(items["ddp_over_best_gradex_ttt_100m"])
    assert "nan" in race.result_line(items) and race.result_line(items).startswith("RESULT ttt_ddp_100m=100 ")
    # A rate whose ddp run failed has no target, hence no items.
    assert race.summarize({"1gbit": {"nocomm": [(0, 0, 9.0, 0)]}}) == ({}, {})
    # The tolerance loosens the target.
    assert race.summarize(curves, tolerance=0.1)[1]["ttt_gradex_default_100m"] == 100


@pytest.mark.parametrize("argv, message", [
    (["--methods", "ddp,adam9"], "unknown method(s) adam9"),
    (["--methods", "fp16,nocomm"], "must include ddp"),
    (["--rates", "fast"], "bad --rates fast"),
    (["--budget", "0"], "--budget must be positive"),
    (["--hosts", "1"], "--hosts must be at least 2"),
    (["--tolerance", "-0.1"], "--tolerance must be >= 0"),
])
def test_argument_errors_are_clear(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        race.parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_tiny_race_on_loopback(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "bench.lm.race", "--loopback", "--hosts", "2",
         "--methods", "ddp,nocomm", "--budget", "2", "--vocab", "512", "--corpus-bytes", str(SMALL),
         "--rank-args", "--d-model 32 --layers 1 --heads 2 --context 16 --batch 2 --eval-batches 2",
         "--out", str(tmp_path / "lm.json"), "--plot", str(tmp_path / "lm.png"), "--log-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    result = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(result) == 1
    fields = dict(kv.split("=") for kv in result[0].split()[1:])
    doc = json.loads((tmp_path / "lm.json").read_text())
    curves = doc["curves"]["loopback"]
    assert set(curves) == {"ddp", "nocomm"}  # a hook method is the same path as ddp's in the harness
    for method, curve in curves.items():
        assert curve[-1][0] >= 2.0 and curve[-1][1] > 0  # trained through the budget
        assert float(fields[f"final_loss_{method}_loopback"]) == pytest.approx(curve[-1][2], rel=1e-3)
        assert fields[f"bytes_to_target_{method}_loopback"] == "nan"  # loopback: nothing counted
    ddp_ttt = race.first_reaching(curves["ddp"], curves["ddp"][-1][2])[0]
    assert float(fields["ttt_ddp_loopback"]) == pytest.approx(ddp_ttt, rel=1e-3)
    assert "ddp_over_best_gradex_ttt_loopback" not in fields  # no gradex method ran
    assert (tmp_path / "lm.png").stat().st_size > 0


def test_short_race_is_one_rate_and_four_methods():
    args = race.parse_args(["--short"])
    assert args.rates == ["100mbit"] and args.budget == 240
    assert args.methods == ["ddp", "powersgd", "gradex_diloco4", "gradex_localsgd"]
    assert len(args.methods) * (args.budget + 120) <= 30 * 60  # fits the half hour with start-up and evaluations


def test_diloco_grid_settings_parse_and_reject_by_name():
    assert diloco_grid.parse_setting("diloco4 lr=0.7 m=0.5 F=2") == (
        "gradex_diloco4", ["--outer-lr", "0.7", "--outer-momentum", "0.5", "--fragments", "2"])
    assert diloco_grid.parse_setting("topk density=0.03")[1] == ["--density", "0.03"]
    with pytest.raises(ValueError, match="first word"):
        diloco_grid.parse_setting("diloco5")
    with pytest.raises(ValueError, match="'speed=2'"):
        diloco_grid.parse_setting("diloco8 speed=2")
    with pytest.raises(ValueError):
        diloco_grid.parse_setting("diloco8 lr=fast")


def test_equal_step_runs_stop_at_their_step_count(tmp_path):
    """lm_rank.py --steps: the run ends after exactly N steps (not a budget), evaluating every --eval-steps; a
    DiLoCo run (its outer rounds count steps) also reports the bytes gradex counted. DDP's --steps run is
    test_powersgd_hook_with_many_buckets_on_gloo's."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.lm.diloco_grid", "--only", "diloco4 H=4 F=2 d=1", "--steps", "8",
         "--eval-steps", "4", "--vocab", "512", "--corpus-bytes", str(SMALL), "--log-dir", str(tmp_path), "--out",
         str(tmp_path / "diloco4.json"), "--rank-args",
         "--d-model 32 --layers 1 --heads 2 --context 16 --batch 2 --eval-batches 2"],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads((tmp_path / "diloco4.json").read_text())["results"][0]
    assert [c[1] for c in result["curve"]] == [0, 4, 8]
    assert result["gradex_bytes_sent_rank0"] > 0


def test_powersgd_hook_with_many_buckets_on_gloo(tmp_path):
    """PyTorch's PowerSGD hook over gloo with many DDP buckets in flight: its second and third allreduces are
    issued from future callbacks on gloo's threads, which raced the next bucket's first allreduce across ranks
    ("Received data size doesn't match expected size") until lm_rank.serialized_hook ordered the buckets.
    Tiny buckets (--bucket-cap-mb) give a small model many of them; PowerSGD runs from step 2."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.lm.race", "--loopback", "--hosts", "3",
         "--methods", "ddp,powersgd", "--budget", "1", "--vocab", "512", "--corpus-bytes", str(SMALL),
         "--rank-args", "--d-model 32 --layers 2 --heads 2 --context 16 --batch 2 --eval-batches 2 "
                        "--steps 12 --eval-steps 6 --bucket-cap-mb 0.005",
         "--out", str(tmp_path / "lm.json"), "--plot", str(tmp_path / "lm.png"), "--log-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    curves = json.loads((tmp_path / "lm.json").read_text())["curves"]["loopback"]
    assert [c[1] for c in curves["powersgd"]] == [0, 6, 12]
    assert [c[1] for c in curves["ddp"]] == [0, 6, 12]  # --steps ends DDP's run at its step count too
    assert all(math.isfinite(c[2]) for c in curves["powersgd"])
    assert curves["powersgd"][-1][2] < curves["powersgd"][0][2]  # it trained


def test_curve_points_bisect_to_the_first_snapshot_at_the_target():
    from bench.lm import lm_rank
    losses = [10 - 0.1 * i for i in range(61)]  # falls monotonically: 10.0 at 0 ... 4.0 at 60
    seen = []

    def loss_at(i):
        seen.append(i)
        return losses[i]

    grid = lm_rank.curve_points(61, 6, 7.05, loss_at)
    assert grid == [0, 10, 20, 30, 40, 50, 60]
    first = min(i for i in set(seen) if losses[i] <= 7.05)
    assert first == 30  # 7.0 <= 7.05 < 7.1
    assert len(set(seen)) <= len(grid) + 4  # a bisection, not every snapshot
    seen.clear()
    lm_rank.curve_points(61, 6, 7.45, loss_at)
    assert min(i for i in set(seen) if losses[i] <= 7.45) == 26  # inside a coarse interval: found exactly
    seen.clear()
    lm_rank.curve_points(61, 6, 3.0, loss_at)  # never reached: the grid only
    assert sorted(set(seen)) == [0, 10, 20, 30, 40, 50, 60]
