"""Runs tests of torchft's own suite (the installed package's *_test.py modules) with gradex substituted.

torchft's tests build their process groups by calling `ProcessGroupGloo(...)` from their module's namespace;
`run()` replaces that name (and any other given) for the duration of one test, runs the test with unittest
(as torchft's CI does) and returns the result, so a pytest test can assert on it and print what failed.
"""
import contextlib
import fcntl
import importlib
import io
import math
import os
import tempfile
import unittest
from datetime import timedelta
from unittest import mock

import torch
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


def seeded_privately(model_class, seed=42):
    """model_class, its Linear layers initialised as torch does (uniform in +-1/sqrt(fan_in)) but from a generator
    of their own instead of the process-wide one."""
    class Model(model_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            generator = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for layer in self.modules():
                    if isinstance(layer, torch.nn.Linear):
                        bound = 1 / math.sqrt(layer.in_features)
                        layer.weight.uniform_(-bound, bound, generator=generator)
                        layer.bias.uniform_(-bound, bound, generator=generator)
    return Model


# Names a test's module gets besides ProcessGroupGloo, where torchft's test has a race of its own.
# test_ddp_skip_init_sync: both replicas seed the process-wide RNG and build their model under a lock, so that
# skipping the initial sync still starts them equal; but a replica that is already training draws its inputs
# from that same RNG without the lock, and now and then does so between the other's seeding and its model
# (measured: 1 run in 54 of the suite alone, with replicas 0.98 apart at the end). A model seeded from its own
# generator keeps what the test checks, that replicas which start equal stay equal without the initial sync.
EXTRA_SUBSTITUTIONS = {
    "ManagerIntegTest.test_ddp_skip_init_sync": lambda module: {"MyModel": seeded_privately(module.MyModel)},
}

# torchft's tests give each quorum 10 s, sized for torchft's CI, where one test has the machine to itself. Here
# pytest runs several workers on two cores: a quorum waits for the slowest replica's whole step, and under that
# load a healthy upscale test was measured at 8-12 s end to end, so a 10 s quorum wait fails it now and then
# (with gloo as with gradex). A quorum that forms returns at once; the longer limit only changes how long a
# broken one takes to fail. An explicit timeout= in a test, and a value the user exported, still win.
QUORUM_TIMEOUT_ENV = "TORCHFT_QUORUM_TIMEOUT_SEC"
QUORUM_TIMEOUT_UNDER_LOAD_S = "60"


@contextlib.contextmanager
def one_suite_test_at_a_time():
    """torchft's tests bind their Managers' servers at fixed ports (free_ports.TORCHFT_FIXED_PORTS), so two
    of them cannot run at once: pytest-xdist's workers take turns through a file lock."""
    with open(os.path.join(tempfile.gettempdir(), "gradex-tests-torchft-suite.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
        stack.enter_context(one_suite_test_at_a_time())
        quorum_timeout = os.environ.get(QUORUM_TIMEOUT_ENV, QUORUM_TIMEOUT_UNDER_LOAD_S)
        stack.enter_context(mock.patch.dict(os.environ, {QUORUM_TIMEOUT_ENV: quorum_timeout}))
        for name in (module_name, *also):
            stack.enter_context(substituted(importlib.import_module(name), {"ProcessGroupGloo": gradex_group}))
        if test_id in EXTRA_SUBSTITUTIONS:
            stack.enter_context(substituted(module, EXTRA_SUBSTITUTIONS[test_id](module)))
        result = unittest.TextTestRunner(stream=out, verbosity=2).run(suite)
    # Some of torchft's tests leave a default process group behind (torchft's CI runs each file in a process
    # of its own); the next test may create one again.
    if dist.is_initialized():
        dist.destroy_process_group()
    if result.testsRun and len(result.skipped) == result.testsRun:
        import pytest
        pytest.skip(f"{test_id}: skipped by torchft: {result.skipped[0][1]}")
    return result.wasSuccessful(), out.getvalue()
