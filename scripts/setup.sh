#!/usr/bin/env bash
# Idempotent setup for a fresh Debian 12 machine: system packages, the project's Python virtual
# environment (.venv, reused when it already has torch), then a build of everything into build/.
# Usage: bash scripts/setup.sh [--no-venv] [--no-build] [--tests]
#   --tests  also builds the trees the test command needs beside build/: the ThreadSanitizer tree
#            (scripts/tsan.sh) and the fuzzers' (tests/fuzz/run.sh), so that scripts/test.sh only tests.
#            Without it scripts/test.sh builds them itself, in the background at the lowest priority.
set -euo pipefail
cd "$(dirname "$0")/.."

want_venv=1
want_build=1
want_test_trees=0
for arg in "$@"; do
  case "$arg" in
    --no-venv) want_venv=0 ;;
    --no-build) want_build=0 ;;
    --tests) want_test_trees=1 ;;
    *) echo "setup.sh: unknown option '$arg' (known: --no-venv, --no-build, --tests)" >&2; exit 2 ;;
  esac
done

apt_packages=(build-essential cmake ninja-build pkg-config git libucx-dev ucx-utils libzstd-dev
              libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev iproute2 libssl-dev
              python3-venv)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# .venv's packages (torch, TensorFlow, the test dependencies): each installed only when missing.
install_venv_packages() {
  if ! .venv/bin/python -c "import torch, numpy, sklearn, matplotlib, pytest" >/dev/null 2>&1; then
    echo "setup: installing torch, numpy, scikit-learn, matplotlib, pytest into .venv (large, once)"
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q torch numpy scikit-learn matplotlib pytest
  fi
  # pytest-xdist: scripts/test.sh runs the Python tests on several workers (most of them wait on sockets and
  # process start-up, so even 2 cores run 3 at once faster).
  if ! .venv/bin/python -c "import xdist" >/dev/null 2>&1; then
    .venv/bin/pip install -q pytest-xdist
  fi
  # Test dependencies of the PyTorch integrations (tests/python/test_lightning.py, test_accelerate.py).
  if ! .venv/bin/python -c "import pytorch_lightning, accelerate" >/dev/null 2>&1; then
    echo "setup: installing pytorch-lightning and accelerate into .venv (test dependencies)"
    .venv/bin/pip install -q pytorch-lightning accelerate
  fi
  # The Hugging Face Trainer (gradex.torch.transformers, examples/hf_trainer_tiny.py, tests/python/
  # test_integration_momentum.py; models built from a config, nothing downloaded) and TensorBoard (the scalar
  # callbacks' SummaryWriter, tests/python/test_scalars.py).
  if ! .venv/bin/python -c "import transformers, tensorboard" >/dev/null 2>&1; then
    echo "setup: installing transformers and tensorboard into .venv (test dependencies)"
    .venv/bin/pip install -q transformers tensorboard
  fi
  # torchft (gradex.torchft, tests/python/test_torchft_*.py): the nightly, whose fault-tolerant DDP skips a step
  # after a failed allreduce (the 0.2.0 release asserts). It requires a torch >= 2.7 and would otherwise upgrade
  # the installed one: installed without dependencies, plus its pure-Python ones and `parameterized` (its tests).
  if ! .venv/bin/python -c "import torchft, parameterized" >/dev/null 2>&1; then
    echo "setup: installing torchft-nightly into .venv (gradex.torchft)"
    .venv/bin/pip install -q --no-deps torchft-nightly
    .venv/bin/pip install -q "opentelemetry-sdk>=1.39" "opentelemetry-exporter-otlp-proto-http>=1.39" parameterized
  fi
  # mypy: scripts/test.sh's "type check (mypy)" stage ([tool.mypy] in pyproject.toml checks python/gradex).
  if ! .venv/bin/python -c "import mypy" >/dev/null 2>&1; then
    echo "setup: installing mypy into .venv (the type check)"
    .venv/bin/pip install -q "mypy==2.4.*"
  fi
  # TensorFlow (CPU wheel) beside torch, for gradex.tensorflow; reused when it imports (with Keras 3).
  if ! .venv/bin/python -c "import tensorflow, keras" >/dev/null 2>&1; then
    echo "setup: installing tensorflow-cpu 2.21 into .venv (large, once)"
    .venv/bin/pip install -q "tensorflow-cpu==2.21.*"
  fi
  # tf-keras (Keras 2, TF_USE_LEGACY_KERAS=1) declares a dependency on the full `tensorflow` wheel, which would
  # pull a second TF beside tensorflow-cpu: installed without its dependencies (tensorflow-cpu provides them).
  if ! .venv/bin/python -c "import tf_keras" >/dev/null 2>&1; then
    .venv/bin/pip install -q --no-deps "tf-keras==2.21.*"
  fi
}

venv_pid=""
venv_log=""
if [ "$want_venv" -eq 1 ]; then
  # The default python3 may be pyenv's; any python >= 3.10 with venv works.
  py=${GRADEX_PYTHON:-python3}
  if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $($py --version)"
    "$py" -m venv .venv
  fi
  # Whether anything is missing, by looking the packages up (importing torch and TF into one interpreter
  # aborts: both bring their own LLVM).
  venv_complete="import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in
             ('torch', 'tensorflow', 'keras', 'tf_keras', 'xdist', 'mypy', 'torchft', 'parameterized',
              'pytorch_lightning', 'accelerate', 'sklearn', 'matplotlib', 'transformers', 'tensorboard')))"
  if [ "$want_build" -eq 1 ] && ! .venv/bin/python -c "$venv_complete" >/dev/null 2>&1; then
    # A fresh .venv takes minutes of downloads and unpacking on one core: the C++ tree, which does not need
    # it, builds meanwhile on the others (the plugins follow once torch and TF are in).
    venv_log=$(mktemp)
    echo "setup: installing .venv's packages in the background (log: $venv_log) while the C++ tree builds"
    install_venv_packages >"$venv_log" 2>&1 &
    venv_pid=$!
  else
    install_venv_packages
  fi
