#!/usr/bin/env bash
# Builds the fuzzers with clang + ASan + UBSan in build-fuzz/ (only those targets) and runs each for
# SECONDS (default 30) over a scratch copy of its committed seed corpus. Fails on any crash or
# sanitizer report; the reproducer is left in build-fuzz/artifacts/<target>/.
#   decode     the sparse payload decoder          corpus/
#   store      the TCP store's server protocol     corpus-store/
#   negotiate  negotiation messages                corpus-negotiate/
#   state      the saved-state loader (C API)      corpus-state/
#   seal       the sealed-frame parser             corpus-seal/
# Usage: bash tests/fuzz/run.sh [SECONDS] [TARGET...]   (default: all five)
#        bash tests/fuzz/run.sh --build-only [TARGET...]   (build the fuzzers, fuzz nothing; scripts/test.sh
#                                                           builds this tree in the background)
#   GX_FUZZ_PARALLEL   targets fuzzed at once (default 2)
set -euo pipefail
cd "$(dirname "$0")/../.."
build_only=0 seconds=0
if [ "${1:-}" = --build-only ]; then
  build_only=1
  shift
else
  seconds=${1:-30}
  shift || true
  [[ $seconds =~ ^[0-9]+$ ]] || { echo "fuzz: SECONDS must be a whole number, got '$seconds'" >&2; exit 2; }
fi
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(decode store negotiate state seal)

sanitize="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fsanitize=fuzzer-no-link"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
mkdir -p build-fuzz
# Line tables (-g1) are all a sanitizer report needs: a third less compile time than full debug information.
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_FLAGS="$sanitize" -DCMAKE_CXX_FLAGS="$sanitize" \
  -DGRADEX_BUILD_FUZZ=ON -DGRADEX_CUDA=OFF -DGRADEX_THRUST_OMP=OFF -DGRADEX_BUILD_BENCH=OFF >build-fuzz/configure.log 2>&1 ||
  { cat build-fuzz/configure.log; exit 1; }
ninja -C build-fuzz -j "${GRADEX_FUZZ_JOBS:-2}" "${targets[@]/#/gradex-fuzz-}"
[ "$build_only" = 1 ] && exit 0

# UCX (inside the state fuzzer's engine) must not hook malloc under ASan.
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_EVENTS=no
export LSAN_OPTIONS="suppressions=$PWD/tests/fuzz/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
# Each target runs in the background with its output in build-fuzz/<target>.log, at most PARALLEL at a
# time (GX_FUZZ_PARALLEL, default 2: CI has 2 cores, and each libFuzzer run is one process on one core,
# so two at a time fuzz as long per target in half the wall time); the logs' tails are printed in order.
parallel=${GX_FUZZ_PARALLEL:-2}
fuzz_one() {
  local t=$1 corpus max_len scratch
  corpus=tests/fuzz/corpus-$t
  [ "$t" = decode ] && corpus=tests/fuzz/corpus
  max_len=8192
  [ "$t" = state ] && max_len=32768
  scratch=build-fuzz/corpus-run-$t
  rm -rf "$scratch"
  cp -r "$corpus" "$scratch"
  mkdir -p "build-fuzz/artifacts/$t"
  build-fuzz/bin/gradex-fuzz-$t -max_total_time="$seconds" -max_len=$max_len -rss_limit_mb=2048 \
    -timeout=10 -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$t/" "$scratch" \
    >"build-fuzz/$t.log" 2>&1
}
status=0
declare -A pid_of=()
report() {  # waits for target $1 and prints the end of its log
  local t=$1 rc=0
  wait "${pid_of[$t]}" || rc=$?
  echo "== fuzzing $t for $seconds s (exit $rc)"
  tail -n 25 "build-fuzz/$t.log"
  [ $rc -eq 0 ] || status=1
}
running=()
for t in "${targets[@]}"; do
  if [ ${#running[@]} -ge "$parallel" ]; then
    report "${running[0]}"
    running=("${running[@]:1}")
  fi
  fuzz_one "$t" &
  pid_of[$t]=$!
  running+=("$t")
done
for t in "${running[@]}"; do
  report "$t"
done
exit $status
