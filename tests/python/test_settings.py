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


def _run_with_library(path: str, code: str):
    import os
    import subprocess
    import sys
    env = dict(os.environ, GRADEX_LIBRARY=path, GRADEX_LOG_LEVEL="warn")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_gradex_library_is_honoured_known_to_the_engine_and_named_when_missing():
    """GRADEX_LIBRARY (another build of libgradex.so under the installed package) is loaded, the engine does
    not call it an unknown variable, and a path that does not exist is named as GRADEX_LIBRARY's."""
    import os

    import gradex
    own = os.path.join(os.path.dirname(gradex.__file__), "libgradex.so")
    loaded = _run_with_library(own, "from gradex import _capi; e = _capi.Engine(0, 1, None, None, {}); "
                                    "print(_capi.library_path()); e.close()")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == own
    assert "unknown environment variable" not in loaded.stderr
    missing = _run_with_library("/nonexistent/libgradex.so", "from gradex import _capi; _capi.lib()")
    assert missing.returncode != 0
    assert "GRADEX_LIBRARY=/nonexistent/libgradex.so does not exist" in missing.stderr
