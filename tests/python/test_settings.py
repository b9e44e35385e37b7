"""gradex_get_setting_number: numeric GRADEX_* settings read by name from an engine and from the environment."""
import pytest


def test_an_engines_numeric_settings_by_name(monkeypatch):
    import gradex
    from gradex import _capi
    monkeypatch.setenv("GRADEX_CLIP_NORM", "2.5")
    engine = _capi.Engine(0, 1, None, None, {"GRADEX_MOMENTUM": "0.875", "GRADEX_FP16": "0",
                                             "GRADEX_LOCALSGD_PERIOD": "3"})
    try:
        assert engine.setting("GRADEX_MOMENTUM") == 0.875  # API config
        assert engine.setting("GRADEX_CLIP_NORM") == 2.5  # environment
        assert engine.setting("GRADEX_LOCALSGD_PERIOD") == 3.0  # an integer
        assert engine.setting("GRADEX_FP16") == 0.0  # a boolean
        with pytest.raises(gradex.InvalidArgumentError, match="'GRADEX_MOMENTUMM' is not a GRADEX_\\* setting"):
            engine.setting("GRADEX_MOMENTUMM")
        with pytest.raises(gradex.InvalidArgumentError, match="GRADEX_POLICY is one of .*, not a number"):
            engine.setting("GRADEX_POLICY")
    finally:
        engine.close()
    assert _capi.setting_number("GRADEX_CLIP_NORM") == 2.5


def test_the_torch_momentum_rule_reads_the_engines_setting():
    from gradex import _capi
    from gradex.torch import _momentum
    engine = _capi.Engine(0, 1, None, None, {"GRADEX_MOMENTUM": "0.5"})
    try:
        assert _momentum.gradex_momentum(engine, {"GRADEX_MOMENTUM": "0.25"}) == 0.5  # the engine's wins
    finally:
        engine.close()
    assert _momentum.gradex_momentum(None, {"GRADEX_MOMENTUM": "0.25"}) == 0.25
