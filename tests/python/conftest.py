"""The plugin tests need the installed package (scripts/setup.sh runs `pip install .` into .venv)."""
import os

import pytest

# The plugin tests compare against DDP at stated thresholds (DGC above GRADEX_DENSE_THRESHOLD at
# GRADEX_SPARSITY): they run the fixed policy unless a test names one in its ranks' environment.
os.environ.setdefault("GRADEX_POLICY", "fixed")

try:
    import gradex.torch  # noqa: F401
    import torch

    # scripts/test.sh runs three pytest-xdist workers on a 2-core machine, each spawning ranks: a second
    # intra-op thread in every worker only spins against them (an in-process 100-step training took 150 s
    # beside the other workers where it takes 7 s alone). Rank processes set their own thread counts.
    torch.set_num_threads(1)
    _missing = None
except ImportError as exc:  # reported, not skipped silently: the tests then fail with the reason
    _missing = exc


@pytest.fixture(autouse=True)
def _require_package():
    if _missing is not None:
        pytest.fail(f"gradex.torch is not importable ({_missing}); run scripts/setup.sh")


def _stale_install():
    """Why the installed package is older than the tree, or None. scripts/setup.sh stamps the install with
    scripts/install_digest.sh's digest of the sources it was built from; a tree changed since then would be
    tested through the old libraries (a route that no longer exists, a fix not yet in), silently."""
    import pathlib
    import subprocess

    root = pathlib.Path(__file__).resolve().parents[2]
    stamp = root / ".venv" / ".gradex-install-stamp"
    if not stamp.exists():
        return None  # installed some other way: nothing to compare
    digest = subprocess.run(["bash", "scripts/install_digest.sh"], cwd=root, capture_output=True, text=True)
    if digest.returncode != 0:
        return f"scripts/install_digest.sh failed: {digest.stderr.strip()}"
    if digest.stdout.strip() != stamp.read_text().strip():
        return "the gradex installed in .venv was built from other sources than this tree"
    return None


def pytest_configure(config):
    # `slow`: a sweep whose cases repeat code paths that a faster case of the same test already runs in
    # scripts/test.sh's default stage; the opt-in stage (GX_SLOW=1 bash scripts/test.sh) runs them too.
    # Plain `pytest tests/python` runs everything.
    config.addinivalue_line("markers", "slow: a sweep case left to the opt-in stage (GX_SLOW=1 scripts/test.sh)")
    if not hasattr(config, "workerinput"):  # once, in the controller (pytest-xdist's workers share its tree)
        stale = _stale_install()
        if stale:
            pytest.exit(f"{stale}: run `bash scripts/setup.sh` (it rebuilds and reinstalls only what changed)",
                        returncode=2)


# Longest first. scripts/test.sh runs the suite on pytest-xdist workers with --dist worksteal: each worker is
# handed one contiguous block of the collected tests and an idle one takes the back half of the longest
# queue. Collected in file order, a 50 s test near the end of a block starts last and the other workers sit
# idle beside it. durations.txt holds each long test's call time from a recorded run (seconds, node id);
# here the tests are sorted longest first and dealt round robin into the blocks xdist will cut, so every
# worker starts with its longest test and ends with short ones, which are also what stealing moves.
# Tests not in the file keep their file order after the listed ones. Refresh the file with
# `pytest --store-durations tests/python` (with or without -n): it records every test of 5 s or more.
_DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.txt")


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help="write the call time of every test of 5 s or more to tests/python/durations.txt")


def _known_durations():
    known = {}
    try:
        with open(_DURATIONS) as f:
            for line in f:
                if line.strip() and not line.startswith("#"):
                    seconds, nodeid = line.split(maxsplit=1)
                    known[nodeid.strip()] = float(seconds)
    except FileNotFoundError:
        pass
    return known


def _blocks(count, workers):
    """The block sizes xdist's worksteal scheduler cuts from `count` tests for `workers` idle workers."""
    sizes = []
    for i in range(workers):
        sizes.append(count // (workers - i))
        count -= sizes[-1]
    return sizes


@pytest.hookimpl(trylast=True)  # after `-m`/`-k` deselection: the blocks are cut from what runs
def pytest_collection_modifyitems(config, items):
    known = _known_durations()
    if not known:
        return
    ranked = sorted(items, key=lambda item: -known.get(item.nodeid, 0.0))  # stable: file order otherwise
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        blocks = [[] for _ in range(workers)]
        room = _blocks(len(ranked), workers)
        turn = 0
        for item in ranked:
            while len(blocks[turn]) >= room[turn]:
                turn = (turn + 1) % workers
            blocks[turn].append(item)
            turn = (turn + 1) % workers
        ranked = [item for block in blocks for item in block]
    items[:] = ranked


_measured = {}


def pytest_runtest_logreport(report):
    if report.when == "call":
        _measured[report.nodeid] = report.duration


def pytest_sessionfinish(session):
    if session.config.getoption("store_durations") and not hasattr(session.config, "workerinput"):
        long = sorted(((s, n) for n, s in _measured.items() if s >= 5.0), reverse=True)
        with open(_DURATIONS, "w") as f:
            f.write("# seconds node-id: call times of the tests of 5 s or more (pytest --store-durations)\n")
            f.writelines(f"{s:7.1f} {n}\n" for s, n in long)
