//! The nvshmem backend's tuning: [`NvshmemOptions`] (read from `OXTRAIN_NVSHMEM_*` by
//! `Default`), the all-reduce [`Algorithm`]s, and which one runs for a given call.

use super::kernels;

/// Which all-reduce algorithm runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Low-latency up to `ll_max_bytes`, one-shot up to `oneshot_max_bytes`, then two-shot
    /// (streaming from `stream_min_bytes` on two GPUs with 16-byte aligned tensors, when set).
    Auto,
    /// Data and flags in every 8-byte word, one NVLink crossing, no signals (`ll.cu`).
    LowLatency,
    OneShot,
    TwoShot,
    /// Pushes and reductions pipelined through rings in one launch (`stream.cu`). Every GPU
    /// receives the whole tensor from every peer: the least time on two GPUs, more traffic
    /// than two-shot on more.
    Stream,
}

impl Algorithm {
    /// `auto`, `ll`, `oneshot`, `twoshot` or `stream`.
    pub fn parse(s: &str) -> Option<Algorithm> {
        Some(match s {
            "auto" => Algorithm::Auto,
            "ll" => Algorithm::LowLatency,
            "oneshot" => Algorithm::OneShot,
            "twoshot" => Algorithm::TwoShot,
            "stream" => Algorithm::Stream,
            _ => return None,
        })
    }
}

/// Tuning of the nvshmem backend; `Default` reads the `OXTRAIN_NVSHMEM_*` variables.
#[derive(Debug, Clone)]
pub struct NvshmemOptions {
    /// Most blocks a collective kernel uses (1..=256, and at most one per SM); fewer SMs taken
    /// from compute.
    pub max_blocks: u32,
    /// All-reduces of at most this many bytes run low-latency under `Algorithm::Auto`; it
    /// also sizes the low-latency slots (2 x world x 2 x this on the heap).
    pub ll_max_bytes: usize,
    /// All-reduces of at most this many bytes (and more than `ll_max_bytes`) run one-shot
    /// under `Algorithm::Auto`.
    pub oneshot_max_bytes: usize,
    pub algorithm: Algorithm,
    /// Bytes of one staging slot: larger messages run in windows of this size. The heap
    /// holds 2 x world x this (0: 128 MiB, at most 256 MiB / world: 512 MiB of heap). On
    /// 2xH200 128 MiB windows took two-shot from 323 to 329 GB/s at 256 MiB and the symmetric
    /// all-reduce from 342 to 351 against 64 MiB (each window costs about 10 us).
    pub chunk_bytes: usize,
    /// All-reduces of at least this many bytes stream under `Algorithm::Auto` (two GPUs);
    /// between `oneshot_max_bytes` and this they run two-shot.
    pub stream_min_bytes: usize,
    /// Streaming all-reduce: bytes per ring chunk (at most 64 KiB: a pusher block holds one in
    /// registers), and chunks per ring. Defaults 64 KiB and 2, the best of a sweep on 2xH200.
    pub stream_chunk_bytes: usize,
    pub stream_depth: usize,
    /// Streaming all-reduce: pusher blocks per reducer block.
    pub stream_pushers_per_reducer: usize,
    /// The zero-copy all-reduce of symmetric memory: Some(true) pushes (two-shot, results
    /// stored into the peers' copies; whole 16-byte packs only), Some(false) one pass loading
    /// the peers' copies, None picks by blocks and size ([`symmetric_pushes`]).
    /// `OXTRAIN_NVSHMEM_SYMM`: push, pull or auto (default).
    pub symmetric_push: Option<bool>,
    /// GPUs per node (PEs numbered node by node); fewer than the world makes the collectives
    /// hierarchical (see `hier.rs`). 0: the launcher's (torchrun's `LOCAL_WORLD_SIZE`, Open
    /// MPI's `OMPI_COMM_WORLD_LOCAL_SIZE`, Slurm's tasks per node), else every PE on one node.
    pub ranks_per_node: usize,
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
            // Measured on 2xH200 (bench/results/comm-2xh200.json, f32): one-shot is faster up to
            // 8 MiB (40.3 vs 42.4 us), two-shot from 16 MiB (65.5 vs 69.7 us).
            oneshot_max_bytes: env_num("OXTRAIN_NVSHMEM_ONESHOT_MAX_BYTES").unwrap_or(8 << 20),
            ll_max_bytes: env_num("OXTRAIN_NVSHMEM_LL_MAX_BYTES").unwrap_or(256 << 10),
            algorithm,
            chunk_bytes: env_num("OXTRAIN_NVSHMEM_CHUNK_BYTES").unwrap_or(0),
            stream_chunk_bytes: env_num("OXTRAIN_NVSHMEM_STREAM_CHUNK_BYTES").unwrap_or(64 << 10),
            stream_depth: env_num("OXTRAIN_NVSHMEM_STREAM_DEPTH").unwrap_or(2).max(1),
            // One: with two or three pushers per reducer the reducers fell behind (232 and 192
            // GB/s at 256 MiB on 2xH200 against 321).
            stream_pushers_per_reducer: env_num("OXTRAIN_NVSHMEM_STREAM_PUSHERS_PER_REDUCER")
                .unwrap_or(1)
                .max(1),
            ranks_per_node: env_num("OXTRAIN_NVSHMEM_RANKS_PER_NODE").unwrap_or(0),
            symmetric_push: match std::env::var("OXTRAIN_NVSHMEM_SYMM").as_deref().map(str::trim) {
                Ok("push") => Some(true),
                Ok("pull") => Some(false),
                _ => None,
            },
            // Auto does not stream unless asked: with 128 MiB windows two-shot measured 329 GB/s at
            // 256 MiB against streaming's 316-319, and 329-330 at 1 GiB against 323-332 (2xH200,
            // f32, 128 and 132 blocks). With 64 MiB windows streaming had been ahead at 256 MiB.
            stream_min_bytes: env_num("OXTRAIN_NVSHMEM_STREAM_MIN_BYTES").unwrap_or(usize::MAX),
        }
    }
}

