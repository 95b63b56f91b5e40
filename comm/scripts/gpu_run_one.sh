#!/usr/bin/env bash
# The multi-PE paths of the nvshmem backend on ONE GPU: 2, 4 and 8 PEs share it under CUDA MPS
# (comm-bench --gpus 1), in one team and as "nodes" of 1, 2 and 4 PEs (node and rail stages).
# Correctness only: the PEs share the GPU's SMs and HBM, so timings say nothing about links.
# Run from the repository root with comm-bench in .gpu/bin/ (see gpu_run.sh); as root or as
# the user who may start the MPS daemon. About 1-2 minutes.
#   bash comm/scripts/gpu_run_one.sh      # logs in $OUT (default ./gpu-out)
# Then: python3 bench/tools/comm_checks.py bench/results/comm-1xh200-mps-checks.json NAME=LOG ...
set -uo pipefail
. "$(dirname "$0")/gpu_env.sh"
export OXTRAIN_COMM_TIMEOUT=20 NVSHMEM_SYMMETRIC_SIZE=2G
nvidia-smi --query-gpu=name,memory.total,compute_mode --format=csv,noheader

# MPS runs the PEs' kernels at once; without it the GPU takes their contexts in turns and every
# collective waits milliseconds (the communicator warns).
mps=$(command -v nvidia-cuda-mps-control || ls /usr/local/nvidia/bin/nvidia-cuda-mps-control 2>/dev/null)
[ -n "$mps" ] || { echo "gpu_run_one.sh: nvidia-cuda-mps-control not found"; exit 2; }
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/oxtrain-mps-pipe}
export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/oxtrain-mps-log}
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
"$mps" -d || { echo "gpu_run_one.sh: the MPS daemon did not start"; exit 2; }
trap 'echo quit | "$mps"' EXIT

status=0
run() { # name, timeout seconds, args...
  local name=$1 t=$2; shift 2
  echo "=== $name: comm-bench $*"
  timeout -k 5 "$t" "$bin" --backend nvshmem --gpus 1 --iters 2 --warmup 1 "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  grep -E "^ +(all_reduce|reduce_scatter|all_gather|broadcast|reduce) " "$OUT/$name.log" | awk '$8 != 0' | head -5
  echo "=== $name: exit $rc"
  [ "$rc" -eq 0 ] || status=1
}
# Sizes 4k+2 bytes, k odd: odd lengths in every dtype; then whole packs past the one-shot range.
odd=6,14,102,1030,65542,1048582
run flat2 120 --ranks 2 --algo all --sizes $odd,4096,16777222,16M --dtypes f32,bf16,f16 --graph-max 4M
run windows2 120 --ranks 2 --algo all --chunk 1M --sizes 4194310,8M --dtypes f32,bf16 --graph-max 8M
run symm2 90 --ranks 2 --algo symm,symm-tensor --sizes $odd,16777222,16M --dtypes f32,bf16,f16
run flat4 120 --ranks 4 --algo all --sizes $odd,4096,16777222 --dtypes f32,bf16,f16 --graph-max 4M
run flat8 120 --ranks 8 --algo all --sizes $odd,4096 --dtypes f32,bf16
for layout in 2x1 4x1 8x1 2x2 4x2 2x4; do
  nodes=${layout%x*} per=${layout#*x}
  dtypes=f32,bf16,f16; [ $((nodes * per)) -eq 8 ] && dtypes=f32,bf16
  OXTRAIN_NVSHMEM_RANKS_PER_NODE=$per run hier$layout 120 --ranks $((nodes * per)) --sizes $odd,4096 \
    --dtypes $dtypes --graph-max 4M
done
# 1 MiB staging slots: several windows per call, padded where the parts differ.
OXTRAIN_NVSHMEM_RANKS_PER_NODE=2 run hier2x2-windows 120 --ranks 4 --chunk 1M --sizes 4194310,8388614,8M \
  --dtypes f32,bf16
echo "gpu_run_one.sh: logs in $OUT (exit $status)"
exit $status
