//! The nvshmem backend's tuning: [`NvshmemOptions`] (read from `OXTRAIN_NVSHMEM_*` by
//! `Default`), where its libraries and headers are ([`NvshmemPaths`]), the all-reduce
//! [`Algorithm`]s, and which one runs for a given call. Only these types read the backend's
//! variables; comm's README has the table of them, with the measurements behind the defaults.

use super::kernels;
use std::path::PathBuf;

/// Which all-reduce algorithm runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Low-latency up to `ll_max_bytes`, one-shot up to `oneshot_max_bytes`, then two-shot.
    Auto,
    /// Data and flags in every 8-byte word, one NVLink crossing, no signals (`ll.cu`).
    LowLatency,
    OneShot,
    TwoShot,
}

impl Algorithm {
    /// `auto`, `ll`, `oneshot` or `twoshot`.
    pub fn parse(s: &str) -> Option<Algorithm> {
        Some(match s {
            "auto" => Algorithm::Auto,
            "ll" => Algorithm::LowLatency,
            "oneshot" => Algorithm::OneShot,
            "twoshot" => Algorithm::TwoShot,
            _ => return None,
        })
    }
}

/// Tuning of the nvshmem backend; `Default` reads the `OXTRAIN_NVSHMEM_*` variables.
#[derive(Debug, Clone)]
pub struct NvshmemOptions {
    /// Most blocks a collective kernel uses (1..=256, and at most one per SM); fewer SMs taken
    /// from compute. `OXTRAIN_NVSHMEM_BLOCKS`, default 32.
    pub max_blocks: u32,
    /// All-reduces of at most this many bytes run low-latency under `Algorithm::Auto`; it
    /// also sizes the low-latency slots (2 x world x 2 x this on the heap).
    /// `OXTRAIN_NVSHMEM_LL_MAX_BYTES`, default 256 KiB.
    pub ll_max_bytes: usize,
    /// All-reduces of at most this many bytes (and more than `ll_max_bytes`) run one-shot
    /// under `Algorithm::Auto`. `OXTRAIN_NVSHMEM_ONESHOT_MAX_BYTES`, default 8 MiB.
    pub oneshot_max_bytes: usize,
    /// `OXTRAIN_NVSHMEM_ALGO`: auto (default), ll, oneshot, twoshot.
    pub algorithm: Algorithm,
    /// Bytes of one staging slot: larger messages run in windows of this size. The heap
    /// holds 2 x world x this (0: 128 MiB, at most 256 MiB / world: 512 MiB of heap).
    /// `OXTRAIN_NVSHMEM_CHUNK_BYTES`, default 0.
    pub chunk_bytes: usize,
    /// The zero-copy all-reduce of symmetric memory: Some(true) pushes (two-shot, results
    /// stored into the peers' copies; whole 16-byte packs only), Some(false) one pass loading
    /// the peers' copies, None picks by blocks and size ([`symmetric_pushes`]).
    /// `OXTRAIN_NVSHMEM_SYMM`: push, pull or auto (default).
    pub symmetric_push: Option<bool>,
    /// GPUs per node (PEs numbered node by node); fewer than the world makes the collectives
    /// hierarchical (see `hier.rs`). 0: the launcher's (torchrun's `LOCAL_WORLD_SIZE`, Open
    /// MPI's `OMPI_COMM_WORLD_LOCAL_SIZE`, Slurm's tasks per node), else every PE on one node.
    /// `OXTRAIN_NVSHMEM_RANKS_PER_NODE`, default 0.
    pub ranks_per_node: usize,
    /// Launch collectives as programmatic dependent launches on sm_90 and newer (hides the
    /// gap between back-to-back collectives); off with `OXTRAIN_NVSHMEM_PDL=0`. Off anyway
    /// when several PEs share a GPU.
    pub dependent_launch: bool,
}

/// Where the backend finds NVSHMEM and CUDA's headers, from the environment.
#[derive(Debug, Clone, Default)]
pub struct NvshmemPaths {
    /// `OXTRAIN_NVSHMEM_LIB`: the host library file (`libnvshmem_host.so.3`).
    pub lib: Option<PathBuf>,
    /// `OXTRAIN_NVSHMEM_HOME`, else NVSHMEM's own `NVSHMEM_HOME`: the folder with `include/`
    /// and `lib/`.
    pub home: Option<PathBuf>,
    /// `OXTRAIN_CUDA_INCLUDE_DIR`: the folder holding `cuda.h`, for the kernels' compile.
    pub cuda_include_dir: Option<PathBuf>,
}

impl NvshmemPaths {
    pub fn from_env() -> NvshmemPaths {
        let path = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        NvshmemPaths {
            lib: path("OXTRAIN_NVSHMEM_LIB"),
            home: path("OXTRAIN_NVSHMEM_HOME").or_else(|| path("NVSHMEM_HOME")),
            cuda_include_dir: path("OXTRAIN_CUDA_INCLUDE_DIR"),
        }
    }
}