/// Whether the zero-copy all-reduce of `bytes` of symmetric memory pushes (two-shot) rather
/// than loads the peers' copies in one pass; `packs`: the buffer is whole aligned 16-byte packs,
/// which pushing needs. Measured on 2xH200 (f32, GB/s at 64 MiB / 256 MiB / 1 GiB): with 32
/// blocks pull 286/300/306 against push 253/257/257; with 64 push 321/330/330 against
/// 308/324/330; with 128 push 340/349/350 against 319/335/340; at 8 MiB push leads with 32 too
/// (231 against 220).
pub(crate) fn symmetric_pushes(opts: &NvshmemOptions, bytes: usize, packs: bool) -> bool {
    packs && opts.symmetric_push.unwrap_or(opts.max_blocks >= 64 || bytes < (64 << 20))
}

/// The kernel mode of an all-reduce of `bytes` on `world` GPUs of one node (`aligned`: the
/// tensor starts on 16 bytes) under `algorithm`.
pub(crate) fn all_reduce_mode(
    opts: &NvshmemOptions,
    algorithm: Algorithm,
    world: usize,
    bytes: usize,
    aligned: bool,
) -> i32 {
    // Streaming moves whole 16-byte packs, and needs many blocks: with 32 it moved 110 GB/s at
    // 256 MiB on 2xH200, where two-shot moves about 220; with 128 the two are within 2-3%
    // (either ahead, run to run). On more than two GPUs it sends more than two-shot.
    let stream = world == 2 && aligned && bytes >= opts.stream_min_bytes && opts.max_blocks >= 128;
    match algorithm {
        Algorithm::LowLatency => kernels::LL,
        Algorithm::OneShot => kernels::ONESHOT,
        Algorithm::TwoShot => kernels::TWOSHOT,
        Algorithm::Stream if aligned => kernels::STREAM,
        Algorithm::Stream => kernels::TWOSHOT,
        Algorithm::Auto if bytes <= opts.ll_max_bytes => kernels::LL,
        Algorithm::Auto if bytes <= opts.oneshot_max_bytes => kernels::ONESHOT,
        Algorithm::Auto if stream => kernels::STREAM,
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
            stream_min_bytes: 256 << 20,
            stream_chunk_bytes: 64 << 10,
            stream_depth: 2,
            stream_pushers_per_reducer: 1,
            ranks_per_node: 0,
            symmetric_push: None,
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
    fn auto_goes_low_latency_one_shot_two_shot_then_streaming() {
        let o = opts(128);
        let mode = |bytes| all_reduce_mode(&o, Algorithm::Auto, 2, bytes, true);
        assert_eq!(mode(8), kernels::LL);
        assert_eq!(mode(256 << 10), kernels::LL);
        assert_eq!(mode((256 << 10) + 4), kernels::ONESHOT);
        assert_eq!(mode(8 << 20), kernels::ONESHOT);
        assert_eq!(mode(64 << 20), kernels::TWOSHOT);
        assert_eq!(mode(256 << 20), kernels::STREAM);
    }

    #[test]
    fn streaming_only_on_two_gpus_with_many_blocks_and_aligned_tensors() {
        let big = 1 << 30;
        assert_eq!(all_reduce_mode(&opts(128), Algorithm::Auto, 4, big, true), kernels::TWOSHOT);
        assert_eq!(all_reduce_mode(&opts(32), Algorithm::Auto, 2, big, true), kernels::TWOSHOT);
        assert_eq!(all_reduce_mode(&opts(128), Algorithm::Auto, 2, big, false), kernels::TWOSHOT);
        // Forced, it still needs 16-byte packs.
        assert_eq!(all_reduce_mode(&opts(32), Algorithm::Stream, 4, 64, true), kernels::STREAM);
        assert_eq!(all_reduce_mode(&opts(32), Algorithm::Stream, 2, 64, false), kernels::TWOSHOT);
    }

    #[test]
    fn forced_algorithms_win_at_any_size() {
        let o = opts(32);
        assert_eq!(all_reduce_mode(&o, Algorithm::LowLatency, 2, 1 << 30, true), kernels::LL);
        assert_eq!(all_reduce_mode(&o, Algorithm::OneShot, 2, 1 << 30, true), kernels::ONESHOT);
        assert_eq!(all_reduce_mode(&o, Algorithm::TwoShot, 2, 8, true), kernels::TWOSHOT);
    }

    #[test]
    fn algorithm_names_parse() {
        for (s, a) in [
            ("auto", Algorithm::Auto),
            ("ll", Algorithm::LowLatency),
            ("oneshot", Algorithm::OneShot),
            ("twoshot", Algorithm::TwoShot),
            ("stream", Algorithm::Stream),
        ] {
            assert_eq!(Algorithm::parse(s), Some(a));
        }
        assert_eq!(Algorithm::parse("ring"), None);
    }
}
