//! Launches of the channels-last batch-norm kernels (`channels_last.cu`): a packed
//! `[rows, C]` activation read in vectors of V channels, each thread keeping one vector slot
//! of a row for the whole kernel. `cuda.rs` picks these whenever the input is channels-last.

use crate::cuda::{self, expect_launch, CudaStorage, KernelSource};
use crate::DType;
use cudarc::driver::{LaunchConfig, PushKernelArg};

pub(crate) const SOURCE: KernelSource = cuda::source!("norm_cl", "src/ops/norm/channels_last.cu");

/// Threads per block (the kernels' `TILE_THREADS`).
const TILE_THREADS: usize = 256;
/// Blocks a launch aims for: eight per SM of an H200 (132 SMs), enough to hide memory latency.
const TARGET_BLOCKS: usize = 1056;
/// Most row splits (and so partials per channel) of a reduction.
const MAX_SPLITS: usize = 4096;

/// How the tile kernels cover a packed `[rows, channels]` buffer.
pub(super) struct Tiles {
    /// Elements per vector: 16 bytes' worth when the channels and every buffer allow, else 1.
    v: usize,
    /// Vectors per row (`channels / v`).
    nvr: usize,
    rows: usize,
    channels: usize,
    cfg: LaunchConfig,
}

impl Tiles {
    /// The tiling of `rows` x `channels` elements of `dtype` at the device addresses `ptrs`.
    pub(super) fn new(dtype: DType, channels: usize, rows: usize, ptrs: &[u64]) -> Tiles {
        let wide = 16 / dtype.size_in_bytes();
        let v =
            if channels.is_multiple_of(wide) && ptrs.iter().all(|p| p.is_multiple_of(16)) { wide } else { 1 };
        let nvr = channels / v;
        // A warp spans whole rows when they are narrow (tx = nvr), 32 slots of one row else.
        let tx = nvr.clamp(1, 32);
        let ty = TILE_THREADS / tx;
        let gx = nvr.div_ceil(tx);
        let gy = TARGET_BLOCKS.div_ceil(gx).min(rows.div_ceil(ty)).clamp(1, MAX_SPLITS);
        let cfg = LaunchConfig {
            grid_dim: (gx as u32, gy as u32, 1),
            block_dim: (tx as u32, ty as u32, 1),
            shared_mem_bytes: 0,
        };
        Tiles { v, nvr, rows, channels, cfg }
    }

    /// Partials per channel that a reduction writes.
    pub(super) fn splits(&self) -> usize {
        self.cfg.grid_dim.1 as usize
    }

    fn function(&self, s: &CudaStorage, kernel: &str, op: &str) -> cudarc::driver::CudaFunction {
        let name = format!("{kernel}_{}_v{}", cuda::suffix(s.dtype()), self.v);
        expect_launch(s.device().function(&SOURCE, &name), op)
    }

    /// Partial sums of `x - x[row 0]` and of its square per channel, into `p1` and `p2`
    /// (`channels * splits` each) for `moments_shifted_finish`.
    pub(super) fn stats(&self, s: &CudaStorage, x: u64, (p1, p2): (u64, u64), op: &str) {
        let f = self.function(s, "bn_stats_cl", op);
        let (rows, nvr, c) = (self.rows as i64, self.nvr as i32, self.channels as i32);
        let stream = s.stream();
        let mut b = stream.launch_builder(&f);
        b.arg(&x).arg(&p1).arg(&p2).arg(&rows).arg(&nvr).arg(&c);
        // SAFETY: rows * channels elements follow `x` (packed, the caller checked), aligned for
        // the vector width (checked in `new`); p1 and p2 hold channels * splits values.
        expect_launch(unsafe { b.launch(self.cfg) }, op);
    }

    /// `out = (x - mean) * scale + shift` per channel, plus `res` (packed like x) when it is
    /// not 0, then ReLU when `relu`.
    pub(super) fn affine(
        &self,
        s: &CudaStorage,
        (x, res, out): (u64, u64, u64),
        (mean, scale, shift): (u64, u64, u64),
        relu: bool,
        op: &str,
    ) {
        let f = self.function(s, "bn_affine_cl", op);
        let (rows, nvr, relu) = (self.rows as i64, self.nvr as i32, relu as i32);
        let stream = s.stream();
        let mut b = stream.launch_builder(&f);
        b.arg(&x).arg(&res).arg(&out).arg(&rows).arg(&nvr).arg(&mean).arg(&scale).arg(&shift).arg(&relu);
        // SAFETY: `x`, `out` (and `res` when set) hold rows * channels packed elements, aligned
        // as checked in `new`; the factors hold `channels` f64 values each.
        expect_launch(unsafe { b.launch(self.cfg) }, op);
    }

