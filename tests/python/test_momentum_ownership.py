"""Momentum ownership follows the optimizer, on real processes: AdamW with DDP + gx.State(ddp) + gx.hook (no
optimizer= given) trains exactly like AdamW with plain DDP at sparsity 0 (gradex adds no momentum by default); gradex takes an SGD optimizer's momentum over and its state_dict() still holds the user's
momentum; Adam-family optimizers never get gradex momentum, even when GRADEX_MOMENTUM is set."""
import torch_ranks as ranks

STEPS = 50
_ENV = {"GRADEX_SPARSITY": "0", "GRADEX_FP16": "0", "GRADEX_TIMEOUT_S": "60"}


def _model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(80, 256), torch.nn.Tanh(), torch.nn.Linear(256, 10))


def _adamw(rank, world, readme_lines):
    import torch
    import torch.nn.functional as F
    import gradex.torch as gx
    from gradex.torch import _momentum

    def batches():
        gen = torch.Generator().manual_seed(100 + rank)
        for _ in range(STEPS):
            yield torch.randn(16, 80, generator=gen), torch.randint(0, 10, (16,), generator=gen)

    def train(hooked):
        model = _model()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        state = None
        if hooked:
            state = gx.State(ddp)
            ddp.register_comm_hook(state, gx.hook)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        for x, y in batches():
            opt.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
        momentum = _momentum.gradex_momentum(state.engine, None) if state else None
        if state:
            state.close()
        return model, momentum

    reference, _ = train(False)
    gradex_run, momentum = train(True)
    distance = max(float((a - b).abs().max()) for a, b in zip(gradex_run.parameters(), reference.parameters()))
    initial = _model()
    moved = max(float((a - b).abs().max()) for a, b in zip(reference.parameters(), initial.parameters()))
    return {"distance": distance, "moved": moved, "engine_momentum": momentum}


def test_adamw_with_the_readme_lines_equals_adamw_with_ddp():
    for r in ranks.run(_adamw, 2, env=_ENV, args=(True,), timeout=300):
        print(f"\nAdamW + gx hook vs AdamW + DDP after {STEPS} steps: max |diff| {r['distance']:.3g}, "
              f"training moved parameters by {r['moved']:.3g}")
        assert r["engine_momentum"] == 0.0
        assert r["moved"] > 1e-2
        assert r["distance"] <= 1e-5 * max(1.0, r["moved"]), r


def _ownership(rank, world):
    import logging

    import torch
    import gradex.torch as gx
    from gradex.torch import _momentum

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("gradex").addHandler(Keep())
    logging.getLogger("gradex").setLevel(logging.INFO)
    out = {}
    # SGD with momentum: gradex takes it over; state_dict() keeps the user's value; close() gives it back.
    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.8, nesterov=True)
    with gx.DistributedOptimizer(sgd, named_parameters=model.named_parameters()) as opt:
        out["engine_momentum"] = _momentum.gradex_momentum(opt.engine, None)
        out["live_momentum"] = sgd.param_groups[0]["momentum"]
        model(torch.randn(4, 80)).sum().backward()
        opt.step()
        saved = opt.state_dict()
        out["saved_momentum"] = (saved["optimizer"]["param_groups"][0]["momentum"],
                                 saved["optimizer"]["param_groups"][0]["nesterov"])
        fresh = torch.optim.SGD(_model().parameters(), lr=0.1, momentum=0.8, nesterov=True)
        fresh.load_state_dict(saved["optimizer"])
        out["fresh_momentum"] = fresh.param_groups[0]["momentum"]
        opt.load_state_dict(saved)
        out["after_load_live"] = sgd.param_groups[0]["momentum"]
    out["after_close"] = (sgd.param_groups[0]["momentum"], sgd.param_groups[0]["nesterov"])
    # SGD with weight decay: folded into SGD's buffer, so the optimizer keeps its momentum.
    sgd_wd = torch.optim.SGD(_model().parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    with gx.DistributedOptimizer(sgd_wd) as opt:
        out["wd"] = (_momentum.gradex_momentum(opt.engine, None), sgd_wd.param_groups[0]["momentum"])
    # Adam family: never gradex momentum, even when GRADEX_MOMENTUM says so.
    for cls in (torch.optim.Adam, torch.optim.AdamW, torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adamax):
        adam = cls(_model().parameters(), lr=1e-3)
        with gx.DistributedOptimizer(adam, config={"GRADEX_MOMENTUM": "0.9"}) as opt:
            out[cls.__name__] = _momentum.gradex_momentum(opt.engine, None)
    rms = torch.optim.RMSprop(_model().parameters(), lr=1e-3, momentum=0.5)
    out["RMSprop"] = _momentum.keeps_first_moment(rms)
    # No optimizer: no momentum, said once.
    state = gx.State(_model())
    gx.State(_model())
    out["no_optimizer"] = _momentum.gradex_momentum(state.engine, state._config)
    state.close()
    out["records"] = records
    return out


def test_momentum_follows_the_optimizer():
    for r in ranks.run(_ownership, 2, env=_ENV, timeout=300):
        assert abs(r["engine_momentum"] - 0.8) < 1e-12 and r["live_momentum"] == 0.0
        assert r["saved_momentum"] == (0.8, True) and r["fresh_momentum"] == 0.8
        assert r["after_load_live"] == 0.0
        assert r["after_close"] == (0.8, True)
        assert r["wd"] == (0.0, 0.9)
        for name in ("Adam", "AdamW", "NAdam", "RAdam", "Adamax"):
            assert r[name] == 0.0, name
        assert r["RMSprop"] is True
        assert r["no_optimizer"] == 0.0
        said = [m for m in r["records"] if "no optimizer= was given" in m]
        assert len(said) == 1, r["records"]
        assert any("GRADEX_MOMENTUM=0.9 is ignored" in m and "Adam" in m for m in r["records"]), r["records"]
        assert any("weight decay" in m for m in r["records"]), r["records"]
