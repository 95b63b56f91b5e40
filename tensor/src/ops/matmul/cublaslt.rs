//! Matrix products through cuBLASLt, with the algorithm for each large shape chosen by timing
//! cuBLASLt's best few candidates once (and kept), the way `cudnn.benchmark` does for
//! convolutions. cuBLAS's `GemmEx` takes the first heuristic answer, which for some large bf16
//! shapes on Hopper is measurably slower than the best of its next few.
//!
//! The operands arrive already swapped to column-major form by `cuda::gemm` (which see); this
//! file only describes them to cuBLASLt. Any failure here returns `false` and the caller uses
//! plain cuBLAS, so cuBLASLt is an accelerator, never a requirement.

use super::cuda::{allow_tf32, bind, Operand};
use super::epilogue::{Epilogue, EpilogueKey};
use crate::cuda::libs::{self, CudaLib};
use crate::cuda::{CudaBuffer, CudaDevice};
use crate::DType;
use cudarc::cublaslt::{result as lt, sys};
use cudarc::driver::CudaStream;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

/// Workspace per stream offered to cuBLASLt (PyTorch offers the same on Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// Candidates asked of the heuristic, and timed when the shape is large enough.
const CANDIDATES: usize = 8;

/// Timed runs per candidate and round when tuning.
const TIMED_RUNS: usize = 5;

/// Products of at least this many multiply-adds are tuned by timing; smaller ones take the
/// heuristic's first answer (timing would cost more than it could save).
const TUNE_MIN_MACS: usize = 1 << 30;

struct Handle {
    raw: sys::cublasLtHandle_t,
    workspaces: HashMap<usize, CudaBuffer>,
}

// SAFETY: the handle is only used under its mutex.
unsafe impl Send for Handle {}

fn handle(dev: &Arc<CudaDevice>) -> Option<Arc<Mutex<Handle>>> {
    type PerDevice = HashMap<usize, Option<Arc<Mutex<Handle>>>>;
    static HANDLES: OnceLock<Mutex<PerDevice>> = OnceLock::new();
    let mut all = HANDLES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    all.entry(dev.ordinal())
        .or_insert_with(|| {
            if !libs::loadable(CudaLib::CublasLt) {
                return None;
            }
            libs::preload(CudaLib::CublasLt);
            bind(dev, "matmul");
            lt::create_handle()
                .ok()
                .map(|raw| Arc::new(Mutex::new(Handle { raw, workspaces: HashMap::new() })))
        })
        .clone()
}

/// Everything that decides which algorithms apply and how fast they run.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    device: usize,
    dims: (usize, usize, usize, usize),
    dtypes: (DType, DType),
    ops: (bool, bool),
    leading: (usize, usize, usize),
    batch_strides: (usize, usize, usize),
    tf32: bool,
    accumulate: bool,
    /// The epilogue and what its choice depends on (see [`Epilogue::key`]).
    epilogue: Option<EpilogueKey>,
}

/// An algorithm and the workspace it needs.
#[derive(Clone, Copy)]
struct Choice {
    algo: sys::cublasLtMatmulAlgo_t,
    workspace: usize,
}

fn data_type(dtype: DType) -> Option<sys::cudaDataType> {
    Some(match dtype {
        DType::F32 => sys::cudaDataType::CUDA_R_32F,
        DType::F64 => sys::cudaDataType::CUDA_R_64F,
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        _ => return None,
    })
}

/// Descriptors of one product, destroyed on drop.
struct Descs {
    matmul: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    pref: sys::cublasLtMatmulPreference_t,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: each was created once in `describe` and is destroyed once, here.
        unsafe {
            let _ = lt::destroy_matmul_desc(self.matmul);
            for l in self.layouts {
                let _ = lt::destroy_matrix_layout(l);
            }
            let _ = lt::destroy_matmul_pref(self.pref);
        }
    }
}

/// A matrix of the column-major problem: `rows x cols` with leading dimension `ld`, `batch`
/// of them `stride` elements apart.
fn layout(
    dtype: DType,
    rows: usize,
    cols: usize,
    ld: usize,
    batch: usize,
    stride: usize,
) -> Option<sys::cublasLtMatrixLayout_t> {
    let l = lt::create_matrix_layout(data_type(dtype)?, rows as u64, cols as u64, ld as i64).ok()?;
    let (count, offset) = (i32::try_from(batch).ok()?, i64::try_from(stride).ok()?);
    // SAFETY: a live layout; the attribute values have the types cuBLASLt documents.
    let ok = unsafe {
        lt::set_matrix_layout_attribute(
            l,
            sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
            &count as *const i32 as *const c_void,
            4,
        )
        .is_ok()
            && lt::set_matrix_layout_attribute(
                l,
                sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                &offset as *const i64 as *const c_void,
                8,
            )
            .is_ok()
    };
    if !ok {
        // SAFETY: created above, not used after.
        unsafe {
            let _ = lt::destroy_matrix_layout(l);
        }
        return None;
    }
    Some(l)
}

