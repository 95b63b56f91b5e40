# Sourced by the namespace benchmarks (comm_bench.sh, ddp_step.sh): two "hosts" that are
# network namespaces, the same network as comm/tests/netns/harness.rs: a bridge in a namespace
# of its own, each host's eth0 on it, 10.77.0.0/24 existing only inside the namespaces.
# Expects `id` (the namespaces' prefix) and `tmp` (a scratch folder, removed at exit); sets
# OXTRAIN_NETNS_HOSTS for rsh-agent.sh and removes everything on exit, even on failure.

down() {
  for ns in "$id-h0" "$id-h1" "$id-sw"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap down EXIT

ip netns add "$id-sw"
ip -n "$id-sw" link add br0 type bridge
ip -n "$id-sw" link set br0 up
for i in 0 1; do
  ip netns add "$id-h$i"
  ip link add eth0 netns "$id-h$i" type veth peer name "p$i" netns "$id-sw"
  ip -n "$id-sw" link set "p$i" master br0 up
  ip -n "$id-h$i" addr add "10.77.0.$((i + 1))/24" dev eth0
  ip -n "$id-h$i" link set eth0 up
  ip -n "$id-h$i" link set lo up
done
export OXTRAIN_NETNS_HOSTS="10.77.0.1=$id-h0,10.77.0.2=$id-h1"
