#!/usr/bin/env bash
# Issue 32's measurement on one H200: the whole training step of `oxtrain bench` against the
# same step in PyTorch (bench/peers/train.py, the strong peer), and the first step from cold.
#   bash bench/scripts/train_h200.sh [PHASE...]    (default: cold rounds extras)
# Phases:
#   cold    first_step_cold_{resnet50,gpt2}: ours with OXTRAIN_KERNEL_CACHE a new empty folder,
#           then PyTorch eager in a fresh process, `--warmup 1 --steps 3` each; then the
#           cold folders' cubins are copied into the kernel cache the rounds use.
#   warm    one short torch.compile process per bf16 case, to fill inductor's disk cache (the
#           sitting runs it in the background while the untimed parity runs).
#   rounds  equal rounds, interleaved case by case: ours, [BASE_BIN], torch eager, torch.compile
#           (bf16 cases); a new round starts only while the last round's duration still fits
#           before BUDGET_S, so every side gets the same number of rounds.
#   extras  the plain (older, weaker) peer, eager and compiled, once per bf16 case (GPT-2 first),
#           while time allows (PLAIN=0 skips); PROFILE=1 adds one profiled step of ours per model.
# Every raw JSON line goes to $OUT/<tag>.<side>.jsonl with its round number; the caller
# assembles them with bench/scripts/train_results.py. Run from the repository root with oxtrain
# in .gpu/bin/ (BIN overrides); the library path is the caller's (gpu_sitting.sh decides it).
# CASES (a regular expression) keeps only the matching case tags; STEPS/WARMUP per process
# (default 20 after 5), MAX_ROUNDS (default 3); BUDGET_S: seconds from this script's start by
# which every run has ended (default 480; run timeouts are cut to it).
set -uo pipefail
bin="${BIN:-$(pwd)/.gpu/bin/oxtrain}"
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
budget="${BUDGET_S:-480}"
dev="${DEVICE:-cuda}"  # cpu: a dry run of the scripts at small sizes
steps=(--steps "${STEPS:-20}" --warmup "${WARMUP:-5}")
phases="${*:-cold rounds extras}"
export PYTHONUNBUFFERED=1

# case: <tag>|<oxtrain args>|<peer args>|<peer kinds run in each round>
cases=(
  "resnet50_bf16_b256|resnet50 --batch 256 --image 224 --precision bf16 --channels-last|resnet50 --batch 256 --image 224 --precision bf16 --channels-last|eager compile"
  "gpt2_124m_bf16_b16_t1024|gpt2-124m --batch 16 --seq 1024 --precision bf16|gpt2-124m --batch 16 --seq 1024 --precision bf16|eager compile"
  "resnet50_tf32_b256|resnet50 --batch 256 --image 224 --precision tf32 --channels-last|resnet50 --batch 256 --image 224 --precision tf32 --channels-last|eager"
)
filtered=(); for c in "${cases[@]}"; do [[ ${c%%|*} =~ ${CASES:-.} ]] && filtered+=("$c"); done
cases=("${filtered[@]}")
declare -A peer_flags=([eager]="" [compile]="--compile" [plain_eager]="--plain" [plain_compile]="--plain --compile")
rnd=0

run() { # <file stem> <timeout> <cmd...>: one process, its last JSON line tagged with the round
  local f=$1 t=$2 left=$((budget - SECONDS)) line rc; shift 2
  (( left < 10 )) && { echo "skip (time): $*"; return 1; }
  (( t > left )) && t=$left
  echo "== [r$rnd ${SECONDS}s] $*"
  timeout "$t" "$@" > "$f.stdout" 2>> "$f.err"; rc=$?
  line=$(grep '^{' "$f.stdout" | tail -n 1); rm -f "$f.stdout"
  if (( rc != 0 )) || [ -z "$line" ]; then
    echo "   failed (exit $rc$( (( rc == 124 )) && echo ", timed out after ${t}s")): $(tail -n 3 "$f.err" | cut -c1-300)"
    return 1
  fi
  echo "${line/#\{/\{\"round\": $rnd, }" >> "$f.jsonl"
  echo "   $(cut -c1-170 <<< "$line")"
}

peer() { # <file stem> <timeout> <kind> <peer args...>
  local f=$1 t=$2 kind=$3; shift 3
  # shellcheck disable=SC2086  # the flags are words
  run "$f" "$t" python3 bench/peers/train.py "$@" ${peer_flags[$kind]} --device "$dev"
}

