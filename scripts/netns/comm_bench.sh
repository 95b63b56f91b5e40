#!/usr/bin/env bash
# CPU all-reduce across "hosts" that are network namespaces of this machine: comm-bench's mpi
# backend under mpirun (remote ranks started by rsh-agent.sh), for the scaling model
# (bench/src/bin/scaling_model). Four runs, then the shm backend on one host:
#   mpi-1h2r       1 host x 2 ranks (Open MPI's shared memory)
#   mpi-2h1r       2 hosts x 1 rank (TCP over the veth pair and bridge)
#   mpi-2h2r       2 hosts x 2 ranks, Open MPI's default algorithm choice
#   mpi-2h2r-ring  2 hosts x 2 ranks, ring forced (coll_libnbc_iallreduce_algorithm 1: the mpi
#                  backend calls MPI_Iallreduce, which Open MPI serves from its libnbc component)
#   shm_2r         the shm backend, 2 ranks on one host
# and writes one results file (default bench/results/comm-netns-cpu.json).
#
# Needs root, iproute2, Open MPI, and comm-bench built with the mpi feature:
#   cargo build --release -p oxtrain-bench --features mpi --bin comm-bench
# Usage: scripts/netns/comm_bench.sh [OUT.json]   (from anywhere; paths are the repo's)
# On a shared, loaded machine run it as `nice -n -15 scripts/netns/comm_bench.sh`: ranks that
# wait for a core otherwise dominate the small-message times.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${COMM_BENCH:-$repo/target/release/comm-bench}"
out="${1:-$repo/bench/results/comm-netns-cpu.json}"
sizes="--ops all_reduce --dtypes f32 --min-bytes 8 --max-bytes ${MAX_BYTES:-16M} --iters ${ITERS:-10} --warmup 3"
[ -x "$bin" ] || { echo "comm_bench.sh: $bin not found; build it with --features mpi (see the header)" >&2; exit 1; }
id="oxtnet-$$-bench"
tmp="$(mktemp -d)"

# shellcheck source=two_hosts.sh
source "$repo/scripts/netns/two_hosts.sh"

run() { # label, hostfile text, ranks, extra mpirun arguments...
  local label=$1 hosts=$2 np=$3
  shift 3
  printf "$hosts" >"$tmp/hosts"
  echo "== $label"
  ip netns exec "$id-h0" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$id-h0" \
    mpirun --allow-run-as-root --hostfile "$tmp/hosts" -np "$np" \
    --mca plm_rsh_agent "$repo/scripts/netns/rsh-agent.sh" --mca plm_rsh_no_tree_spawn 1 \
    --mca pml ob1 --mca btl self,vader,tcp \
    --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 "$@" \
    "$bin" --backend mpi $sizes --json "$tmp/$label.json"
}
run mpi-1h2r "10.77.0.1 slots=2\n" 2
run mpi-2h1r "10.77.0.1 slots=1\n10.77.0.2 slots=1\n" 2
run mpi-2h2r "10.77.0.1 slots=2\n10.77.0.2 slots=2\n" 4
run mpi-2h2r-ring "10.77.0.1 slots=2\n10.77.0.2 slots=2\n" 4 \
  --mca coll_libnbc_iallreduce_algorithm 1
echo "== shm_2r"
(cd "$tmp" && "$bin" --backend shm --ranks 2 $sizes --json "$tmp/shm.json")

load="$(cut -d' ' -f1-3 /proc/loadavg), niceness $(nice)"
cpu="$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
python3 - "$tmp" "$out" "$load" "$cpu" <<'PY'
import json, os, sys
tmp, out, load, cpu = sys.argv[1:]
rows, commit, date = [], "", ""
for label in ["mpi-1h2r", "mpi-2h1r", "mpi-2h2r", "mpi-2h2r-ring", "shm"]:
    d = json.load(open(os.path.join(tmp, label + ".json")))
    commit, date = d["commit"], d["date"]
    for b in d["benchmarks"]:
        if label != "shm":  # all_reduce_mpi_4r_f32_8B -> all_reduce_mpi-2h2r_f32_8B
            head, rest = b["name"].split("_mpi_", 1)
            b["name"] = f"{head}_{label}_{rest.split('_', 1)[1]}"
        rows.append(b)
json.dump({
    "date": date, "commit": commit, "machine": f"CPU ({cpu}); hosts are network namespaces of this machine (veth pairs on a bridge)",
    "notes": "comm-bench all_reduce f32, time per call averaged over the timed iterations, every element checked; "
             "mpi = Open MPI (pml ob1; btl vader inside a host, tcp between hosts) started by mpirun --hostfile with "
             "scripts/netns/rsh-agent.sh as plm_rsh_agent; shm = oxtrain's shared-memory backend. Names: 1h2r = 1 host "
             f"x 2 ranks, 2h1r = 2 hosts x 1 rank, 2h2r = 2 hosts x 2 ranks. A shared machine: load average {load} "
             "when the runs ended (other builds running), so the figures are noisy; one run.",
    "benchmarks": rows,
}, open(out, "w"), indent=1)
print("wrote", out, len(rows), "rows")
PY
