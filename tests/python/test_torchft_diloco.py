"""gradex's DiLoCo as the outer loop of a torchft job (gradex.torchft.DiLoCo).

In this process (a stand-in Manager that decides which syncs commit, a real ProcessGroupGradex and outer
optimizer over a real store): a sync that does not commit (merged at once, or streamed: merged a step after it
started) leaves the shared outer state and the parameters exactly as they were before it, and it runs again; corrupt, foreign or mismatched outer state is
refused and changes nothing.

With real processes and torchft's Lighthouse (tests/python/torchft_diloco_worker.py): a healthy run ends with
bit-identical parameters, global copies and shared outer state on every replica (4-bit; 8-bit with two
streamed fragments); a replica killed while a sync is starting makes the survivors roll that sync back and go
on without it, and when it is started again it receives the outer state from a peer through torchft's
recovery, after which every replica holds the same bits again.

Skipped when torchft is absent.
"""
import json
import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest

pytest.importorskip("torchft")

import torch  # noqa: E402
from torch.distributed import TCPStore  # noqa: E402
from torchft._torchft import LighthouseServer  # noqa: E402
from torchft.process_group import reconfigure_with_store  # noqa: E402

import gradex  # noqa: E402
import gradex.torchft as gxft  # noqa: E402

_WORKER = os.path.join(os.path.dirname(__file__), "torchft_diloco_worker.py")
_DEADLINE_S = 180  # per phase: the machine may be busy; a hang still fails the test
_KEY = "gradex.torchft.DiLoCo"


# --- in this process ------------------------------------------------------------------------------------


class StandInManager:
    """The part of torchft.Manager that DiLoCo uses; `plan` lists the commit decisions of the next syncs."""

    _use_async_quorum = False

    def __init__(self, pg):
        self._pg = pg
        self.step = 0
        self.error = None
        self.plan = []
        self.fns = {}

    def register_state_dict_fn(self, key, load, save):
        self.fns[key] = (load, save)

    def start_quorum(self):
        self.error = None

    def errored(self):
        return self.error

    def report_error(self, exc):
        self.error = exc

    def should_commit(self):
        ok = (self.plan.pop(0) if self.plan else True) and self.error is None
        self.step += ok
        return ok

    def current_step(self):
        return self.step

    def allow_state_dict_read(self):
        pass

    def disallow_state_dict_read(self):
        pass


class Alone:
    """One replica (world 1): model, inner AdamW, ProcessGroupGradex, stand-in Manager, DiLoCo."""

    def __init__(self, store, prefix, hidden=32, **diloco_args):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 3))
        self.inner = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.after_inner = None
        self.inner.register_step_post_hook(self._record)  # runs before DiLoCo's hook
        self.pg = gxft.ProcessGroupGradex(timeout=timedelta(seconds=20))
        self.manager = StandInManager(self.pg)
        self.diloco = gxft.DiLoCo(self.manager, self.model, self.inner, **diloco_args).__enter__()
        reconfigure_with_store(self.pg, f"localhost:{store.port}/{prefix}", 0, 1)
        self.steps = 0

    def _record(self, *_):
        self.after_inner = [p.detach().clone() for p in self.model.parameters()]

    def inner_step(self):
        g = torch.Generator().manual_seed(self.steps)
        x = torch.randn(16, 8, generator=g)
        self.inner.zero_grad()
        torch.nn.functional.cross_entropy(self.model(x), x[:, :3].argmax(1)).backward()
        self.inner.step()
        self.steps += 1

    def params(self):
        return [p.detach().clone() for p in self.model.parameters()]

    def close(self):
        self.diloco.close()
        self.pg.shutdown()


def _bits_equal(a, b):
    return all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(a, b))


@pytest.fixture
def store():
    return TCPStore("localhost", 0, is_master=True, wait_for_workers=False)


def test_a_sync_that_does_not_commit_is_rolled_back_exactly(store):
    r = Alone(store, "rollback", sync_every=2, bits=4)
    try:
        for _ in range(4):  # two committed syncs
            r.inner_step()
        assert r.diloco.commits == 2 and r.manager.step == 2
        r.inner_step()
        before = r.diloco.shared_state()  # as of the step before the next sync
        r.manager.plan = [False]
        r.inner_step()  # the sync runs (exchange, outer step, merge) and does not commit
        assert r.diloco.rollbacks == 1 and r.diloco.commits == 2
        assert r.diloco.shared_state() == before, "the outer state is not what it was before the sync"
        assert _bits_equal(r.params(), r.after_inner), "the parameters are not the local ones of before the merge"
        r.inner_step()  # the sync runs again and commits
        assert r.diloco.commits == 3 and r.manager.step == 3
        after = r.diloco.shared_state()
        assert after != before
        assert _bits_equal(r.params(), list(r.diloco.global_parameters().values()))  # merged: the global copy
    finally:
        r.close()


