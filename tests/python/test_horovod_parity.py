"""Horovod parity for PyTorch without DDP, on real processes: rank/size/local rank,
broadcast_parameters and broadcast_optimizer_state (ranks bit-identical afterwards), allreduce (Sum exact),
join() with uneven inputs, DistributedOptimizer leaving frozen parameters alone, engines owned by objects."""
import torch_ranks as ranks

_EXACT = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0", "GRADEX_TIMEOUT_S": "60"}


def _plain(value):
    """Tensors as (dtype, shape, raw bytes), recursively: results travel back to the test as plain data (torch
    shares returned tensors through the dead rank's shared memory), and equal tuples mean equal bits."""
    import torch
    if isinstance(value, torch.Tensor):
        flat = value.detach().reshape(-1).contiguous().cpu()
        return ("tensor", str(value.dtype), tuple(value.shape), flat.view(torch.uint8).numpy().tobytes()
                if flat.numel() else b"")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def _tensor(plain):
    import torch
    _, dtype, shape, raw = plain
    dtype = getattr(torch, dtype.split(".")[1])
    if not raw:
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)


def _model(seed):
    import torch
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 3))
    return model


def _broadcast_and_collectives(rank, world):
    import torch
    import gradex.torch as gx

    out = {"rank": gx.rank(), "size": gx.size(), "local": (gx.local_rank(), gx.local_size())}
    model = _model(seed=100 + rank)  # every rank starts elsewhere
    model(torch.randn(8, 12)).sum().backward()  # BatchNorm statistics and num_batches_tracked differ too
    opt = torch.optim.AdamW(model.parameters(), lr=0.01 * (rank + 1), weight_decay=0.1)
    if rank == 1:
        opt.step()  # state (exp_avg, exp_avg_sq, step) only where the root has none
    gx.broadcast_parameters(model.state_dict(), root_rank=1)
    gx.broadcast_optimizer_state(opt, root_rank=1)
    out["params"] = {k: v.clone() for k, v in model.state_dict().items()}
    out["opt"] = opt.state_dict()
    out["opt"] = {"param_groups": out["opt"]["param_groups"], "state": out["opt"]["state"]}
    # allreduce: Sum is exact for integers and for floats that sum exactly; Average is the fp32 average.
    ints = torch.arange(5, dtype=torch.int64) * (rank + 1) + 2**40
    out["sum_int"] = gx.allreduce(ints, op=gx.Sum)
    out["sum_float"] = gx.allreduce(torch.tensor([0.1, 1e8, 3.0]) * (rank + 1), op=gx.Sum)
    out["avg"] = gx.allreduce(torch.full((3, 2), float(rank), dtype=torch.bfloat16), op=gx.Average)
    out["object"] = gx.broadcast_object({"epoch": 7 if rank == 0 else -1, "rank": rank}, root_rank=0)
    try:
        gx.allreduce(torch.zeros(2, dtype=torch.int32), op=gx.Average)
        out["int_average"] = None
    except gx.InvalidArgumentError as exc:
        out["int_average"] = str(exc)
    try:
        gx.broadcast_parameters({"w": torch.zeros(3 + rank)}, root_rank=0)
        out["mismatch"] = None
    except gx.MismatchError as exc:
        out["mismatch"] = str(exc)
    return _plain(out)


def _check_broadcast(results, world):
    import torch

    root = results[1]
    for rank, r in enumerate(results):
        assert r["rank"] == rank and r["size"] == world and r["local"] == (rank, world)
        assert r["params"] == root["params"]  # every dtype (float, int64 num_batches_tracked), bit for bit
        assert r["opt"] == root["opt"] and root["opt"]["state"]
        assert torch.equal(_tensor(r["sum_int"]), sum(torch.arange(5, dtype=torch.int64) * (k + 1) + 2**40
                                                      for k in range(world)))
        exact = [sum(v * (k + 1) for k in range(world)) for v in (0.1, 1e8, 3.0)]
        assert _tensor(r["sum_float"]).tolist() == torch.tensor(exact, dtype=torch.float64).float().tolist()
        assert r["sum_float"] == results[0]["sum_float"]
        assert torch.equal(_tensor(r["avg"]), torch.full((3, 2), (world - 1) / 2, dtype=torch.bfloat16))
        assert r["object"] == {"epoch": 7, "rank": 0}
        assert "gx.Sum" in r["int_average"]
        assert r["mismatch"] and "different tensors" in r["mismatch"]


def test_broadcast_and_allreduce_with_a_process_group():
    _check_broadcast(ranks.run(_broadcast_and_collectives, 2, env=_EXACT), 2)


def test_broadcast_and_allreduce_without_a_process_group():
    """Only the launcher's variables (RANK, WORLD_SIZE, MASTER_ADDR/PORT): gradex's own store and launch
    detection."""
    _check_broadcast(ranks.run(_broadcast_and_collectives, 3, env=_EXACT, process_group=False), 3)


