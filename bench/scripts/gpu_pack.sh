#!/usr/bin/env bash
# Packs what one GPU sitting runs into .gpu/ (ignored), in one xz archive so that it fits the device
# tool's 64 MiB: the CUDA test binaries of tensor, autograd and nn, the oxtrain binary and the
# bench programs. Run here after `cargo build --release`; then on the device:
#   carry [".gpu"], command "bash bench/scripts/gpu_sitting.sh all 2>&1 | tee $OUT/sitting.log"
# (or mode tests, then mode final: the figures of a final sitting within one 10-minute command)
# CRATES overrides the crates whose unit tests travel; ITESTS the integration tests with CUDA
# tests (crate:test); BINS the binaries (names under target/release);
# BASE_BIN adds an earlier oxtrain binary, run beside this one in the benchmark (A/B).
set -euo pipefail
top=$(git rev-parse --show-toplevel); cd "$top"
target="${CARGO_TARGET_DIR:-$top/target}"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu; mkdir -p .gpu/tests .gpu/bin
crates="${CRATES:-oxtrain-tensor oxtrain-autograd oxtrain-nn oxtrain-models}"
args=(--lib); for c in $crates; do args+=(-p "$c"); done
for t in ${ITESTS:-oxtrain-models:resnet oxtrain-models:steady_step oxtrain:memory}; do
  args+=(-p "${t%%:*}" --test "${t#*:}")
done
cargo test --release --no-run --message-format=json "${args[@]}" \
  | python3 -c 'import sys,json
for l in sys.stdin:
    try: m=json.loads(l)
    except Exception: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m.get("profile",{}).get("test"):
        print(m["target"]["name"], m["executable"])' \
  | while read -r name exe; do cp "$exe" ".gpu/tests/$name"; done
for b in ${BINS:-oxtrain step_kernels cuda_ops gpt2_matmuls layer_norm_kernels}; do cp "$target/release/$b" .gpu/bin/; done
[ -n "${BASE_BIN:-}" ] && cp "$BASE_BIN" .gpu/bin/oxtrain-base
strip .gpu/tests/* .gpu/bin/*
# One solid archive: the binaries share most of their code, so together they compress to a
# third of what each compressed alone does.
tar -C .gpu -cf - tests bin | xz -T2 -9 > .gpu/pack.tar.xz
rm -rf .gpu/tests .gpu/bin
git rev-parse --short HEAD > .gpu/commit
du -sh .gpu | awk '{print "gpu_pack: " $1 " in .gpu/ (64 MiB travel at most)"}'