fi

# One build tree for everything: with .venv (torch importable), build/ also holds the PyTorch and TensorFlow op
# libraries, and the Python package is installed from that same tree (pip's build-dir=build, configured with
# build/'s own options), so nothing is compiled twice.
# The options pip's configure of build/ must repeat (pyproject.toml's defaults are a plain wheel's: no tests, no
# bench, no CUDA backend); a difference would rebuild the tree each time.
tree_options=(GRADEX_BUILD_TESTS=ON GRADEX_BUILD_BENCH=ON GRADEX_CUDA=AUTO)
# Debug information: line tables (-g1) by default, enough for every backtrace and sanitizer report and a third
# less compile time than full -g; GX_DEBUG_INFO=full keeps variables and types for a debugger.
case "${GX_DEBUG_INFO:-lines}" in
  lines) debug_flag=-g1 ;;
  full) debug_flag=-g ;;
  *) echo "setup.sh: GX_DEBUG_INFO='${GX_DEBUG_INFO}' is not one of: lines, full" >&2; exit 2 ;;
esac
for lang in C CXX CUDA; do tree_options+=("CMAKE_${lang}_FLAGS_RELWITHDEBINFO=-O2 $debug_flag -DNDEBUG"); done
# CUDA kernels: for the GPU that is here ("native"); with none visible, nothing can run them, and one
# architecture (sm_90) proves they compile and link at 0.63 of the time of CMake's default pair (sm_80 + sm_90,
# for a build that is shipped elsewhere). GX_CUDA_ARCHITECTURES chooses others.
if [ -n "${GX_CUDA_ARCHITECTURES:-}" ]; then
  cuda_architectures=$GX_CUDA_ARCHITECTURES
elif command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  cuda_architectures=native
else
  cuda_architectures=90
fi
tree_options+=("CMAKE_CUDA_ARCHITECTURES=$cuda_architectures")
cmake_args=(-S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo)
for o in "${tree_options[@]}"; do cmake_args+=("-D$o"); done
# ccache, where installed, keeps compiled objects across build trees (worktrees, a clean clone's rebuild).
if command -v ccache >/dev/null; then
  for lang in C CXX CUDA; do cmake_args+=("-DCMAKE_${lang}_COMPILER_LAUNCHER=ccache"); done
fi
# The tests' Python checks run on .venv's interpreter when there is one (the path pip's configure passes).
[ -x .venv/bin/python3 ] && cmake_args+=(-DPython3_EXECUTABLE="$PWD/.venv/bin/python3")
if [ -n "$venv_pid" ]; then
  cmake "${cmake_args[@]}" >/dev/null
  cmake --build build -j "$(nproc)"
  if ! wait "$venv_pid"; then
    echo "setup: installing .venv's packages failed; the log's end:" >&2
    tail -n 40 "$venv_log" >&2
    exit 1
  fi
  cat "$venv_log"
  rm -f "$venv_log"
fi

venv_torch=0
if [ "$want_venv" -eq 1 ] && [ -x .venv/bin/python ] && .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  venv_torch=1
fi
if [ "$want_build" -eq 1 ]; then
  [ $venv_torch -eq 1 ] && cmake_args+=(-DGRADEX_BUILD_TORCH=ON -DGRADEX_BUILD_TENSORFLOW=AUTO)
  cmake "${cmake_args[@]}" >/dev/null
  cmake --build build -j "$(nproc)"
fi

if [ "$want_build" -eq 1 ] && [ $venv_torch -eq 1 ]; then
  # The Python package (gradex, gradex.torch, gradex.tensorflow): libgradex.so and the torch and TF op
  # libraries from build/ (built against the torch and TF in .venv, hence --no-build-isolation), installed
  # into .venv. Skipped when neither the sources nor torch changed since the last install (the stamp is a hash
  # of both: scripts/install_digest.sh, which the plugin tests check too).
  stamp=.venv/.gradex-install-stamp
  digest=$(bash scripts/install_digest.sh)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ] || \
     ! .venv/bin/python -c "import gradex._capi as c; c.lib()" >/dev/null 2>&1; then
    if ! .venv/bin/python -c "import scikit_build_core" >/dev/null 2>&1; then
      .venv/bin/pip install -q "scikit-build-core>=0.8"
    fi
    echo "setup: installing the gradex Python package into .venv (from build/)"
    pip_args=(-C build-dir=build -C cmake.args=-GNinja)
    for o in "${tree_options[@]}"; do pip_args+=(-C "cmake.define.$o"); done
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" .venv/bin/pip install -q --no-build-isolation "${pip_args[@]}" .
    echo "$digest" > "$stamp"
  fi
fi

if [ "$want_build" -eq 1 ] && [ "$want_test_trees" -eq 1 ]; then
  # Each script configures its own tree and builds only the targets it runs.
  echo "setup: building the ThreadSanitizer and fuzzer trees (build-tsan/, build-fuzz/)"
  GX_TSAN_JOBS="$(nproc)" bash scripts/tsan.sh --build-only
  GRADEX_FUZZ_JOBS="$(nproc)" bash tests/fuzz/run.sh --build-only
fi
