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