cold() {
  local warm_cache="${OXTRAIN_KERNEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/oxtrain/kernels}" m c
  mkdir -p "$warm_cache"
  for m in resnet50 gpt2; do
    for c in "${cases[@]}" ""; do [[ $c == "$m"*_bf16_* ]] && break; done
    [ -z "$c" ] && continue  # CASES left this model's bf16 case out
    IFS='|' read -r _ ours theirs _ <<< "$c"
    local empty; empty=$(mktemp -d /tmp/oxtrain-cold-kernels.XXXX)
    # shellcheck disable=SC2086
    OXTRAIN_KERNEL_CACHE="$empty" run "$OUT/cold_$m.oxtrain" 240 "$bin" bench $ours --device "$dev" --warmup 1 --steps 3
    # shellcheck disable=SC2086
    peer "$OUT/cold_$m.eager" 150 eager $theirs --warmup 1 --steps 3
    cp -n "$empty"/* "$warm_cache"/ 2>/dev/null; rm -rf "$empty"
  done
}

warm() {
  for c in "${cases[@]}"; do
    IFS='|' read -r tag _ theirs kinds <<< "$c"
    # shellcheck disable=SC2086
    [[ $kinds == *compile* ]] && peer "$OUT/warm_$tag" 300 compile $theirs --warmup 1 --steps 1
  done
}

one_round() {
  local c tag ours theirs kinds k
  for c in "${cases[@]}"; do
    IFS='|' read -r tag ours theirs kinds <<< "$c"
    # shellcheck disable=SC2086
    run "$OUT/$tag.oxtrain" 150 "$bin" bench $ours --device "$dev" "${steps[@]}"
    # shellcheck disable=SC2086
    [ -n "${BASE_BIN:-}" ] && run "$OUT/$tag.base" 150 "$BASE_BIN" bench $ours --device "$dev" "${steps[@]}"
    for k in $kinds; do
      # shellcheck disable=SC2086
      peer "$OUT/$tag.$k" 300 "$k" $theirs "${steps[@]}"
    done
  done
}

rounds() {
  local last=0 start
  while (( rnd < ${MAX_ROUNDS:-3} )); do
    # The first round always runs; a later one only if one more like the last still fits.
    if (( rnd > 0 && SECONDS + last * 11 / 10 > budget )); then
      echo "rounds: stop after $rnd (the last took ${last}s, ${SECONDS}s of ${budget}s used)"; break
    fi
    rnd=$((rnd + 1)); start=$SECONDS
    one_round
    last=$((SECONDS - start))
  done
  echo "rounds: $rnd"
}

extras() {
  rnd=0
  if [[ "${PLAIN:-1}" == 1 ]]; then
    local i c tag theirs kinds
    # Last case first: GPT-2's compile is the shorter, so it is the one that fits a short end.
    for (( i = ${#cases[@]} - 1; i >= 0; i-- )); do
      c=${cases[i]}
      IFS='|' read -r tag _ theirs kinds <<< "$c"
      [[ $kinds == *compile* ]] || continue
      # shellcheck disable=SC2086
      peer "$OUT/$tag.plain_eager" 150 plain_eager $theirs "${steps[@]}"
      # shellcheck disable=SC2086
      peer "$OUT/$tag.plain_compile" 300 plain_compile $theirs "${steps[@]}"
    done
  fi
  if [[ "${PROFILE:-0}" == 1 ]]; then
    [[ resnet50_bf16 =~ ${CASES:-.} ]] && run "$OUT/profile_resnet50" 120 "$bin" bench resnet50 --batch 256 \
      --image 224 --precision bf16 --channels-last --device "$dev" --steps 1 --warmup 2 --profile
    [[ gpt2 =~ ${CASES:-.} ]] && run "$OUT/profile_gpt2" 120 "$bin" bench gpt2-124m --batch 16 --seq 1024 \
      --precision bf16 --device "$dev" --steps 1 --warmup 2 --profile
  fi
}

command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
for phase in $phases; do
  case $phase in
    cold|warm|rounds|extras) echo "=== train_h200: $phase (${SECONDS}s of ${budget}s)"; $phase ;;
    *) echo "train_h200: unknown phase $phase (cold, warm, rounds, extras)"; exit 2 ;;
  esac
done
