#!/usr/bin/env bash
# Builds the decoder fuzzer with clang + ASan + UBSan in build-fuzz/ (only that target: it needs
# gradex_base and gradex_compress, no UCX library is built) and runs it for SECONDS (default 60)
# over a scratch copy of the committed seed corpus. Fails on any crash or sanitizer report; the
# reproducer is left in build-fuzz/artifacts/.
# Usage: bash tests/fuzz/run.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}

sanitize="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fsanitize=fuzzer-no-link"
mkdir -p build-fuzz
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_FLAGS="$sanitize" -DCMAKE_CXX_FLAGS="$sanitize" \
  -DGRADEX_BUILD_FUZZ=ON -DGRADEX_CUDA=OFF -DGRADEX_BUILD_BENCH=OFF >build-fuzz/configure.log 2>&1 ||
  { cat build-fuzz/configure.log; exit 1; }
ninja -C build-fuzz -j "${GRADEX_FUZZ_JOBS:-2}" gradex-fuzz-decode

rm -rf tests/fuzz/corpus-run
cp -r tests/fuzz/corpus tests/fuzz/corpus-run
mkdir -p build-fuzz/artifacts
build-fuzz/bin/gradex-fuzz-decode -max_total_time="$seconds" -max_len=8192 -rss_limit_mb=2048 \
  -timeout=10 -print_final_stats=1 -artifact_prefix=build-fuzz/artifacts/ tests/fuzz/corpus-run
