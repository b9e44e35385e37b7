"""The optimizer reaches gradex in every integration: Accelerate (the optimizer prepare() returns), the Hugging
Face Trainer (gradex.torch.transformers.CommHook) and Lightning (CommHook hands the Trainer's optimizer to the
State at on_fit_start) apply the momentum rule exactly as gx.State(ddp, optimizer=opt) does in plain PyTorch.

Each integration trains integration_parity.py's classifier on the same batches with the same seed and settings
(GRADEX_SPARSITY=0.99 after 10 warm-up steps, SGD momentum 0.9) as the plain run given the optimizer: it must
end on the same parameters (to fp32 rounding; a run whose optimizer kept its momentum ends far from them, as the
plain run without the optimizer shows) and within 0.02 of its accuracy, ranks bit-identical."""
import os
import subprocess
import sys

import pytest
import torch
import torch_ranks as ranks

import integration_parity as parity

_EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
# Parameters of a run that applied the rule as the plain run did differ by fp32 rounding only; a run without
# gradex's momentum differs by orders of magnitude more (checked against the plain run without the optimizer).
_SAME = 1e-4


def _check(results, which):
    for reference, other in results:
        assert reference["identical"] and other["identical"], which
        moved = float(abs(other["flat"] - reference["flat"]).max())
        assert moved < _SAME, f"{which} ended {moved:.2e} away from plain PyTorch with the optimizer"
        assert abs(other["acc"] - reference["acc"]) <= 0.02, (which, other["acc"], reference["acc"])
        assert other["stats"]["sparse_exchanges"] > 0, other["stats"]
    return results


def test_plain_run_without_the_optimizer_differs(tmp_path):
    """The comparison can fail: the two lines without optimizer= leave SGD its momentum on sparse updates."""
    for reference, other in ranks.run(parity._pair, 2, args=(0, "none", str(tmp_path)), timeout=300):
        assert reference["identical"] and other["identical"]
        assert float(abs(other["flat"] - reference["flat"]).max()) > 100 * _SAME


def test_accelerate_hands_its_optimizer_to_gradex(tmp_path):
    _check(ranks.run(parity._pair, 2, args=(0, "accelerate", str(tmp_path)), timeout=300), "accelerate")


def test_hf_trainer_callback_hands_its_optimizer_to_gradex(tmp_path):
    results = _check(ranks.run(parity._pair, 2, args=(0, "trainer", str(tmp_path)), timeout=300), "trainer")
    assert all(other["took_momentum"] for _, other in results)


def test_lightning_comm_hook_hands_its_optimizer_to_gradex(tmp_path):
    reference = ranks.run(parity.plain, 2, args=(0, True), timeout=300)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ranks.free_port()))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    done = subprocess.run(parity.lightning_script(0, str(tmp_path)), env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    lightning = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for ref, light in zip(reference, lightning):
        assert light["momentum_while_owned"] == 0.0  # gradex took SGD's momentum over
    _check(list(zip(reference, lightning)), "lightning")


def _trainer_example(rank, world, out_dir):
    sys.path.insert(0, _EXAMPLES)
    import hf_trainer_tiny
    import gradex.torch as gx
    trainer, hook = hf_trainer_tiny.train(out_dir, steps=30, config={"GRADEX_SPARSITY": "0.99",
                                                                      "GRADEX_WARMUP_STEPS": "5"})
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    flat = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    torch.distributed.all_gather(gathered, flat)
    out = {"losses": losses, "identical": all(torch.equal(g, gathered[0]) for g in gathered),
           "stats": gx.stats(hook.gradex_state),
           "momentum": trainer.optimizer.param_groups[0]["momentum"],
           "engine_momentum": hook.gradex_state.engine.describe_config()}
    hook.gradex_state.close()
    out["momentum_after_close"] = trainer.optimizer.param_groups[0]["momentum"]
    return out


def test_hf_trainer_example_trains_a_config_built_bert(tmp_path):
    for r in ranks.run(_trainer_example, 2, args=(str(tmp_path),), timeout=300):
        assert r["identical"]
        assert r["stats"]["sparse_exchanges"] > 0 and r["stats"]["compression_ratio"] > 2, r["stats"]
        assert r["momentum"] == 0.0 and r["momentum_after_close"] == 0.9  # owned by gradex, then given back
        assert "GRADEX_MOMENTUM=0.9" in r["engine_momentum"]
        assert r["losses"][-1] < r["losses"][0] - 0.05, r["losses"]


@pytest.mark.parametrize("wrapper", ["accelerate", "lightning"])
def test_rule_looks_through_framework_optimizer_wrappers(wrapper):
    from gradex._optimizer_family import Family, family, unwrap
    sgd = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1, momentum=0.9)
    if wrapper == "accelerate":
        from accelerate.optimizer import AcceleratedOptimizer
        # Built without an Accelerator (which its constructor requires): the rule reads `optimizer` only.
        wrapped = AcceleratedOptimizer.__new__(AcceleratedOptimizer)
        wrapped.__dict__["optimizer"] = sgd
    else:
        from pytorch_lightning.core.optimizer import LightningOptimizer
        wrapped = LightningOptimizer(sgd)
    assert unwrap(wrapped) is sgd and family(wrapped) is Family.SGD


def test_set_optimizer_applies_the_rule_once_and_before_the_first_bucket():
    import gradex
    import gradex.torch as gx
    model = torch.nn.Linear(4, 2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = gx.State()
    assert state.optimizer is None
    state.set_optimizer(sgd)
    assert state.optimizer is sgd and sgd.param_groups[0]["momentum"] == 0.0  # gradex owns it now
    assert state._config["GRADEX_MOMENTUM"] == "0.9"  # what the engine will be created with
    state.set_optimizer(sgd)  # the same optimizer again: nothing changes
    with pytest.raises(gradex.InvalidArgumentError):
        state.set_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5))
    state.close()
    assert sgd.param_groups[0]["momentum"] == 0.9  # given back
    closed = gx.State()
    closed.close()
    with pytest.raises(gradex.StateError):  # the engine's settings are fixed (here: it is gone)
        closed.set_optimizer(sgd)