def _frozen(rank, world):
    import torch
    import gradex.torch as gx

    model = _model(seed=0)
    frozen = model[0]
    for p in frozen.parameters():
        p.requires_grad_(False)
    unused = torch.nn.Linear(3, 3)  # trains, but never gets a gradient
    params = list(model.named_parameters()) + [("unused." + n, p) for n, p in unused.named_parameters()]
    before = {n: p.detach().clone() for n, p in params}
    inner = torch.optim.AdamW([p for _, p in params], lr=0.05, weight_decay=0.5)
    with gx.DistributedOptimizer(inner, named_parameters=params) as opt:
        torch.manual_seed(rank)
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(8, 12)).pow(2).mean().backward()
            opt.step()
        registered = gx.stats(opt)["tensors"]
    engine_closed = opt.engine.address == 0
    return {"frozen_same": all(torch.equal(p, before[n]) for n, p in params if n.startswith("0.")),
            "unused_same": all(torch.equal(p, before[n]) for n, p in params if n.startswith("unused.")),
            "unused_grad": [p.grad is None for n, p in params if n.startswith("unused.")],
            "trained_moved": not torch.equal(model[3].weight, before["3.weight"]),
            "tensors": registered, "closed": engine_closed,
            "final": _plain([p.detach() for _, p in params])}


def test_distributed_optimizer_leaves_frozen_parameters_bit_unchanged():
    results = ranks.run(_frozen, 2, env=_EXACT)
    for r in results:
        assert r["frozen_same"] and r["unused_same"] and r["trained_moved"] and r["closed"]
        assert r["unused_grad"] == [True, True]
        # 5 steps x the 6 trainable tensors (BatchNorm's 2, the last Linear's 2, unused's 2); the frozen 2 never.
        assert r["tensors"] == 5 * 6, r["tensors"]
    assert results[0]["final"] == results[1]["final"]


def _uneven(rank, world, steps_of):
    import copy

    import torch
    import gradex.torch as gx

    torch.manual_seed(0)
    model = torch.nn.Linear(6, 2)
    # SGD with momentum kept by the optimizer (GRADEX_MOMENTUM=0): the exchange is the plain average.
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = gx.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), uneven_inputs=True,
                                  config={"GRADEX_MOMENTUM": "0"})
    assert sgd.param_groups[0]["momentum"] == 0.9
    grads = []
    for step in range(steps_of[rank]):
        torch.manual_seed(1000 * step + rank)
        x = torch.randn(4, 6)
        twin = copy.deepcopy(model)  # this rank's own gradient, computed beside the exchanged one
        twin(x).pow(2).sum().backward()
        local = [p.grad.clone() for p in twin.parameters()]
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.synchronize()
        grads.append(([p.grad.clone() for p in model.parameters()], local))
        opt.step()
    mirrored = gx.join()
    gx.broadcast_parameters(model.named_parameters(), root_rank=0)  # rank 0 trained longest
    weights = [p.detach().clone() for p in model.parameters()]
    opt.close()
    return _plain({"grads": grads, "mirrored": mirrored, "weights": weights})


def test_join_with_uneven_inputs_averages_over_the_ranks_still_training():
    import torch

    steps_of = [6, 3, 4]
    results = ranks.run(_uneven, 3, env=_EXACT, args=(steps_of,))
    for rank, r in enumerate(results):
        assert len(r["grads"]) == steps_of[rank]
        assert r["mirrored"] == max(steps_of) - steps_of[rank]
        assert r["weights"] == results[0]["weights"]
    for step in range(max(steps_of)):
        training = [k for k in range(3) if steps_of[k] > step]
        expected = [sum(_tensor(results[k]["grads"][step][1][i]).double() for k in training) / len(training)
                    for i in range(2)]
        for k in training:
            for got, want in zip(results[k]["grads"][step][0], expected):
                torch.testing.assert_close(_tensor(got).double(), want, rtol=1e-6, atol=1e-7)


def _uneven_default_policy(rank, world, steps_of):
    import copy

    import torch
    import gradex.torch as gx

    torch.manual_seed(0)
    model = torch.nn.Linear(200, 100)  # the weight (20,000 elements) is DGC, the bias dense
    # SGD's momentum moves into gradex (DGC's momentum correction): each rank keeps its own u.
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    opt = gx.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), uneven_inputs=True)
    assert sgd.param_groups[0]["momentum"] == 0
    grads = []
    for step in range(steps_of[rank]):
        torch.manual_seed(1000 * step + rank)
        x = torch.randn(8, 200)
        twin = copy.deepcopy(model)  # this rank's own gradient, computed beside the exchanged one
        twin(x).pow(2).sum().backward()
        local = [p.grad.clone() for p in twin.parameters()]
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.synchronize()
        grads.append(([p.grad.clone() for p in model.parameters()], local))
        opt.step()
    mirrored = gx.join()
    stats = opt._engine.stats()
    opt.close()
    return _plain({"grads": grads, "mirrored": mirrored, "sparse": stats["sparse_exchanges"],
                   "fallbacks": stats["dense_fallbacks"]})


