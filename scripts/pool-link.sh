#!/usr/bin/env bash
# An emulated network link to the shared KV pool: a network namespace `sg-NAME` joined to this side by a pair of
# TUN devices (`sg-NAME-h` here, `sg-NAME-n` there) with a rate and a delay in both directions: a tbf qdisc on each
# device's egress for the rate, and sessiongate/benchmarks/link_relay.py, which forwards between the two devices, for
# the delay and loss (this machine's kernel has no netem, the qdisc a veth pair would use; see that module).
# Addresses in the RFC 2544 benchmarking range 198.18.0.0/15 only. Whatever runs in the namespace (`ip netns exec
# sg-NAME ...`: the pool's Mooncake master and storage node) is reached from here across the link, so a KV page read
# back from the pool costs its bytes over RATE plus the delay, as it would over a cluster's network. Needs root and
# iproute2; touches no other interface, route or address.
#
#   pool-link.sh up NAME --rate RATE --delay MS [--loss PCT] [--block N] [--mtu BYTES]
#   pool-link.sh down NAME
#   pool-link.sh status NAME
#
# RATE: a whole number with tc's unit (`200mbit`, `1gbit`) or alone, in Mbit/s. MS: the delay each direction adds
# (one way), so the round trip is 2 x MS. NAME: 1-10 of [a-z0-9], one link per name. The link takes the /30 block N
# of 198.18.0.0/16 (default: derived from NAME): 198.18.0.0 + 4N + 1 is this side, + 2 the namespace's. MTU: 9000
# (jumbo frames, as a cluster's pool network would use). `up` prints `netns=... local=... remote=...` and removes what
# it made if it fails; `down` removes everything with the name (the namespace's processes are ended first) and
# succeeds when nothing is there.
set -Eeuo pipefail

usage() { sed -n '11,13p' "$0" | sed 's/^# *//' >&2; exit 2; }
die() { echo "pool-link: $*" >&2; exit 1; }

[ $# -ge 2 ] || usage
action=$1 name=$2
shift 2
[[ $name =~ ^[a-z0-9]{1,10}$ ]] || die "NAME must be 1-10 of [a-z0-9], got '$name'"
netns="sg-$name" host_if="sg-$name-h" ns_if="sg-$name-n"

rate="" delay="" loss="" block="" mtu=9000
run_dir=/run/sessiongate-pool-link relay="$(cd "$(dirname "$0")/.." && pwd)/sessiongate/benchmarks/link_relay.py"
pid_file="$run_dir/$name.pid"
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rate=${2:?}; shift 2 ;;
    --delay) delay=${2:?}; shift 2 ;;
    --loss) loss=${2:?}; shift 2 ;;
    --block) block=${2:?}; shift 2 ;;
    --mtu) mtu=${2:?}; shift 2 ;;
    *) usage ;;
  esac
done

addresses() {  # block -> "local remote"
  local offset=$(($1 * 4))
  echo "198.18.$((offset / 256)).$((offset % 256 + 1)) 198.18.$((offset / 256)).$((offset % 256 + 2))"
}

