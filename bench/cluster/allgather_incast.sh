#!/usr/bin/env bash
# Ring vs direct allgatherv on an emulated cluster: builds its own cluster (cluster.sh, under its
# own namespace names so that it can coexist with bench/run's), runs `gradex-bench allgather` as one
# rank per host, prints rank 0's report and tears the cluster down, whatever happens. Then each
# collective runs alone, with the TCP retransmissions of its run counted on every host.
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
# TCP segments retransmitted by all hosts so far (RetransSegs of each namespace's /proc/net/snmp):
# incast shows up as retransmissions (tail drops at the shaped port, then RTOs of >= 200 ms).
retransmits() {
  local total=0 r n
  for ((r = 0; r < HOSTS; r++)); do
    n=$(ip netns exec "$GX_CLUSTER_NAME-h$r" awk '/^Tcp:/ { if (!h) { for (i = 1; i <= NF; i++) if ($i == "RetransSegs") c = i; h = 1 } else print $c }' /proc/net/snmp)
    total=$((total + n))
  done
  echo "$total"
}

# One run of every rank, one per host; rank 0's log is kept as $LOGS/<label>.log.
run_phase() {
  local label=$1 r status=0
  shift
  pids=()
  for ((r = 0; r < HOSTS; r++)); do
    # UCX_TLS=tcp,self: the namespaces share /dev/shm; without it UCX would bypass the shaped links.
    ip netns exec "$GX_CLUSTER_NAME-h$r" env RANK=$r WORLD_SIZE="$HOSTS" LOCAL_RANK=0 \
      LOCAL_WORLD_SIZE=1 MASTER_ADDR="$GX_CLUSTER_SUBNET.1" MASTER_PORT=$((29700 + PORT_SEQ)) \
      GRADEX_IFACE=eth0 UCX_TLS=tcp,self GRADEX_SHM=0 "$BENCH" allgather "$@" \
      >"$LOGS/$label.rank$r.log" 2>&1 &
    pids+=($!)
  done
  PORT_SEQ=$((PORT_SEQ + 1))
  for r in "${!pids[@]}"; do
    wait "${pids[$r]}" || { status=1; echo "allgather_incast: $label rank $r failed:" >&2; tail -5 "$LOGS/$label.rank$r.log" >&2; }
  done
  pids=()
  return $status
}

PORT_SEQ=0
status=0
echo "hosts=$HOSTS rate=$RATE"
# Side by side (alternating calls), then each collective alone with its retransmissions counted.
run_phase both "$@" || status=1
grep -v '^\[allgather\]' "$LOGS/both.rank0.log"
for only in direct ring; do
  before=$(retransmits)
  run_phase "$only" "$@" --only "$only" || status=1
  echo "$only alone: $(grep '^RESULT' "$LOGS/$only.rank0.log" | cut -d' ' -f2-) tcp_retransmits=$(( $(retransmits) - before ))"
done
exit $status
