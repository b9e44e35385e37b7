"""GRADEX_JOB_SECRET under torch.distributed: gradex bootstraps through torch's (unauthenticated) store, so
the secret protects the gradex side: the published UCX addresses carry an HMAC, every pair of ranks
proves the secret before exchanging gradients, and every message between ranks is sealed (GRADEX_SEAL=auto:
authenticated and encrypted with keys of its connection; docs/security.md)."""
import torch_ranks as ranks

_CONFIG = {"GRADEX_DENSE_THRESHOLD": "2000", "GRADEX_SPARSITY": "0.99", "GRADEX_TIMEOUT_S": "30"}


def _train(rank, world, secrets, extra=None):
    import hashlib

    import torch
    import gradex.torch as gx

    config = dict(_CONFIG)
    if secrets[rank] is not None:
        config["GRADEX_JOB_SECRET"] = secrets[rank]
    config.update((extra or [{}, {}])[rank])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 40))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(11 + rank)
    try:
        # gx.State is lazy: the engine (and so the authentication) starts at the first bucket; its settings
        # are checked here.
        state = gx.State(ddp, config=config)
        ddp.register_comm_hook(state, gx.hook)
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


def test_sealed_training_is_bit_identical_to_training_in_clear():
    # DGC at 99 % with momentum correction and error feedback: every route the hook takes, sealed by
    # default with a secret, and the same job with the data plane in clear.
    sealed = ranks.run(_train, 2, args=(["job-secret", "job-secret"],))
    clear = ranks.run(_train, 2, args=(["job-secret", "job-secret"], [{"GRADEX_SEAL": "off"}] * 2))
    assert "digest" in sealed[0] and "digest" in clear[0], (sealed, clear)
    assert sealed[0]["digest"] == sealed[1]["digest"] == clear[0]["digest"] == clear[1]["digest"]


def test_a_tampered_message_fails_every_rank_naming_the_peer_and_the_check():
    for tamper, check in (("flip:5", "check failed"), ("forge:3", "authentication tag check failed"),
                          ("replay:4", "check failed")):
        out = ranks.run(_train, 2, args=(["job-secret", "job-secret"], [{}, {"GRADEX_TEST_SEAL_TAMPER": tamper}]))
        for rank in (0, 1):
            assert "error" in out[rank], (tamper, out)
        assert "refused a sealed message" in out[0]["message"], (tamper, out)
        assert check in out[0]["message"] and "from rank 1" in out[0]["message"], (tamper, out)


def test_seal_on_without_a_secret_is_refused_naming_both_settings():
    out = ranks.run(_train, 2, args=([None, None], [{"GRADEX_SEAL": "on"}] * 2))
    for rank in (0, 1):
        assert out[rank].get("error") == "ConfigError", out
        assert "GRADEX_SEAL=on" in out[rank]["message"] and "GRADEX_JOB_SECRET" in out[rank]["message"], out


def _diloco(rank, world, seal, tamper=None):
    import hashlib

    import torch
    import gradex.torch as gx

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 33), torch.nn.Tanh(), torch.nn.Linear(33, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    config = {"GRADEX_JOB_SECRET": "job-secret", "GRADEX_SEAL": seal, "GRADEX_TIMEOUT_S": "30"}
    if tamper and rank == 1:
        config["GRADEX_TEST_SEAL_TAMPER"] = tamper
    gen = torch.Generator().manual_seed(100 + rank)
    try:
        diloco = gx.DiLoCo(model, opt, period=2, bits=4, config=config)
        for _ in range(6):
            x = torch.randn(16, 12, generator=gen)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), torch.sin(x[:, :3])).backward()
            opt.step()
            diloco.step()
        diloco.synchronize()
    except gx.GradexError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    diloco.close()
    return {"digest": digest}


def test_diloco_outer_traffic_is_sealed_bit_identical_and_refuses_tampering():
    """gx.DiLoCo's own connections (the outer optimizer's 4-bit pseudo-gradients) are sealed with a secret: the same
    model as in clear on every rank, and a tampered message fails every rank naming the check."""
    sealed = ranks.run(_diloco, 2, args=("auto",))
    clear = ranks.run(_diloco, 2, args=("off",))
    assert "digest" in sealed[0] and "digest" in clear[0], (sealed, clear)
    assert sealed[0]["digest"] == sealed[1]["digest"] == clear[0]["digest"] == clear[1]["digest"]
    out = ranks.run(_diloco, 2, args=("auto", "flip:4"))
    assert all("error" in r for r in out), out
    assert "refused a sealed message" in out[0]["message"], out