down() {
  if ip netns list | grep -qE "^$netns( |$)"; then
    local pids
    pids=$(ip netns pids "$netns" || true)
    if [ -n "$pids" ]; then
      # shellcheck disable=SC2086
      kill -TERM $pids 2>/dev/null || true
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        [ -z "$(ip netns pids "$netns" || true)" ] && break
        sleep 0.3
      done
      pids=$(ip netns pids "$netns" || true)
      # shellcheck disable=SC2086
      [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    fi
  fi
  # The relay holds both devices: they go with it.
  if [ -f "$pid_file" ]; then
    local relay_pid
    relay_pid=$(cat "$pid_file")
    if grep -qs "link_relay.py" "/proc/$relay_pid/cmdline"; then
      kill -TERM "$relay_pid" 2>/dev/null || true
      for _ in 1 2 3 4 5 6 7 8 9 10; do [ -d "/proc/$relay_pid" ] || break; sleep 0.2; done
      [ ! -d "/proc/$relay_pid" ] || kill -KILL "$relay_pid" 2>/dev/null || true
    fi
    rm -f "$pid_file"
  fi
  rm -f "$run_dir/$name.log"
  if ip netns list | grep -qE "^$netns( |$)"; then ip netns delete "$netns"; fi
  for dev in "$host_if" "$ns_if"; do
    if ip link show "$dev" >/dev/null 2>&1; then ip link delete "$dev"; fi
  done
}

shape() {  # [netns-exec...] dev: a tbf at the root (the rate)
  local dev=${*: -1}
  local run=("${@:1:$#-1}")
  "${run[@]}" tc qdisc add dev "$dev" root handle 1: tbf rate "$rate" burst "$burst" latency 200ms
  "${run[@]}" ip link set "$dev" txqueuelen 10000
}

case $action in
  up)
    [ -n "$rate" ] && [ -n "$delay" ] || die "up needs --rate and --delay"
    [[ $rate =~ ^[0-9]+$ ]] && rate="${rate}mbit"
    [[ $delay =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--delay is a number of milliseconds, got '$delay'"
    [ -z "$loss" ] || [[ $loss =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--loss is a percentage, got '$loss'"
    [ "$(id -u)" = 0 ] || die "needs root (ip netns, tc)"
    if [ -z "$block" ]; then block=$(($(printf '%s' "$name" | cksum | cut -d' ' -f1) % 16384)); fi
    read -r local_addr remote_addr <<<"$(addresses "$block")"
    ip netns list | grep -qE "^$netns( |$)" && die "$netns exists already (pool-link.sh down $name)"
    if ip -o addr show | grep -qw "inet $local_addr"; then die "$local_addr is in use here: pick another --block"; fi
    # A burst of ~4 ms at the rate, and at least two packets.
    [[ $rate =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || die "--rate is N[bit|kbit|mbit|gbit] or N (Mbit/s), got '$rate'"
    declare -A scale=([bit]=1 [kbit]=1000 [mbit]=1000000 [gbit]=1000000000)
    rate_bits=$((BASH_REMATCH[1] * scale[${BASH_REMATCH[2]}]))
    burst=$((rate_bits / 8 / 250 > 2 * mtu ? rate_bits / 8 / 250 : 2 * mtu))
    made=0
    trap '[ "$made" = 1 ] || down >/dev/null 2>&1 || true' EXIT
    [ -e /dev/net/tun ] || die "no /dev/net/tun"
    mkdir -p "$run_dir"
    ip netns add "$netns"
    python3 "$relay" "$host_if" "$ns_if" "$delay" "${loss:-0}" </dev/null >"$run_dir/$name.log" 2>&1 &
    echo $! >"$pid_file"
    for _ in $(seq 50); do ip link show "$ns_if" >/dev/null 2>&1 && break; sleep 0.1; done
    ip link show "$ns_if" >/dev/null 2>&1 || die "the relay did not start: $(cat "$run_dir/$name.log")"
    ip link set "$ns_if" netns "$netns"
    ip addr add "$local_addr" peer "$remote_addr/30" dev "$host_if"
    ip netns exec "$netns" ip addr add "$remote_addr" peer "$local_addr/30" dev "$ns_if"
    ip link set "$host_if" mtu "$mtu" up
    ip netns exec "$netns" ip link set "$ns_if" mtu "$mtu" up
    ip netns exec "$netns" ip link set lo up
    shape "$host_if"
    shape ip netns exec "$netns" "$ns_if"
    made=1
    echo "netns=$netns host_if=$host_if ns_if=$ns_if local=$local_addr remote=$remote_addr rate=$rate" \
      "delay_ms=$delay loss_pct=${loss:-0}"
    ;;
  down)
    down
    ;;
  status)
    ip netns list | grep -qE "^$netns( |$)" || { echo "$netns: absent"; exit 3; }
    echo "== $host_if (this side)"
    ip -o addr show dev "$host_if"
    tc qdisc show dev "$host_if"
    echo "== $ns_if (in $netns)"
    ip netns exec "$netns" ip -o addr show dev "$ns_if"
    ip netns exec "$netns" tc qdisc show dev "$ns_if"
    echo "== relay: pid $(cat "$pid_file" 2>/dev/null || echo none); $(cat "$run_dir/$name.log" 2>/dev/null)"
    echo "== processes in $netns: $(ip netns pids "$netns" | tr '\n' ' ')"
    ;;
  *) usage ;;
esac
