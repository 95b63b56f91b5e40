#!/usr/bin/env bash
# Issue 22's measurement on one H200: the whole training step of `oxtrain bench` against the
# same step in PyTorch (bench/peers/train.py), eager and under torch.compile, interleaved
# (ours, then theirs, case by case), then a second round while time allows. Writes every raw
# JSON line and the assembled bench/results-format file to $OUT/train-h200.json. Run from the
# repository root with oxtrain in .gpu/bin/ (BIN overrides). BASE_BIN, when set, is an earlier
# oxtrain run beside ours in every round (rows in <tag>.base.jsonl), to measure a change.
# PyTorch's f32 case keeps its defaults: TF32 in cuDNN convolutions, as ours with tf32.
set -uo pipefail
bin="${BIN:-$(pwd)/.gpu/bin/oxtrain}"
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
nv=$(python3 -c 'import nvidia; print(nvidia.__path__[0])' 2>/dev/null)
for d in "$nv"/*/lib /usr/local/cuda/lib64; do [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; done
export LD_LIBRARY_PATH NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
budget="${BUDGET_S:-420}"   # stop starting new runs after this many seconds
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader

# case: <tag> <oxtrain args> | <peer args>
cases=(
  "resnet50_bf16_b256|resnet50 --batch 256 --image 224 --precision bf16 --channels-last|resnet50 --batch 256 --image 224 --precision bf16 --channels-last"
  "gpt2_124m_bf16_b16_t1024|gpt2-124m --batch 16 --seq 1024 --precision bf16|gpt2-124m --batch 16 --seq 1024 --precision bf16"
  "resnet50_tf32_b256|resnet50 --batch 256 --image 224 --precision tf32 --channels-last|resnet50 --batch 256 --image 224 --precision f32 --channels-last"
)
# CASES (a regular expression) keeps only the matching case tags.
filtered=(); for c in "${cases[@]}"; do [[ ${c%%|*} =~ ${CASES:-.} ]] && filtered+=("$c"); done
cases=("${filtered[@]}")
run() { # <file> <timeout> <cmd...>
  local f=$1 t=$2; shift 2
  if (( SECONDS > budget )); then echo "skip (time): $*"; return; fi
  echo "== $*"
  timeout "$t" "$@" >> "$f.jsonl" 2>> "$f.err" || echo "   failed (exit $?): $(tail -n 3 "$f.err")"
  tail -n 1 "$f.jsonl" | cut -c1-160
}
round() { # ours then eager torch, case by case
  for c in "${cases[@]}"; do
    IFS='|' read -r tag ours peer <<< "$c"
    run "$OUT/$tag.oxtrain" 150 "$bin" bench $ours --device cuda --steps 10 --warmup 3
    [ -n "${BASE_BIN:-}" ] && run "$OUT/$tag.base" 150 "$BASE_BIN" bench $ours --device cuda --steps 10 --warmup 3
    run "$OUT/$tag.eager" 120 python3 bench/peers/train.py $peer --device cuda --steps 10 --warmup 3
  done
}
round
# One profiled step of ours, for where the time goes (PROFILE=0 skips it).
[[ "${PROFILE:-1}" == 1 && resnet50_bf16 =~ ${CASES:-.} ]] && run "$OUT/profile_resnet50" 120 "$bin" bench resnet50 --batch 256 \
  --image 224 --precision bf16 --channels-last --device cuda --steps 1 --warmup 2 --profile
[[ "${PROFILE:-1}" == 1 && gpt2 =~ ${CASES:-.} ]] && run "$OUT/profile_gpt2" 120 "$bin" bench gpt2-124m --batch 16 --seq 1024 \
  --precision bf16 --device cuda --steps 1 --warmup 2 --profile
for c in "${cases[@]}"; do  # torch.compile, the bf16 cases' named peer (compiling takes a minute)
  IFS='|' read -r tag ours peer <<< "$c"
  [[ $tag == *tf32* ]] || run "$OUT/$tag.compile" 200 python3 bench/peers/train.py $peer --device cuda \
    --steps 10 --warmup 3 --compile
done
round
python3 bench/scripts/train_results.py "$OUT" > "$OUT/train-h200.json" && cat "$OUT/train-h200.json"
