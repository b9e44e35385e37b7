"""gx.hook under DDP(gradient_as_bucket_view=True), the setting that spares DDP its two copies of every
gradient a step (into the bucket before the hook, back out after it): the parameters' .grad are then views
of the bucket the hook writes. On real processes: at sparsity 0 and fp32 the gradients equal gloo's average
exactly, and through each compressed route (SGD momentum handed to gradex, as gx.State(ddp, optimizer=...)
arranges) training ends on the same bits with and without the views. The routes are named explicitly: the
auto policy picks codecs from times it measures, so two of its runs need not pick the same ones."""
import pytest

import torch_ranks as ranks
from test_hook_exact import _check_exact, _hook_vs_gloo

STEPS = 6
_TIMEOUT = {"GRADEX_TIMEOUT_S": "60"}


def _model():
    import torch
    torch.manual_seed(0)  # the same model on every rank and in both runs
    return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.Tanh(), torch.nn.Linear(512, 512),
                               torch.nn.Tanh(), torch.nn.Linear(512, 10))


def test_bucket_view_gradients_equal_gloo_average():
    env = dict(_TIMEOUT, GRADEX_SPARSITY="0", GRADEX_FP16="0", GRADEX_MOMENTUM="0")
    results = ranks.run(_hook_vs_gloo, 2, env=env, args=(False, True))
    _check_exact(results)  # every iteration through gradex, per parameter, equal to gloo's average
    for r in results:
        assert r["storages"] < r["params"], r  # .grad really were views of a shared bucket


def _train(rank, world, bucket_view):
    """Parameters after STEPS steps of SGD momentum through gx.hook, with or without bucket views."""
    import torch
    import torch.nn.functional as F
    import gradex.torch as gx

    model = _model()
    ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=bucket_view)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = gx.State(ddp, optimizer=opt)
    ddp.register_comm_hook(state, gx.hook)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x, y = torch.randn(16, 64, generator=gen), torch.randint(0, 10, (16,), generator=gen)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
    stats = gx.stats(state)
    state.close()
    return [p.detach().clone() for p in model.parameters()], stats


def _with_and_without_views(rank, world):
    import torch

    initial = [p.detach().clone() for p in _model().parameters()]
    copied, copied_stats = _train(rank, world, False)
    viewed, viewed_stats = _train(rank, world, True)
    return {"equal": all(torch.equal(a, b) for a, b in zip(copied, viewed)),
            "moved": max(float((a - b).abs().max()) for a, b in zip(copied, initial)),
            "ratio": (copied_stats["compression_ratio"], viewed_stats["compression_ratio"])}


@pytest.mark.parametrize("settings", [
    {"GRADEX_POLICY": "fixed", "GRADEX_WARMUP_STEPS": "3"},  # DGC's warm-up ramp, then 99.9 %
    {"GRADEX_SPARSITY": "0.99", "GRADEX_WARMUP_STEPS": "0"},
    {"GRADEX_SPARSITY_OVERRIDES": "*:int4", "GRADEX_DENSE_THRESHOLD": "0"},  # the race's 4-bit rung
], ids=["dgc_ramp", "sparsity_0.99", "int4"])
def test_bucket_view_trains_to_the_same_bits(settings):
    for r in ranks.run(_with_and_without_views, 2, env=dict(_TIMEOUT, **settings), timeout=240):
        assert r["moved"] > 1e-3, r  # training did move the parameters
        assert min(r["ratio"]) > 5, r  # both runs took a compressed route (their control bytes may differ)
        assert r["equal"], r
