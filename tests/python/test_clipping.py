"""GRADEX_CLIP_NORM = C clips by the whole model's gradient norm on each rank, at C / sqrt(world size), before
the exchange (the DGC paper's local clipping, as torch.nn.utils.clip_grad_norm_ computes the norm), through
the DDP hook and gx.DistributedOptimizer: with sparsity 0, fp32 and no gradex momentum the averaged gradient
equals the average of clip_grad_norm_(local gradient, C / sqrt(N)) to fp32 rounding."""
import math

import pytest
import torch_ranks as ranks

CLIP = 0.2


def _clipped(rank, world, via):
    import copy
    import math

    import torch
    import torch.distributed as dist
    import gradex.torch as gx

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.Tanh(), torch.nn.Linear(300, 10))
    reference = copy.deepcopy(model)
    if via == "hook":
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        helper = gx.State(ddp)
        ddp.register_comm_hook(helper, gx.hook)
        forward = ddp
    else:
        helper = gx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                         named_parameters=model.named_parameters())
        forward = model
    gen = torch.Generator().manual_seed(80 + rank)
    errors, norms, unclipped_gap = [], [], []
    for _ in range(3):
        x = torch.randn(16, 64, generator=gen) * (1 + rank)
        model.zero_grad()
        reference.zero_grad()
        forward(x).square().mean().backward()
        if via != "hook":
            helper.step()  # lr 0: exchanges the gradients, leaves the parameters
        reference(x).square().mean().backward()
        raw = [r.grad.clone() for r in reference.parameters()]
        norms.append(float(torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP / math.sqrt(world))))
        worst, gap = 0.0, 0.0
        for p, r, g in zip(model.parameters(), reference.parameters(), raw):
            expected = r.grad.clone()
            dist.all_reduce(expected)
            expected /= world
            unclipped = g.clone()
            dist.all_reduce(unclipped)
            unclipped /= world
            worst = max(worst, float((p.grad - expected).abs().max() / expected.abs().max()))
            gap = max(gap, float((p.grad - unclipped).abs().max() / unclipped.abs().max()))
        errors.append(worst)
        unclipped_gap.append(gap)
    helper.close()
    return {"errors": errors, "norms": norms, "gap": unclipped_gap}


@pytest.mark.parametrize("via", ["hook", "optimizer"])
def test_clip_norm_clips_by_the_whole_model_norm(via):
    env = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0", "GRADEX_MOMENTUM": "0", "GRADEX_CLIP_NORM": str(CLIP),
           "GRADEX_TIMEOUT_S": "60"}
    for r in ranks.run(_clipped, 2, env=env, args=(via,), timeout=300):
        assert all(n > CLIP / math.sqrt(2) for n in r["norms"]), r  # clipping is active on every rank
        assert all(g > 1e-2 for g in r["gap"]), r  # and changes the result
        assert all(e <= 1e-5 for e in r["errors"]), r
