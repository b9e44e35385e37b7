"""gx.State and gx.LocalSGD are lazy: construction needs no process group, rank variables or network, checks
the configuration locally, and pickles; the engine bootstraps at the first bucket and then refuses pickling.
DDP over process subgroups gets an engine over the group's ranks (keyed per group)."""
import pickle

import pytest
import torch_ranks as ranks


def test_construction_needs_no_job_and_pickles(monkeypatch):
    import torch
    import gradex.torch as gx
    from gradex.torch import _bootstrap

    # Lightning builds its strategy in the launching process: WORLD_SIZE may be set, RANK not yet.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    before = _bootstrap.latest_engine()
    state = gx.State(config={"GRADEX_SPARSITY": "0.99"})
    assert not state.bootstrapped and _bootstrap.latest_engine() is before
    copy = pickle.loads(pickle.dumps(state))
    assert isinstance(copy, gx.State) and not copy.bootstrapped and copy._config == {"GRADEX_SPARSITY": "0.99"}
    lsgd = gx.LocalSGD(torch.nn.Linear(3, 2), period=4)
    lsgd_copy = pickle.loads(pickle.dumps(lsgd))
    assert lsgd_copy._config["GRADEX_LOCALSGD_PERIOD"] == "4" and lsgd_copy.steps == 0


def test_local_configuration_errors_surface_at_construction(monkeypatch):
    import torch
    import gradex.torch as gx

    with pytest.raises(gx.ConfigError, match="GRADEX_SPARSITY='lots'"):
        gx.State(config={"GRADEX_SPARSITY": "lots"})
    with pytest.raises(gx.ConfigError, match="GRADEX_FP16"):
        gx.LocalSGD(torch.nn.Linear(3, 2), period=2, config={"GRADEX_FP16": "maybe"})
    monkeypatch.setenv("GRADEX_TIMEOUT_S", "-1")
    with pytest.raises(gx.ConfigError, match="GRADEX_TIMEOUT_S"):
        gx.State()


def _refuses_after_bootstrap(rank, world):
    import torch
    import gradex.torch as gx

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = pickle.loads(pickle.dumps(gx.State(ddp)))  # a State that travelled through pickle works
    ddp.register_comm_hook(state, gx.hook)
    out = {"before": state.bootstrapped}
    ddp(torch.randn(4, 16)).sum().backward()
    out["after"] = state.bootstrapped
    out["tensors"] = gx.stats(state)["tensors"]
    try:
        pickle.dumps(state)
        out["refusal"] = None
    except TypeError as exc:
        out["refusal"] = str(exc)
    state.close()
    return out


def test_pickling_refused_once_bootstrapped():
    for r in ranks.run(_refuses_after_bootstrap, 2, env={"GRADEX_TIMEOUT_S": "60"}):
        assert r["before"] is False and r["after"] is True and r["tensors"] == 2
        assert r["refusal"] and "state_dict()" in r["refusal"]


def _subgroups(rank, world, named):
    import torch
    import torch.distributed as dist
    import gradex.torch as gx

    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group
    group = groups[rank // 2]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    # Group 0 passes the DDP module; group 1 lets the State find it (Lightning-style gx.State()).
    state = gx.State(ddp) if (named or rank < 2) else gx.State()
    ddp.register_comm_hook(state, gx.hook)
    reference = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    reference.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(50 + rank)
    exact = []
    for _ in range(3):
        x = torch.randn(8, 32, generator=gen)
        ddp.zero_grad()
        reference.zero_grad()
        ddp(x).square().sum().backward()
        reference(x).square().sum().backward()
        ok = True
        for p, r in zip(model.parameters(), reference.parameters()):
            expected = r.grad.clone()
            dist.all_reduce(expected, group=group)
            ok = ok and torch.equal(p.grad, expected / 2)
        exact.append(ok)
    stats = gx.stats(state)
    engine = state.engine
    out = {"exact": exact, "engine_world": engine.world_size, "engine_rank": engine.rank,
           "tensors": stats["tensors"]}
    state.close()
    return out


def test_ddp_over_subgroups_gets_an_engine_per_group():
    env = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0", "GRADEX_MOMENTUM": "0", "GRADEX_TIMEOUT_S": "60"}
    results = ranks.run(_subgroups, 4, env=env, args=(False,), timeout=300)
    for rank, r in enumerate(results):
        assert r["engine_world"] == 2 and r["engine_rank"] == rank % 2, r
        # The group's average exactly (2 ranks: the sum is exact in any order); another group's ranks
        # would make it differ.
        assert r["exact"] == [True] * 3, r
        assert r["tensors"] == 3 * 4
