#!/usr/bin/env bash
# The emulated commodity-Ethernet cluster of bench/run.
#
# Topology: P hosts, network namespaces gx-h0 .. gx-h<P-1>. Host i has one interface, eth0, with
# address 198.18.0.<i+1>/24 (the benchmarking range 198.18.0.0/15), cabled by a veth pair to port
# p<i> of bridge br0 inside a switch namespace gx-sw (names and subnet: GX_CLUSTER_NAME and
# GX_CLUSTER_SUBNET below). Every link is shaped in both directions with a tbf at --rate (a
# full-duplex NIC); --delay/--jitter add a netem delay on each host's egress, i.e. a one-way
# host-to-host delay, when the kernel has sch_netem. Nothing is attached to the root namespace, so
# the benchmark's traffic never leaves the cluster's namespaces. Every host runs TCP with --cc's
# congestion control (default cubic, Linux's own default): a namespace otherwise inherits the
# machine's, and this one's is bbr, whose start-up overshoots the links' 5 ms queues wherever
# several flows share a link (measured: a direct 8-bit exchange at 100 Mbit/s ran at 45 % of the
# rate with 100x the retransmissions it has under cubic). The name is added to the machine's
# net.ipv4.tcp_allowed_congestion_control if missing (a namespace may only pick an allowed one).
#
# Usage:
#   cluster.sh probe                     exit 0 when this machine can build the cluster; else say why, exit 3
#   cluster.sh up --hosts P --rate R [--delay D [--jitter J]] [--cc NAME] [--owner PID] [--max-s S]
#       Builds the cluster (first removing a stale one whose owner is gone). With --owner, a detached
#       watchdog tears it down when that process exits (even by SIGKILL) or after --max-s seconds.
#   cluster.sh shape --rate R [--delay D [--jitter J]]    re-shapes every link of the running cluster
#   cluster.sh counters                  "h<i> <tx_bytes> <rx_bytes>" of each host's eth0 (cumulative)
#   cluster.sh status                    the hosts, their links' qdiscs and the owner
#   cluster.sh down                      kills what runs inside the cluster's namespaces, deletes them
#   cluster.sh help
# R is a tc rate such as 1gbit, 10gbit, 25gbit or 500mbit; D and J are tc times such as 0.2ms; NAME is
# one of net.ipv4.tcp_available_congestion_control (cubic, bbr, reno, ...) or 'machine' (the machine's).
#
# Exit status: 0 success, 2 usage error, 3 cannot build a cluster here (the reason is printed),
# 4 another live benchmark owns the cluster, 1 anything else.
set -euo pipefail

# GX_CLUSTER_NAME / GX_CLUSTER_SUBNET let a second cluster coexist with the default one (another
# benchmark on the same machine): namespaces <name>-sw, <name>-h<i> (probes <name>-probe-<pid>),
# addresses <subnet>.<i+1>. bench/run --cluster-name/--subnet and bench/harness/network.py read the
# same two variables.
readonly CLUSTER_NAME=${GX_CLUSTER_NAME:-gx}
readonly SUBNET=${GX_CLUSTER_SUBNET:-198.18.0}
[[ $CLUSTER_NAME =~ ^[a-z][a-z0-9]{0,15}$ ]] || { echo "cluster: bad GX_CLUSTER_NAME '$CLUSTER_NAME' (1-16 of a-z0-9, a letter first)" >&2; exit 2; }
[[ $SUBNET =~ ^198\.1[89]\.[0-9]{1,3}$ ]] || { echo "cluster: bad GX_CLUSTER_SUBNET '$SUBNET' (198.18.x or 198.19.x)" >&2; exit 2; }
readonly SWITCH=$CLUSTER_NAME-sw
readonly HOST_PREFIX=$CLUSTER_NAME-h
if [ "$CLUSTER_NAME" = gx ]; then readonly STATE_DIR=/run/gradex-cluster; else readonly STATE_DIR=/run/gradex-cluster-$CLUSTER_NAME; fi
readonly MAX_HOSTS=64

die() { echo "cluster: $*" >&2; exit 1; }
help() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
usage() { echo "cluster: $* (see: $0 help)" >&2; exit 2; }