def test_a_streamed_sync_that_does_not_commit_is_rolled_back_exactly(store):
    # Two fragments, each sync merged one step after it starts (the exchange runs in the background meanwhile).
    r = Alone(store, "streamed", sync_every=4, fragments=2, fragment_sync_delay=1, bits=8)
    try:
        while r.diloco.commits < 2 or r.diloco.in_flight:
            r.inner_step()
        before = r.diloco.shared_state()
        while not r.diloco.in_flight:  # up to the step that starts the next sync
            before = r.diloco.shared_state()
            r.inner_step()
        r.manager.plan = [False]
        r.inner_step()  # merged, not committed
        assert r.diloco.rollbacks == 1 and not r.diloco.in_flight
        assert r.diloco.shared_state() == before, "the outer state is not what it was before the sync"
        assert _bits_equal(r.params(), r.after_inner), "the parameters are not the local ones of before the merge"
        r.inner_step()  # started again
        assert r.diloco.in_flight
        r.inner_step()
        assert r.diloco.commits == 3 and r.diloco.shared_state() != before
    finally:
        r.close()


def test_corrupt_foreign_or_mismatched_state_is_refused(store):
    r = Alone(store, "good", sync_every=2, bits=4)
    eight = Alone(store, "eight", sync_every=2, bits=8)
    wider = Alone(store, "wider", hidden=33, sync_every=2, bits=4)
    try:
        for _ in range(4):
            r.inner_step()
        load, save = r.manager.fns[_KEY]
        state = save()
        shared = r.diloco.shared_state()
        assert state["shared"].numpy().tobytes() == shared
        corrupt = state["shared"].clone()
        corrupt[-3] ^= 0x40
        with pytest.raises(gradex.CorruptError, match="checksum"):
            load({"format": state["format"], "shared": corrupt})
        with pytest.raises(gradex.StateError, match="not a gradex.torchft.DiLoCo/1 state"):
            load({"format": "torchft.DiLoCo", "shared": state["shared"]})
        own = torch.frombuffer(bytearray(r.diloco.engine.save_state()), dtype=torch.uint8)
        with pytest.raises(gradex.StateError, match="not a DiLoCo shared state"):
            load({"format": state["format"], "shared": own})
        assert r.diloco.shared_state() == shared, "a refused state changed the outer state"
        with pytest.raises(gradex.StateError, match="GRADEX_OUTER_BITS"):
            eight.manager.fns[_KEY][0](state)
        with pytest.raises(gradex.StateError, match="tensor"):
            wider.manager.fns[_KEY][0](state)
        load(state)  # its own state loads, bit for bit
        assert r.diloco.shared_state() == shared
    finally:
        for x in (r, eight, wider):
            x.close()


def test_constructor_checks():
    pg = gxft.ProcessGroupGradex(timeout=timedelta(seconds=5))
    model = torch.nn.Linear(4, 2)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = StandInManager(pg)
    with pytest.raises(gradex.ConfigError, match="multiple of fragments"):
        gxft.DiLoCo(manager, model, inner, sync_every=3, fragments=2)
    with pytest.raises(gradex.ConfigError, match="fragment_sync_delay"):
        gxft.DiLoCo(manager, model, inner, sync_every=4, fragments=2, fragment_sync_delay=2)
    with pytest.raises(gradex.ConfigError, match="bits"):
        gxft.DiLoCo(manager, model, inner, sync_every=4, bits=6)
    manager._use_async_quorum = True
    with pytest.raises(ValueError, match="use_async_quorum=False"):
        gxft.DiLoCo(manager, model, inner, sync_every=4)


# --- real processes, real Lighthouse ----------------------------------------------------------------------


def _progress(out, replica):
    try:
        with open(os.path.join(out, f"replica{replica}.step")) as f:
            return tuple(int(v) for v in f.read().split())  # step commits rollbacks heals inner_steps
    except (OSError, ValueError):
        return None


def _field(out, replica, i):
    p = _progress(out, replica)
    return p[i] if p else -1


