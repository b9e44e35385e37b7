"""gradex_check_config (gradex._capi.check_config): GRADEX_* names and values in `config=` and the environment
are validated in this process, as engine creation parses them, when a lazy object is constructed."""
import pytest


def test_check_config_names_the_variable_and_its_range(monkeypatch):
    import gradex
    from gradex import _capi

    _capi.check_config({"GRADEX_SPARSITY": "0.99", "GRADEX_FP16": "0"})
    _capi.check_config(None)
    with pytest.raises(gradex.ConfigError, match=r"unknown configuration variable 'GRADEX_SPARSTY' "
                                                 r"\(did you mean GRADEX_SPARSITY, a number in \[0, 1\)"):
        _capi.check_config({"GRADEX_SPARSTY": "0.99"})
    with pytest.raises(gradex.ConfigError, match=r"GRADEX_FUSION_MB='-3'.*\[0, 4096\]"):
        _capi.check_config({"GRADEX_FUSION_MB": "-3"})
    with pytest.raises(gradex.ConfigError, match="GRADEX_OUTER_DELAY"):
        _capi.check_config({"GRADEX_OUTER_PERIOD": "4", "GRADEX_OUTER_DELAY": "4"})
    with pytest.raises(gradex.InvalidArgumentError, match="must be a dict"):
        _capi.check_config([("GRADEX_SPARSITY", "0.9")])
    # The environment is parsed too; a value given in config wins over it.
    monkeypatch.setenv("GRADEX_HALF_TYPE", "fp8")
    with pytest.raises(gradex.ConfigError, match="GRADEX_HALF_TYPE='fp8'.*fp16|bf16"):
        _capi.check_config({})
    _capi.check_config({"GRADEX_HALF_TYPE": "bf16"})


def test_unknown_config_key_raises_at_construction():
    import torch
    import gradex.torch as gx

    with pytest.raises(gx.ConfigError, match="GRADEX_SPARSTY"):
        gx.State(config={"GRADEX_SPARSTY": "0.99"})
    with pytest.raises(gx.ConfigError, match="GRADEX_LOCALSGD_PERIODS"):
        gx.LocalSGD(torch.nn.Linear(3, 2), period=2, config={"GRADEX_LOCALSGD_PERIODS": "3"})


def test_distributed_optimizer_checks_config_before_any_engine():
    import torch
    import gradex.torch as gx
    from gradex.torch import _bootstrap

    before = _bootstrap.latest_engine()
    with pytest.raises(gx.ConfigError, match="did you mean GRADEX_DENSE_THRESHOLD"):
        gx.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(3, 2).parameters(), lr=0.1),
                                config={"GRADEX_DENSE_THRESHOLDS": "10"})
    assert _bootstrap.latest_engine() is before  # refused before bootstrap: nothing was created
