#!/usr/bin/env bash
# Issue 33's whole-job measurement on one H200, every figure from the same sitting:
#   bash bench/scripts/imagenet_job.sh [RESULT_JSON]   (default bench/results/imagenet-h200.json)
# 1. makes the ImageNet-like folder with bench/peers/imagenet_job.py (100 classes, 120 train and
#    10 val JPEGs each, 500x375, quality 90) in $DATA unless it is there;
# 2. the bare step: `oxtrain bench resnet50 --batch 256 --image 224 --precision bf16
#    --channels-last`;
# 3. `oxtrain train` on the folder for $EPOCHS epochs (evaluation after each) at 16 and at 4
#    workers, with each setting of $DECODES (data.decode=auto|cpu|gpu; auto is what a user gets,
#    the others pin the decoder), log.every_steps=$WINDOW;
# 4. the PyTorch job (ImageFolder, DataLoader with pinned memory, channels_last bf16 step) at 16
#    and 4 workers;
# 5. bench/scripts/imagenet_results.py writes the result file from $OUT (nothing by hand).
# Run from the repository root with oxtrain in .gpu/bin/ (BIN overrides) and the peer's Python
# as python3 (PYTHON overrides). A dry run on a CPU machine at a tiny size:
#   DEVICE=cpu CLASSES=2 PER_CLASS=8 VAL_PER_CLASS=2 WIDTH=64 HEIGHT=48 IMAGE=32 BATCH=4 \
#     EPOCHS=2 WORKER_COUNTS="2" DECODES=cpu bash bench/scripts/imagenet_job.sh /tmp/imagenet-dry.json
set -uo pipefail
result="${1:-bench/results/imagenet-h200.json}"
bin="${BIN:-$(pwd)/.gpu/bin/oxtrain}"
py="${PYTHON:-python3}"
OUT="${OUT:-./gpu-out/imagenet}"; mkdir -p "$OUT"
DATA="${DATA:-/tmp/oxtrain-imagenet-like}"
dev="${DEVICE:-cuda}"
batch="${BATCH:-256}"; image="${IMAGE:-224}"; epochs="${EPOCHS:-4}"; window="${WINDOW:-5}"
export PYTHONUNBUFFERED=1

echo "== folder $DATA"
"$py" bench/peers/imagenet_job.py make "$DATA" --classes "${CLASSES:-100}" --per-class "${PER_CLASS:-120}" \
  --val-per-class "${VAL_PER_CLASS:-10}" --width "${WIDTH:-500}" --height "${HEIGHT:-375}" --quality 90 || exit 1

echo "== bare step"
"$bin" bench resnet50 --batch "$batch" --image "$image" --precision bf16 --channels-last --device "$dev" \
  --warmup 5 --steps "${BARE_STEPS:-30}" 2> "$OUT/bare.err" | grep '^{' | tail -n 1 > "$OUT/bare.json"
cat "$OUT/bare.json"

for workers in ${WORKER_COUNTS:-16 4}; do
  for decode in ${DECODES:-auto cpu gpu}; do
    tag="oxtrain_${workers}w_${decode}"; run="$OUT/$tag"
    echo "== $tag"
    rm -rf "$run"
    timeout "${RUN_TIMEOUT_S:-900}" "$bin" train --config examples/configs/resnet50_imagenet.toml \
      data.train="$DATA/train" data.val="$DATA/val" data.batch_size="$batch" data.workers="$workers" \
      data.image_size="$image" data.eval_resize=$((image * 8 / 7)) precision.dtype=bf16 \
      train.channels_last=true train.device="$dev" train.epochs="$epochs" \
      log.dir="$run" log.every_steps="$window" log.progress=lines data.decode="$decode" \
      > "$run.log" 2>&1 || echo "   failed (exit $?): $(tail -n 3 "$run.log" | cut -c1-300)"
    printf '{"workers": %s, "decode": "%s", "batch": %s, "metrics": "%s"}\n' \
      "$workers" "$decode" "$batch" "$run/metrics.jsonl" > "$OUT/$tag.meta.json"
  done
  echo "== pytorch_${workers}w"
  "$py" bench/peers/imagenet_job.py train "$DATA" --workers "$workers" --epochs "$epochs" --batch "$batch" \
    --image "$image" --window "$window" --device "$dev" 2> "$OUT/pytorch_${workers}w.err" \
    | grep '^{' | tail -n 1 > "$OUT/pytorch_${workers}w.json" || echo "   failed: $(tail -n 3 "$OUT/pytorch_${workers}w.err")"
done

DEVICE_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)" \
  "$py" bench/scripts/imagenet_results.py "$OUT" "$result"
