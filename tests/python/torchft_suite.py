"""Runs tests of torchft's own suite (the installed package's *_test.py modules) with gradex substituted.

torchft's tests build their process groups by calling `ProcessGroupGloo(...)` from their module's namespace;
`run()` replaces that name (and any other given) for the duration of one test, runs the test with unittest
(as torchft's CI does) and returns the result, so a pytest test can assert on it and print what failed.
"""
import contextlib
import importlib
import io
import os
import unittest
from datetime import timedelta

import torch.distributed as dist

from gradex.torchft import ProcessGroupGradex


def gradex_group(timeout=timedelta(seconds=60), **_ignored):
    """What torchft's tests get where they ask for ProcessGroupGloo(timeout=...)."""
    return ProcessGroupGradex(timeout=timeout)


@contextlib.contextmanager
def substituted(module, names):
    saved = {name: getattr(module, name) for name in names}
    try:
        for name, value in names.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


# torchft's tests give each quorum 10 s, sized for torchft's CI, where one test has the machine to itself. Here
# pytest runs several workers on two cores: a quorum waits for the slowest replica's whole step, and under that
# load a healthy upscale test was measured at 8-12 s end to end, so a 10 s quorum wait fails it now and then
# (with gloo as with gradex). A quorum that forms returns at once; the longer limit only changes how long a
# broken one takes to fail. An explicit timeout= in a test, and a value the user exported, still win.
QUORUM_TIMEOUT_ENV = "TORCHFT_QUORUM_TIMEOUT_SEC"
QUORUM_TIMEOUT_UNDER_LOAD_S = 60


@contextlib.contextmanager
def environment(defaults):
    """Sets each variable not already set, for the duration; restores the environment afterwards."""
    added = [name for name in defaults if name not in os.environ]
    try:
        for name in added:
            os.environ[name] = defaults[name]
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def run(module_name, test_id, also=()):
    """Runs `Class.method` of torchft's `module_name` with ProcessGroupGloo replaced by ProcessGroupGradex in
    that module and in the modules named in `also` (helpers the test builds its groups with). Returns
    (passed, report)."""
    module = importlib.import_module(module_name)
    suite = unittest.defaultTestLoader.loadTestsFromName(test_id, module)
    if suite.countTestCases() == 0:
        raise AssertionError(f"{module_name}.{test_id} names no test (renamed in this torchft version?)")
    out = io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(environment({QUORUM_TIMEOUT_ENV: str(QUORUM_TIMEOUT_UNDER_LOAD_S)}))
        for name in (module_name, *also):
            stack.enter_context(substituted(importlib.import_module(name), {"ProcessGroupGloo": gradex_group}))
        result = unittest.TextTestRunner(stream=out, verbosity=2).run(suite)
    # Some of torchft's tests leave a default process group behind (torchft's CI runs each file in a process
    # of its own); the next test may create one again.
    if dist.is_initialized():
        dist.destroy_process_group()
    if result.testsRun and len(result.skipped) == result.testsRun:
        import pytest
        pytest.skip(f"{test_id}: skipped by torchft: {result.skipped[0][1]}")
    return result.wasSuccessful(), out.getvalue()
