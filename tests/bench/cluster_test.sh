#!/usr/bin/env bash
# Checks bench/cluster/cluster.sh end to end in about ten seconds: two hosts at 100 Mbit/s can reach
# each other, the hosts run the congestion control asked for (cubic by default; an unknown one is
# refused before anything is built), the link is shaped (TCP goodput between 70 % and 105 % of the
# rate), the veth counters see the bytes, a second `up` is refused while the owner lives, `down` leaves no gx-* namespace,
# and the watchdog removes the cluster once its owner dies.
# Under GX_CLUSTER_NAME / GX_CLUSTER_SUBNET (cluster.sh's own variables) it checks a cluster of that name,
# so that it can run beside another benchmark's cluster.
# Exit 0: pass; 77: skipped (not root, or no namespaces/tbf here: the reason is printed); 1: fail.
set -euo pipefail
cd "$(dirname "$0")/../.."
readonly CLUSTER=bench/cluster/cluster.sh LINKCHECK=bench/cluster/linkcheck.py
readonly NAME=${GX_CLUSTER_NAME:-gx} SUBNET=${GX_CLUSTER_SUBNET:-198.18.0}
PY=$(command -v python3)

fail() { echo "cluster_test: FAIL: $*" >&2; exit 1; }
no_gx_left() { ! ip netns list 2>/dev/null | grep -q "^$NAME-"; }

if [ "$(id -u)" -ne 0 ]; then echo "cluster_test: SKIP: needs root (network namespaces, tc)"; exit 77; fi
if ! reason=$("$CLUSTER" probe 2>&1); then echo "cluster_test: SKIP: $reason"; exit 77; fi
if ip netns list | grep -q "^$NAME-"; then
  echo "cluster_test: SKIP: $NAME-* namespaces exist (a benchmark may be running)"; exit 77
fi
trap '"$CLUSTER" down' EXIT

status=0; "$CLUSTER" up --hosts 2 --rate 100mbit --cc no_such_cc >/dev/null 2>&1 || status=$?
[ $status -eq 2 ] || fail "'up --cc no_such_cc' returned $status, expected 2 (usage)"
no_gx_left || fail "'up' with an unknown --cc built namespaces"

"$CLUSTER" up --hosts 2 --rate 100mbit --owner $$ --max-s 120 >/dev/null
[ "$(ip netns list | grep -c "^$NAME-h")" -eq 2 ] || fail "expected 2 host namespaces"
for h in 0 1; do
  cc=$(ip netns exec "$NAME-h$h" cat /proc/sys/net/ipv4/tcp_congestion_control)
  [ "$cc" = cubic ] || fail "host $h runs tcp '$cc', expected cubic (the default of --cc)"
done

# A second benchmark must not take over a cluster whose owner is alive.
status=0; "$CLUSTER" up --hosts 2 --rate 1gbit >/dev/null 2>&1 || status=$?
[ $status -eq 4 ] || fail "second 'up' returned $status, expected 4 (cluster owned)"

# Goodput over 2 s from host 0 to host 1, and the switch-side counters of host 0's link.
read -r _ tx0 _ < <("$CLUSTER" counters | head -1)
timeout 30 ip netns exec "$NAME-h1" "$PY" "$LINKCHECK" serve 5201 2 >"${TMPDIR:-/tmp}/gx-cluster-test.$$" &
server=$!
sleep 0.3
timeout 30 ip netns exec "$NAME-h0" "$PY" "$LINKCHECK" send "$SUBNET.2" 5201 2
wait $server
read -r _ bytes seconds <"${TMPDIR:-/tmp}/gx-cluster-test.$$"
rm -f "${TMPDIR:-/tmp}/gx-cluster-test.$$"
read -r _ tx1 _ < <("$CLUSTER" counters | head -1)
mbit=$(awk -v b="$bytes" -v s="$seconds" 'BEGIN { printf "%.1f", b * 8 / s / 1e6 }')
echo "cluster_test: goodput $mbit Mbit/s on a 100mbit link; veth counted $((tx1 - tx0)) bytes for $bytes received"
awk -v m="$mbit" 'BEGIN { exit !(m >= 70 && m <= 105) }' || fail "goodput $mbit Mbit/s outside [70, 105]"
[ $((tx1 - tx0)) -ge "$bytes" ] || fail "veth counters saw fewer bytes than were received"

"$CLUSTER" down
no_gx_left || fail "namespaces left after down: $(ip netns list | tr '\n' ' ')"

# The watchdog: an owner that dies without tearing down.
bash -c "\"$CLUSTER\" up --hosts 2 --rate 1gbit --owner \$\$ --max-s 60 >/dev/null"
for _ in $(seq 50); do no_gx_left && break; sleep 0.1; done
no_gx_left || fail "the watchdog did not remove the cluster of a dead owner"
echo "cluster_test: PASS"