fn env_num(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

impl Default for NvshmemOptions {
    fn default() -> Self {
        let algorithm = std::env::var("OXTRAIN_NVSHMEM_ALGO")
            .ok()
            .and_then(|v| Algorithm::parse(v.trim()))
            .unwrap_or(Algorithm::Auto);
        NvshmemOptions {
            max_blocks: env_num("OXTRAIN_NVSHMEM_BLOCKS").unwrap_or(32) as u32,
            oneshot_max_bytes: env_num("OXTRAIN_NVSHMEM_ONESHOT_MAX_BYTES").unwrap_or(8 << 20),
            ll_max_bytes: env_num("OXTRAIN_NVSHMEM_LL_MAX_BYTES").unwrap_or(256 << 10),
            algorithm,
            chunk_bytes: env_num("OXTRAIN_NVSHMEM_CHUNK_BYTES").unwrap_or(0),
            ranks_per_node: env_num("OXTRAIN_NVSHMEM_RANKS_PER_NODE").unwrap_or(0),
            dependent_launch: std::env::var("OXTRAIN_NVSHMEM_PDL").map_or(true, |v| v.trim() != "0"),
            symmetric_push: match std::env::var("OXTRAIN_NVSHMEM_SYMM").as_deref().map(str::trim) {
                Ok("push") => Some(true),
                Ok("pull") => Some(false),
                _ => None,
            },
        }
    }
}

/// Whether the zero-copy all-reduce of `bytes` of symmetric memory pushes (two-shot) rather
/// than loads the peers' copies in one pass; `packs`: the buffer is whole aligned 16-byte packs,
/// which pushing needs. The thresholds come from the measurements in comm's README.
pub(crate) fn symmetric_pushes(opts: &NvshmemOptions, bytes: usize, packs: bool) -> bool {
    packs && opts.symmetric_push.unwrap_or(opts.max_blocks >= 64 || bytes < (64 << 20))
}

/// The kernel mode of an all-reduce of `bytes` under `algorithm`.
pub(crate) fn all_reduce_mode(opts: &NvshmemOptions, algorithm: Algorithm, bytes: usize) -> i32 {
    match algorithm {
        Algorithm::LowLatency => kernels::LL,
        Algorithm::OneShot => kernels::ONESHOT,
        Algorithm::TwoShot => kernels::TWOSHOT,
        Algorithm::Auto if bytes <= opts.ll_max_bytes => kernels::LL,
        Algorithm::Auto if bytes <= opts.oneshot_max_bytes => kernels::ONESHOT,
        Algorithm::Auto => kernels::TWOSHOT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(max_blocks: u32) -> NvshmemOptions {
        NvshmemOptions {
            max_blocks,
            ll_max_bytes: 256 << 10,
            oneshot_max_bytes: 8 << 20,
            algorithm: Algorithm::Auto,
            chunk_bytes: 0,
            ranks_per_node: 0,
            symmetric_push: None,
            dependent_launch: true,
        }
    }

    #[test]
    fn symmetric_memory_pulls_with_few_blocks_and_large_messages() {
        let big = 256 << 20;
        assert!(!symmetric_pushes(&opts(32), big, true));
        assert!(symmetric_pushes(&opts(32), 8 << 20, true));
        assert!(symmetric_pushes(&opts(64), big, true));
        assert!(symmetric_pushes(&opts(128), big, true));
        // Pushing needs whole packs; a forced choice wins otherwise.
        assert!(!symmetric_pushes(&opts(128), big, false));
        let forced = NvshmemOptions { symmetric_push: Some(true), ..opts(32) };
        assert!(symmetric_pushes(&forced, big, true));
        let pull = NvshmemOptions { symmetric_push: Some(false), ..opts(128) };
        assert!(!symmetric_pushes(&pull, 8 << 20, true));
    }

    #[test]
    fn auto_goes_low_latency_one_shot_then_two_shot() {
        let o = opts(128);
        let mode = |bytes| all_reduce_mode(&o, Algorithm::Auto, bytes);
        assert_eq!(mode(8), kernels::LL);
        assert_eq!(mode(256 << 10), kernels::LL);
        assert_eq!(mode((256 << 10) + 4), kernels::ONESHOT);
        assert_eq!(mode(8 << 20), kernels::ONESHOT);
        assert_eq!(mode(64 << 20), kernels::TWOSHOT);
        assert_eq!(mode(1 << 30), kernels::TWOSHOT);
    }

    #[test]
    fn forced_algorithms_win_at_any_size() {
        let o = opts(32);
        assert_eq!(all_reduce_mode(&o, Algorithm::LowLatency, 1 << 30), kernels::LL);
        assert_eq!(all_reduce_mode(&o, Algorithm::OneShot, 1 << 30), kernels::ONESHOT);
        assert_eq!(all_reduce_mode(&o, Algorithm::TwoShot, 8), kernels::TWOSHOT);
    }

    #[test]
    fn algorithm_names_parse() {
        for (s, a) in [
            ("auto", Algorithm::Auto),
            ("ll", Algorithm::LowLatency),
            ("oneshot", Algorithm::OneShot),
            ("twoshot", Algorithm::TwoShot),
        ] {
            assert_eq!(Algorithm::parse(s), Some(a));
        }
        // The streaming all-reduce measured slower than two-shot and was removed.
        assert_eq!(Algorithm::parse("stream"), None);
    }
}
