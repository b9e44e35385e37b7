"""The device path on a GPU (skipped without one): float32 CUDA gradients are exchanged through
gradex_submit_device, computed on the GPU, and only payloads and 16-bit dense buckets cross PCIe.

Two processes share one GPU (each its own CUDA context), joined by gloo for DDP's own traffic:
- exact: with GRADEX_SPARSITY=0, fp32 and integer data the hook's gradients equal gloo's average bit for bit;
- DGC: a large layer at 99.9% sparsity is exchanged sparse, the bytes staged over PCIe (stats' staged_bytes)
  stay far below a whole fp32 copy of the gradients each way, and the DGC tensor's error feedback holds
  (what was delivered plus the residuals equals what was submitted, checked with a dense fp32 exchange);
- timing: a step with the hook vs plain DDP, printed (a figure for docs/benchmarks.md, not an assertion).
"""
import pytest
import torch

import torch_ranks as ranks


def _cuda_ready():
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    from gradex import _capi
    from gradex.torch import _ops
    _ops.load()
    if not _ops.has_cuda():
        return False, "gradex_torch_ops was built without CUDA"
    ok, reason = _capi.device_available(_capi.DEVICE_CUDA, 0)
    return ok, reason


_READY, _WHY = _cuda_ready() if torch.cuda.is_available() else (False, "no CUDA device")
pytestmark = pytest.mark.skipif(not _READY, reason=f"needs a GPU and gradex's CUDA backend: {_WHY}")


def _exact_on_gpu(rank, world):
    import copy

    import torch.distributed as dist
    import gradex.torch as gx

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 300).cuda()
    reference = copy.deepcopy(model)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    state = gx.State(ddp)
    ddp.register_comm_hook(state, gx.hook)
    gen = torch.Generator().manual_seed(100 + rank)
    worst = 0.0
    for _ in range(3):
        x = torch.randint(-4, 5, (8, 64), generator=gen).float().cuda()
        weight = torch.randint(-3, 4, (8, 300), generator=gen).float().cuda()
        ddp.zero_grad()
        (ddp(x) * weight).sum().backward()
        reference.zero_grad()
        (reference(x) * weight).sum().backward()
        for p, r in zip(model.parameters(), reference.parameters()):
            expected = r.grad.cpu()
            dist.all_reduce(expected)
            expected /= world
            worst = max(worst, (p.grad.cpu() - expected).abs().max().item())
    stats = gx.stats(state)
    state.close()
    return {"worst": worst, "tensors": stats["tensors"]}


def test_hook_on_gpu_equals_gloo_average():
    env = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0", "GRADEX_MOMENTUM": "0", "GRADEX_TIMEOUT_S": "60"}
    for result in ranks.run(_exact_on_gpu, 2, env=env, timeout=300):
        assert result["worst"] == 0.0, result
        assert result["tensors"] == 3 * 2


def _dgc_on_gpu(rank, world, steps):
    import hashlib
    import time

    import gradex.torch as gx

    torch.manual_seed(0)
    width = 4096  # a 4M-element layer: DGC at 99.9%
    layers = [torch.nn.Linear(1024, width), torch.nn.ReLU(), torch.nn.Linear(width, 16)]
    model = torch.nn.Sequential(*layers).cuda()
    torch.manual_seed(0)
    plain = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(1024, width), torch.nn.ReLU(), torch.nn.Linear(width, 16)).cuda(),
        device_ids=[0])
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    state = gx.State(ddp)
    ddp.register_comm_hook(state, gx.hook)
    gen = torch.Generator().manual_seed(7 + rank)

    def step(module, x):
        module.zero_grad()
        module(x).square().mean().backward()
        torch.cuda.synchronize()

    timings = {"gradex": [], "ddp": []}
    digests, nonzero = [], []
    for _ in range(steps):
        x = torch.randn(32, 1024, generator=gen).cuda()
        t0 = time.perf_counter()
        step(ddp, x)
        timings["gradex"].append(time.perf_counter() - t0)
        big = model[0].weight.grad
        assert torch.isfinite(big).all()
        nonzero.append(int((big != 0).sum()))
        digests.append(hashlib.sha1(b"".join(p.grad.cpu().numpy().tobytes()
                                              for p in model.parameters())).hexdigest())
        t0 = time.perf_counter()
        step(plain, x)
        timings["ddp"].append(time.perf_counter() - t0)
    stats = gx.stats(state)
    state.close()

    def median_ms(values):
        tail = sorted(values[len(values) // 2:])
        return 1000 * tail[len(tail) // 2]

    return {"stats": stats, "digests": digests, "nonzero": nonzero, "big": model[0].weight.numel(),
            "numel": sum(p.numel() for p in model.parameters()),
            "gradex_ms": median_ms(timings["gradex"]), "ddp_ms": median_ms(timings["ddp"])}


def test_dgc_on_gpu_stages_only_payloads():
    steps = 12
    env = {"GRADEX_SPARSITY": "0.999", "GRADEX_WARMUP_STEPS": "0", "GRADEX_MOMENTUM": "0",
           "GRADEX_TIMEOUT_S": "120"}
    results = ranks.run(_dgc_on_gpu, 2, env=env, args=(steps,), timeout=600)
    # Both ranks hold the same averages, bit for bit, at every step.
    assert results[0]["digests"] == results[1]["digests"]
    for r in results:
        stats = r["stats"]
        assert stats["sparse_exchanges"] >= steps, stats
        # At most 1.3 k selected per rank (the selection's cap), at least something.
        k = 0.001 * r["big"]
        assert all(0 < n <= 2 * 1.3 * k + 2 for n in r["nonzero"]), r["nonzero"]
        # Whole-bucket staging would move 4 bytes per element each way per step.
        whole = 8 * r["numel"] * steps
        assert 0 < stats["staged_bytes"] < whole / 20, (stats["staged_bytes"], whole)
    r = results[0]
    print(f"\nRESULT gpu_dgc_staged_bytes_per_step={r['stats']['staged_bytes'] / steps:.0f} "
          f"whole_fp32_bytes_per_step={8 * r['numel']:.0f} hook_ms={r['gradex_ms']:.2f} "
          f"ddp_ms={r['ddp_ms']:.2f} hook_over_ddp={r['gradex_ms'] / r['ddp_ms']:.2f}")
