"""torch.compile: DDP with the gradex hook around a compiled model (torch.compile(ddp), inductor on CPU) trains
like the eager run. With sparsity 0 and fp32 on the wire the exchange is exact, so the two runs differ only by
the compiled kernels' rounding; with DGC the compiled run must keep ranks bit-identical and train."""
import torch_ranks as ranks


def _compiled_vs_eager(rank, world):
    import torch
    import torch.distributed as dist
    import gradex.torch as gx

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8))

    gen = torch.Generator().manual_seed(60 + rank)
    xs = [torch.randn(16, 64, generator=gen) for _ in range(6)]
    out = {}
    for mode in ("eager", "compiled"):
        model = make()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        state = gx.State(ddp)
        ddp.register_comm_hook(state, gx.hook)
        run = torch.compile(ddp) if mode == "compiled" else ddp
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for x in xs:
            opt.zero_grad()
            run(x).square().mean().backward()
            opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        out[mode] = {"flat": flat, "identical": all(torch.equal(g, gathered[0]) for g in gathered),
                     "tensors": gx.stats(state)["tensors"]}
        state.close()
    diff = float((out["compiled"]["flat"] - out["eager"]["flat"]).abs().max())
    moved = float((out["eager"]["flat"] - torch.cat([p.reshape(-1) for p in make().parameters()])).abs().max())
    return {"diff": diff, "moved": moved, "scale": float(out["eager"]["flat"].abs().max()),
            "identical": [out[m]["identical"] for m in ("eager", "compiled")],
            "tensors": [out[m]["tensors"] for m in ("eager", "compiled")]}


def test_compiled_ddp_with_gradex_hook_matches_eager():
    env = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0", "GRADEX_TIMEOUT_S": "120"}
    for r in ranks.run(_compiled_vs_eager, 2, env=env, timeout=540):
        assert r["identical"] == [True, True]
        assert r["tensors"] == [6 * 4, 6 * 4]  # the compiled run's buckets went through gradex too
        assert r["moved"] > 1e-3
        assert r["diff"] <= 1e-5 * max(r["scale"], 1.0), r