/// The column-major product `C [n, m] = op(B) [n, k] @ op(A) [k, m]` that `cuda::gemm` hands
/// over (`a_t`/`b_t`: whether the stored matrix is read transposed).
struct Problem {
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    b_t: bool,
    ld_b: usize,
    a_t: bool,
    ld_a: usize,
}

fn describe(
    p: &Problem,
    a: &Operand,
    b: &Operand,
    c: &Operand,
    epilogue: Option<&Epilogue>,
) -> Option<Descs> {
    let wide = a.dtype == DType::F64;
    let compute = if wide {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_64F
    } else if a.dtype == DType::F32 && allow_tf32() {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
    } else {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
    };
    let scale = if wide { sys::cudaDataType::CUDA_R_64F } else { sys::cudaDataType::CUDA_R_32F };
    let matmul = lt::create_matmul_desc(compute, scale).ok()?;
    let pref = match lt::create_matmul_pref() {
        Ok(p) => p,
        Err(_) => {
            // SAFETY: created above, not used after.
            unsafe {
                let _ = lt::destroy_matmul_desc(matmul);
            }
            return None;
        }
    };
    // Rows and columns of the stored matrices of the column-major problem.
    let (br, bc) = if p.b_t { (p.k, p.n) } else { (p.n, p.k) };
    let (ar, ac) = if p.a_t { (p.m, p.k) } else { (p.k, p.m) };
    let made = [
        layout(b.dtype, br, bc, p.ld_b, p.batch, b.batch_stride),
        layout(a.dtype, ar, ac, p.ld_a, p.batch, a.batch_stride),
        layout(c.dtype, p.n, p.m, c.rs, p.batch, c.batch_stride),
    ];
    let descs = Descs { matmul, layouts: made.map(|l| l.unwrap_or(std::ptr::null_mut())), pref };
    if made.iter().any(Option::is_none) {
        return None;
    }
    let (op_first, op_second) = (p.b_t as i32, p.a_t as i32);
    let ws = WORKSPACE_BYTES as u64;
    // SAFETY: live descriptors; attribute values of the documented types and sizes.
    let ok = unsafe {
        lt::set_matmul_desc_attribute(
            matmul,
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            &op_first as *const i32 as *const c_void,
            4,
        )
        .is_ok()
            && lt::set_matmul_desc_attribute(
                matmul,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                &op_second as *const i32 as *const c_void,
                4,
            )
            .is_ok()
            && lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                8,
            )
            .is_ok()
    };
    // cuBLAS's A is our `b`, its B our `a` (the swap of `cuda::gemm`).
    let with_epilogue = epilogue.is_none_or(|e| e.describe(matmul, pref, (b.ptr, a.ptr, c.ptr)));
    (ok && with_epilogue).then_some(descs)
}

