"""The `gradex` logger, shared by the framework plugins.

Messages go through `logging.getLogger("gradex")`, so applications route, filter or silence them as they
do for any library. Without any logging configuration Python's last-resort handler prints WARNING and above
on stderr; INFO lines (the GRADEX_STATS_EVERY report when it comes from Python, "says so once" notices)
need `logging.basicConfig(level=logging.INFO)` or a handler on the "gradex" logger.
"""
from __future__ import annotations

import logging
import threading
from typing import Hashable, Set

logger = logging.getLogger("gradex")

_said: Set[Hashable] = set()
_said_lock = threading.Lock()


def once(key: Hashable, level: int, message: str, *args: object) -> bool:
    """Logs `message` at `level` the first time `key` is seen in this process; True when it logged."""
    with _said_lock:
        if key in _said:
            return False
        _said.add(key)
    logger.log(level, message, *args)
    return True


def warn_once(key: Hashable, message: str, *args: object) -> bool:
    return once(key, logging.WARNING, message, *args)


def info_once(key: Hashable, message: str, *args: object) -> bool:
    return once(key, logging.INFO, message, *args)