# Bits per second of a tc rate ("25gbit" -> 25000000000); exits 2 on anything else.
rate_bps() {
  local r=$1 n unit
  [[ $r =~ ^([0-9]+)([kmg]?)bit$ ]] || usage "bad rate '$r' (expected e.g. 1gbit, 10gbit, 500mbit)"
  n=${BASH_REMATCH[1]}; unit=${BASH_REMATCH[2]}
  case $unit in
    k) echo $((n * 1000)) ;; m) echo $((n * 1000000)) ;; g) echo $((n * 1000000000)) ;; *) echo "$n" ;;
  esac
}

check_time() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] || usage "bad time '$1' (expected e.g. 0.2ms)"; }

hosts_of_cluster() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${HOST_PREFIX}[0-9]+$" | sort -V || true
}

# Whether the kernel offers a qdisc: tried on a throwaway veth pair inside a throwaway namespace.
qdisc_available() {
  local kind=$1 ns=$CLUSTER_NAME-probe-$$ ok=1
  ip netns add "$ns" 2>/dev/null || return 1
  if ip -n "$ns" link add q0 type veth peer name q1 2>/dev/null &&
     ip netns exec "$ns" tc qdisc add dev q0 root $kind >/dev/null 2>&1; then  # word-split on purpose
    ok=0
  fi
  ip netns del "$ns" 2>/dev/null || true
  return $ok
}

cmd_probe() {
  local err
  command -v ip >/dev/null || { echo "cluster: cannot build a cluster: 'ip' (iproute2) is not installed" >&2; exit 3; }
  command -v tc >/dev/null || { echo "cluster: cannot build a cluster: 'tc' (iproute2) is not installed" >&2; exit 3; }
  if ! err=$(ip netns add "$CLUSTER_NAME-probe-$$" 2>&1); then
    echo "cluster: cannot create network namespaces here: ${err:-ip netns add failed}" >&2
    echo "cluster: (needs root or CAP_SYS_ADMIN + CAP_NET_ADMIN, and a kernel with network namespaces)" >&2
    exit 3
  fi
  ip netns del "$CLUSTER_NAME-probe-$$"
  if ! qdisc_available "tbf rate 1gbit burst 128kb latency 5ms"; then
    echo "cluster: cannot shape links here: the kernel has no tbf qdisc (sch_tbf)" >&2
    exit 3
  fi
}

# Kills every process still running inside this cluster's namespaces (<name>-*: all started by the
# benchmark), then deletes them. Idempotent; safe when nothing exists.
cmd_down() {
  local ns pids
  for ns in $(hosts_of_cluster) $SWITCH $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${CLUSTER_NAME}-probe-[0-9]+$"); do
    ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$ns" || continue
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$pids" ]; then
      # shellcheck disable=SC2086
      kill -TERM $pids 2>/dev/null || true
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [ -z "$pids" ] && break
        sleep 0.2
      done
      # shellcheck disable=SC2086
      [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
    fi
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$STATE_DIR"
}

owner_alive() {
  [ -f "$STATE_DIR/owner" ] || return 1
  local pid start
  read -r pid start <"$STATE_DIR/owner"
  [ -r "/proc/$pid/stat" ] && [ "$(proc_start "$pid")" = "$start" ]
}

# Start time of a process (field 22 of /proc/PID/stat), to tell a live owner from a reused pid.
proc_start() { awk '{sub(/^.*\) /, ""); print $20}' "/proc/$1/stat" 2>/dev/null || echo gone; }

# Replaces the qdiscs of one interface: [netem delay] -> tbf at the rate.
shape_link() {
  local ns=$1 dev=$2 rate=$3 delay=$4 jitter=$5 bps burst
  bps=$(rate_bps "$rate")
  # Burst: 1 ms at line rate (at least 64 KB), enough for the token bucket to reach the rate with
  # high-resolution timers; queue: 5 ms at line rate, a switch port's buffer rather than bufferbloat.
  burst=$((bps / 8 / 1000)); [ "$burst" -lt 65536 ] && burst=65536
  ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
  if [ -n "$delay" ]; then
    ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "$delay" ${jitter:+"$jitter"}
    ip netns exec "$ns" tc qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$rate" burst "$burst" latency 5ms
  else
    ip netns exec "$ns" tc qdisc add dev "$dev" root handle 10: tbf rate "$rate" burst "$burst" latency 5ms
  fi
}

# Parses --rate/--delay/--jitter (+ --hosts/--cc/--owner/--max-s for `up`) into globals.
parse_shape_args() {
  RATE="" DELAY="" JITTER="" HOSTS="" OWNER="" MAX_S="" CC=""
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) RATE=${2:?}; shift 2 ;;
      --delay) DELAY=${2:?}; shift 2 ;;
      --jitter) JITTER=${2:?}; shift 2 ;;
      --hosts) HOSTS=${2:?}; shift 2 ;;
      --owner) OWNER=${2:?}; shift 2 ;;
      --max-s) MAX_S=${2:?}; shift 2 ;;
      --cc) CC=${2:?}; shift 2 ;;
      *) usage "unknown option '$1'" ;;
    esac
  done
  [ -n "$RATE" ] || usage "--rate is required"
  rate_bps "$RATE" >/dev/null
  [ -n "$DELAY" ] && check_time "$DELAY"
  [ -n "$JITTER" ] && { [ -n "$DELAY" ] || usage "--jitter needs --delay"; check_time "$JITTER"; }
  if [ -n "$DELAY" ] && ! qdisc_available "netem delay 1ms"; then
    echo "cluster: cannot add --delay $DELAY: this kernel has no netem qdisc (sch_netem); run without --delay" >&2
    exit 3
  fi
  return 0
}

