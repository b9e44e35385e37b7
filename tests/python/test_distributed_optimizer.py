"""gx.DistributedOptimizer without DDP: identical parameters on every rank after every step (DGC, fp16 and
dense tensors mixed), the momentum rule (gradex takes SGD's momentum over, no double momentum), and LocalSGD
selected by GRADEX_LOCALSGD_PERIOD."""
import torch_ranks as ranks

# The model's two weight matrices (4096 and 2560 elements) go DGC above this threshold; biases go dense.
_ENV = {"GRADEX_DENSE_THRESHOLD": "2000", "GRADEX_WARMUP_STEPS": "3", "GRADEX_TIMEOUT_S": "60"}


def _train(rank, world, steps, sgd_momentum):
    import logging

    import torch
    import torch.distributed as dist
    import gradex.torch as gx
    from gradex.torch import _momentum

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("gradex").addHandler(Keep())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 40))
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=sgd_momentum)
    opt = gx.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    momentum_warnings = [m for m in records if "applied twice" in m]
    owners = (_momentum.gradex_momentum(opt.engine, None), sgd.param_groups[0]["momentum"])
    gen = torch.Generator().manual_seed(1000 + rank)
    mismatches = []
    for step in range(steps):
        x = torch.randn(16, 64, generator=gen)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        mismatches.append(sum(int(not torch.equal(g, gathered[0])) for g in gathered))
    stats = gx.stats(opt)
    opt.close()
    return {"mismatches": mismatches, "warnings": momentum_warnings, "stats": stats,
            "moved": float(flat.abs().sum()), "owners": owners}


def test_same_parameters_on_every_rank_after_each_step():
    results = ranks.run(_train, 4, env=_ENV, args=(8, 0.0))
    for r in results:
        assert r["mismatches"] == [0] * 8
        assert r["warnings"] == []
        assert r["stats"]["steps"] == 8
        assert r["stats"]["sparse_exchanges"] > 0  # the weight matrices went DGC
        assert r["stats"]["bytes_sent"] > 0


def test_momentum_rule_takes_sgd_momentum_over_unless_told_not_to():
    # (gradex's momentum, the SGD optimizer's live momentum): never both, so never applied twice.
    for env, owners in ((_ENV, (0.9, 0.0)), (dict(_ENV, GRADEX_MOMENTUM="0.9"), (0.9, 0.0)),
                        (dict(_ENV, GRADEX_MOMENTUM="0"), (0.0, 0.9))):
        for r in ranks.run(_train, 2, env=env, args=(2, 0.9)):
            assert r["warnings"] == []
            assert r["owners"] == owners, (env, r["owners"])
            assert r["mismatches"] == [0, 0]


def test_localsgd_period_from_environment():
    env = dict(_ENV, GRADEX_LOCALSGD_PERIOD="3", GRADEX_LOCALSGD_WARMUP_STEPS="2")
    results = ranks.run(_train, 2, env=env, args=(8, 0.0))
    for r in results:
        # Synchronous during warm-up (steps 1-2), then equal only right after an averaging round: after
        # steps 5 and 8 (every 3 steps after the warm-up).
        assert r["mismatches"][:2] == [0, 0]
        assert r["mismatches"][4] == 0 and r["mismatches"][7] == 0
        assert r["mismatches"][2] > 0 and r["mismatches"][5] > 0
        assert r["stats"]["parameter_averages"] > 0
