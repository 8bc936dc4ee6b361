#!/usr/bin/env bash
# A cluster's network on one machine: one network namespace per node (`sgc-NAME-ROLE`), each with its own address on
# one bridge (`sgc-NAME`), so that gateway replicas, workers, PostgreSQL, Redis and the KV pool talk over a network
# as they would on separate hosts, and a test can cut, slow or break any one node's link. This side (the test, the
# client) is on the bridge too, at .1. Addresses: 198.19.N.0/24 (RFC 2544's benchmarking range 198.18.0.0/15, apart
# from scripts/pool-link.sh's blocks, which are all in 198.18.0.0/16); node i (in --nodes order) is .(10 + i).
# Traffic goes only between the namespaces made here and this side's bridge address: no route, NAT or forwarding
# to anywhere else is set up. Needs root and iproute2.
#
#   netns-cluster.sh up NAME --nodes "gw1 gw2 wk1 wk2 pg rd mc" [--relay "mc"] [--subnet N]
#   netns-cluster.sh down NAME
#   netns-cluster.sh status NAME
#   netns-cluster.sh cut NAME ROLE | heal NAME ROLE
#   netns-cluster.sh shape NAME ROLE --delay MS --loss PCT
#
# NAME: 1-6 of [a-z0-9]; ROLE: 1-3 of [a-z0-9]. A node named in --relay is joined to the bridge through
# sessiongate/benchmarks/link_relay.py (a pair of TAP devices) instead of a veth pair, so that `shape` can add delay and
# loss to its link while it runs (this machine's kernel has no netem). `cut` sets the node's bridge-side device down
# (its link is cut: packets vanish, connections stay half-open), `heal` sets it up again. `up` prints
# `bridge=... client=...` then one `node=ROLE netns=... addr=... dev=...` line per node, and removes what it made if it
# fails; `down` ends every process in the namespaces, then removes everything with the name (succeeds when nothing is
# there).
set -Eeuo pipefail

usage() { sed -n '10,14p' "$0" | sed 's/^# *//' >&2; exit 2; }
die() { echo "netns-cluster: $*" >&2; exit 1; }

[ $# -ge 2 ] || usage
action=$1 name=$2
shift 2
[[ $name =~ ^[a-z0-9]{1,6}$ ]] || die "NAME must be 1-6 of [a-z0-9], got '$name'"
bridge="sgc-$name" prefix="sgc-$name-"
run_dir=/run/sessiongate-netns-cluster
relay="$(cd "$(dirname "$0")/.." && pwd)/sessiongate/benchmarks/link_relay.py"

nodes="" relayed="" subnet="" delay="" loss="" role=""
case $action in cut|heal|shape) role=${1:?ROLE}; shift ;; esac
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) nodes=${2:?}; shift 2 ;;
    --relay) relayed=${2:?}; shift 2 ;;
    --subnet) subnet=${2:?}; shift 2 ;;
    --delay) delay=${2:?}; shift 2 ;;
    --loss) loss=${2:?}; shift 2 ;;
    *) usage ;;
  esac
done

dev_of() { echo "sgc$name-$1"; }      # the bridge-side device of node $1 (at most 14 characters)
peer_of() { echo "sgc$name$1p"; }     # its other end, renamed eth0 once in the namespace

our_namespaces() { ip netns list | awk '{print $1}' | grep -E "^${prefix}[a-z0-9]{1,3}$" || true; }

stop_relay() {  # pid file
  local pid
  pid=$(cat "$1" 2>/dev/null || true)
  if [ -n "$pid" ] && grep -qs "link_relay.py" "/proc/$pid/cmdline"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 20); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
    [ ! -d "/proc/$pid" ] || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

down() {
  local ns pids
  for ns in $(our_namespaces); do
    pids=$(ip netns pids "$ns" || true)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -CONT $pids 2>/dev/null || true
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -TERM $pids 2>/dev/null || true
  done
  for _ in $(seq 30); do
    pids=""
    for ns in $(our_namespaces); do pids="$pids $(ip netns pids "$ns" || true)"; done
    [ -z "${pids// /}" ] && break
    sleep 0.2
  done
  for ns in $(our_namespaces); do
    pids=$(ip netns pids "$ns" || true)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  done
  for pid_file in "$run_dir/$name"-*.pid; do [ -e "$pid_file" ] && stop_relay "$pid_file"; done
  rm -f "$run_dir/$name"-*.log "$run_dir/$name"-*.shape
  for ns in $(our_namespaces); do ip netns delete "$ns"; done
  local dev
  for dev in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^sgc$name-" || true); do
    ip link delete "$dev" 2>/dev/null || true
  done
  if ip link show "$bridge" >/dev/null 2>&1; then ip link delete "$bridge"; fi
}

