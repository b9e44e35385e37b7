"""The DDP hook exchanges each bucket per parameter, keyed by parameter name: the engine's policy decides per
tensor (small ones dense, large ones DGC, GRADEX_SPARSITY_OVERRIDES by name), the averages land in DDP's
bucket, and a checkpoint keyed by names survives a change of bucket_cap_mb."""
import pytest
import torch_ranks as ranks

# fc1.weight (64x256 = 16384) and fc2.weight (160x64 = 10240) go DGC above this threshold; biases dense.
_ENV = {"GRADEX_DENSE_THRESHOLD": "4096", "GRADEX_SPARSITY": "0.99", "GRADEX_MOMENTUM": "0.9",
        "GRADEX_TIMEOUT_S": "60"}


def _make():
    import collections

    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(collections.OrderedDict(
        fc1=torch.nn.Linear(256, 64), act=torch.nn.Tanh(), fc2=torch.nn.Linear(64, 160)))


def _identical_across_ranks(model):
    import torch
    import torch.distributed as dist
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return all(torch.equal(g, gathered[0]) for g in gathered)


def _policy_per_parameter(rank, world, overrides):
    import torch
    import gradex.torch as gx

    model = _make()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    config = {"GRADEX_SPARSITY_OVERRIDES": overrides} if overrides else {}
    state = gx.State(ddp, config=config)
    ddp.register_comm_hook(state, gx.hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(10 + rank)
    identical = []
    for _ in range(4):
        opt.zero_grad()
        ddp(torch.randn(8, 256, generator=gen)).square().mean().backward()
        opt.step()
        identical.append(_identical_across_ranks(model))
    stats = gx.stats(state)
    keys = sorted(state.state_dict()["tensors"])
    state.close()
    return {"identical": identical, "stats": stats, "keys": keys, "iteration": state.iteration}


@pytest.mark.parametrize("overrides,sparse_per_step", [("", 2), ("fc2.weight:dense", 1)])
def test_policy_decides_per_parameter_by_name(overrides, sparse_per_step):
    for r in ranks.run(_policy_per_parameter, 2, env=_ENV, args=(overrides,)):
        assert r["keys"] == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
        assert r["identical"] == [True] * 4
        # With parameter names the engine runs from DDP's first iteration: 4 steps x 4 tensors.
        assert r["stats"]["steps"] == 4 and r["stats"]["tensors"] == 16
        assert r["stats"]["sparse_exchanges"] + r["stats"]["dense_fallbacks"] == 4 * sparse_per_step


def _checkpoint_across_bucket_sizes(rank, world):
    import copy

    import torch
    import gradex.torch as gx

    gen = torch.Generator().manual_seed(20 + rank)
    batches = [torch.randn(8, 256, generator=gen) for _ in range(8)]

    def train(ddp, model, opt, xs):
        for x in xs:
            opt.zero_grad()
            ddp(x).square().mean().backward()
            opt.step()

    model = _make()
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
    state = gx.State(ddp)
    ddp.register_comm_hook(state, gx.hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    train(ddp, model, opt, batches[:5])
    saved = state.state_dict()
    # A restart with tiny buckets: a different layout (one parameter per bucket, other bucket indices).
    twin = copy.deepcopy(model)
    twin_ddp = torch.nn.parallel.DistributedDataParallel(twin, bucket_cap_mb=0.001)
    twin_state = gx.State(twin_ddp)
    twin_state.load_state_dict(saved)
    seen = set()

    def counting_hook(s, bucket):
        seen.add(bucket.index())
        return gx.hook(s, bucket)

    twin_ddp.register_comm_hook(twin_state, counting_hook)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.05)
    train(ddp, model, opt, batches[5:])
    train(twin_ddp, twin, twin_opt, batches[5:])
    out = {"same": all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters())),
           "moved": any(not torch.equal(a, b) for a, b in zip(model.parameters(), copy.deepcopy(_make()).parameters())),
           "sparse": gx.stats(twin_state)["sparse_exchanges"], "twin_buckets": len(seen)}
    # Restoring into a State with positional keys (no model, and none found: no bucket yet) is refused with a
    # clear error when its engine is created, not loaded into the wrong tensors.
    plain = gx.State()
    try:
        plain.load_state_dict(saved)
        plain.engine  # noqa: B018 - creates the engine (collective), which applies the loaded state
        out["refused"] = None
    except gx.StateError as exc:
        out["refused"] = str(exc)
    for s in (state, twin_state, plain):
        s.close()
    return out


def test_checkpoint_keyed_by_names_survives_a_new_bucket_cap():
    for r in ranks.run(_checkpoint_across_bucket_sizes, 2, env=_ENV):
        assert r["moved"]
        assert r["sparse"] > 0
        assert r["twin_buckets"] >= 2  # the original model's 4 parameters fit one 25 MB bucket
        assert r["same"], "restored state under another bucket layout must continue bit-identically"
        assert r["refused"] and "names" in r["refused"]


def test_positional_keys_refuse_a_changed_bucket_layout():
    import torch
    import gradex
    from gradex.torch import _layout

    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(5))
    keys = _layout.BucketKeys(None)
    assert keys.keys(2, [a, b], [a, b]) == ["bucket2.param0", "bucket2.param1"]
    assert keys.keys(2, [a, b], [a, b]) == ["bucket2.param0", "bucket2.param1"]
    with pytest.raises(gradex.MismatchError, match=r"bucket2.param0.*shape \(5,\).*gx.State\(ddp\)"):
        keys.keys(2, [b], [b])
    named = _layout.BucketKeys(torch.nn.Linear(3, 2))
    assert named.keys(0, [], []) == []
    stranger = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(gradex.InvalidArgumentError, match=r"shape \(4,\) that is not a parameter of the model"):
        named.keys(1, [stranger], [stranger])
