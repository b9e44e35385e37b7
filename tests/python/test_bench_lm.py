"""bench/lm's pieces without a race: the held-out split of the standard library's files is disjoint and
stable, windows are next-byte pairs, the model's initial loss is near ln(256), the RESULT arithmetic, and
(as root) the private namespace cluster is created with unique names and removed completely."""
import math
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "lm"))
try:
    import corpus  # noqa: E402
    import model as lm  # noqa: E402
    import race  # noqa: E402
finally:
    del sys.path[0]
    for name in ("corpus", "model", "race", "netns"):  # plain names: keep them out of other tests' way
        sys.modules.pop(name, None)


def test_split_is_disjoint_and_windows_are_next_bytes():
    files = corpus._files()
    held = [p for p in files if corpus._held_out(p)]
    assert 0.05 < len(held) / len(files) < 0.2
    assert set(held).isdisjoint(p for p in files if not corpus._held_out(p))
    train, held_tokens = corpus.load(max_bytes=1 << 20)
    assert len(train) >= 1 << 20 and len(held_tokens) > 0 and int(train.max()) < 256
    x, y = corpus.Sampler(train, 32, 4, seed=3).next()
    x2, _ = corpus.Sampler(train, 32, 4, seed=3).next()
    assert x.equal(x2) and x[:, 1:].equal(y[:, :-1])


def test_initial_loss_is_near_uniform():
    import torch
    train, held = corpus.load(max_bytes=1 << 20)
    m = lm.make(seed=0, d=32, layers=1, context=16)
    loss = lm.held_out_loss(m, corpus.eval_batches(held, 16, count=2, batch=4))
    assert abs(loss - math.log(256)) < 1.5, loss
    assert m(torch.zeros(2, 16, dtype=torch.long)).shape == (2, 16, 256)


def test_first_reaching():
    curve = [(0.0, 0, 5.0, 0), (1.0, 8, 3.0, 10), (2.0, 16, 2.0, 20)]
    assert race.first_reaching(curve, 3.0) == (1.0, 10)
    assert race.first_reaching(curve, 1.0) == (None, None)


def test_private_cluster_is_unique_and_removed():
    probe = subprocess.run([str(ROOT / "bench" / "cluster" / "cluster.sh"), "probe"], capture_output=True,
                           text=True, timeout=60)
    if probe.returncode != 0:  # no root, no namespaces or no tc here: said, not hidden
        pytest.skip(probe.stdout.strip() + probe.stderr.strip())
    sys.path.insert(0, str(ROOT / "bench" / "lm"))
    try:
        from netns import PrivateCluster
    finally:
        del sys.path[0]
        sys.modules.pop("netns", None)
    c = PrivateCluster(2, "100mbit")
    try:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert c.host(0) in names and c.switch in names and not c.host(0).startswith("gx-h")
        before = c.bytes_sent()
        send = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                f"s.sendto(b'x' * 1000, ('{c.master_addr}', 9))")
        out = subprocess.run(c.command(1, [sys.executable, "-c", send]), capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert c.bytes_sent() - before >= 1000  # through host 1's shaped link to the switch
    finally:
        c.close()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert c.prefix not in names
