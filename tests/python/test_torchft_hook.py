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
    def __init__(self, rank, store, prefix, manager, config=_CONFIG, scaler=None, tell=True):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
        self.manager = manager
        self.scaler = scaler
        self.pg = gxft.ProcessGroupGradex(timeout=timedelta(seconds=20))
        self.state = gxft.State(manager, self.pg, self.model, config=config,
                                scaler=scaler if tell else None)
        self.ddp = gxft.DistributedDataParallel(manager, self.model, self.state)
        self.rank, self.store, self.prefix = rank, store, prefix

    def join(self):
        reconfigure_with_store(self.pg, f"localhost:{self.store.port}/{self.prefix}", self.rank, 2)

    def gradients(self, seed, inf=False):
        """Runs one backward pass on data of `seed` (the loss scaled by the scaler, if any); returns the
        averaged gradients (copies). `inf`: this replica's first weight gradient gets an Inf."""
        g = torch.Generator().manual_seed(seed * 10 + self.rank)
        self.model.zero_grad()
        handle = self.model[0].weight.register_hook(_with_inf) if inf else None
        out = self.ddp(torch.randn(8, 32, generator=g))
        loss = torch.nn.functional.cross_entropy(out, torch.randint(0, 4, (8,), generator=g))
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        if handle is not None:
            handle.remove()
        return [p.grad.clone() for p in self.model.parameters()]

    def close(self):
        self.state.close()
        self.pg.shutdown()


def _with_inf(grad):
    grad = grad.clone()
    grad.view(-1)[3] = float("inf")
    return grad


def _pair(prefix, managers, config=_CONFIG, scalers=(None, None), tell=True):
    """Two joined replicas; `scalers` scale their losses, given to their States as scaler= if `tell`."""
    store = TCPStore(host_name="localhost", port=0, is_master=True, wait_for_workers=False)
    replicas = [Replica(r, store, prefix, managers[r], config, scalers[r], tell) for r in range(2)]
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


def _committed_run(prefix, config, steps, scalers=(None, None), tell=True):
    """Runs `steps` [(seed, scale to set before the step, ranks with an Inf)], every step committed;
    returns each step's averaged gradients per replica."""
    managers = [StandInManager(), StandInManager()]
    store, replicas = _pair(prefix, managers, config, scalers, tell)
    try:
        out = []
        for step, (seed, scale, infs) in enumerate(steps):
            for r in replicas:
                if r.scaler is not None and step > 0:  # the scaler's scale exists once it has scaled a loss
                    r.scaler.update(scale)  # as after an overflow (halved) or growth (doubled)
            out.append(_both(replicas, lambda r: r.gradients(seed, inf=r.rank in infs)))
            for m in managers:
                m.step += 1
        return out
    finally:
        _both(replicas, Replica.close)


def test_the_hook_clips_by_each_replicas_whole_model_norm():
    """GRADEX_CLIP_NORM = C through the torchft hook, as through gx.State (test_clipping.py): with sparsity 0,
    fp32 and no gradex momentum the average is the average of clip_grad_norm_(local gradient, C / sqrt(2))."""
    clip = 0.05
    config = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0", "GRADEX_MOMENTUM": "0", "GRADEX_CLIP_NORM": str(clip)}
    got = _committed_run("clip", config, [(seed, None, ()) for seed in (1, 2)])
    for step, seed in enumerate((1, 2)):
        assert _equal(got[step][0], got[step][1])
        clipped, raw = [], []
        for rank in range(2):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
            g = torch.Generator().manual_seed(seed * 10 + rank)
            out = model(torch.randn(8, 32, generator=g))
            torch.nn.functional.cross_entropy(out, torch.randint(0, 4, (8,), generator=g)).backward()
            raw.append([p.grad.clone() for p in model.parameters()])
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip / 2 ** 0.5))
            assert norm > clip / 2 ** 0.5  # clipping is active on this replica
            clipped.append([p.grad.clone() for p in model.parameters()])
        for got_p, a, b, ra, rb in zip(got[step][0], *clipped, *raw):
            want, unclipped = (a + b) / 2, (ra + rb) / 2
            assert float((got_p - want).abs().max() / want.abs().max()) <= 1e-5
            assert float((got_p - unclipped).abs().max() / unclipped.abs().max()) > 1e-2  # and it changed it


def test_a_grad_scalers_scale_stays_out_of_gradex_state():
    """With scaler= the GradScaler's scale (changed between steps, as after an overflow or a growth) stays
    out of the DGC residuals and momenta, as under gx.State (test_amp.py): each step's average divided by its
    scale is bit-identical to the unscaled run's. Without scaler= the residuals mix scales and it is not.
    An Inf on one replica reaches both replicas' averages (GRADEX_NONFINITE=propagate), so every GradScaler
    skips that step."""
    config = dict(_CONFIG, GRADEX_MOMENTUM="0.9", GRADEX_FP16="1")
    scales = [2.0 ** 8, 2.0 ** 10, 2.0 ** 6, 2.0 ** 6]
    plan = [(seed, s, ()) for seed, s in zip((1, 2, 3, 4), scales)]
    plain = _committed_run("amp-plain", config, plan)

    def scalers():
        return tuple(torch.amp.GradScaler("cpu", init_scale=scales[0]) for _ in range(2))
    given = _committed_run("amp-given", config, plan, scalers())
    for step, scale in enumerate(scales):
        for rank in range(2):
            assert _equal([g / scale for g in given[step][rank]], plain[step][rank]), (step, rank)
    # Without scaler= the engine sees scaled gradients: residuals kept at 2^8 are added to gradients at 2^10.
    not_given = _committed_run("amp-not-given", config, plan, scalers(), tell=False)
    assert not _equal([g / scales[1] for g in not_given[1][0]], plain[1][0])
    # An Inf in replica 1's first weight gradient: both averages of that tensor are non-finite.
    inf = _committed_run("amp-inf", config, [(1, None, (1,))], scalers())
    for rank in range(2):
        assert not bool(torch.isfinite(inf[0][rank][0]).all()), rank