/// Queues the product on `stream` through cuBLASLt; false when cuBLASLt is missing or does not
/// take this problem (the caller then uses cuBLAS). `alpha`/`beta` point at f64 for f64
/// operands and f32 otherwise.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm(
    dev: &Arc<CudaDevice>,
    stream: &Arc<CudaStream>,
    (m, n, k): (usize, usize, usize),
    batch: usize,
    (a, a_t, ld_a): (&Operand, bool, usize),
    (b, b_t, ld_b): (&Operand, bool, usize),
    c: &Operand,
    (alpha, beta): (*const c_void, *const c_void),
    accumulate: bool,
    epilogue: Option<&Epilogue>,
) -> bool {
    let Some(h) = handle(dev) else { return false };
    let mut h = h.lock().unwrap_or_else(|e| e.into_inner());
    bind(dev, "matmul");
    let p = Problem { m, n, k, batch, b_t, ld_b, a_t, ld_a };
    let Some(d) = describe(&p, a, b, c, epilogue) else { return false };
    let stream_id = stream.cu_stream() as usize;
    let ws = match h.workspaces.entry(stream_id) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => {
            match dev.allocator().alloc(WORKSPACE_BYTES, stream_id) {
                Ok(buf) => v.insert(buf),
                Err(_) => return false,
            }
        }
    };
    let ws_ptr = ws.device_ptr() as *mut c_void;
    let raw = h.raw;
    let key = Key {
        device: dev.ordinal(),
        dims: (m, n, k, batch),
        dtypes: (a.dtype, c.dtype),
        ops: (a_t, b_t),
        leading: (ld_a, ld_b, c.rs),
        batch_strides: (a.batch_stride, b.batch_stride, c.batch_stride),
        tf32: allow_tf32(),
        accumulate,
        epilogue: epilogue.map(|e| e.key((b.ptr, a.ptr, c.ptr))),
    };
    let run = |choice: &Choice| {
        // SAFETY: live handle and descriptors; the operands hold every element the layouts
        // reach and outlive the queued work; the workspace holds WORKSPACE_BYTES >= the
        // algorithm's need (the preference capped it).
        unsafe {
            lt::matmul(
                raw,
                d.matmul,
                alpha,
                beta,
                b.ptr as *const c_void,
                d.layouts[0],
                a.ptr as *const c_void,
                d.layouts[1],
                c.ptr as *const c_void,
                d.layouts[2],
                c.ptr as *mut c_void,
                d.layouts[2],
                &choice.algo,
                ws_ptr,
                choice.workspace,
                stream.cu_stream() as sys::cudaStream_t,
            )
            .is_ok()
        }
    };
    static CHOICES: OnceLock<Mutex<HashMap<Key, Option<Choice>>>> = OnceLock::new();
    let choices = CHOICES.get_or_init(Default::default);
    let cached = choices.lock().unwrap_or_else(|e| e.into_inner()).get(&key).copied();
    let choice = match cached {
        Some(c) => c,
        None => {
            let c = choose(raw, &d, m * n * k * batch >= TUNE_MIN_MACS && !accumulate, stream, &run);
            choices.lock().unwrap_or_else(|e| e.into_inner()).insert(key, c);
            c
        }
    };
    match choice {
        Some(c) => run(&c),
        None => false,
    }
}

/// The heuristic's first candidate, or with `tune` the fastest of its first [`CANDIDATES`]
/// over a few timed runs (which write the output: only done when not accumulating into it).
fn choose(
    raw: sys::cublasLtHandle_t,
    d: &Descs,
    tune: bool,
    stream: &Arc<CudaStream>,
    run: &dyn Fn(&Choice) -> bool,
) -> Option<Choice> {
    // SAFETY: all-zero bits are valid for the result struct; live handle and descriptors.
    let found = unsafe {
        let mut results: [sys::cublasLtMatmulHeuristicResult_t; CANDIDATES] = std::mem::zeroed();
        let mut count = 0;
        let r = sys::cublasLtMatmulAlgoGetHeuristic(
            raw,
            d.matmul,
            d.layouts[0],
            d.layouts[1],
            d.layouts[2],
            d.layouts[2],
            d.pref,
            CANDIDATES as i32,
            results.as_mut_ptr(),
            &mut count,
        );
        if r.result().is_err() {
            return None;
        }
        results[..count.max(0) as usize]
            .iter()
            .filter(|r| {
                r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && r.workspaceSize <= WORKSPACE_BYTES
            })
            .map(|r| Choice { algo: r.algo, workspace: r.workspaceSize })
            .collect::<Vec<_>>()
    };
    let first = *found.first()?;
    if !tune || found.len() == 1 {
        return Some(first);
    }
    // Each candidate's time over a few runs, taken in two interleaved rounds so clock and
    // temperature drift during tuning does not favour whichever candidate ran first.
    let time = |c: &Choice| -> Option<f32> {
        let start = stream.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).ok()?;
        for _ in 0..TIMED_RUNS {
            if !run(c) {
                return None;
            }
        }
        let end = stream.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).ok()?;
        end.synchronize().ok()?;
        crate::cuda::host_waits::waited_on_stream(stream);
        start.elapsed_ms(&end).ok()
    };
    // A warm-up run each, which also proves the candidate runs at all.
    let runnable: Vec<Choice> = found.iter().copied().filter(|c| run(c)).collect();
    let mut total = vec![0f32; runnable.len()];
    for _round in 0..2 {
        for (t, c) in total.iter_mut().zip(&runnable) {
            *t += time(c).unwrap_or(f32::INFINITY);
        }
    }
    let best = runnable.iter().zip(&total).min_by(|a, b| a.1.total_cmp(b.1)).map(|(c, _)| *c);
    Some(best.unwrap_or(first))
}
