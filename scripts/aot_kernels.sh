#!/usr/bin/env bash
# Makes the ahead-of-time kernels in tensor/aot/ again: every op family's CUDA source compiled
# by NVRTC for sm_80 and sm_90, compressed, with the manifest the CI test checks them against.
# Only families whose source changed are compiled (pass --all to redo every one). Needs no GPU
# and no CUDA toolkit: NVRTC comes from pip, pinned, into a virtualenv of its own.
#
#   scripts/aot_kernels.sh [--all] [--arch 80,90]
#
# The NVRTC is the oldest of CUDA 13, so that every CUDA 13 driver takes the cubins it makes; a
# driver that refuses them anyway costs only time (oxtrain then compiles with NVRTC as before).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${OXTRAIN_AOT_VENV:-$HOME/.cache/oxtrain-aot/venv}"
[ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "nvidia-cuda-nvrtc==13.0.88"
OXTRAIN_CUDA_LIB_DIRS="$(ls -d "$venv"/lib/python3*/site-packages/nvidia/*/lib | tr '\n' ':')"
export OXTRAIN_CUDA_LIB_DIRS
cargo run --release -p oxtrain-tensor --example aot_kernels -- "$@"