def _check_uneven_default_policy(results, steps_of, sparse):
    """Every training rank gets bit-identical averages. Dense steps (the bias always; the DGC weight during its
    warm-up, which sends u whole): the mean over the ranks still training of each one's own momentum
    u_k = 0.9 u_k + g_k, summed over its training steps only (a joined rank adds no momentum). Sparse steps:
    at most k elements per training rank are non-zero."""
    import torch

    u = {k: [None, None] for k in range(3)}
    for step in range(max(steps_of)):
        training = [k for k in range(3) if steps_of[k] > step]
        for k in training:
            local = [_tensor(g).double() for g in results[k]["grads"][step][1]]
            u[k] = [l if b is None else 0.9 * b + l for b, l in zip(u[k], local)]
            assert results[k]["grads"][step][0] == results[training[0]]["grads"][step][0], (step, k)
        got = [_tensor(g).double() for g in results[training[0]]["grads"][step][0]]
        expected = [sum(u[k][i] for k in training) / len(training) for i in range(2)]
        # fp32 arithmetic on values of |u| <= ~60: a few ulps of the largest.
        torch.testing.assert_close(got[1], expected[1], rtol=1e-5, atol=1e-4)
        if sparse:
            k_per_rank = max(1, round(20000 * 0.001))
            assert 0 < int(torch.count_nonzero(got[0])) <= len(training) * int(k_per_rank * 1.3) + 1, step
        else:
            torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-4)


def test_join_with_dgc_and_gradex_momentum_averages_over_the_ranks_still_training():
    """Default policy (DGC above GRADEX_DENSE_THRESHOLD) with SGD's momentum in gradex. A long warm-up keeps the
    DGC weight on dense steps (density 0.25 >= 1/(2P)), whose results are exact; then the same with sparse
    steps."""
    steps_of = [6, 3, 4]
    env = {"GRADEX_DENSE_THRESHOLD": "10000", "GRADEX_FP16": "0", "GRADEX_TIMEOUT_S": "60"}
    for warmup, sparse in (("400", False), ("0", True)):
        results = ranks.run(_uneven_default_policy, 3, env=dict(env, GRADEX_WARMUP_STEPS=warmup),
                            args=(steps_of,))
        for rank, r in enumerate(results):
            assert len(r["grads"]) == steps_of[rank]
            assert r["mirrored"] == max(steps_of) - steps_of[rank]
            assert (r["sparse"] > 0) == sparse and (r["fallbacks"] > 0) != sparse, (r["sparse"], r["fallbacks"])
        _check_uneven_default_policy(results, steps_of, sparse)


def _stats_sources(rank, world):
    import torch
    import gradex
    import gradex.torch as gx

    model = torch.nn.Linear(4, 4)
    opt = gx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    out = {"opt": gx.stats(opt)["tensors"], "engine": gx.stats(opt.engine)["tensors"],
           "last": gx.stats(opt, last_step=True)["steps"], "latest": gx.stats()["steps"]}
    try:
        gx.stats(42)
    except gradex.InvalidArgumentError as exc:
        out["bad"] = str(exc)
    opt.close()
    opt.close()  # idempotent
    try:
        opt.step()
        out["closed"] = None
    except gradex.InvalidArgumentError as exc:
        out["closed"] = str(exc)
    return out


def test_stats_takes_its_source():
    for r in ranks.run(_stats_sources, 2, env=_EXACT):
        assert r["opt"] == 2 and r["engine"] == 2 and r["last"] == 1 and r["latest"] == 1
        assert "not int" in r["bad"] and "closed" in r["closed"]


def _owned_engines(rank, world):
    import gc

    import torch
    import gradex.torch as gx

    out = {}
    model = torch.nn.Linear(4, 4)
    with gx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)) as opt:
        model(torch.randn(2, 4)).sum().backward()  # a gradient in flight when the block ends: close() drains it
        engine = opt.engine
        out["owned_momentum"] = opt.param_groups[0]["momentum"]
    out["closed_by_with"] = engine.address == 0
    out["momentum_back"] = opt.param_groups[0]["momentum"]
    opt = gx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    engine = opt.engine
    del opt
    gc.collect()
    out["closed_by_gc"] = engine.address == 0
    with gx.LocalSGD(model, period=2) as lsgd:
        engine = lsgd.engine
    out["localsgd_closed"] = engine.address == 0
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    with gx.State(ddp) as state:
        ddp.register_comm_hook(state, gx.hook)
        ddp(torch.randn(2, 4)).sum().backward()
        engine = state.engine
    out["state_closed"] = engine.address == 0
    return out


def test_objects_own_their_engines():
    for r in ranks.run(_owned_engines, 2, env=_EXACT):
        assert r == {"owned_momentum": 0.0, "closed_by_with": True, "momentum_back": 0.9, "closed_by_gc": True,
                     "localsgd_closed": True, "state_closed": True}, r
