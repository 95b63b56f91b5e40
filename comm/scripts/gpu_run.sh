#!/usr/bin/env bash
# The GPU half of oxtrain-comm on one node with 2 GPUs joined by NVLink (made for 2x H200).
# Run from the repository root with comm-bench prebuilt in .gpu/bin/ (e.g. by
# `../shared/tools/gpu-pack -p oxtrain-bench`, or `cargo build --release -p oxtrain-bench --bin
# comm-bench` and a copy of target/release/comm-bench). Needs pip's nvidia-nccl-cu13,
# nvidia-nvshmem-cu13, nvrtc and nvjitlink (a PyTorch install has them) and CUDA 13 headers
# (/usr/local/cuda/include, or pip's nvidia-cuda-runtime + nvidia-cuda-cccl).
#   bash comm/scripts/gpu_run.sh            # results in $OUT (default ./gpu-out)
# Steps: (1) correctness of every collective on both backends at small and odd sizes,
# (2) the NVSHMEM-vs-NCCL comparison with both all-reduce algorithms, writing
# $OUT/comm-2xh200.json, (3) a short table. About 5-7 minutes.
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
export OXTRAIN_COMM_TIMEOUT=60
# The heap holds the staging (512 MiB on 2 GPUs), comm-bench's symmetric buffer and its
# symmetric tensor (up to 1 GiB each).
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-4G}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -4

status=0
run() { # name, timeout seconds, args...
  local name=$1 t=$2; shift 2
  echo "=== $name: comm-bench $*"
  timeout -k 10 "$t" "$bin" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc"
  [ "$rc" -eq 0 ] || status=1
}

# 1. Correctness: every op, f32/bf16/f16, every element checked, both backends, both all-reduce
#    algorithms. Sizes 4k+2 bytes with k odd give odd lengths in every dtype (the world size does
#    not divide them, shards start unaligned), then powers of two.
odd=6,14,102,1030,65542,1048582,4194310
# Every all_reduce up to 4 MiB is also captured in a CUDA graph, timed in replays and checked
# after two replays of a captured call (--graph-max).
run check-nccl 150 --backend nccl --ranks 2 --sizes $odd,8,4096,1M --iters 3 --warmup 1 --graph-max 4M \
  --dtypes f32,bf16,f16 --json "$OUT/check-nccl.json"
run check-nvshmem 180 --backend nvshmem --algo all --ranks 2 --sizes $odd,8,4096,1M --iters 3 --warmup 1 \
  --graph-max 4M --dtypes f32,bf16,f16 --json "$OUT/check-nvshmem.json"
# The zero-copy all-reduce of symmetric buffers and tensors, past its 4 MiB threshold: odd sizes
# (one pass loading the peers' copies) and whole packs (two-shot pushes into them).
run check-nvshmem-symm 150 --backend nvshmem --algo symm,symm-tensor --ranks 2 --sizes $odd,16777222,16M,64M \
  --iters 3 --warmup 1 --dtypes f32,bf16,f16 > /dev/null
# Windows: a 1 MiB staging slot makes several launches per call (and odd windows at the end);
# 64 KiB low-latency slots.
run check-nvshmem-windows 120 --backend nvshmem --algo all --chunk 1M --ranks 2 --sizes 4194310,8M \
  --graph-max 8M --iters 3 --warmup 1 --dtypes f32,bf16 > /dev/null
OXTRAIN_NVSHMEM_LL_MAX_BYTES=65536 run check-nvshmem-ll-slots 120 \
  --backend nvshmem --algo ll --blocks 16 --ranks 2 --sizes $odd,33554438 --iters 3 --warmup 1 --graph-max 64M \
  --dtypes f32,bf16,f16 > /dev/null
# The multi-node path on one node: each GPU taken as a node of its own, so every op runs in
# stages over the rail (hier.rs) and reaches the other PE by NVSHMEM puts with signals.
OXTRAIN_NVSHMEM_RANKS_PER_NODE=1 run check-nvshmem-hier 150 --backend nvshmem --ranks 2 --sizes $odd,8,4096,1M \
  --graph-max 4M --iters 3 --warmup 1 --dtypes f32,bf16,f16 --json "$OUT/check-nvshmem-hier.json"
