#!/usr/bin/env bash
# Issue 32's A/B on one H200: oxtrain's whole step with every new path on, with all of them off
# (the switches each change documents), and with one group off at a time, so one sitting tells
# what each change bought; then the kernel programs and one cold first step. oxtrain only (the
# PyTorch peers run in gpu_sitting.sh final). Run from the repository root after
# bench/scripts/gpu_pack.sh:  bash bench/scripts/ab_h200.sh 2>&1 | tee $OUT/ab.log
set -uo pipefail
top=$(pwd); OUT="${OUT:-$top/gpu-out}"; mkdir -p "$OUT"
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
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
bin=.gpu/bin/oxtrain
budget="${BUDGET_S:-540}"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
echo "commit $(cat .gpu/commit 2>/dev/null)"
results="$OUT/ab.jsonl"
run() { # <tag> <env...> -- <bench args...>
  local tag=$1; shift
  local envs=(); while [[ $1 != -- ]]; do envs+=("$1"); shift; done; shift
  if (( SECONDS > budget )); then echo "skip (time): $tag"; return; fi
  local line
  line=$(env "${envs[@]}" timeout 150 "$bin" bench "$@" --device cuda 2> "/tmp/ab-$tag.err" | tail -n 1)
  if [[ $line == "{"* ]]; then
    echo "{\"tag\": \"$tag\", \"result\": $line}" >> "$results"
    python3 -c 'import json,sys; r=json.loads(sys.argv[2]); print(f"{sys.argv[1]:<28} {r[\"oxtrain\"]:>10.0f} {r[\"unit\"]:<9} step {r[\"step_seconds\"]*1e3:7.2f} ms  peak {(r.get(\"peak_memory_bytes\") or 0)/2**30:5.2f} GiB  first {r.get(\"first_step_seconds\") or 0:6.2f} s  waits/step {r.get(\"steady_step_host_waits\")}  allocs/step {r.get(\"steady_step_driver_allocs\")}")' "$tag" "$line"
  else
    echo "$tag failed: $(tail -n 3 /tmp/ab-$tag.err)"
  fi
}
gpt2=(gpt2-124m --batch 16 --seq 1024 --precision bf16 --steps 10 --warmup 3)
resnet=(resnet50 --batch 256 --image 224 --precision bf16 --channels-last --steps 10 --warmup 3)
# The first step on an empty kernel cache (embedded cubins, else compiled in the background).
run gpt2_cold "OXTRAIN_KERNEL_CACHE=$(mktemp -d)" OXTRAIN_KERNEL_LOG=1 -- "${gpt2[@]}"
grep -m 20 -i "kernel" /tmp/ab-gpt2_cold.err | cut -c1-160
run resnet_cold "OXTRAIN_KERNEL_CACHE=$(mktemp -d)" -- "${resnet[@]}"
off_gpt2=(OXTRAIN_ATTENTION=v1 OXTRAIN_DISABLE_EPILOGUES=1 OXTRAIN_DISABLE_PADDED_HEAD=1
  OXTRAIN_DISABLE_FAST_LAYER_NORM=1 OXTRAIN_DISABLE_FUSED_ADD_LAYER_NORM=1
  OXTRAIN_DISABLE_MULTI_TENSOR=1 OXTRAIN_DISABLE_CAST_CACHE=1)
off_resnet=(OXTRAIN_DISABLE_BN_RELU_FOLD=1 OXTRAIN_DISABLE_POOL_OFFSETS=1 OXTRAIN_DISABLE_MULTI_TENSOR=1
  OXTRAIN_DISABLE_CAST_CACHE=1 OXTRAIN_DISABLE_FUSED_RUNNING_STATS=1)
round() {
  run "gpt2_all_on_r$1" -- "${gpt2[@]}"
  run "gpt2_all_off_r$1" "${off_gpt2[@]}" -- "${gpt2[@]}"
  run "resnet_all_on_r$1" -- "${resnet[@]}"
  run "resnet_all_off_r$1" "${off_resnet[@]}" -- "${resnet[@]}"
}
round 1
run gpt2_attention_v1 OXTRAIN_ATTENTION=v1 -- "${gpt2[@]}"
run gpt2_no_epilogues OXTRAIN_DISABLE_EPILOGUES=1 -- "${gpt2[@]}"
run gpt2_plain_head OXTRAIN_DISABLE_PADDED_HEAD=1 -- "${gpt2[@]}"
run gpt2_no_fast_ln OXTRAIN_DISABLE_FAST_LAYER_NORM=1 OXTRAIN_DISABLE_FUSED_ADD_LAYER_NORM=1 -- "${gpt2[@]}"
run gpt2_no_multi_tensor OXTRAIN_DISABLE_MULTI_TENSOR=1 OXTRAIN_DISABLE_CAST_CACHE=1 -- "${gpt2[@]}"
run resnet_no_bn_fold OXTRAIN_DISABLE_BN_RELU_FOLD=1 -- "${resnet[@]}"
run resnet_no_pool_offsets OXTRAIN_DISABLE_POOL_OFFSETS=1 -- "${resnet[@]}"
run resnet_no_multi_tensor OXTRAIN_DISABLE_MULTI_TENSOR=1 OXTRAIN_DISABLE_CAST_CACHE=1 OXTRAIN_DISABLE_FUSED_RUNNING_STATS=1 -- "${resnet[@]}"
for prog in step_kernels layer_norm_kernels gpt2_matmuls; do
  (( SECONDS > budget )) && break
  [ -x ".gpu/bin/$prog" ] || continue
  echo "=== $prog"; timeout 120 ".gpu/bin/$prog" 2>&1 | tee -a "$OUT/kernels.txt" | cut -c1-150
done
round 2
echo "=== done in ${SECONDS}s"
