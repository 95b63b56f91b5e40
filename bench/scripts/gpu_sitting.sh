#!/usr/bin/env bash
# One GPU sitting from what bench/scripts/gpu_pack.sh packed into .gpu/:
#   bash bench/scripts/gpu_sitting.sh [all|final|tests|kernels|kprof|parity|bench] [TEST FILTER]
# TEST_CRATES and PARITY_CASES narrow the tests and parity modes to some crates and models.
# tests: every CUDA test (--include-ignored) of the packed crates, summarised into
# $OUT/tests-<crate>.json; kernels: step_kernels; kprof: kernel time per name of one step, ours
# (ncu) and PyTorch's (torch.profiler); parity: 20 steps' losses, ours against PyTorch's from the
# same weights and batch, judged step by step, into $OUT/parity-h200.json; bench:
# bench/scripts/train_h200.sh (first steps from cold, then ours and the strong PyTorch peer in
# equal interleaved rounds) into $OUT/train-h200.json.
# final: the final sitting's figures in one device command of at most SITTING_S seconds (default
# 540): cold first steps, parity (inductor's cache warmed in the background meanwhile), as many
# equal rounds as fit, the plain peer if time is left, a short table last. Tests are a
# separate command (mode tests). LD_PATH=none runs everything with no LD_LIBRARY_PATH; DEVICE=cpu
# is for a dry run of the parity, bench and final modes on a CPU machine (with the sizes edited).
# Writes few files into $OUT (the device returns 8 at most).
set -uo pipefail
mode="${1:-all}"; filter="${2:-}"
top=$(pwd); OUT="${OUT:-$top/gpu-out}"; mkdir -p "$OUT"
commit=$(cat .gpu/commit 2>/dev/null || echo unknown)
python3 - <<'PY'
import lzma, pathlib, tarfile
for p in pathlib.Path(".gpu").rglob("*.xz"):
    if p.name.endswith(".tar.xz"):
        with tarfile.open(p) as t:
            t.extractall(".gpu")
    else:
        q = p.with_suffix("")
        q.write_bytes(lzma.decompress(p.read_bytes())); q.chmod(0o755)
    p.unlink()
