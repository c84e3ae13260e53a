#!/usr/bin/env bash
# Runs N ranks of a command on a shaped network made of network namespaces (needs root).
#
#   sudo benchmarks/netns.sh [--ranks 4] [--nodes N] [--rate 1gbit] [--delay 0.1ms] -- COMMAND [ARGS...]
#   e.g. benchmarks/netns.sh --ranks 4 --rate 1gbit -- .venv/bin/python benchmarks/collectives.py
#
# With --nodes N (N divides the ranks), the namespaces are nodes: node k holds ranks
# kL..kL+L-1 (L = ranks/N), which reach each other over the node's own loopback,
# unshaped, and the other nodes over its shaped link; they get a multi-node torchrun's
# variables (LOCAL_RANK, LOCAL_WORLD_SIZE = L, GROUP_RANK = k).
# Each rank runs in its own namespace gz<pid>-r<i> with one interface, eth0 (10.77.0.<i+1>),
# a veth link to a bridge in a hub namespace gz<pid>-hub. Both directions of every link
# are shaped: --rate (1gbit, 10gbit, 100mbit, ...) and --delay (one way, e.g. 0.1ms) with
# netem; on a kernel without netem (sch_netem), the rate with tbf and no added delay (the
# script says so, and GRADZIP_NETWORK, which benchmarks print, records it).
# The ranks get torchrun's rendezvous variables (MASTER_ADDR = rank 0's address,
# MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) and GLOO_SOCKET_IFNAME=eth0,
# so traffic stays on the namespaces' own addresses. Rank 0 prints to the terminal; the
# others write to <logdir>/rank-<i>.log, shown when a rank fails. Everything the script
# created is removed on exit, also after a failure or Ctrl-C. Exit status: the first
# failing rank's, else 0.
set -euo pipefail

ranks=4 nodes="" rate=1gbit delay=0.1ms port=29500
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --nodes) nodes="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --delay) delay="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    *) echo "netns.sh: unknown option '$1'" >&2; usage ;;
  esac
done
[[ $# -gt 0 ]] || { echo "netns.sh: no command given (put it after --)" >&2; usage; }
[[ "$ranks" =~ ^[0-9]+$ && "$ranks" -ge 1 && "$ranks" -le 200 ]] || { echo "netns.sh: --ranks must be 1..200" >&2; exit 2; }
nodes=${nodes:-$ranks}
[[ "$nodes" =~ ^[0-9]+$ && "$nodes" -ge 1 && $((ranks % nodes)) -eq 0 ]] ||
  { echo "netns.sh: --nodes must divide --ranks ($ranks)" >&2; exit 2; }
per_node=$((ranks / nodes))
[[ $(id -u) -eq 0 ]] || { echo "netns.sh: needs root (network namespaces and tc); run it with sudo" >&2; exit 2; }
for tool in ip tc; do
  command -v "$tool" >/dev/null || { echo "netns.sh: '$tool' is missing (apt-get install iproute2)" >&2; exit 2; }
done

prefix="gz$$"
hub="$prefix-hub"
logdir="$(mktemp -d "${TMPDIR:-/tmp}/gradzip-netns.XXXXXX")"
pids=()

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for ((i = 0; i < nodes; i++)); do ip netns del "$prefix-r$i" 2>/dev/null || true; done
  ip netns del "$hub" 2>/dev/null || true
  ip netns del "$prefix-probe" 2>/dev/null || true
  rm -rf "$logdir"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rate_bits() {  # a tc rate (100mbit, 1gbit, 10gbit, 500kbit) in bit/s
  [[ "$1" =~ ^([0-9]+)(kbit|mbit|gbit)$ ]] || { echo "netns.sh: --rate '$1' is not like 100mbit, 1gbit or 10gbit" >&2; exit 2; }
  case "${BASH_REMATCH[2]}" in kbit) echo $((BASH_REMATCH[1] * 1000)) ;; mbit) echo $((BASH_REMATCH[1] * 1000000)) ;;
    gbit) echo $((BASH_REMATCH[1] * 1000000000)) ;; esac
}
burst=$(( $(rate_bits "$rate") / 8 / 1000 ))  # a millisecond of traffic: enough for tbf at these rates
(( burst >= 16384 )) || burst=16384

# netem if this kernel has it; else tbf (rate only).
ip netns add "$prefix-probe"
ip -n "$prefix-probe" link add probe0 type veth peer name probe1
if ip netns exec "$prefix-probe" tc qdisc add dev probe0 root netem delay "$delay" rate "$rate" 2>/dev/null; then
  shaper=netem network="$rate, $delay one way (netem)"
else
  shaper=tbf network="$rate (tbf), no added delay: this kernel has no netem"
  echo "netns.sh: this kernel has no netem qdisc: shaping the rate with tbf, without the $delay delay" >&2
fi
ip netns del "$prefix-probe"

shape() {  # namespace, device: shape the device's egress
  if [[ $shaper == netem ]]; then
    ip netns exec "$1" tc qdisc add dev "$2" root netem delay "$delay" rate "$rate" limit 100000
  else
    ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$rate" burst "$burst" latency 50ms
  fi
}

ip netns add "$hub"
ip -n "$hub" link add br0 type bridge
ip -n "$hub" link set br0 up
for ((i = 0; i < nodes; i++)); do
  ns="$prefix-r$i"
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip link add "$prefix-h$i" netns "$hub" type veth peer name eth0 netns "$ns"
  ip -n "$hub" link set "$prefix-h$i" master br0 up
  ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  shape "$ns" eth0
  shape "$hub" "$prefix-h$i"
done

[[ $nodes -lt $ranks ]] && network="$network; $nodes nodes of $per_node ranks"
for ((i = 0; i < ranks; i++)); do
  node=$((i / per_node))
  env_vars=(MASTER_ADDR=10.77.0.1 MASTER_PORT="$port" RANK="$i" WORLD_SIZE="$ranks" GLOO_SOCKET_IFNAME=eth0
            GRADZIP_NETWORK="netns: $network")
  if [[ $nodes -lt $ranks ]]; then
    env_vars+=(LOCAL_RANK=$((i % per_node)) LOCAL_WORLD_SIZE="$per_node" GROUP_RANK="$node")
  else
    env_vars+=(LOCAL_RANK="$i" LOCAL_WORLD_SIZE="$ranks")
  fi
  if [[ $i -eq 0 ]]; then
    ip netns exec "$prefix-r$node" env "${env_vars[@]}" "$@" &
  else
    ip netns exec "$prefix-r$node" env "${env_vars[@]}" "$@" >"$logdir/rank-$i.log" 2>&1 &
  fi
  pids+=($!)
done

status=0
for ((i = 0; i < ranks; i++)); do
  code=0
  wait "${pids[$i]}" || code=$?
  if [[ $code -ne 0 ]]; then
    if [[ $status -eq 0 ]]; then
      status=$code
      echo "netns.sh: rank $i failed with status $code" >&2
      [[ $i -gt 0 ]] && tail -n 40 "$logdir/rank-$i.log" >&2
      for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    fi
  fi
done
exit "$status"
