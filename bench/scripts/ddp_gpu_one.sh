#!/usr/bin/env bash
# DDP on ONE H200 (issue 23's one-GPU part): 2 PEs of the nvshmem backend share the GPU under
# CUDA MPS, train ResNet-50 (SyncBatchNorm, bf16 autocast) and GPT-2 124M, and are checked
# against one process on the combined batch: parameters bit-identical across ranks at every
# step, losses within bf16 tolerance. Run from the repository root with ddp_gpu in
# .gpu/bin/ (BIN overrides); writes the logs to $OUT (default ./gpu-out).
set -uo pipefail
# The environment of the comm GPU scripts (library folders, NVSHMEM's home, no multicast),
# with ddp_gpu as the program.
BENCH="${BIN:-$(pwd)/.gpu/bin/ddp_gpu}" source comm/scripts/gpu_env.sh
mps=$(command -v nvidia-cuda-mps-control || ls /usr/local/nvidia/bin/nvidia-cuda-mps-control 2>/dev/null)
export CUDA_MPS_PIPE_DIRECTORY=/tmp/oxtrain-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/oxtrain-mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
[ -n "$mps" ] && "$mps" -d
status=0
for spec in "resnet50 16 30" "gpt2 4 30"; do
  set -- $spec
  echo "== ddp_gpu --model $1 --batch $2 --steps $3 (nvshmem, 2 PEs on 1 GPU)"
  timeout 240 "$bin" --model "$1" --backend nvshmem --world 2 --gpus 1 --batch "$2" --steps "$3" \
    --precision bf16 > "$OUT/ddp-$1.log" 2> "$OUT/ddp-$1.err" || status=1
  tail -n 3 "$OUT/ddp-$1.log"; tail -n 5 "$OUT/ddp-$1.err"
done
[ -n "$mps" ] && echo quit | "$mps"
exit $status
