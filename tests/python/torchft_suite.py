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
import threading
import time
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


@contextlib.contextmanager
def late_replica_joins_the_last_quorum(module, late_replica="0", last_step=3, margin_s=0.5, join_timeout_ms=5000,
                                       limit_s=120.0):
    """torchft's upscale test starts replica 0 once replicas 1 and 2 have reached step 2, and expects all three
    in the quorum before 1 and 2 stop after step 4. Two races in the test can leave one replica alone below
    min_replicas until its quorum times out (measured with 6 busy processes beside it: 1 run in 4):
    - the lighthouse forms a "fast quorum" as soon as every member of the previous quorum asks, so replicas 1
      and 2 can take their quorums for steps 2 and 3 while replica 0 is still on its first inner step;
    - it waits for a heartbeating replica that has not asked only for join_timeout_ms (100 ms here) after the
      first request, so replica 0, having asked early, and one of 1 and 2 can form a quorum without the other.
    This holds the other replicas' last quorum until replica 0 has asked, and then until a margin has passed
    since it asked (for its request to reach the lighthouse; also where they find it has asked already: on a
    loaded machine its request reached the lighthouse 3 ms after theirs had formed a quorum without it), and
    gives the lighthouse a join timeout longer than that margin: the order the test is written for. What the
    test checks (the late replica heals from a peer and all three end with the same
    state) is unchanged; its first quorum now waits the join timeout for replica 0, held at its barrier."""
    from torchft import manager as manager_module

    asked = threading.Event()
    asked_at = [0.0]  # time.monotonic() of the late replica's first ask, written before `asked` is set
    original = manager_module.Manager._async_quorum

    def async_quorum(self, *args, **kwargs):
        if self._replica_id == late_replica:
            if not asked.is_set():
                asked_at[0] = time.monotonic()
                asked.set()
        elif self.current_step() >= last_step:
            if not asked.wait(limit_s):
                raise TimeoutError(f"replica {late_replica} never asked for a quorum in {limit_s:.0f} s")
            time.sleep(max(0.0, asked_at[0] + margin_s - time.monotonic()))
        return original(self, *args, **kwargs)

    lighthouse = module.LighthouseServer

    def patient_lighthouse(*args, **kwargs):
        kwargs.setdefault("join_timeout_ms", join_timeout_ms)
        return lighthouse(*args, **kwargs)

    with mock.patch.object(manager_module.Manager, "_async_quorum", async_quorum), \
            substituted(module, {"LighthouseServer": patient_lighthouse}):
        yield


# Tests whose replicas race in a way torchft's own test does not order (see the function named).
ORDERED_BY = {
    "LocalSGDIntegTest.test_streaming_diloco_upscale_00": late_replica_joins_the_last_quorum,
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
        if test_id in ORDERED_BY:
            stack.enter_context(ORDERED_BY[test_id](module))
        result = unittest.TextTestRunner(stream=out, verbosity=2).run(suite)
    # Some of torchft's tests leave a default process group behind (torchft's CI runs each file in a process
    # of its own); the next test may create one again.
    if dist.is_initialized():
        dist.destroy_process_group()
    if result.testsRun and len(result.skipped) == result.testsRun:
        import pytest
        pytest.skip(f"{test_id}: skipped by torchft: {result.skipped[0][1]}")
    return result.wasSuccessful(), out.getvalue()
