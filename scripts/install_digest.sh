#!/usr/bin/env bash
# Prints the digest of what the installed Python package is built from: torch's and tensorflow-cpu's
# versions in .venv and every source file the package compiles or ships. scripts/setup.sh stores it
# beside the install (.venv/.gradex-install-stamp) and reinstalls when it changes; the plugin tests
# (tests/python/conftest.py) compare it with the stamp, so that they never run an install older than the
# tree. Run from the repository root.
set -u  # as inline in setup.sh before: a missing optional input (tensorflow-cpu) changes the digest, never fails it
{ .venv/bin/python -c "import importlib.metadata as m; print(m.version('torch'))";
  .venv/bin/python -c "import importlib.metadata as m; print(m.version('tensorflow-cpu'))" 2>/dev/null || true;
  find CMakeLists.txt pyproject.toml base comm compress sync outer capi include plugins python \
       -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.py' \
       -o -name '*.txt' -o -name '*.map' -o -name '*.toml' -o -name '*.cmake' -o -name py.typed \) \
       -not -path '*/__pycache__/*' 2>/dev/null | LC_ALL=C sort | xargs sha256sum; } | sha256sum
