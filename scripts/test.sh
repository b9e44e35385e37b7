#!/usr/bin/env bash
# Runs every test: the C++ suite (ctest), the Python plugin tests (pytest, when present), the
# ThreadSanitizer build of the threaded tests (scripts/tsan.sh) and a short fuzzing run of each
# fuzzer. Expects scripts/setup.sh to have built build/.
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
echo "== C++ tests (ctest)"
ctest --test-dir build --output-on-failure -j 2 --timeout 600 || status=1

if [ -d tests/python ] && [ -x .venv/bin/python ]; then
  echo "== Python tests (pytest)"
  .venv/bin/python -m pytest -q --durations=15 tests/python || status=1
fi

echo "== ThreadSanitizer (comm, sync, worker pool)"
bash scripts/tsan.sh || status=1

if [ -x build-fuzz/bin/gradex-fuzz-decode ] || [ -f tests/fuzz/run.sh ]; then
  # Four fuzzers (payload decoder, store protocol, negotiation, saved state), each this long.
  echo "== fuzzing (${GRADEX_FUZZ_SECONDS:-30} s per target)"
  bash tests/fuzz/run.sh "${GRADEX_FUZZ_SECONDS:-30}" || status=1
fi
exit $status
