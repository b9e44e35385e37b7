"""Checkpointing of the compressor state, and engine errors surfacing as Python exceptions: a bad GRADEX_*
value at first use, state that does not fit, a peer that dies."""
import torch_ranks as ranks

_CONFIG = {"GRADEX_DENSE_THRESHOLD": "2000", "GRADEX_MOMENTUM": "0.9", "GRADEX_SPARSITY": "0.99",
           "GRADEX_TIMEOUT_S": "60"}


def _model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 40))


def _step(model, opt, x):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def _round_trips(rank, world):
    import copy

    import torch
    import gradex
    import gradex.torch as gx

    out = {}
    gen = torch.Generator().manual_seed(7 + rank)
    batches = [torch.randn(16, 64, generator=gen) for _ in range(5)]

    # DistributedOptimizer: a restored copy continues exactly like the original (residuals, momenta).
    model = _model()
    # Keys other than the hook's (which are the module's parameter names), for the mismatch check below.
    opt = gx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                  named_parameters=[("opt." + n, p) for n, p in model.named_parameters()],
                                  config=_CONFIG)
    for x in batches[:4]:
        _step(model, opt, x)
    saved = opt.state_dict()
    twin = copy.deepcopy(model)
    twin_opt = gx.DistributedOptimizer(torch.optim.SGD(twin.parameters(), lr=0.05),
                                       named_parameters=[("opt." + n, p) for n, p in twin.named_parameters()],
                                       config=_CONFIG)
    twin_opt.load_state_dict(saved)
    out["optimizer_state_equal"] = twin_opt.state_dict()["gradex"] == saved["gradex"]
    out["state_bytes"] = len(saved["gradex"])
    _step(model, opt, batches[4])
    _step(twin, twin_opt, batches[4])
    out["continues_identically"] = all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))

    # The DDP hook's State: restorable before the first iteration (kept until the engine exists, then
    # registered from the state dict's tensors and loaded).
    ddp_model = _model()
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_model)
    state = gx.State(ddp, config=_CONFIG)
    ddp.register_comm_hook(state, gx.hook)
    for x in batches:
        ddp(x).square().mean().backward()
    hook_saved = state.state_dict()
    restored = gx.State(ddp, config=_CONFIG)
    restored.load_state_dict(hook_saved)
    out["hook_iteration"] = restored.iteration
    restored.engine  # noqa: B018 - creates the engine (collective), which applies the loaded state
    out["hook_state_equal"] = restored.state_dict()["engine"] == hook_saved["engine"]

    # State that does not belong to this engine's tensors fails with StateError, not silently.
    try:
        restored.engine.load_state(saved["gradex"])
        out["mismatch_error"] = None
    except gradex.StateError as exc:
        out["mismatch_error"] = str(exc)
    for obj in (opt, twin_opt, state, restored):
        obj.close()
    return out


def test_state_dict_round_trip():
    for r in ranks.run(_round_trips, 2):
        assert r["state_bytes"] > 0
        assert r["optimizer_state_equal"]
        assert r["continues_identically"]
        assert r["hook_state_equal"]
        assert r["hook_iteration"] == 5
        assert r["mismatch_error"], "loading another engine's state must raise gradex.StateError"


def _bad_value(rank, world):
    import os

    import torch
    import gradex.torch as gx

    messages = []
    os.environ["GRADEX_SPARSITY"] = "lots"
    try:
        for make in (lambda: gx.State(),
                     lambda: gx.DistributedOptimizer(torch.optim.SGD(_model().parameters(), lr=0.1))):
            try:
                make()
                messages.append(None)
            except gx.ConfigError as exc:
                messages.append(str(exc))
    finally:
        del os.environ["GRADEX_SPARSITY"]
    try:
        gx.LocalSGD(_model(), period=4, config={"GRADEX_FP16": "maybe"})
        messages.append(None)
    except gx.ConfigError as exc:
        messages.append(str(exc))
    return messages


def test_bad_gradex_value_raises_config_error_at_construction():
    for messages in ranks.run(_bad_value, 2):
        assert messages[0] and "GRADEX_SPARSITY" in messages[0] and "lots" in messages[0]
        assert messages[1] and "GRADEX_SPARSITY" in messages[1]
        assert messages[2] and "GRADEX_FP16" in messages[2]


_KEPT = []


def _peer_dies(rank, world):
    import time

    import torch
    import gradex
    import gradex.torch as gx

    model = _model()
    opt = gx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                  named_parameters=model.named_parameters(),
                                  config=dict(_CONFIG, GRADEX_TIMEOUT_S="10"))
    x = torch.randn(16, 64)
    _step(model, opt, x)  # both ranks alive: works
    if rank == 1:
        _KEPT.append(opt)  # a dying process does not close its objects: no finalizer may leave the job
        return ranks.EXIT  # dies without leaving the job
    time.sleep(1)
    started = time.monotonic()
    try:
        for _ in range(3):
            _step(model, opt, x)
        return {"error": None}
    except gradex.GradexError as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "seconds": time.monotonic() - started,
                "is_peer_or_timeout": isinstance(exc, (gradex.PeerError, gradex.TimeoutError,
                                                       gradex.TransportError))}


def test_dead_peer_raises_instead_of_hanging():
    results = ranks.run(_peer_dies, 2, timeout=120, leave_together=False)
    r = results[0]
    assert r["error"], "a step with a dead peer must fail"
    assert r["is_peer_or_timeout"], r["error"]
    assert r["seconds"] < 30, r