# The congestion control the hosts run (--cc, default cubic; 'machine': the root namespace's),
# checked against what the kernel offers; exits 2 naming the choices when it has no such module.
congestion_control() {
  local cc=${CC:-cubic} available
  if [ "$cc" = machine ]; then cat /proc/sys/net/ipv4/tcp_congestion_control; return; fi
  available=$(cat /proc/sys/net/ipv4/tcp_available_congestion_control)
  if ! grep -qw -- "$cc" <<<"$available"; then
    modprobe "tcp_$cc" 2>/dev/null || true
    available=$(cat /proc/sys/net/ipv4/tcp_available_congestion_control)
    grep -qw -- "$cc" <<<"$available" || usage "--cc $cc: this kernel offers $available"
  fi
  echo "$cc"
}

# Sets host namespace $1's congestion control to $2, first allowing it machine-wide if needed.
set_congestion_control() {
  local ns=$1 cc=$2 allowed
  allowed=$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control)
  grep -qw -- "$cc" <<<"$allowed" || sysctl -q -w net.ipv4.tcp_allowed_congestion_control="$allowed $cc"
  ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_congestion_control="$cc"
}

shape_all() {
  local i hosts=$1
  for ((i = 0; i < hosts; i++)); do
    shape_link "$HOST_PREFIX$i" eth0 "$RATE" "$DELAY" "$JITTER"   # host -> switch: the host's upload
    shape_link "$SWITCH" "p$i" "$RATE" "" ""                       # switch -> host: its download
  done
  printf '%s %s %s\n' "$RATE" "${DELAY:--}" "${JITTER:--}" >"$STATE_DIR/shape"
}

