"""bench/fsdp/race.py's --cluster and --wan plumbing without a network: each shard group lives on one emulated
host (--cluster) or in one region (--wan), so only the replicate dimension crosses the shaped link; the worker gets
the driver's options less the driver-only ones; bad arguments fail clearly; the report writes its result file."""
import json
import math
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def race():
    from bench.fsdp import race as module
    return module


def test_shard_groups_are_hosts_and_replicas_cross_the_link(race):
    net = race.make_cluster("100mbit")
    assert race.shard_groups() == [[0, 1], [2, 3]]  # init_device_mesh's row-major (replicate, shard) layout
    assert [net.host_of(r) for r in range(race.WORLD)] == [0, 0, 1, 1]
    assert net.hosts == 2 and net.rate == "100mbit" and net.local_world(race.WORLD) == 2
    # the two members of each replicate group (same shard index) sit on different hosts
    for s in range(race.SHARDS):
        assert {net.host_of(g * race.SHARDS + s) for g in range(race.REPLICAS)} == {0, 1}


def test_wan_puts_each_shard_group_in_a_region_and_replicas_across(race, tmp_path):
    wan = race.make_wan("1gbit,0.1ms,100mbit,20ms", str(tmp_path))
    spec = wan.spec
    assert spec.hosts == race.WORLD and spec.regions == [0, 0, 1, 1]
    assert (spec.rate, spec.delay, spec.inter_rate, spec.inter_delay) == ("1gbit", "0.1ms", "100mbit", "20ms")
    assert spec.cc == "cubic" and spec.link_mtu() == 9000  # the fastest pipe is 1 Gbit/s
    for s in range(race.SHARDS):  # each replicate group's members sit in different regions
        assert {spec.regions[g * race.SHARDS + s] for g in range(race.REPLICAS)} == {0, 1}


def test_report_writes_the_result_file_with_its_provenance(race, tmp_path, capsys):
    out = tmp_path / "race.json"
    args = race.parse_args(["--wan", "1gbit,0.1ms,100mbit,20ms", "--budget", "5", "--out", str(out)])
    runs = {"native": ([(10, 1.0, 5.0), (20, 2.0, 4.0)], 3000), "gradex": ([(10, 0.5, 4.5), (20, 1.0, 3.9)], 1000)}
    race.report(args, {m: (c, 100.0, [(10, 20), (30, 40)], regions) for m, (c, regions) in runs.items()})
    data = json.loads(out.read_text())
    assert data["target_loss"] == 4.0 and "2 regions" in data["link"]
    assert data["methods"]["gradex"]["time_to_target_s"] == 1.0
    assert data["methods"]["native"]["time_to_target_s"] == 2.0
    assert data["methods"]["gradex"]["bytes_across_regions"] == 1000
    assert "command" in data["provenance"] and "commit" in data["provenance"]
    assert "ttt_gradex=1.00" in capsys.readouterr().out
    assert not math.isnan(data["methods"]["native"]["bytes_across_hosts"])


def test_worker_argv_drops_driver_only_options(race):
    argv = ["--cluster", "100mbit", "--wan", "1gbit,0.1ms,100mbit,20ms", "--budget", "60", "--methods=native,gradex",
            "--out", "x.json", "--target-loss", "5.0", "--eval-every", "10"]
    assert race._rank_argv(argv) == ["--budget", "60", "--eval-every", "10"]
    args = race.parse_args(race._rank_argv(argv) + ["--worker", "gradex", "--curve-out", "c.json", "--data", "d"])
    assert args.worker == "gradex" and args.budget == 60 and args.cluster is None


@pytest.mark.parametrize("argv, message", [
    (["--cluster", "100mbit"], "need a --budget"),
    (["--cluster", "fast", "--budget", "5"], "tc rate"),
    (["--methods", "native,ddp"], "unknown method"),
    (["--methods", "gradex"], "--target-loss is needed"),
    (["--budget", "0"], "must be positive"),
    (["--wan", "1gbit,0.1ms,100mbit,20ms"], "need a --budget"),
    (["--wan", "1gbit,0.1ms,100mbit", "--budget", "5"], "IN_RATE,IN_DELAY,ACROSS_RATE,ACROSS_DELAY"),
    (["--wan", "1gbit,0.1ms,slow,20ms", "--budget", "5"], "bad rate"),
    (["--wan", "1gbit,0.1ms,100mbit,20ms", "--cluster", "100mbit", "--budget", "5"], "choose one"),
])
def test_argument_errors_are_clear(race, argv, message, capsys):
    with pytest.raises(SystemExit):
        race.parse_args(argv)
    assert message in capsys.readouterr().err