def _wait_for(what, condition, procs):
    deadline = time.monotonic() + _DEADLINE_S
    while time.monotonic() < deadline:
        if condition():
            return
        for replica, proc in procs.items():
            if proc is not None and proc.poll() not in (None, 0):
                log = open(proc.log_path).read()[-3000:]
                raise AssertionError(f"replica {replica} exited with {proc.returncode} while waiting for {what}:"
                                     f"\n{log}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _start(replica, lighthouse, out, *extra):
    path = os.path.join(out, f"replica{replica}.log")
    log = open(path, "a")
    proc = subprocess.Popen([sys.executable, _WORKER, "--replica", str(replica), "--lighthouse", lighthouse,
                             "--out", out, *extra], stdout=log, stderr=subprocess.STDOUT)
    proc.log_path = path
    return proc


def _stop_and_compare(out, procs, compare_params):
    """Stops every replica after the same committed sync; their outputs must be bit-identical."""
    stop_at = max(_field(out, r, 0) for r in procs) + 2
    with open(os.path.join(out, "stop.tmp"), "w") as f:
        f.write(str(stop_at))
    os.replace(os.path.join(out, "stop.tmp"), os.path.join(out, "stop"))
    for r, proc in procs.items():
        proc.wait(timeout=_DEADLINE_S)
        assert proc.returncode == 0, open(proc.log_path).read()[-3000:]
    results = {r: torch.load(os.path.join(out, f"replica{r}.pt")) for r in procs}
    first = results[0]
    for r, res in results.items():
        assert res["step"] == first["step"], (r, res["step"], first["step"])
        assert res["shared"] == first["shared"], f"replica {r}'s shared outer state differs from replica 0's"
        for name, value in first["global"].items():
            assert torch.equal(res["global"][name].view(torch.int32), value.view(torch.int32)), (r, name)
        if compare_params:
            for name, value in first["params"].items():
                assert torch.equal(res["params"][name].view(torch.int32), value.view(torch.int32)), (r, name)
    return {r: json.load(open(os.path.join(out, f"replica{r}.stats"))) for r in procs}


def test_healthy_streaming_8bit_run_is_bit_identical(tmp_path):
    bits, fragments, delay = 8, 2, 1  # 4-bit with one fragment: test_killed_replica_rejoins_with_the_outer_state
    out = str(tmp_path)
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=10000, heartbeat_timeout_ms=2000)
    procs = {}
    try:
        args = ["--bits", str(bits), "--fragments", str(fragments), "--delay", str(delay), "--replicas", "2"]
        for r in range(2):
            procs[r] = _start(r, lighthouse.address(), out, *args)
        _wait_for("3 committed syncs everywhere", lambda: all(_field(out, r, 1) >= 3 for r in range(2)), procs)
        stats = _stop_and_compare(out, procs, compare_params=fragments == 1)
        for s in stats.values():
            # 4-bit: ~7x fewer bytes than an fp32 ring; 8-bit: ~3.8x (block scales included)
            assert s["compression_ratio"] > (5.0 if bits == 4 else 3.0), s
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        lighthouse.shutdown()


def test_killed_replica_rejoins_with_the_outer_state(tmp_path):
    out = str(tmp_path)
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=10000, heartbeat_timeout_ms=2000)
    procs = {}
    args = ["--delay", "1"]
    try:
        for r in range(3):
            procs[r] = _start(r, lighthouse.address(), out, *args, *(["--die-when-told"] if r == 2 else []))
        _wait_for("2 syncs of all three together",
                  lambda: all(_field(out, r, 1) >= 2 for r in range(3)) and len({_field(out, r, 0) for r in range(3)})
                  == 1, procs)
        # Replica 2 kills itself when the next quorum of all three has formed: the survivors' exchange fails.
        with open(os.path.join(out, "die"), "w"):
            pass
        _wait_for("replica 2 to die", lambda: procs[2].poll() is not None,
                  {r: p for r, p in procs.items() if r != 2})
        assert procs[2].returncode == -9
        killed_time = time.monotonic()
        killed_at = max(_field(out, 0, 0), _field(out, 1, 0))
        survivors = {0: procs[0], 1: procs[1]}
        _wait_for("a survivor's commit", lambda: max(_field(out, 0, 0), _field(out, 1, 0)) > killed_at, survivors)
        survivor_s = time.monotonic() - killed_time
        _wait_for("2 more syncs of the survivors", lambda: min(_field(out, r, 0) for r in (0, 1)) >= killed_at + 2,
                  survivors)
        for r in (0, 1):  # the sync the dead replica was part of did not commit and was rolled back
            assert _field(out, r, 2) >= 1, _progress(out, r)
        for name in ("replica2.step", "replica2.started", "die"):
            os.remove(os.path.join(out, name))
        procs[2] = _start(2, lighthouse.address(), out, *args)
        started = time.monotonic()
        rejoin_at = max(_field(out, 0, 0), _field(out, 1, 0))
        _wait_for("the restarted replica's first commit", lambda: _field(out, 2, 1) >= 1, procs)
        rejoin_s = time.monotonic() - started
        _wait_for("the restarted replica's second commit", lambda: _field(out, 2, 1) >= 2, procs)
        step, commits, rollbacks, heals, _ = _progress(out, 2)
        assert heals >= 1 and step > rejoin_at, _progress(out, 2)  # it took the outer state from a peer
        print(f"\n[torchft DiLoCo] survivors committed {survivor_s:.1f} s after the kill; the restarted replica "
              f"committed its first sync {rejoin_s:.1f} s after its start")
        _stop_and_compare(out, procs, compare_params=True)
    finally:
        for proc in procs.values():
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        lighthouse.shutdown()