case $action in
  up)
    [ -n "$nodes" ] || die "up needs --nodes"
    [ "$(id -u)" = 0 ] || die "needs root (ip netns, ip link)"
    if [ -z "$subnet" ]; then subnet=$(($(printf '%s' "$name" | cksum | cut -d' ' -f1) % 256)); fi
    [[ $subnet =~ ^[0-9]+$ ]] && [ "$subnet" -le 255 ] || die "--subnet is 0-255, got '$subnet'"
    net="198.19.$subnet"
    ip link show "$bridge" >/dev/null 2>&1 && die "$bridge exists already (netns-cluster.sh down $name)"
    [ -z "$(our_namespaces)" ] || die "namespaces ${prefix}* exist already (netns-cluster.sh down $name)"
    if ip -o addr show | grep -q "inet $net\."; then die "$net.0/24 is in use here: pick another --subnet"; fi
    made=0
    trap '[ "$made" = 1 ] || down >/dev/null 2>&1 || true' EXIT
    mkdir -p "$run_dir"
    ip link add "$bridge" type bridge stp_state 0 forward_delay 0
    ip addr add "$net.1/24" dev "$bridge"
    ip link set "$bridge" up
    echo "bridge=$bridge client=$net.1 subnet=$net.0/24"
    index=0
    for role in $nodes; do
      [[ $role =~ ^[a-z0-9]{1,3}$ ]] || die "ROLE must be 1-3 of [a-z0-9], got '$role'"
      ns="$prefix$role" dev=$(dev_of "$role") peer=$(peer_of "$role") addr="$net.$((10 + index))"
      index=$((index + 1))
      ip netns add "$ns"
      if [[ " $relayed " == *" $role "* ]]; then
        [ -e /dev/net/tun ] || die "no /dev/net/tun (a relayed link is a pair of TAP devices)"
        echo "0 0" >"$run_dir/$name-$role.shape"
        python3 "$relay" "$dev" "$peer" 0 0 --tap --control "$run_dir/$name-$role.shape" \
          </dev/null >"$run_dir/$name-$role.log" 2>&1 &
        echo $! >"$run_dir/$name-$role.pid"
        for _ in $(seq 50); do ip link show "$peer" >/dev/null 2>&1 && break; sleep 0.1; done
        ip link show "$peer" >/dev/null 2>&1 || die "the relay of $role did not start: $(cat "$run_dir/$name-$role.log")"
      else
        ip link add "$dev" type veth peer name "$peer"
      fi
      ip link set "$peer" netns "$ns"
      ip netns exec "$ns" ip link set "$peer" name eth0
      ip netns exec "$ns" ip addr add "$addr/24" dev eth0
      ip netns exec "$ns" ip link set eth0 up
      ip netns exec "$ns" ip link set lo up
      ip link set "$dev" master "$bridge"
      ip link set "$dev" up
      echo "node=$role netns=$ns addr=$addr dev=$dev"
    done
    made=1
    ;;
  down)
    down
    ;;
  cut|heal)
    [[ $role =~ ^[a-z0-9]{1,3}$ ]] || die "ROLE must be 1-3 of [a-z0-9], got '$role'"
    ip link set "$(dev_of "$role")" "$([ "$action" = cut ] && echo down || echo up)"
    ;;
  shape)
    [ -n "$delay" ] && [ -n "$loss" ] || die "shape needs --delay MS and --loss PCT"
    [[ $delay =~ ^[0-9]+(\.[0-9]+)?$ ]] && [[ $loss =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--delay and --loss are numbers"
    pid=$(cat "$run_dir/$name-$role.pid" 2>/dev/null) || die "$role has no relayed link (up ... --relay \"$role\")"
    echo "$delay $loss" >"$run_dir/$name-$role.shape"
    kill -HUP "$pid"
    ;;
  status)
    [ -n "$(our_namespaces)" ] || { echo "$name: absent"; exit 3; }
    ip -o addr show dev "$bridge"
    for ns in $(our_namespaces); do
      role=${ns#"$prefix"}
      echo "== $ns: $(ip netns exec "$ns" ip -o -4 addr show dev eth0 | awk '{print $4}')," \
        "link $(ip -o link show "$(dev_of "$role")" | grep -o 'state [A-Z]*')," \
        "processes: $(ip netns pids "$ns" | tr '\n' ' ')"
      [ ! -e "$run_dir/$name-$role.shape" ] || echo "   relayed: delay_ms loss_pct = $(cat "$run_dir/$name-$role.shape")"
    done
    ;;
  *) usage ;;
esac
