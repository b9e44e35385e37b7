"""gx.LocalSGD with a DDP model: warm-up steps exchange gradients through gradex, local steps submit nothing
(gradients stay each rank's own), averaging rounds make parameters and BatchNorm running statistics equal on
every rank, and the optimizer owns momentum (GRADEX_MOMENTUM defaults to 0 under LocalSGD; a value the
caller sets is kept)."""
import torch_ranks as ranks


def _same_everywhere(tensors):
    import torch
    import torch.distributed as dist
    flat = torch.cat([t.detach().float().reshape(-1) for t in tensors])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return all(torch.equal(g, gathered[0]) for g in gathered)


def _localsgd(rank, world):
    import warnings

    import torch
    import gradex.torch as gx
    from gradex.torch import _momentum, _ops

    submitted = []
    real_submit = _ops.submit

    def counting_submit(engine, key, tensor, **kwargs):
        submitted.append(key)
        return real_submit(engine, key, tensor, **kwargs)
    _ops.submit = counting_submit

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8))
    # broadcast_buffers=False: DDP leaves the running statistics alone, so only LocalSGD can equalise them.
    ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lsgd = gx.LocalSGD(ddp, period=3, warmup_steps=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # the optimizer owns momentum
    gen = torch.Generator().manual_seed(40 + rank)
    log = []
    for _ in range(8):
        del submitted[:]
        opt.zero_grad()
        ddp(torch.randn(16, 32, generator=gen) * (1 + rank)).square().mean().backward()
        grads_same = _same_everywhere([p.grad for p in model.parameters()])
        opt.step()
        averaged = lsgd.step()
        log.append({"submitted": len(submitted), "grads_same": grads_same, "averaged": averaged,
                    "params_same": _same_everywhere(list(model.parameters())),
                    "buffers_same": _same_everywhere([model[1].running_mean, model[1].running_var])})
    momentum = _momentum.gradex_momentum(lsgd.engine, None)
    lsgd.close()
    other = gx.LocalSGD(torch.nn.Linear(4, 4), period=2, config={"GRADEX_MOMENTUM": "0.9"})
    momentum_set = _momentum.gradex_momentum(other.engine, None)  # the caller's choice is kept
    other.close()
    return {"log": log, "momentum": momentum, "warnings": [str(w.message) for w in caught],
            "momentum_set": momentum_set}


def test_localsgd_local_phase_buffers_and_momentum_rule():
    for r in ranks.run(_localsgd, 2, env={"GRADEX_TIMEOUT_S": "60"}, timeout=300):
        log = r["log"]
        # Steps 1-2: synchronous (gradients exchanged, 6 parameters per backward); then local.
        assert [s["submitted"] for s in log] == [6, 6, 0, 0, 0, 0, 0, 0]
        assert [s["grads_same"] for s in log] == [True, True] + [False] * 6
        # Averaging every 3 steps after the warm-up: after steps 5 and 8.
        assert [s["averaged"] for s in log] == [False] * 4 + [True, False, False, True]
        assert [s["params_same"] for s in log] == [True, True, False, False, True, False, False, True]
        assert [s["buffers_same"] for s in log][4] and log[7]["buffers_same"]
        assert not log[2]["buffers_same"]  # different data: the running statistics drift apart locally
        assert r["momentum"] == 0.0 and r["warnings"] == []
        assert r["momentum_set"] == 0.9
