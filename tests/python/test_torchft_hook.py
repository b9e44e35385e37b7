"""gradex.torchft's comm hook: a step that does not commit leaves gradex's state as if it never ran, a replica
that does not take part contributes nothing, and the hook's averages are the Manager's.

Two replica groups are threads of this process with real engines (ProcessGroupGradex and the State's own),
reconfigured as torchft's Manager does; the Manager itself is replaced by a stand-in that answers the calls the
hook makes (quorum, step counter, participation, errors), so that a test decides which steps commit. The hook's
behaviour with the real Manager and Lighthouse is covered by test_torchft_kill_restart.py.
"""
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

pytest.importorskip("torchft")

import torch  # noqa: E402
from torch.distributed import TCPStore  # noqa: E402
from torchft.process_group import reconfigure_with_store  # noqa: E402

import gradex.torchft as gxft  # noqa: E402

# DGC on the first layer's weight (8192 elements), dense fp32 below the threshold.
_CONFIG = {"GRADEX_DENSE_THRESHOLD": "4096", "GRADEX_SPARSITY": "0.99", "GRADEX_FP16": "0"}


class StandInManager:
    """The part of torchft.Manager the hook uses; `commit()` and `discard()` end a step."""

    def __init__(self, participating=True, participants=2):
        self.step = 0
        self.error = None
        self.participating = participating
        self.participants = participants

    def wait_quorum(self):
        pass

    def current_step(self):
        return self.step

    def errored(self):
        return self.error

    def report_error(self, exc):
        self.error = exc

    def num_participants(self):
        return self.participants

    def is_participating(self):
        return self.participating


class Replica:
    def __init__(self, rank, store, prefix, manager):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
        self.manager = manager
        self.pg = gxft.ProcessGroupGradex(timeout=timedelta(seconds=20))
        self.state = gxft.State(manager, self.pg, self.model, config=_CONFIG)
        self.ddp = gxft.DistributedDataParallel(manager, self.model, self.state)
        self.rank, self.store, self.prefix = rank, store, prefix

    def join(self):
        reconfigure_with_store(self.pg, f"localhost:{self.store.port}/{self.prefix}", self.rank, 2)

    def gradients(self, seed):
        """Runs one backward pass on data of `seed`; returns the averaged gradients (copies)."""
        g = torch.Generator().manual_seed(seed * 10 + self.rank)
        self.model.zero_grad()
        out = self.ddp(torch.randn(8, 32, generator=g))
        torch.nn.functional.cross_entropy(out, torch.randint(0, 4, (8,), generator=g)).backward()
        return [p.grad.clone() for p in self.model.parameters()]

    def close(self):
        self.state.close()
        self.pg.shutdown()


def _pair(prefix, managers):
    store = TCPStore(host_name="localhost", port=0, is_master=True, wait_for_workers=False)
    replicas = [Replica(r, store, prefix, managers[r]) for r in range(2)]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda r: r.join(), replicas))
    return store, replicas


def _both(replicas, fn):
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(fn, replicas))


def _equal(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_discarded_step_leaves_gradex_state_as_if_it_never_ran():
    """Run A: steps on data 1, 2 (not committed), 3. Run B: steps on data 1, 3. The third exchange of A and
    the second of B must be bit-identical: the DGC residuals that step 2 changed were rolled back. (Without
    the rollback they differ: step 2's selection would have emptied part of the residual.)"""
    results = {}
    for run, seeds in (("A", [1, 2, 3]), ("B", [1, 3])):
        managers = [StandInManager(), StandInManager()]
        store, replicas = _pair(f"rollback{run}", managers)
        try:
            out = []
            for seed in seeds:
                grads = _both(replicas, lambda r: r.gradients(seed))
                assert _equal(grads[0], grads[1])  # the same average on both replicas
                out.append(grads[0])
                if not (run == "A" and seed == 2):
                    for m in managers:
                        m.step += 1  # committed; a discarded step leaves the counter as it is
            results[run] = out
            assert replicas[0].state.rollbacks == (1 if run == "A" else 0)
        finally:
            _both(replicas, Replica.close)  # together: closing an engine waits for its peers to leave
    assert _equal(results["A"][2], results["B"][1])
    assert not _equal(results["A"][1], results["B"][1])  # the discarded step did exchange something else


def test_a_replica_that_does_not_take_part_contributes_nothing():
    """A healing replica (not participating) submits absent contributions: the average is the participant's
    own gradient, rescaled from 2 members to 1 participant, on both replicas."""
    managers = [StandInManager(participating=True, participants=1),
                StandInManager(participating=False, participants=1)]
    store, replicas = _pair("absent", managers)
    try:
        # The participant alone, on its own data, in dense fp32: its gradient comes back as it is, up to the
        # division by 2 and the multiplication by 2 (exact in binary).
        grads = _both(replicas, lambda r: r.gradients(5))
        assert _equal(grads[0], grads[1])
        g = torch.Generator().manual_seed(50)
        replicas[0].model.zero_grad()
        out = replicas[0].model(torch.randn(8, 32, generator=g))
        torch.nn.functional.cross_entropy(out, torch.randint(0, 4, (8,), generator=g)).backward()
        local = [p.grad for p in replicas[0].model.parameters()]
        # Dense tensors are exact; the DGC tensor sends a top-k and keeps the rest as residual, so it is
        # compared where it was sent.
        for name, got, want in zip([n for n, _ in replicas[0].model.named_parameters()], grads[0], local):
            if got.numel() < 4096:
                assert torch.equal(got, want), name
            else:  # DGC: the selected values travel as fp16
                sent = got != 0
                assert sent.any(), name
                torch.testing.assert_close(got[sent], want[sent], rtol=1e-3, atol=1e-6)
    finally:
        _both(replicas, Replica.close)


def test_failed_exchange_is_reported_and_the_bucket_returned():
    """A replica whose peer is gone reports the error to the Manager and backward completes (torchft then
    discards the step), instead of raising out of backward."""
    managers = [StandInManager(), StandInManager()]
    store, replicas = _pair("failed", managers)
    try:
        _both(replicas, lambda r: r.gradients(1))
        leaving = threading.Thread(target=replicas[1].close)
        leaving.start()
        replicas[0].gradients(2)  # returns
        assert managers[0].errored() is not None
        leaving.join()
    finally:
        replicas[0].close()
