"""Hugging Face Accelerate: the documented recipe (prepare the model, then register gradex's hook on the DDP
module it returns) with gradient accumulation (accelerator.accumulate(), which uses DDP's no_sync between
synchronising steps). With sparsity 0 and fp32 on the wire the run equals plain Accelerate bit for bit;
with DGC it keeps ranks identical and exchanges once per accumulation window."""
import torch_ranks as ranks

ACCUMULATE = 3
MICRO_STEPS = 12


def _train(rank, world, with_gradex, env):
    import os

    import torch
    import torch.distributed as dist
    from accelerate import Accelerator
    import gradex.torch as gx

    os.environ.update(env)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.Tanh(), torch.nn.Linear(300, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = accelerator.prepare(model, opt)
    state = None
    if with_gradex:
        state = gx.State(model)                      # the recipe: after prepare(),
        model.register_comm_hook(state, gx.hook)     # on the DDP module prepare() returned
    gen = torch.Generator().manual_seed(70 + rank)
    for _ in range(MICRO_STEPS):
        x = torch.randn(8, 64, generator=gen)
        with accelerator.accumulate(model):
            accelerator.backward(model(x).square().mean())
            opt.step()
            opt.zero_grad()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    out = {"flat": flat, "identical": all(torch.equal(g, gathered[0]) for g in gathered),
           "ddp": isinstance(model, torch.nn.parallel.DistributedDataParallel)}
    if state is not None:
        out["stats"] = gx.stats(state)
        state.close()
    return out


def _both(rank, world):
    import torch
    exact = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0", "GRADEX_MOMENTUM": "0"}
    plain = _train(rank, world, False, {})
    gradex_exact = _train(rank, world, True, exact)
    gradex_dgc = _train(rank, world, True, {"GRADEX_SPARSITY": "0.99", "GRADEX_MOMENTUM": "0"})
    return {"ddp": plain["ddp"], "equal": torch.equal(plain["flat"], gradex_exact["flat"]),
            "identical": [plain["identical"], gradex_exact["identical"], gradex_dgc["identical"]],
            "exact_stats": gradex_exact["stats"], "dgc_stats": gradex_dgc["stats"],
            "dgc_moved": float((gradex_dgc["flat"] - plain["flat"]).abs().max())}


def test_accelerate_recipe_with_gradient_accumulation():
    for r in ranks.run(_both, 2, env={"GRADEX_TIMEOUT_S": "60"}, timeout=420):
        assert r["ddp"]
        assert r["identical"] == [True, True, True]
        assert r["equal"], "sparsity 0, fp32: gradex through Accelerate must equal plain Accelerate"
        for stats in (r["exact_stats"], r["dgc_stats"]):
            # One exchange per accumulation window (no_sync in between), 4 parameters each.
            assert stats["steps"] == MICRO_STEPS // ACCUMULATE and stats["tensors"] == 4 * MICRO_STEPS // ACCUMULATE
        assert r["dgc_stats"]["sparse_exchanges"] > 0 and r["dgc_moved"] > 0