cmd_up() {
  parse_shape_args "$@"
  [[ $HOSTS =~ ^[0-9]+$ ]] && [ "$HOSTS" -ge 2 ] && [ "$HOSTS" -le $MAX_HOSTS ] ||
    usage "--hosts must be an integer in [2, $MAX_HOSTS]"
  [ -z "$MAX_S" ] || [[ $MAX_S =~ ^[0-9]+$ ]] || usage "--max-s must be a whole number of seconds"
  local cc
  cc=$(congestion_control)
  cmd_probe
  if [ -n "$(hosts_of_cluster)" ] || ip netns list | awk '{print $1}' | grep -qx "$SWITCH"; then
    if owner_alive; then
      echo "cluster: another benchmark (pid $(cut -d' ' -f1 "$STATE_DIR/owner")) owns the cluster" >&2
      exit 4
    fi
    echo "cluster: removing a stale cluster left by an earlier run" >&2
    cmd_down
  fi
  mkdir -p "$STATE_DIR"
  local owner=${OWNER:-$$} i
  printf '%s %s\n' "$owner" "$(proc_start "$owner")" >"$STATE_DIR/owner"
  trap 'echo "cluster: setup failed, tearing down" >&2; cmd_down' ERR
  ip netns add "$SWITCH"
  ip -n "$SWITCH" link set lo up
  ip -n "$SWITCH" link add br0 type bridge stp_state 0
  ip -n "$SWITCH" link set br0 up
  for ((i = 0; i < HOSTS; i++)); do
    local ns=$HOST_PREFIX$i
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # Created directly inside the two namespaces: the pair never appears in the root namespace.
    ip link add name eth0 netns "$ns" type veth peer name "p$i" netns "$SWITCH"
    ip -n "$SWITCH" link set "p$i" master br0 up
    ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    set_congestion_control "$ns" "$cc"
  done
  echo "$HOSTS" >"$STATE_DIR/hosts"
  echo "$cc" >"$STATE_DIR/cc"
  shape_all "$HOSTS"
  trap - ERR
  if [ -n "$OWNER" ]; then
    # Detached (own session, no inherited stdio) so that it outlives a killed owner.
    setsid "$0" _watchdog "$OWNER" "${MAX_S:-0}" "$(cat "$STATE_DIR/owner")" </dev/null >/dev/null 2>&1 &
  fi
  echo "cluster: $HOSTS hosts ${HOST_PREFIX}0..${HOST_PREFIX}$((HOSTS - 1)) at $SUBNET.1..$SUBNET.$HOSTS, links $RATE${DELAY:+ + $DELAY delay}, tcp $cc"
}

# Tears the cluster down once its owner is gone or after max_s seconds (0: no limit); quits silently
# when the cluster was torn down or re-created by someone else meanwhile.
cmd_watchdog() {
  local owner=$1 max_s=$2 token=$3 start=$SECONDS
  while true; do
    sleep 1
    [ -f "$STATE_DIR/owner" ] && [ "$(cat "$STATE_DIR/owner")" = "$token" ] || exit 0
    if ! owner_alive || { [ "$max_s" -gt 0 ] && [ $((SECONDS - start)) -ge "$max_s" ]; }; then
      cmd_down
      exit 0
    fi
  done
}

require_cluster() {
  [ -f "$STATE_DIR/hosts" ] || die "no cluster is up (cluster.sh up first)"
  cat "$STATE_DIR/hosts"
}

cmd_shape() {
  parse_shape_args "$@"
  [ -z "$HOSTS$OWNER$MAX_S$CC" ] || usage "shape takes only --rate, --delay, --jitter"
  shape_all "$(require_cluster)"
  echo "cluster: links now $RATE${DELAY:+ + $DELAY delay}"
}

# Host i's eth0 counters, read on the switch side of the same veth pair (port p<i>): what the port
# receives is exactly what the host transmitted after its own shaping, and vice versa.
cmd_counters() {
  local hosts i rx tx
  hosts=$(require_cluster)
  for ((i = 0; i < hosts; i++)); do
    rx=$(ip netns exec "$SWITCH" cat "/sys/class/net/p$i/statistics/rx_bytes")
    tx=$(ip netns exec "$SWITCH" cat "/sys/class/net/p$i/statistics/tx_bytes")
    echo "h$i $rx $tx"
  done
}

cmd_status() {
  local hosts i
  hosts=$(require_cluster)
  echo "owner: $(cat "$STATE_DIR/owner"), shape: $(cat "$STATE_DIR/shape"), tcp: $(cat "$STATE_DIR/cc" 2>/dev/null || echo '?')"
  for ((i = 0; i < hosts; i++)); do
    echo "$HOST_PREFIX$i $SUBNET.$((i + 1)): $(ip netns exec "$HOST_PREFIX$i" tc qdisc show dev eth0 | tr '\n' ';')"
  done
}

case ${1:-} in
  probe) cmd_probe ;;
  up) shift; cmd_up "$@" ;;
  shape) shift; cmd_shape "$@" ;;
  counters) cmd_counters ;;
  status) cmd_status ;;
  down) cmd_down ;;
  _watchdog) shift; cmd_watchdog "$@" ;;
  help | -h | --help) help ;;
  *) usage "unknown command '${1:-}'" ;;
esac