    /// Partial sums of dy and of dy * (x - mean) per channel, into `pd` and `pdx`, dy masked
    /// as `mask` says (and with [`TileMask::Output`] written masked to its `masked`).
    pub(super) fn grad_sums(
        &self,
        s: &CudaStorage,
        (dy, x, mean): (u64, u64, u64),
        mask: TileMask,
        (pd, pdx): (u64, u64),
        op: &str,
    ) {
        let kernel = match mask {
            TileMask::None => "bn_grad_sums_cl",
            TileMask::Output { .. } => "bn_grad_sums_masked_cl",
            TileMask::Recompute { .. } => "bn_grad_sums_recomputed_cl",
        };
        let f = self.function(s, kernel, op);
        let (rows, nvr, c) = (self.rows as i64, self.nvr as i32, self.channels as i32);
        let stream = s.stream();
        let mut b = stream.launch_builder(&f);
        b.arg(&dy);
        if let TileMask::Output { addend, .. } = &mask {
            b.arg(addend);
        }
        b.arg(&x).arg(&mean);
        match &mask {
            TileMask::None => {}
            TileMask::Output { relu_out, masked, .. } => {
                b.arg(relu_out).arg(masked);
            }
            TileMask::Recompute { mean, scale, shift } => {
                b.arg(mean).arg(scale).arg(shift);
            }
        }
        b.arg(&pd).arg(&pdx).arg(&rows).arg(&nvr).arg(&c);
        // SAFETY: dy and x (and the mask's relu_out, masked and addend) are packed alike (rows *
        // channels elements, aligned as checked in `new`); `mean` and the mask's factors hold
        // `channels` values, the partial buffers channels * splits.
        expect_launch(unsafe { b.launch(self.cfg) }, op);
    }

    /// `dx = scale * (dy - shift - (x - mean) * k)` per channel, dy masked as `mask` says: with
    /// [`TileMask::Output`] the masked dy that [`Tiles::grad_sums`] wrote is read instead of dy.
    pub(super) fn input_grad(
        &self,
        s: &CudaStorage,
        (dy, x, out): (u64, u64, u64),
        mask: TileMask,
        (mean, scale, shift, k): (u64, u64, u64, u64),
        op: &str,
    ) {
        let (rows, nvr) = (self.rows as i64, self.nvr as i32);
        let stream = s.stream();
        let f;
        let mut b = match &mask {
            TileMask::Recompute { mean: fm, scale: fs, shift: fz } => {
                f = self.function(s, "bn_input_grad_recomputed_cl", op);
                let mut b = stream.launch_builder(&f);
                b.arg(&dy).arg(&x).arg(fm).arg(fs).arg(fz);
                b
            }
            TileMask::None | TileMask::Output { .. } => {
                f = self.function(s, "bn_input_grad_cl", op);
                let mut b = stream.launch_builder(&f);
                match &mask {
                    TileMask::Output { masked, .. } => b.arg(masked),
                    _ => b.arg(&dy),
                };
                b.arg(&x);
                b
            }
        };
        b.arg(&out).arg(&rows).arg(&nvr).arg(&mean).arg(&scale).arg(&shift).arg(&k);
        // SAFETY: dy (or the masked dy), x and out hold rows * channels packed elements,
        // aligned as checked; the factors (and the mask's) `channels` f64 values each.
        expect_launch(unsafe { b.launch(self.cfg) }, op);
    }
}

/// How the backward's tile kernels mask dy with the ReLU that followed batch norm.
#[derive(Clone, Copy, Debug)]
pub(super) enum TileMask {
    None,
    /// By the ReLU's output `relu_out`, packed like x; the sums' pass writes the masked dy to
    /// `masked` (same size and packing), and the input gradient's pass reads it. An `addend`
    /// (0: none; packed like x) is added to dy first, rounded as `add` rounds.
    Output {
        relu_out: u64,
        masked: u64,
        addend: u64,
    },
    /// Recomputed from x with the forward's per-channel `mean`, `scale` and `shift` (f64).
    Recompute {
        mean: u64,
        scale: u64,
        shift: u64,
    },
}
