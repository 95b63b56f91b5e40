# Sourced by the GPU scripts: the library folders of pip's nvidia packages for oxtrain's library
# search and the loader, NVSHMEM's home, and no NVLink multicast or InfiniBand probing.
nv=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null)
dirs=""
if [ -n "$nv" ]; then for d in "$nv"/*/lib; do [ -d "$d" ] && dirs="$dirs:$d"; done; fi
export OXTRAIN_CUDA_LIB_DIRS="${dirs#:}"
export LD_LIBRARY_PATH="${OXTRAIN_CUDA_LIB_DIRS}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
[ -n "$nv" ] && [ -d "$nv/nvshmem" ] && export OXTRAIN_NVSHMEM_HOME="$nv/nvshmem"
export OXTRAIN_KERNEL_CACHE="${OXTRAIN_KERNEL_CACHE:-/tmp/oxtrain-kernel-cache}"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 NVSHMEM_REMOTE_TRANSPORT=none TORCH_SYMM_MEM_DISABLE_MULTICAST=1
echo "nvidia packages: $nv"