# With 4 GPUs, 2 "nodes" of 2: the node stages as well as the rail ones.
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 4 ]; then
  OXTRAIN_NVSHMEM_RANKS_PER_NODE=2 run check-nvshmem-hier4 150 --backend nvshmem --ranks 4 --sizes $odd,8,4096,1M \
    --iters 3 --warmup 1 --dtypes f32,bf16,f16 > /dev/null
fi

# 1b. A rank that never calls: rank 1 skips an all_reduce, rank 0's kernel must give up after
#     OXTRAIN_COMM_TIMEOUT (2 s here) and the call fail naming rank 1; then every call fails.
for algo in ll twoshot; do
  OXTRAIN_COMM_TIMEOUT=2 run timeout-$algo 60 --backend nvshmem --ranks 2 --timeout-check 1 --algo $algo
done
# 1c. Ranks that pass different symmetric tensors (1), or a symmetric and an ordinary one (2),
#     must fail instead of storing into another of the peer's tensors.
for m in 1 2; do
  OXTRAIN_COMM_TIMEOUT=3 run mismatch-$m 60 --backend nvshmem --ranks 2 --mismatch-check $m
done

# 2. The comparison: all_reduce, 8 B .. 1 GiB, NCCL beside NVSHMEM: f32 (nccl-tests' default)
#    with every algorithm and 128 blocks (the fastest), up to 1 MiB also timed with the host
#    ahead of the GPU (the GPU's own time per call) and as CUDA-graph replays (the latency entries);
#    then the auto choice with the default 32
#    blocks (most SMs left to compute) in f32 and bf16.
run compare-128 300 --backend nvshmem --compare nccl --algo all --blocks 128 --ranks 2 --ops all_reduce \
  --dtypes f32 --min-bytes 8 --max-bytes 1G --host-ahead-max 1M --graph-max 1M --json "$OUT/comm-2xh200.json"
run compare-32 300 --backend nvshmem --compare nccl --algo auto --ranks 2 --ops all_reduce --dtypes f32,bf16 \
  --min-bytes 8 --max-bytes 1G --graph-max 1M --json "$OUT/comm-2xh200-32blocks.json"
# The same large messages at one SM budget: NCCL held to 32 CTAs too (its channels; both names,
# old and new), as our default cap of 32 blocks.
NCCL_MIN_NCHANNELS=32 NCCL_MAX_NCHANNELS=32 NCCL_MIN_CTAS=32 NCCL_MAX_CTAS=32 run compare-32-equal 200 \
  --backend nvshmem --compare nccl --algo auto --ranks 2 --ops all_reduce --dtypes f32 --min-bytes 64M \
  --max-bytes 1G --json "$OUT/comm-2xh200-32blocks-equal.json"

# 3. Table.
python3 - "$OUT/comm-2xh200.json" <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
print(f"\n{d['machine']}  {d['date']}  commit {d['commit']}")
for b in d["benchmarks"]:
    if "ratio" in b:
        print(f"  {b['name']:<24} oxtrain {b['oxtrain']:>10} {b['unit']:<4} {b['peer_name']} {b['peer']:>10}  ratio {b['ratio']} (goal {b['goal']})")
rows = [b for b in d["benchmarks"] if "busbw_GBps" in b and "_f32_" in b["name"]]
sizes = sorted({int(b["name"].rsplit("_", 1)[1][:-1]) for b in rows})
labels = sorted({b["name"].split("_")[2] for b in rows})
print(f"\n  all_reduce f32, time(us) busbw(GB/s): {'size':>11} " + " ".join(f"{l:>16}" for l in labels))
for s in sizes:
    cells = []
    for l in labels:
        m = [b for b in rows if b["name"].split("_")[2] == l and b["name"].endswith(f"_{s}B")]
        cells.append(f"{m[0]['oxtrain']:>9.2f} {m[0]['busbw_GBps']:>6.1f}" if m else " " * 16)
    print(f"  {'':>25} {s:>11} " + " ".join(cells))
PY
python3 - "$OUT/comm-2xh200-32blocks.json" <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
print("\n32 blocks:")
for b in d["benchmarks"]:
    if "ratio" in b:
        print(f"  {b['name']:<24} oxtrain {b['oxtrain']:>10} {b['unit']:<4} {b['peer_name']} {b['peer']:>10}  ratio {b['ratio']} (goal {b['goal']})")
PY
echo "gpu_run.sh: results in $OUT (exit $status)"
exit $status
