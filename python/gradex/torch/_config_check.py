"""Checking GRADEX_* settings locally, before any engine exists (lazy objects: gx.State, gx.LocalSGD).

gradex_check_config parses the environment and the `config=` overrides in this process with the registry
the engine uses, and refuses unknown names in `config=`. Results are cached per configuration.
"""
from __future__ import annotations

import os
import threading
from typing import Set, Tuple

from .. import _capi

_checked: Set[Tuple[Tuple[Tuple[str, str], ...], Tuple[Tuple[str, str], ...]]] = set()
_lock = threading.Lock()


def check(config: _capi.Config) -> None:
    """Raises gradex.ConfigError for a bad GRADEX_* value in the environment or a bad name or value in
    `config`."""
    settings = {str(k): str(v) for k, v in (config or {}).items()}
    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("GRADEX_")))
    key = (environment, tuple(sorted(settings.items())))
    with _lock:
        if key in _checked:
            return
    _capi.check_config(settings)
    with _lock:
        _checked.add(key)
