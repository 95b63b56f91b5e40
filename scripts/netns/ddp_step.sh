#!/usr/bin/env bash
# The DDP step on CPU, measured for the scaling model's check (bench/src/bin/scaling_model):
# `ddp_cpu step-rank` (ResNet-18, 32x32, batch 8 per rank, one thread per process) in
#   alone-1   one process, a process group of one (the compute of a step, no communication)
#   alone-2   2 such processes side by side (a rank's compute when 2 processes share the cores)
#   alone-4   4 side by side
#   shm-1h2r          DDP, 1 host x 2 ranks over the shm backend (default buckets: overlap)
#   shm-1h2r-1bucket  the same with one bucket, launched when backward ends (no overlap)
#   mpi-2h2r          DDP, 2 hosts x 2 ranks over the mpi backend, hosts being network
#                     namespaces (mpirun --hostfile, remote ranks by rsh-agent.sh)
#   mpi-2h2r-1bucket  the same with one bucket
# and writes one results file (default bench/results/ddp-cpu-netns.json): the slowest rank's
# median step of each run as a row, and every rank's figures (compute, buckets) under "runs".
#
# Needs root, iproute2, Open MPI, and ddp_cpu built with the mpi feature:
#   cargo build --release -p oxtrain-bench --features mpi --bin ddp_cpu
# Usage: scripts/netns/ddp_step.sh [OUT.json]   (from anywhere; paths are the repo's)
# BENCH_STEPS (default 10) timed steps after 3 of warm-up per run. On a shared machine run it
# when the load is low, as `nice -n -15 scripts/netns/ddp_step.sh`.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${DDP_CPU:-$repo/target/release/ddp_cpu}"
out="${1:-$repo/bench/results/ddp-cpu-netns.json}"
[ -x "$bin" ] || { echo "ddp_step.sh: $bin not found; build it with --features mpi (see the header)" >&2; exit 1; }
id="oxtnet-$$-ddp"
tmp="$(mktemp -d)"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"

# shellcheck source=two_hosts.sh
source "$repo/scripts/netns/two_hosts.sh"
export RAYON_NUM_THREADS=1 OMP_NUM_THREADS=1 BENCH_STEPS="${BENCH_STEPS:-10}"
on_host0() { ip netns exec "$id-h0" "$@"; }

alone() { # N processes side by side, each a group of one
  local n=$1
  echo "== alone-$n"
  for i in $(seq 1 "$n"); do
    mkdir -p "$tmp/alone-$n/$i"
    BENCH_ALONE=1 BENCH_OUT_DIR="$tmp/alone-$n/$i" "$bin" step-rank &
  done
  wait
}

shm() { # label, extra variables...
  local label=$1
  shift
  echo "== $label"
  mkdir -p "$tmp/$label"
  for r in 0 1; do
    on_host0 env RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=29510 OXTRAIN_COMM_BACKEND=shm OXTRAIN_SHM_NAME="$id-shm" BENCH_OUT_DIR="$tmp/$label" "$@" \
      "$bin" step-rank &
  done
  wait
}

mpi() { # label, extra variables...
  local label=$1
  shift
  echo "== $label"
  mkdir -p "$tmp/$label"
  printf "10.77.0.1 slots=2\n10.77.0.2 slots=2\n" >"$tmp/hosts"
  local xs=(-x RAYON_NUM_THREADS -x OMP_NUM_THREADS -x BENCH_STEPS -x BENCH_OUT_DIR -x MASTER_ADDR -x MASTER_PORT)
  for v in "$@"; do xs+=(-x "${v%%=*}"); done
  on_host0 unshare --uts sh -c 'hostname "$0" && exec "$@"' "$id-h0" \
    env BENCH_OUT_DIR="$tmp/$label" MASTER_ADDR=10.77.0.1 MASTER_PORT=29500 "$@" \
    mpirun --allow-run-as-root --hostfile "$tmp/hosts" -np 4 \
    --mca plm_rsh_agent "$repo/scripts/netns/rsh-agent.sh" --mca plm_rsh_no_tree_spawn 1 \
    --mca pml ob1 --mca btl self,vader,tcp \
    --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 "${xs[@]}" \
    "$bin" step-rank
}

one_bucket=BENCH_BUCKET_MB=1000
alone 1
alone 2
alone 4
shm shm-1h2r
shm shm-1h2r-1bucket "$one_bucket"
mpi mpi-2h2r
mpi mpi-2h2r-1bucket "$one_bucket"

load_after="$(cut -d' ' -f1-3 /proc/loadavg), niceness $(nice)"
cpu="$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
commit="$(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" diff --quiet HEAD -- bench comm || echo '+changes')"
python3 - "$tmp" "$out" "$load_before" "$load_after" "$cpu" "$commit" <<'PY'
import datetime, glob, json, os, sys
tmp, out, load_before, load_after, cpu, commit = sys.argv[1:]
labels = ["alone-1", "alone-2", "alone-4", "shm-1h2r", "shm-1h2r-1bucket", "mpi-2h2r", "mpi-2h2r-1bucket"]
runs, rows = {}, []
for label in labels:
    ranks = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(tmp, label, "**", "rank-*.json"), recursive=True))]
    runs[label] = ranks
    slowest = max(r["step_ms"] for r in ranks)
    rows.append({"name": f"ddp_step_resnet18_32_{label.replace('-', '_')}", "unit": "ms", "oxtrain": round(slowest, 3)})
json.dump({
    "date": datetime.date.today().isoformat(), "commit": commit,
    "machine": f"CPU ({cpu}); hosts are network namespaces of this machine (veth pairs on a bridge)",
    "notes": "ddp_cpu step-rank (scripts/netns/ddp_step.sh): ResNet-18 (1000 classes), 32x32, batch 8 per rank, SGD "
             "momentum, synthetic data, one thread per process, oxtrain DDP (default caps 1 MiB first bucket, 25 MiB; "
             "'1bucket': both caps 1000 MiB, one bucket launched when backward ends). Each row: the slowest rank's median "
             "step over the timed steps. alone-N: N processes side by side, each a process group of one (compute only). "
             "shm-1h2r: 2 ranks, shm backend; mpi-2h2r: 2 hosts x 2 ranks, Open MPI (pml ob1, btl vader inside a host, "
             "tcp between hosts), mpirun --hostfile with scripts/netns/rsh-agent.sh. No peer: these rows are checked "
             "against the scaling model's prediction in docs/scaling.md (scaling_model reads 'runs': every rank's "
             "forward, backward compute, optimizer, and each bucket's bytes, launch and all-reduce time). "
             f"Load average {load_before} before, {load_after} after (2 cores shared with other builders): noisy; one run.",
    "benchmarks": rows,
    "runs": runs,
}, open(out, "w"), indent=1)
print("wrote", out)
PY
