# Sourced by the GPU scripts: comm-bench ($bin: $BENCH or .gpu/bin/comm-bench), the output folder
# ($OUT, default ./gpu-out), the library folders of pip's nvidia packages for oxtrain's library
# search and the loader, NVSHMEM's home, and no NVLink multicast or InfiniBand probing.
here=$(pwd)
bin="${BENCH:-$here/.gpu/bin/comm-bench}"
OUT="${OUT:-$here/gpu-out}"
mkdir -p "$OUT"
[ -x "$bin" ] || { echo "$(basename "$0"): $bin not found (build comm-bench and copy it to .gpu/bin/)"; exit 2; }
nv=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null)
dirs=""
if [ -n "$nv" ]; then for d in "$nv"/*/lib; do [ -d "$d" ] && dirs="$dirs:$d"; done; fi
export OXTRAIN_CUDA_LIB_DIRS="${dirs#:}"
export LD_LIBRARY_PATH="${OXTRAIN_CUDA_LIB_DIRS}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
[ -n "$nv" ] && [ -d "$nv/nvshmem" ] && export OXTRAIN_NVSHMEM_HOME="$nv/nvshmem"
export OXTRAIN_KERNEL_CACHE="${OXTRAIN_KERNEL_CACHE:-/tmp/oxtrain-kernel-cache}"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 NVSHMEM_REMOTE_TRANSPORT=none TORCH_SYMM_MEM_DISABLE_MULTICAST=1
echo "nvidia packages: $nv"
