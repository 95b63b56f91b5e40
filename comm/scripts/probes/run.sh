#!/usr/bin/env bash
# Builds and runs the NVLink probes on a machine with 2 GPUs and nvcc, then writes
# nvlink-ceiling.json beside their logs in $OUT (default ./probe-out):
#   bash comm/scripts/probes/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT="${OUT:-$(pwd)/probe-out}"
mkdir -p "$OUT"
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
"$nvcc" -O3 -arch=sm_90 -o "$OUT/nvlink_ceiling" "$here/nvlink_ceiling.cu" -lcuda
"$nvcc" -O3 -arch=sm_90 -o "$OUT/ce_allreduce" "$here/ce_allreduce.cu" -lcuda
timeout 120 "$OUT/nvlink_ceiling" | tee "$OUT/nvlink_ceiling.log" || echo "nvlink_ceiling failed"
timeout 120 "$OUT/ce_allreduce" | tee "$OUT/ce_allreduce.log" || echo "ce_allreduce failed"
python3 "$here/to_json.py" "$OUT/nvlink_ceiling.log" "$OUT/ce_allreduce.log" > "$OUT/nvlink-ceiling.json"
