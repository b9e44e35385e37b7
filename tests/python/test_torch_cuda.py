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


def _hsdp_on_gpu(rank, world, steps):
    """gx.HSDP with CUDA shards (on the device path) against native HSDP on the same CUDA mesh: 2 replica groups
    of one shard each, both processes on the one GPU (gloo carries FSDP2's and native HSDP's own traffic)."""
    from torch.distributed.device_mesh import init_device_mesh

    import fsdp_ranks as fr
    import gradex.torch as gx

    torch.cuda.set_device(0)
    mesh = init_device_mesh("cuda", (2, 1), mesh_dim_names=("replicate", "shard"))
    teacher = fr.task()

    def train(model, opt):
        for step in range(steps):
            x = fr.batch(rank, step)
            y = teacher(x)
            loss = torch.nn.functional.mse_loss(model(x.cuda()), y.cuda())
            loss.backward()
            opt.step()
            opt.zero_grad()

    def sgd(model):
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def held_out(model):
        x = torch.randn(512, 32, generator=torch.Generator().manual_seed(99))
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(x.cuda()).cpu(), teacher(x)))

    native = fr.shard(fr.make_model().cuda(), mesh)
    native_opt = sgd(native)
    train(native, native_opt)
    # The second replica group starts from other weights: gx.HSDP copies the first group's.
    model = fr.shard(fr.make_model(seed=0 if rank == 0 else 3).cuda(), mesh["shard"])
    opt = sgd(model)
    with gx.HSDP(model, mesh, optimizer=opt) as hsdp:
        train(model, opt)
        stats = hsdp.stats()
    a = {n: t.cpu() for n, t in fr.full_parameters(native).items()}
    b = {n: t.cpu() for n, t in fr.full_parameters(model).items()}
    return {"error": max((a[n] - b[n]).abs().max().item() for n in a),
            "scale": max(a[n].abs().max().item() for n in a),
            "native_loss": held_out(native), "loss": held_out(model), "digest": fr.digest(b),
            "steps": stats["steps"], "bytes_sent": stats["bytes_sent"], "dense_bytes": stats["dense_bytes"],
            "staged_bytes": stats["staged_bytes"], "cuda_tensor": next(model.parameters()).is_cuda}


@pytest.mark.parametrize("env,dense", [
    ({"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0"}, True),
    ({"GRADEX_SPARSITY": "0.9", "GRADEX_FP16": "1", "GRADEX_DENSE_THRESHOLD": "4096"}, False),
], ids=["dense", "dgc90"])
def test_hsdp_on_gpu_matches_native_hsdp(env, dense):
    steps = 30
    results = ranks.run(_hsdp_on_gpu, 2, env=dict(env, GRADEX_TIMEOUT_S="120"), args=(steps,), timeout=600)
    assert results[0]["digest"] == results[1]["digest"]  # the replicas hold the same parameters, bit for bit
    for r in results:
        assert r["cuda_tensor"] and r["steps"] == steps, r
        assert r["staged_bytes"] > 0, r  # the shards went through the device path
        if dense:
            assert r["error"] <= 1e-6 * max(1.0, r["scale"]), r
        else:
            assert r["loss"] <= 1.02 * r["native_loss"], r
            assert r["bytes_sent"] < 0.5 * r["dense_bytes"], r
    print(f"\nRESULT gpu_hsdp dense={dense} error={results[0]['error']:.3g} loss={results[0]['loss']:.5f} "
          f"native_loss={results[0]['native_loss']:.5f} staged_bytes={results[0]['staged_bytes']}")
