#!/usr/bin/env bash
# gradex's GPU checks in one run, for a GPU machine that has CUDA, CMake, ninja and PyTorch but no package
# manager (a lent cloud GPU, a container): the CUDA C++ tests and the device benchmark from a prebuilt tree,
# then the Python package built there against that machine's torch with the CUDA backend, and the GPU
# Python tests (DDP hook and gx.HSDP on CUDA tensors).
#
#   bench/device/gpu_checks.sh PREBUILT DEBS [LOGDIR]
#
# PREBUILT: a folder with bin/ (gradex_backend_test, gradex_sync_backend_test, gradex-device-bench) and lib/
#           (libgradex_backend_cuda.so) from a -DGRADEX_CUDA=ON build of this tree on an x86-64 machine with a
#           glibc no newer than the GPU machine's; DEBS: .deb files of UCX (libucx0, libucx-dev), libnuma1 and
#           zstd (libzstd1, libzstd-dev) and OpenSSL's headers (libssl-dev), unpacked into a private prefix,
#           never into /. A libgomp.so.1 in PREBUILT/extra is used where the machine has none.
# Prints one RESULT/summary line per check; full logs go to LOGDIR (default: $OUT, else /tmp/gradex-gpu).
set -uo pipefail
prebuilt=$(cd "$1" && pwd)
debs=$(cd "$2" && pwd)
logs=${3:-${OUT:-/tmp/gradex-gpu}}
mkdir -p "$logs"
cd "$(dirname "$0")/../.."

prefix=/tmp/gradex-gpu-prefix
mkdir -p "$prefix"
for deb in "$debs"/*.deb; do dpkg -x "$deb" "$prefix"; done
libdir=$prefix/usr/lib/x86_64-linux-gnu
# UCX's CMake package names its prefix as /usr: point it at the private one.
sed -i "s|set(prefix \"/usr\")|set(prefix \"$prefix/usr\")|" "$libdir/cmake/ucx/ucx-targets.cmake"
export LD_LIBRARY_PATH=$libdir:$prebuilt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export UCX_MODULE_DIR=$libdir/ucx
ldconfig -p | grep -q "libgomp.so.1 " || export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$prebuilt/extra
# OpenSSL: the machine's libcrypto.so.3 with the carried headers where it has none of its own.
openssl_args=()
if [ ! -f /usr/include/openssl/evp.h ]; then
  crypto=$(ldconfig -p | awk '/libcrypto.so.3 .*x86-64/ {print $NF; exit}')
  openssl_args=(-C cmake.define.OPENSSL_INCLUDE_DIR="$prefix/usr/include"
                -C cmake.define.OPENSSL_CRYPTO_LIBRARY="$crypto"
                -C cmake.define.CMAKE_CXX_FLAGS="-isystem $prefix/usr/include/x86_64-linux-gnu")
fi

status=0
check() {  # check NAME COMMAND...: runs it with its log in $logs/NAME.log, prints the tail and its exit code
  local name=$1 start=$SECONDS
  shift
  "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && status=1
  echo "== $name: exit $rc, $((SECONDS - start)) s"
  grep -E "RESULT|PASSED|FAILED|passed|failed|skipped|error" "$logs/$name.log" | tail -n 12
}

nvidia-smi -L
check backend_test "$prebuilt/bin/gradex_backend_test"
check sync_backend_test "$prebuilt/bin/gradex_sync_backend_test"
check device_bench "$prebuilt/bin/gradex-device-bench" --backend all --steps 50

# The Python package, built there: its op library must match that machine's torch.
check pip_install python3 -m pip install --no-build-isolation --no-deps --no-cache-dir \
  -C build-dir=/tmp/gradex-build-py -C cmake.define.GRADEX_CUDA=ON \
  -C cmake.define.CMAKE_CUDA_ARCHITECTURES=native -C cmake.define.ucx_DIR="$libdir/cmake/ucx" \
  -C cmake.define.zstd_DIR="$libdir/cmake/zstd" "${openssl_args[@]}" .
check torch_cuda_tests env PYTHONUNBUFFERED=1 python3 -m pytest -q -s -p no:cacheprovider \
  tests/python/test_torch_cuda.py
exit $status
