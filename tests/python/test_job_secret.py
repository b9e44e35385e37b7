"""GRADEX_JOB_SECRET under torch.distributed: gradex bootstraps through torch's (unauthenticated) store, so
the secret protects the gradex side: the published UCX addresses carry an HMAC and every pair of ranks
proves the secret before exchanging gradients (docs/security.md)."""
import torch_ranks as ranks

_CONFIG = {"GRADEX_DENSE_THRESHOLD": "2000", "GRADEX_SPARSITY": "0.99", "GRADEX_TIMEOUT_S": "30"}


def _train(rank, world, secrets):
    import hashlib

    import torch
    import gradex.torch as gx

    config = dict(_CONFIG)
    if secrets[rank] is not None:
        config["GRADEX_JOB_SECRET"] = secrets[rank]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 40))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    # gx.State is lazy: the engine (and so the authentication) starts at the first bucket.
    state = gx.State(ddp, config=config)
    ddp.register_comm_hook(state, gx.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(11 + rank)
    try:
        for _ in range(4):
            opt.zero_grad()
            ddp(torch.randn(16, 64, generator=gen)).square().mean().backward()
            opt.step()
    except gx.GradexError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    state.close()
    return {"digest": digest}


def test_matching_secret_trains():
    out = ranks.run(_train, 2, args=(["job-secret", "job-secret"],))
    assert "digest" in out[0], out
    assert out[0]["digest"] == out[1]["digest"]


def test_mismatched_or_missing_secret_is_refused_naming_the_rank():
    # Both ranks stay until both have reported: rank 0 serves torch's store, and a rank 0 that left at its own
    # refusal could take the store away before rank 1 reads rank 0's address and reaches its own verdict.
    out = ranks.run(_train, 2, args=(["job-secret", "another-secret"],))
    for rank, peer in ((0, 1), (1, 0)):
        assert out[rank].get("error") == "ConfigError", out
        assert f"authentication failed: rank {peer} (host " in out[rank]["message"], out
        assert "wrong proof of the job secret" in out[rank]["message"], out
    out = ranks.run(_train, 2, args=(["job-secret", None],))
    assert "published a UCX address without proof of the job secret" in out[0]["message"], out
    assert "was started with a job secret (GRADEX_JOB_SECRET) and this rank without one" in out[1]["message"], out