PY
library_path() {
  # pip's CUDA libraries on the path (cuDNN's is dropped again below if it breaks cuDNN).
  local nv lp d variant lp_try
  nv=$(python3 -c 'import nvidia; print(nvidia.__path__[0])' 2>/dev/null)
  lp=""; for d in "$nv"/cudnn/lib "$nv"/cu13/lib "$nv"/*/lib /usr/local/cuda/lib64; do
    [ -d "$d" ] && case ":$lp:" in *":$d:"*) ;; *) lp="$lp:$d";; esac; done
  export LD_LIBRARY_PATH="${lp#:}:${LD_LIBRARY_PATH:-}"
  # Which cuDNN arrangement works here: pip's cuDNN on the path, or only the system's. One conv
  # test decides; the rest of the sitting runs with the first that passes.
  [ -x .gpu/tests/oxtrain_tensor ] || return 0
  for variant in with-pip-cudnn without-pip-cudnn; do
    lp_try="$LD_LIBRARY_PATH"
    [ $variant = without-pip-cudnn ] && lp_try=$(echo "$LD_LIBRARY_PATH" | tr ':' '\n' | grep -v '/cudnn/' | paste -sd:)
    if LD_LIBRARY_PATH="$lp_try" .gpu/tests/oxtrain_tensor --include-ignored cudnn_accepts_our_descriptors > /tmp/cudnn-$variant.log 2>&1; then
      echo "cuDNN: $variant passes"; export LD_LIBRARY_PATH="$lp_try"; break
    else
      echo "cuDNN: $variant fails: $(grep -m1 -E 'failed|Error' /tmp/cudnn-$variant.log)"
    fi
  done
}
if [[ "${LD_PATH:-}" == none ]]; then unset LD_LIBRARY_PATH; else library_path; fi
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
echo "commit $commit, mode $mode"
summary=""
if [[ $mode == all || $mode == tests ]]; then
  # Every packed test binary at once (one GPU, 16 cores: the longest binary sets the time),
  # each under TEST_TIMEOUT_S; TEST_CRATES (e.g. "oxtrain_autograd oxtrain_nn") picks some.
  mkdir -p /tmp/test-logs
  for t in .gpu/tests/*; do
    name=$(basename "$t")
    [[ -z "${TEST_CRATES:-}" || " $TEST_CRATES " == *" $name "* ]] || continue
    ( timeout "${TEST_TIMEOUT_S:-300}" "$t" --include-ignored $filter > "/tmp/test-logs/$name.log" 2>&1
      echo $? > "/tmp/test-logs/$name.rc" ) &
  done
  wait
  for log in /tmp/test-logs/*.log; do
    name=$(basename "$log" .log); rc=$(cat "/tmp/test-logs/$name.rc")
    echo "=== $name (rc $rc)"
    grep -E '^test .* FAILED|panicked' "$log" | head -n 20
    summary+="$name (rc $rc): $(grep -E '^test result' "$log" | tail -1)"$'\n'
    mkdir -p /tmp/test-json
    python3 bench/tools/test_summary.py "$log" "/tmp/test-json/tests-$name.json" --commit "$commit" \
      --machine "nvidia-h200 (1x H200)" >/dev/null 2>&1
  done
  # One file for all the summaries: the device returns 8 files at most.
  tar -C /tmp/test-json -czf "$OUT/tests-json.tgz" .
fi
if [[ $mode == all || $mode == kernels ]]; then
  # One file for every kernel diagnostic: the device returns 8 files at most.
  echo "=== step_kernels"; timeout 120 .gpu/bin/step_kernels 2>&1 | tee "$OUT/kernels.txt"
  echo "=== attention (torch, beside step_kernels' attention rows)"
  timeout 90 python3 bench/peers/attention.py 2>&1 | tee -a "$OUT/kernels.txt"
  if [ -x .gpu/bin/gpt2_matmuls ]; then
    echo "=== gpt2_matmuls (ours, torch)"
    { timeout 90 .gpu/bin/gpt2_matmuls; timeout 90 python3 bench/peers/gpt2_matmuls.py; } 2>&1 | tee -a "$OUT/kernels.txt"
  fi
  if [ -x .gpu/bin/layer_norm_kernels ]; then
    echo "=== layer_norm_kernels (fast kernels, then OXTRAIN_DISABLE_FAST_LAYER_NORM=1)"
    { timeout 60 .gpu/bin/layer_norm_kernels; OXTRAIN_DISABLE_FAST_LAYER_NORM=1 timeout 60 .gpu/bin/layer_norm_kernels; } 2>&1 | tee -a "$OUT/kernels.txt"
  fi
  if [[ "${TORCH_PROFILE:-0}" == 1 ]]; then
    echo "=== torch eager GPT-2 step, kernels"
    timeout 120 python3 bench/peers/train.py gpt2-124m --batch 16 --seq 1024 --precision bf16 --device cuda \
      --steps 3 --warmup 3 --profile 2> /tmp/torch_gpt2_profile.txt | cut -c1-200
    { echo "=== torch eager GPT-2 step, kernels"; cat /tmp/torch_gpt2_profile.txt; } >> "$OUT/kernels.txt"
    head -n 45 /tmp/torch_gpt2_profile.txt | cut -c1-220
  fi
fi
if [[ $mode == kprof ]]; then
  # Kernel time of one step, ours (ncu over the step that --profiler-range brackets) beside
  # PyTorch's eager step (torch.profiler), per kernel name. KPROF_CASES picks the models.
  for m in ${KPROF_CASES:-gpt2 resnet50}; do
    case $m in
      gpt2) ours="gpt2-124m --batch 16 --seq 1024 --precision bf16"; peer="$ours" ;;
      resnet50) ours="resnet50 --batch 256 --image 224 --precision bf16 --channels-last"; peer="$ours" ;;
      resnet50_tf32) ours="resnet50 --batch 256 --image 224 --precision tf32 --channels-last"
        peer="resnet50 --batch 256 --image 224 --precision f32 --channels-last" ;;
    esac
    echo "=== ncu: oxtrain bench $ours"
    timeout 300 ncu --profile-from-start off --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum --csv --page raw --print-units base --log-file "/tmp/ncu-$m.csv" \
      .gpu/bin/oxtrain bench $ours --device cuda --steps 3 --warmup 3 --profiler-range | cut -c1-200
    python3 bench/tools/ncu_summary.py "/tmp/ncu-$m.csv" --top 45 | tee "$OUT/kprof-$m.txt"
    [[ "${KPROF_PEER:-1}" == 1 ]] || continue
    echo "=== torch eager: $peer"
    timeout 150 python3 bench/peers/train.py $peer --device cuda --steps 3 --warmup 3 --profile \
      2> "/tmp/torch-$m.txt" | cut -c1-200
    grep -v '^\s*$' "/tmp/torch-$m.txt" | cut -c1-200 | head -n 50 | tee -a "$OUT/kprof-$m.txt"
  done
fi
parity_runs() { # [seconds left]: 20 steps of each PARITY_CASES model, ours then PyTorch's, step by step
  local c dir left t rc
  for c in "resnet50 --batch 256 --image 224 --precision bf16 --channels-last" \
           "gpt2-124m --batch 16 --seq 1024 --precision bf16"; do
    # PARITY_CASES (e.g. "gpt2-124m") picks the models.
    [[ -z "${PARITY_CASES:-}" || " $PARITY_CASES " == *" ${c%% *} "* ]] || continue
    dir="/tmp/parity-${c%% *}"; rm -rf "$dir"
    left=$(( ${1:-100000} - SECONDS )); t=$(( left < 240 ? left : 240 ))
    (( t < 20 )) && { echo "parity: no time left for ${c%% *}"; continue; }
    echo "=== parity: $c"
    timeout "$t" .gpu/bin/oxtrain bench $c --device "${DEVICE:-cuda}" --steps 20 --parity "$dir" > "$dir.log" 2>&1
    rc=$?; cut -c1-300 "$dir.log"; (( rc == 0 )) || { echo "parity: oxtrain failed (exit $rc)"; continue; }
    left=$(( ${1:-100000} - SECONDS )); t=$(( left < 240 ? left : 240 ))
    COMMIT="$commit" timeout "$t" python3 bench/peers/parity.py "$dir" --device "${DEVICE:-cuda}" --out "$dir/parity.json" \
      --results "$OUT/parity-h200.json" > "$dir.log" 2>&1
    rc=$?; grep -v '^{' "$dir.log" | cut -c1-300; (( rc == 0 )) || echo "parity: PyTorch failed (exit $rc)"
    [ -f "$dir/parity.json" ] && cat "$dir/parity.json" >> "$OUT/parity.jsonl"
  done
}
bench_runs() { # <phases> [seconds left]: train_h200.sh into /tmp/bench-out, assembled into $OUT
  local left=$(( ${2:-100000} - SECONDS - 20 ))
  mkdir -p /tmp/bench-out
  [ -x .gpu/bin/oxtrain-base ] && export BASE_BIN="$top/.gpu/bin/oxtrain-base"
  COMMIT="$commit" BASE_COMMIT="$(cat .gpu/base-commit 2>/dev/null)" OUT=/tmp/bench-out BIN="$top/.gpu/bin/oxtrain" \
    BUDGET_S="$(( left < ${BUDGET_S:-480} ? left : ${BUDGET_S:-480} ))" bash bench/scripts/train_h200.sh $1
}
bench_results() {
  COMMIT="$commit" python3 bench/scripts/train_results.py /tmp/bench-out --out "$OUT/train-h200.json" --table \
    > "$OUT/train-table.txt"
  tar -C /tmp/bench-out -czf "$OUT/bench-raw.tgz" .
}
parity_table() {
  python3 - "$OUT/parity-h200.json" <<'PY' 2>/dev/null
import json, sys
for b in json.load(open(sys.argv[1]))["benchmarks"]:
    control = f"; PyTorch control {b['control_steps_within']}/{b['peer']}" if "control_steps_within" in b else ""
    print(f"{b['name']:40} {b['oxtrain']}/{b['peer']} steps within the bar; worst: step {b['worst_step']}, "
          f"{b['worst_margin']}x its bar{control}")
PY
}
if [[ $mode == all || $mode == parity ]]; then
  parity_runs
  summary+=$(parity_table)$'\n'
fi
if [[ $mode == all || $mode == bench ]]; then
  bench_runs "cold rounds extras"; bench_results
  summary+=$(cat "$OUT/train-table.txt")$'\n'
fi
if [[ $mode == final ]]; then
  # The order: cold first steps (nothing is warm yet), parity with inductor's cache filled in the
  # background (parity is not timed), then the equal rounds with what time is left.
  end=$(( ${SITTING_S:-540} ))
  bench_runs cold $(( SECONDS + 200 < end - 240 ? SECONDS + 200 : end - 240 ))
  bench_runs warm $(( end - 200 )) > /tmp/bench-warm.log 2>&1 &
  warm_pid=$!
  parity_runs $(( end - 240 ))
  wait "$warm_pid"; tail -n 4 /tmp/bench-warm.log
  bench_runs "rounds extras" "$end"
  bench_results
  summary+=$(parity_table)$'\n'$(cat "$OUT/train-table.txt")$'\n'
  echo "final: ${SECONDS}s of ${end}s"
fi
[ -d /tmp/test-logs ] && tar -C /tmp/test-logs -czf "$OUT/test-logs.tgz" .
echo "=== summary"; printf '%s' "$summary"
