"""The start-up agreement through torch: ranks started with different GRADEX_HALF_TYPE (fp16 and bf16 have the
same length, so without the start-up agreement fp16 bits were summed as bf16) fail with gradex.ConfigError on
both ranks naming the variable; an engine error on one rank (GRADEX_TEST_FAIL_ROUND) reaches backward() on
every rank as gradex's own exception type with the engine's message, naming the failing rank."""
import os
import time

import torch_ranks as ranks

_CONFIG = {"GRADEX_DENSE_THRESHOLD": "2000", "GRADEX_SPARSITY": "0.99", "GRADEX_TIMEOUT_S": "60"}


def _backward_error(rank, world, per_rank_env):
    import torch
    import gradex
    import gradex.torch as gx

    for name, values in per_rank_env.items():
        os.environ[name] = values[rank]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 40))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = gx.State(ddp, config=_CONFIG)
    ddp.register_comm_hook(state, gx.hook)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(rank))
    started = time.monotonic()
    out = {"error_type": None}
    try:
        for _ in range(3):
            ddp(x).square().mean().backward()
    except Exception as exc:  # noqa: BLE001 - the test inspects what reached backward()
        out = {"error_type": type(exc).__name__, "is_gradex": isinstance(exc, gradex.GradexError),
               "module": type(exc).__module__, "message": str(exc), "seconds": time.monotonic() - started}
    try:
        state.close()
    except Exception:  # noqa: BLE001 - the engine already failed
        pass
    return out


def test_different_half_type_is_a_config_error_on_both_ranks():
    results = ranks.run(_backward_error, 2, args=({"GRADEX_HALF_TYPE": ["fp16", "bf16"]},), timeout=120)
    for rank, r in enumerate(results):
        assert r["error_type"] == "ConfigError" and r["is_gradex"], (rank, r)
        assert "GRADEX_HALF_TYPE: 'fp16' on ranks [0], 'bf16' on ranks [1]" in r["message"], (rank, r)
        assert r["seconds"] < 30, (rank, r)


def test_engine_error_on_one_rank_reaches_backward_on_every_rank_as_gradex_error():
    results = ranks.run(_backward_error, 2, args=({"GRADEX_TEST_FAIL_ROUND": ["0", "1"]},), timeout=120)
    for rank, r in enumerate(results):
        assert r["error_type"] == "InternalError" and r["is_gradex"], (rank, r)
        assert r["module"] == "gradex._errors", (rank, r)
        assert "GRADEX_TEST_FAIL_ROUND" in r["message"], (rank, r)
        assert "Unable to cast" not in r["message"], (rank, r)
        # Generous: the timeout is 60 s; the notice arrives in milliseconds.
        assert r["seconds"] < 30, (rank, r)
    assert "rank 1 failed" in results[0]["message"], results[0]
