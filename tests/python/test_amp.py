"""Mixed precision through the DDP hook: a GradScaler's scale stays out of gradex's residuals and momenta
(gx.State(ddp, scaler=scaler)), an Inf on one rank makes every rank skip the same step and training
recovers, and bf16 models (bf16 buckets) and bf16 autocast train with ranks bit-identical."""
import collections

import torch_ranks as ranks

# fc1.weight (64x256 = 16384) goes DGC; fc1.bias, fc2.* are dense (fp16 on the wire by default).
_ENV = {"GRADEX_DENSE_THRESHOLD": "4096", "GRADEX_SPARSITY": "0.99", "GRADEX_MOMENTUM": "0.9",
        "GRADEX_TIMEOUT_S": "60"}


def _make(dtype=None):
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(collections.OrderedDict(
        fc1=torch.nn.Linear(256, 64), act=torch.nn.Tanh(), fc2=torch.nn.Linear(64, 40)))
    return model.to(dtype) if dtype is not None else model


def _identical_across_ranks(model):
    import torch
    import torch.distributed as dist
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return all(torch.equal(g, gathered[0]) for g in gathered)


def _batches(rank, steps):
    import torch
    gen = torch.Generator().manual_seed(30 + rank)
    return [torch.randn(8, 256, generator=gen) for _ in range(steps)]


def _train(model, ddp, scaler, xs, inject=None):
    """SGD through DDP; with a scaler the GradScaler recipe. `inject(step)` may register gradient hooks.
    Returns per step (skipped, scale after the step, ranks identical)."""
    import torch
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    log = []
    for step, x in enumerate(xs):
        handles = inject(step) if inject is not None else []
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        loss = ddp(x).square().mean()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        for h in handles:
            h.remove()
        skipped = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        log.append((skipped, scaler.get_scale() if scaler is not None else None, _identical_across_ranks(model)))
    return log


def _scale_changes(rank, world):
    import torch
    import gradex.torch as gx

    xs = _batches(rank, 10)
    runs = {}
    for name in ("unscaled", "scaler_given", "scaler_not_given"):
        model = _make()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        scaler = None if name == "unscaled" else torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)
        state = gx.State(ddp, scaler=scaler if name == "scaler_given" else None)
        ddp.register_comm_hook(state, gx.hook)
        log = _train(model, ddp, scaler, xs)
        runs[name] = ([p.detach().clone() for p in model.parameters()], log, gx.stats(state)["sparse_exchanges"])
        state.close()
    base = runs["unscaled"][0]
    return {"given_equal": all(torch.equal(a, b) for a, b in zip(runs["scaler_given"][0], base)),
            "not_given_equal": all(torch.equal(a, b) for a, b in zip(runs["scaler_not_given"][0], base)),
            "scales": [s for _, s, _ in runs["scaler_given"][1]],
            "sparse": runs["scaler_given"][2]}


def test_grad_scaler_scale_stays_out_of_gradex_state():
    for r in ranks.run(_scale_changes, 2, env=_ENV, timeout=300):
        assert r["sparse"] > 0
        assert len(set(r["scales"])) >= 3, r["scales"]  # the scale grew during the run
        # Powers of two: unscale -> engine -> rescale is exact, so the scaled run is the unscaled run.
        assert r["given_equal"]
        # Without scaler=, residuals and momenta mix gradients of different scales: another trajectory.
        assert not r["not_given_equal"]


def _inf_on_one_rank(rank, world):
    import torch
    import gradex.torch as gx

    bad_step = 4
    model = _make()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=1000)
    state = gx.State(ddp, scaler=scaler)
    ddp.register_comm_hook(state, gx.hook)

    def inject(step):
        if rank != 1 or step != bad_step:
            return []

        def poison(grad):  # one element of a DGC tensor and one of a dense tensor
            grad = grad.clone()
            grad.view(-1)[3] = float("inf")
            return grad
        return [model.fc1.weight.register_hook(poison), model.fc2.bias.register_hook(poison)]

    xs = _batches(rank, 12)
    probe = torch.randn(64, 256, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        first = float(model(probe).square().mean())
    log = _train(model, ddp, scaler, xs, inject)
    with torch.no_grad():
        last = float(model(probe).square().mean())
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    stats = gx.stats(state)
    state.close()
    return {"log": log, "bad_step": bad_step, "first": first, "last": last, "finite": finite,
            "nonfinite": stats["nonfinite"]}


def test_inf_on_one_rank_skips_the_step_everywhere_and_training_recovers():
    results = ranks.run(_inf_on_one_rank, 2, env=_ENV, timeout=300)
    for r in results:
        skipped = [s for s, _, _ in r["log"]]
        scales = [scale for _, scale, _ in r["log"]]
        assert skipped == [i == r["bad_step"] for i in range(len(skipped))], skipped
        assert scales[r["bad_step"]] == scales[r["bad_step"] - 1] / 2  # every rank backed off once
        assert all(identical for _, _, identical in r["log"])
        assert r["finite"] and r["last"] < r["first"], r
    assert results[0]["log"] == results[1]["log"]
    assert results[1]["nonfinite"] > 0


def _bf16(rank, world):
    import torch
    import gradex.torch as gx

    out = {}
    for name in ("bf16_model", "bf16_autocast"):
        model = _make(torch.bfloat16 if name == "bf16_model" else None)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        state = gx.State(ddp)
        seen = set()

        def hook(s, bucket):
            seen.add(bucket.buffer().dtype)
            return gx.hook(s, bucket)
        ddp.register_comm_hook(state, hook)
        xs = [x.to(torch.bfloat16) if name == "bf16_model" else x for x in _batches(rank, 6)]
        probe = xs[0]
        with torch.no_grad():
            first = float(model(probe).float().square().mean())
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name == "bf16_autocast"):
            log = _train(model, ddp, None, xs)
        with torch.no_grad():
            last = float(model(probe).float().square().mean())
        out[name] = {"identical": [i for _, _, i in log], "dtypes": sorted(str(d) for d in seen),
                     "improved": last < first, "sparse": gx.stats(state)["sparse_exchanges"]}
        state.close()
    return out


def test_bf16_models_and_bf16_autocast():
    for r in ranks.run(_bf16, 2, env=_ENV, timeout=300):
        assert r["bf16_model"]["dtypes"] == ["torch.bfloat16"]
        assert r["bf16_autocast"]["dtypes"] == ["torch.float32"]
        for run in r.values():
            assert run["identical"] == [True] * 6
            assert run["improved"] and run["sparse"] > 0, run
