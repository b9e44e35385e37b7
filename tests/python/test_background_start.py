"""gx.State(ddp, optimizer=opt) starts its engine at construction, on a thread of its own: the engine exists
before any backward pass, the training is bit for bit the lazily started State's, an error of the start is
raised at the first backward on every rank (not at construction, not lost), such a State refuses pickling, and
one never used is joined and closed at exit."""
import os
import pickle
import time

import torch_ranks as ranks

_ENV = {"GRADEX_TIMEOUT_S": "60", "GRADEX_DENSE_THRESHOLD": "500", "GRADEX_SPARSITY": "0.9"}


def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))


def _train(rank, world):
    import torch
    import gradex.torch as gx
    from gradex.torch import _bootstrap

    eager_model, lazy_model = _model(), _model()
    eager_ddp = torch.nn.parallel.DistributedDataParallel(eager_model)
    lazy_ddp = torch.nn.parallel.DistributedDataParallel(lazy_model)
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.1, momentum=0.9)
    lazy_opt = torch.optim.SGD(lazy_model.parameters(), lr=0.1, momentum=0.9)
    before = _bootstrap.latest_engine()
    eager = gx.State(eager_ddp, optimizer=eager_opt)
    # No bucket yet: the engine appears anyway (its start runs in the background).
    deadline = time.monotonic() + 30
    while _bootstrap.latest_engine() is before and time.monotonic() < deadline:
        time.sleep(0.05)
    out = {"started_before_backward": _bootstrap.latest_engine() is not before, "bootstrapped": eager.bootstrapped}
    try:
        pickle.dumps(eager)
        out["refusal"] = None
    except TypeError as exc:
        out["refusal"] = str(exc)
    lazy = gx.State(lazy_ddp)  # the same settings once set_optimizer runs, created at its first bucket
    lazy.set_optimizer(lazy_opt)
    eager_ddp.register_comm_hook(eager, gx.hook)
    lazy_ddp.register_comm_hook(lazy, gx.hook)
    gen = torch.Generator().manual_seed(10 + rank)
    for _ in range(4):
        x = torch.randn(16, 32, generator=gen)
        for ddp, opt in ((eager_ddp, eager_opt), (lazy_ddp, lazy_opt)):
            opt.zero_grad()
            ddp(x).square().mean().backward()
            opt.step()
    out["same"] = all(torch.equal(a, b) for a, b in zip(eager_model.parameters(), lazy_model.parameters()))
    out["moved"] = not torch.equal(eager_model[0].weight, _model()[0].weight)
    eager.close()
    lazy.close()
    return out


def test_engine_starts_at_construction_and_trains_as_the_lazy_one():
    for rank, r in enumerate(ranks.run(_train, 2, env=_ENV, timeout=180)):
        assert r["started_before_backward"] and not r["bootstrapped"], (rank, r)
        assert r["refusal"] and "state_dict()" in r["refusal"], (rank, r)
        assert r["same"] and r["moved"], (rank, r)


def _start_error(rank, world):
    import torch
    import gradex
    import gradex.torch as gx

    os.environ["GRADEX_HALF_TYPE"] = ["fp16", "bf16"][rank]
    model = _model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = gx.State(ddp, optimizer=opt)  # the mismatch is found by the start, in the background
    ddp.register_comm_hook(state, gx.hook)
    out = {"constructed": True, "error_type": None}
    try:
        ddp(torch.randn(4, 32)).sum().backward()
    except gradex.GradexError as exc:
        out.update(error_type=type(exc).__name__, message=str(exc))
    started = time.monotonic()
    state.close()
    out["close_s"] = time.monotonic() - started
    return out


def test_an_error_of_the_background_start_reaches_the_first_backward_on_every_rank():
    for rank, r in enumerate(ranks.run(_start_error, 2, env=_ENV, timeout=180)):
        assert r["constructed"] and r["error_type"] == "ConfigError", (rank, r)
        assert "GRADEX_HALF_TYPE: 'fp16' on ranks [0], 'bf16' on ranks [1]" in r["message"], (rank, r)
        assert r["close_s"] < 10, (rank, r)


def _constructed_only(rank, world):
    import torch
    import gradex.torch as gx
    from gradex.torch import _bootstrap

    model = _model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = gx.State(ddp, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    start = state._starting
    # What the interpreter runs at exit (atexit): the start still connecting is joined, then its engine closed,
    # before the C++ runtime tears down under it.
    _bootstrap._close_all_at_exit()
    return {"joined": not start._thread.is_alive(), "closed": not start.engine().address,
            "live": _bootstrap.latest_engine() is None}


def test_a_state_never_used_is_joined_and_closed_at_exit():
    for rank, r in enumerate(ranks.run(_constructed_only, 2, env=_ENV, timeout=120)):
        assert r == {"joined": True, "closed": True, "live": True}, (rank, r)
