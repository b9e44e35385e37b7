"""The `gradex` logger, shared by the framework plugins.

Messages go through `logging.getLogger("gradex")`, so applications route, filter or silence them as they
do for any library. Without any logging configuration Python's last-resort handler prints WARNING and above
on stderr; INFO lines (the GRADEX_STATS_EVERY report when it comes from Python, "says so once" notices)
need `logging.basicConfig(level=logging.INFO)` or a handler on the "gradex" logger.
"""
import logging
import threading

logger = logging.getLogger("gradex")

_said = set()
_said_lock = threading.Lock()


def once(key, level, message, *args):
    """Logs `message` at `level` the first time `key` is seen in this process; True when it logged."""
    with _said_lock:
        if key in _said:
            return False
        _said.add(key)
    logger.log(level, message, *args)
    return True


def warn_once(key, message, *args):
    return once(key, logging.WARNING, message, *args)


def info_once(key, message, *args):
    return once(key, logging.INFO, message, *args)
