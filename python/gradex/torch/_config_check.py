"""Checking GRADEX_* settings locally, before any engine exists (lazy objects: gx.State, gx.LocalSGD).

The environment's values are parsed strictly in this process by gradex_describe_config (the same registry
the engine uses). The C API has no call that validates `config=` overrides without creating an engine, so
those are parsed the same way in a short-lived child interpreter whose environment holds them (API values
win over the environment there as in the engine). Neither touches the network. Results are cached per
configuration, so creating many objects with the same overrides costs one child.
"""
import os
import subprocess
import sys
import threading

from .. import _capi, _errors

_checked = set()
_lock = threading.Lock()
_CHILD = "import gradex._capi as c; c.describe_config()"


def check(config):
    """Raises gradex.ConfigError for a bad GRADEX_* value in the environment or in `config`."""
    config = {str(k): str(v) for k, v in (config or {}).items()}
    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("GRADEX_")))
    key = (environment, tuple(sorted(config.items())))
    with _lock:
        if key in _checked:
            return
    _capi.describe_config()  # the environment, in this process
    if config:
        _check_in_child(config)
    with _lock:
        _checked.add(key)


def _check_in_child(config):
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, **config)
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in sys.path if p])
    env["GRADEX_LIBRARY"] = _capi.library_path()
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:  # cannot check here: the engine checks at bootstrap
        return exc
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit status {done.returncode}"
    marker = "ConfigError: "
    if marker in last:
        raise _errors.ConfigError(last.split(marker, 1)[1] + " (in config=)")
    raise _errors.GradexError(f"gradex: checking config= failed: {last}")
