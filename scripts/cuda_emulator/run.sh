#!/usr/bin/env bash
# Runs the attention_v2 CUDA kernels on the CPU, for checking them on a machine with no GPU:
# emu.h emulates the warp-level features they use (mma.sync, ldmatrix, cp.async, shuffles,
# barriers) with one host thread per GPU thread, and attention_harness.cpp compares forward and
# backward with an f64 loop on awkward shapes (T 1, 63, 65, 129, 300; L != S; key padding with a
# row that sees no key; GPT-2's interleaved q, k, v; D 32, 64, 128; bf16, f16). Three passes:
# AddressSanitizer with cp.async copies landing at issue, then at the wait (a missing wait or
# barrier gives wrong results), and ThreadSanitizer (a missing barrier is a race on shared
# memory). What it cannot show: PTX syntax (NVRTC checks that), speed, registers.
# Needs g++ (C++20) and python3; takes several minutes.
#   bash scripts/cuda_emulator/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$here/host_source.py" "$here/../../tensor/src" "$work/kernels_host.h"
flags=(-std=c++20 -O1 -g -pthread -Wno-unknown-pragmas -I"$here" -I"$work")
g++ "${flags[@]}" -fsanitize=address,undefined -o "$work/asan" "$here/attention_harness.cpp"
g++ "${flags[@]}" -fsanitize=thread -o "$work/tsan" "$here/attention_harness.cpp"
status=0
echo "== AddressSanitizer, copies land at issue"; "$work/asan" early || status=1
echo "== AddressSanitizer, copies land at the wait"; "$work/asan" late || status=1
echo "== ThreadSanitizer"
for case in 0 2 4 6 12; do
  TSAN_OPTIONS=halt_on_error=1 "$work/tsan" early "$case" || status=1
done
exit $status
