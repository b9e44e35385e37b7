#!/usr/bin/env bash
# Ring vs direct allgatherv on an emulated cluster: builds its own cluster (cluster.sh, under its
# own namespace names so that it can coexist with bench/run's), runs `gradex-bench allgather` as one
# rank per host, prints rank 0's report and tears the cluster down, whatever happens.
#
# Usage: bench/cluster/allgather_incast.sh [--hosts P] [--rate R] [gradex-bench allgather flags...]
#   defaults: --hosts 8 --rate 1gbit; e.g. ... --hosts 4 --rate 10gbit --iters 30
set -euo pipefail
cd "$(dirname "$0")/../.."
HOSTS=8 RATE=1gbit
while [ $# -gt 0 ]; do
  case $1 in
    --hosts) HOSTS=${2:?}; shift 2 ;;
    --rate) RATE=${2:?}; shift 2 ;;
    *) break ;;
  esac
done
export GX_CLUSTER_NAME=${GX_CLUSTER_NAME:-gxag} GX_CLUSTER_SUBNET=${GX_CLUSTER_SUBNET:-198.19.77}
CLUSTER=bench/cluster/cluster.sh
BENCH=$PWD/build/bin/gradex-bench
[ -x "$BENCH" ] || { echo "allgather_incast: build gradex-bench first" >&2; exit 2; }
LOGS=$(mktemp -d /tmp/gx-allgather.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  "$CLUSTER" down >/dev/null 2>&1 || true
}
trap cleanup EXIT
"$CLUSTER" up --hosts "$HOSTS" --rate "$RATE" --owner $$ --max-s 1800
for ((r = 0; r < HOSTS; r++)); do
  # UCX_TLS=tcp,self: the namespaces share /dev/shm; without it UCX would bypass the shaped links.
  ip netns exec "$GX_CLUSTER_NAME-h$r" env RANK=$r WORLD_SIZE="$HOSTS" LOCAL_RANK=0 \
    LOCAL_WORLD_SIZE=1 MASTER_ADDR="$GX_CLUSTER_SUBNET.1" MASTER_PORT=29777 GRADEX_IFACE=eth0 \
    UCX_TLS=tcp,self GRADEX_SHM=0 "$BENCH" allgather "$@" >"$LOGS/rank$r.log" 2>&1 &
  pids+=($!)
done
status=0
for r in "${!pids[@]}"; do
  wait "${pids[$r]}" || { status=1; echo "allgather_incast: rank $r failed:" >&2; tail -5 "$LOGS/rank$r.log" >&2; }
done
pids=()
echo "hosts=$HOSTS rate=$RATE"
grep -v '^\[allgather\]' "$LOGS/rank0.log"
exit $status
