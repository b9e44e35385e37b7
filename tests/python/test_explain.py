"""gx.explain() / gxt.explain(): each tensor's codec and why, from the engine (gradex_explain), on real
processes. Under GRADEX_POLICY=fixed a large tensor is DGC and a small one dense; under auto every rank reports
the same plan (decisions come from rank 0's agreed numbers); the PyTorch plugin registers output rows."""
import torch_ranks as ranks


def _explain(rank, world, steps):
    import torch
    import gradex.torch as gx

    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("small", torch.nn.Linear(8, 8))
    model.add_module("big", torch.nn.Linear(200, 100))
    opt = gx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                  named_parameters=model.named_parameters())
    for _ in range(steps):
        opt.zero_grad()
        model[1](torch.randn(4, 200)).sum().backward()
        model[0](torch.randn(4, 8)).sum().backward()
        opt.step()
    text = gx.explain(opt)
    default_text = gx.explain()  # the most recent engine: the same one
    opt.close()
    return {"text": text, "default": default_text}


def _lines(text):
    return {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}


def test_fixed_policy_is_explained_per_tensor():
    results = ranks.run(_explain, 2, env={"GRADEX_POLICY": "fixed", "GRADEX_DENSE_THRESHOLD": "1000"},
                        args=(2,))
    text = results[0]["text"]
    assert text.startswith("GRADEX_POLICY=fixed"), text
    lines = _lines(text)
    assert "dgc" in lines["big.weight"], text  # 20,000 elements >= the threshold
    assert "dgc" not in lines["small.weight"] and "dgc" not in lines["big.bias"], text
    assert results[0]["default"] == text
    assert results[1]["text"] == text  # same policy everywhere


def test_auto_policy_plan_is_the_same_on_every_rank():
    # (GRADEX_DENSE_THRESHOLD is the fixed policy's: with auto it is a contradiction, not a setting.)
    results = ranks.run(_explain, 2, env={"GRADEX_POLICY": "auto", "GRADEX_POLICY_INTERVAL": "2"}, args=(6,))
    policies = [{k: " ".join(v.split()[1:3]) for k, v in _lines(r["text"]).items()} for r in results]
    assert set(policies[0]) >= {"small.weight", "small.bias", "big.weight", "big.bias"}, results[0]["text"]
    assert policies[0] == policies[1], (results[0]["text"], results[1]["text"])
    assert "current policies:" in results[0]["text"]


def test_torch_registers_output_rows_for_the_per_row_floor():
    # big.weight is 100 x 200: DGC 99% keeps 200 values, 2 per row. With a floor of 5 per row the
    # plan may not sparsify it, which it can only know from the rows the plugin registered. It stays
    # on a dense rung: fp32, 16-bit, or (where the measured step is exposed) 8-bit or 4-bit codes
    # with error feedback, which send every coordinate.
    results = ranks.run(_explain, 2, env={"GRADEX_POLICY": "auto", "GRADEX_POLICY_INTERVAL": "2",
                                          "GRADEX_POLICY_LADDER": "0.99", "GRADEX_POLICY_MIN_PER_ROW": "5",
                                          "GRADEX_POLICY_RAMP_STEPS": "0"},
                        args=(4,))
    text = results[0]["text"]
    plan = {line.split()[0]: line for line in text.splitlines() if line.startswith(("big.", "small."))}
    assert "GRADEX_POLICY_MIN_PER_ROW" in plan["big.weight"], text
    assert plan["big.weight"].split()[2] in ("fp32", "16-bit", "8-bit", "4-bit"), text
    assert "GRADEX_POLICY_MIN_PER_ROW" not in plan["big.bias"], text


def _horizon(rank, world, kind):
    import torch
    import gradex.torch as gx

    torch.manual_seed(0)
    model = torch.nn.Linear(200, 100)
    inner = torch.optim.SGD(model.parameters(), lr=0.01)
    if kind == "steps":
        horizon = 250
    else:  # an LR scheduler that knows its total
        horizon = torch.optim.lr_scheduler.OneCycleLR(inner, max_lr=0.1, total_steps=120)
    opt = gx.DistributedOptimizer(inner, named_parameters=model.named_parameters(), horizon_steps=horizon)
    opt.zero_grad()
    model(torch.randn(4, 200)).sum().backward()
    opt.step()
    text = gx.explain(opt)
    config = opt.engine.describe_config()
    opt.close()
    setting = [line.strip().split("=", 1)[1].split()[0] for line in config.splitlines()
               if line.strip().startswith("GRADEX_POLICY_HORIZON_STEPS=")]
    return {"text": text, "setting": setting}


def test_torch_passes_the_training_horizon_it_is_given():
    for kind, steps in (("steps", 250), ("scheduler", 120)):
        results = ranks.run(_horizon, 2, env={"GRADEX_POLICY": "auto"}, args=(kind,))
        for r in results:
            assert r["setting"] == [str(steps)], r
            assert f"training horizon {steps} steps" in r["text"].splitlines()[0], r["text"]


def test_torch_horizon_argument_is_checked():
    import pytest
    import torch
    import gradex.torch as gx

    model = torch.nn.Linear(4, 2)
    state = gx.State(model, horizon_steps=torch.optim.lr_scheduler.OneCycleLR(
        torch.optim.SGD(model.parameters(), lr=0.1), max_lr=0.1, total_steps=30))
    assert state._config["GRADEX_POLICY_HORIZON_STEPS"] == "30"
    for bad in ("100", -1, True, torch.optim.SGD(model.parameters(), lr=0.1)):
        with pytest.raises(gx.InvalidArgumentError):
            gx.State(model, horizon_steps=bad)
    with pytest.raises(gx.InvalidArgumentError):
        gx.State(model, horizon_steps=10, config={"GRADEX_POLICY_HORIZON_STEPS": "20"})
    assert gx.State(model, horizon_steps=10, config={"GRADEX_POLICY_HORIZON_STEPS": "10"})._config[
        "GRADEX_POLICY_HORIZON_STEPS"] == "10"
