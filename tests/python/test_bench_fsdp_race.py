"""bench/fsdp/race.py's --cluster plumbing without a network: each shard group lives on one emulated host (so
only the replicate dimension crosses the shaped link), the worker gets the driver's options less the driver-only
ones, and bad arguments fail clearly."""
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


def test_worker_argv_drops_driver_only_options(race):
    argv = ["--cluster", "100mbit", "--budget", "60", "--methods=native,gradex", "--out", "x.json",
            "--target-loss", "5.0", "--eval-every", "10"]
    assert race._rank_argv(argv) == ["--budget", "60", "--eval-every", "10"]
    args = race.parse_args(race._rank_argv(argv) + ["--worker", "gradex", "--curve-out", "c.json", "--data", "d"])
    assert args.worker == "gradex" and args.budget == 60 and args.cluster is None


@pytest.mark.parametrize("argv, message", [
    (["--cluster", "100mbit"], "needs a --budget"),
    (["--cluster", "fast", "--budget", "5"], "tc rate"),
    (["--methods", "native,ddp"], "unknown method"),
    (["--methods", "gradex"], "--target-loss is needed"),
    (["--budget", "0"], "must be positive"),
])
def test_argument_errors_are_clear(race, argv, message, capsys):
    with pytest.raises(SystemExit):
        race.parse_args(argv)
    assert message in capsys.readouterr().err
