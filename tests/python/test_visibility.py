"""What gradex shows while training, on real processes: GRADEX_STATS_EVERY=N prints one line
every N steps on rank 0 only; the first saturation of the 16-bit wire and the first NaN/Inf are each reported
once, naming the tensor."""
import torch_ranks as ranks


def _train(rank, world, steps, poison):
    import os
    import tempfile

    import torch
    import gradex.torch as gx

    log = tempfile.NamedTemporaryFile(prefix=f"gradex-stderr-{rank}-", delete=False)
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)  # the engine writes to the process's stderr
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential()
        model.add_module("small", torch.nn.Linear(8, 8))
        model.add_module("huge", torch.nn.Linear(8, 4))
        opt = gx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                      named_parameters=model.named_parameters())
        poisoned = [False]

        def poison_huge(grad):  # beyond fp16's 65504 even after dividing by the world size
            return torch.full_like(grad, 1e9) if poisoned[0] else grad

        def poison_small(grad):
            if poisoned[0]:
                grad = grad.clone()
                grad[0] = float("nan")
            return grad

        model.huge.weight.register_hook(poison_huge)  # before accumulation: what gradex is handed
        model.small.bias.register_hook(poison_small)
        for step in range(steps):
            poisoned[0] = poison and step >= 2
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
        stats = gx.stats(opt)
        opt.close()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    with open(log.name) as f:
        text = f.read()
    os.unlink(log.name)
    return {"text": text, "saturated": stats["saturated"], "nonfinite": stats["nonfinite"]}


def test_stats_every_prints_on_rank_zero_only():
    results = ranks.run(_train, 2, env={"GRADEX_STATS_EVERY": "3", "GRADEX_SPARSITY": "0"}, args=(7, False))
    lines = [line for line in results[0]["text"].splitlines() if "stats steps" in line]
    assert len(lines) == 2, results[0]["text"]
    assert "stats steps 1-3:" in lines[0] and "stats steps 4-6:" in lines[1]
    for field in ("compression", "MB sent", "exchange", "saturated 0", "non-finite 0"):
        assert field in lines[0], lines[0]
    assert "stats steps" not in results[1]["text"], results[1]["text"]


def test_first_saturation_and_nonfinite_are_named_once():
    results = ranks.run(_train, 2, env={"GRADEX_SPARSITY": "0", "GRADEX_NONFINITE": "zero"}, args=(6, True))
    for r in results:
        assert r["saturated"] > 0 and r["nonfinite"] > 0
        saturation = [line for line in r["text"].splitlines() if "clamped to the 16-bit" in line]
        nonfinite = [line for line in r["text"].splitlines() if "held NaN/Inf" in line]
        assert len(saturation) == 1 and "tensor 'huge.weight'" in saturation[0], r["text"]
        assert "scaler=" in saturation[0]
        assert len(nonfinite) == 1 and "tensor 'small.bias'" in nonfinite[0], r["text"]
