//! CUDA matrix products through cuBLAS.
//!
//! Our matrices are row-major; cuBLAS's are column-major. A row-major `C [m, n] = A @ B` is the
//! column-major `C^T [n, m] = B^T @ A^T`, so every product is handed to cuBLAS with the operands
//! swapped and `m`/`n` exchanged, and the output needs no transposition. An operand whose
//! columns have unit stride is, read column-major, its own transpose (op N); one whose rows have
//! unit stride is itself stored column-major (op T). Only a matrix with neither (a stepped slice,
//! a broadcast row) has to be copied first.
//!
//! bf16 and f16 multiply with f32 accumulation (CUBLAS_COMPUTE_32F), f32 in full precision unless
//! [`set_allow_tf32`] allows TF32 tensor cores, f64 in f64.

use super::cpu::Batched;
use super::epilogue::Epilogue;
use crate::cuda::libs::{self, CudaLib};
use crate::cuda::{CudaBuffer, CudaDevice, CudaStorage};
use crate::DType;
use cudarc::cublas::{result as blas, sys};
use cudarc::driver::CudaStream;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

static ALLOW_TF32: AtomicBool = AtomicBool::new(false);

/// Lets f32 matrix products (and f32 convolutions) use TF32 tensor cores, which round the
/// operands to 10 mantissa bits: about 8x faster on Ampere and Hopper, and about 1e-3 relative
/// error. Off by default, as `torch.backends.cuda.matmul.allow_tf32`. Process-wide.
pub fn set_allow_tf32(allow: bool) {
    ALLOW_TF32.store(allow, Ordering::Relaxed);
}

/// Whether f32 products may use TF32 (see [`set_allow_tf32`]).
pub fn allow_tf32() -> bool {
    ALLOW_TF32.load(Ordering::Relaxed)
}

/// Whether products go through cuBLASLt first (with per-shape tuning, see `cublaslt.rs`);
/// `OXTRAIN_DISABLE_CUBLASLT=1` sends them all to cuBLAS.
fn use_cublaslt() -> bool {
    static USE: OnceLock<bool> = OnceLock::new();
    *USE.get_or_init(|| !std::env::var("OXTRAIN_DISABLE_CUBLASLT").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// Whether the fused products of `fused.rs` may use cuBLASLt epilogues;
/// `OXTRAIN_DISABLE_EPILOGUES=1` composes them from separate ops instead.
fn use_epilogues() -> bool {
    static USE: OnceLock<bool> = OnceLock::new();
    *USE.get_or_init(|| !std::env::var("OXTRAIN_DISABLE_EPILOGUES").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// Workspace per stream, as PyTorch gives cuBLAS on Hopper: enough for its split-K kernels.
const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle of one device, with one workspace per stream it has been used on: kernels on
/// different streams may run at once, so they must not share scratch memory.
struct Handle {
    raw: sys::cublasHandle_t,
    workspaces: HashMap<usize, CudaBuffer>,
}

// SAFETY: the handle is only used under its mutex.
unsafe impl Send for Handle {}

/// Panics, naming `op` and what was searched, when cuBLAS cannot be loaded; cudarc would
/// otherwise panic with only the library's name.
fn ensure_cublas(op: &str) {
    // libcublas needs libcublasLt: load it first so the soname lookup finds it.
    for lib in [CudaLib::CublasLt, CudaLib::Cublas] {
        assert!(libs::loadable(lib), "{op}: cuBLAS cannot be loaded: {}", libs::describe_search(lib));
    }
}

/// The device's cuBLAS handle, created on first use.
fn handle(dev: &Arc<CudaDevice>, op: &str) -> Arc<Mutex<Handle>> {
    static HANDLES: OnceLock<Mutex<HashMap<usize, Arc<Mutex<Handle>>>>> = OnceLock::new();
    let mut handles = HANDLES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    handles
        .entry(dev.ordinal())
        .or_insert_with(|| {
            ensure_cublas(op);
            bind(dev, op);
            let raw = blas::create_handle().unwrap_or_else(|e| panic!("{op}: cublasCreate failed: {e:?}"));
            // f16/bf16 products accumulate in f32 all the way, split-K reductions included, as
            // the CPU backend does. TF32 is chosen per call through the compute type.
            let mode = sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
            // SAFETY: a live handle.
            unsafe { sys::cublasSetMathMode(raw, mode) }
                .result()
                .unwrap_or_else(|e| panic!("{op}: cublasSetMathMode failed: {e:?}"));
            Arc::new(Mutex::new(Handle { raw, workspaces: HashMap::new() }))
        })
        .clone()
}

/// Makes the device's context current on this thread, as cuBLAS and cuDNN expect.
pub(crate) fn bind(dev: &CudaDevice, op: &str) {
    dev.context()
        .bind_to_thread()
        .unwrap_or_else(|e| panic!("{op}: binding cuda:{}'s context failed: {e:?}", dev.ordinal()));
}

/// A row-major matrix (or a batch of them) in device memory: element (i, j) of product b lies at
/// byte `ptr + (b * batch_stride + i * rs + j * cs) * dtype.size_in_bytes()`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operand {
    pub ptr: u64,
    pub dtype: DType,
    pub rs: usize,
    pub cs: usize,
    pub batch_stride: usize,
}

impl Operand {
    /// The matrix at element `offset` of `s`.
    pub fn new(s: &CudaStorage, offset: usize, (rs, cs): (usize, usize), batch_stride: usize) -> Operand {
        Operand {
            ptr: s.ptr() + (offset * s.dtype().size_in_bytes()) as u64,
            dtype: s.dtype(),
            rs,
            cs,
            batch_stride,
        }
    }
}

/// How cuBLAS reads a row-major `rows x cols` matrix with strides `(rs, cs)` so that `op(M)` is
/// its transpose: `(op, leading dimension)`, or `None` when neither stride is 1 (or the other
/// stride is too small to be a leading dimension, as for a broadcast row).
pub(crate) fn blas_view(
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
) -> Option<(sys::cublasOperation_t, usize)> {
    use sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
    // A dim of size 1 never moves along its stride, so any stride does for it.
    if (cs == 1 || cols <= 1) && (rows <= 1 || rs >= cols.max(1)) {
        return Some((CUBLAS_OP_N, if rows <= 1 { cols.max(1) } else { rs }));
    }
    if (rs == 1 || rows <= 1) && (cols <= 1 || cs >= rows.max(1)) {
        return Some((CUBLAS_OP_T, if cols <= 1 { rows.max(1) } else { cs }));
    }
    None
}

fn data_type(dtype: DType, op: &str) -> sys::cudaDataType {
    match dtype {
        DType::F32 => sys::cudaDataType::CUDA_R_32F,
        DType::F64 => sys::cudaDataType::CUDA_R_64F,
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        other => panic!("{op}: cuBLAS has no {other} matrix product"),
    }
}

fn as_i32(v: usize, what: &str, op: &str) -> i32 {
    i32::try_from(v).unwrap_or_else(|_| panic!("{op}: {what} = {v} is past cuBLAS's 32-bit limit"))
}

/// `c[b] = a[b] @ b[b]` (or `+=` with `accumulate`) for `batch` products of `m x k` by `k x n`,
/// queued on `stream`. `a` and `b` share a dtype; `c` has it too, or is f32 for f16/bf16 inputs
/// (cuBLAS supports that pair). `c` must have unit column stride; `a` and `b` must pass
/// [`blas_view`]. Panics naming `op`, the shapes and cuBLAS's status on failure.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    dev: &Arc<CudaDevice>,
    stream: &Arc<CudaStream>,
    op: &str,
    (m, n, k): (usize, usize, usize),
    batch: usize,
    a: Operand,
    b: Operand,
    c: Operand,
    accumulate: bool,
) {
    if m == 0 || n == 0 || batch == 0 {
        return;
    }
    assert!(k > 0, "{op}: gemm with k = 0 must be handled by the caller (it only zeroes or keeps c)");
    assert_eq!(a.dtype, b.dtype, "{op}: gemm operands of different dtypes");
    assert!(c.cs == 1 && c.rs >= n, "{op}: gemm output must be row-major, got strides ({}, {})", c.rs, c.cs);
    let view = |x: &Operand, rows, cols, name| {
        blas_view(rows, cols, x.rs, x.cs).unwrap_or_else(|| {
            panic!("{op}: {name} [{rows}, {cols}] with strides ({}, {}) cannot be read by cuBLAS", x.rs, x.cs)
        })
    };
    // Swapped: cuBLAS computes C^T [n, m] = B^T [n, k] @ A^T [k, m].
    let (op_b, ld_b) = view(&b, k, n, "rhs");
    let (op_a, ld_a) = view(&a, m, k, "lhs");
    let shapes = format!("{batch} x [{m}, {k}] @ [{k}, {n}] ({} -> {})", a.dtype, c.dtype);
    let wide = a.dtype == DType::F64;
    let compute = if wide {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_64F
    } else if a.dtype == DType::F32 && allow_tf32() {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
    } else {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
    };
    let (alpha64, beta64) = (1.0f64, if accumulate { 1.0f64 } else { 0.0 });
    let (alpha32, beta32) = (alpha64 as f32, beta64 as f32);
    let (alpha, beta): (*const c_void, *const c_void) = if wide {
        (&alpha64 as *const f64 as _, &beta64 as *const f64 as _)
    } else {
        (&alpha32 as *const f32 as _, &beta32 as *const f32 as _)
    };
    let i64_of = |v: usize, what: &str| {
        i64::try_from(v).unwrap_or_else(|_| panic!("{op}: {what} = {v} does not fit in 64 bits"))
    };
    if use_cublaslt() {
        use sys::cublasOperation_t::CUBLAS_OP_T;
        let done = super::cublaslt::gemm(
            dev,
            stream,
            (m, n, k),
            batch,
            (&a, op_a == CUBLAS_OP_T, ld_a),
            (&b, op_b == CUBLAS_OP_T, ld_b),
            &c,
            (alpha, beta),
            accumulate,
            None,
        );
        if done {
            return;
        }
    }
    let h = handle(dev, op);
    let mut h = h.lock().unwrap_or_else(|e| e.into_inner());
    bind(dev, op);
    let stream_id = stream.cu_stream() as usize;
    let status = |what: &str, r: Result<(), blas::CublasError>| {
        r.unwrap_or_else(|e| panic!("{op}: {what} failed for {shapes}: {e:?}"));
    };
    // SAFETY: a live handle and a stream of this device's context.
    status("cublasSetStream", unsafe { blas::set_stream(h.raw, stream.cu_stream() as sys::cudaStream_t) });
    // cublasSetStream resets the workspace, so it is set again every call.
    let ws = h.workspaces.entry(stream_id).or_insert_with(|| {
        dev.allocator()
            .alloc(WORKSPACE_BYTES, stream_id)
            .unwrap_or_else(|e| panic!("{op}: allocating the cuBLAS workspace: {e}"))
    });
    let ws_ptr = ws.device_ptr() as *mut c_void;
    // SAFETY: the block holds WORKSPACE_BYTES and is only used by this handle on this stream.
    status(
        "cublasSetWorkspace",
        unsafe { sys::cublasSetWorkspace_v2(h.raw, ws_ptr, WORKSPACE_BYTES) }.result(),
    );
    // SAFETY: the views were checked above to describe the operands' strides; the callers'
    // buffers hold every element those strides reach and outlive the queued work (the caching
    // allocator reuses blocks in stream order); alpha and beta live until the call returns.
    let r = unsafe {
        blas::gemm_strided_batched_ex(
            h.raw,
            op_b,
            op_a,
            as_i32(n, "n", op),
            as_i32(m, "m", op),
            as_i32(k, "k", op),
            alpha,
            b.ptr as *const c_void,
            data_type(b.dtype, op),
            as_i32(ld_b, "rhs leading dimension", op),
            i64_of(b.batch_stride, "rhs batch stride"),
            a.ptr as *const c_void,
            data_type(a.dtype, op),
            as_i32(ld_a, "lhs leading dimension", op),
            i64_of(a.batch_stride, "lhs batch stride"),
            beta,
            c.ptr as *mut c_void,
            data_type(c.dtype, op),
            as_i32(c.rs, "output leading dimension", op),
            i64_of(c.batch_stride, "output batch stride"),
            as_i32(batch, "batch", op),
            compute,
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
        )
    };
    status("cublasGemmStridedBatchedEx", r);
}

/// `c = a @ b` for one `m x k` by `k x n` product with cuBLASLt applying `epilogue` (see
/// `epilogue.rs`), queued on `stream`. False, with nothing queued, when the epilogue cannot be
/// used: cuBLASLt missing or disabled (`OXTRAIN_DISABLE_CUBLASLT`, `OXTRAIN_DISABLE_EPILOGUES`),
/// a dtype other than f32/f16/bf16 or mixed dtypes, an operand cuBLAS cannot read in place, a
/// buffer or leading dimension not 16-byte aligned, a GELU input matrix whose leading
/// dimension is not a multiple of 8, or cuBLASLt refusing the problem. The caller then
/// composes the result from separate ops.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_epilogue(
    dev: &Arc<CudaDevice>,
    stream: &Arc<CudaStream>,
    (m, n, k): (usize, usize, usize),
    a: Operand,
    b: Operand,
    c: Operand,
    epilogue: &Epilogue,
) -> bool {
    if !use_cublaslt() || !use_epilogues() || m == 0 || n == 0 || k == 0 {
        return false;
    }
    let dtype = c.dtype;
    let size = dtype.size_in_bytes();
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) || a.dtype != dtype || b.dtype != dtype {
        return false;
    }
    let (Some((op_a, ld_a)), Some((op_b, ld_b))) = (blas_view(m, k, a.rs, a.cs), blas_view(k, n, b.rs, b.cs))
    else {
        return false;
    };
    let aligned = |ptr: u64| ptr.is_multiple_of(16);
    let ld_aligned = |ld: usize| (ld * size).is_multiple_of(16);
    let kind = epilogue.kind;
    let buffers_aligned = aligned(a.ptr)
        && aligned(b.ptr)
        && aligned(c.ptr)
        && (!kind.has_bias() || aligned(epilogue.bias))
        && (!kind.has_aux()
            || (aligned(epilogue.aux) && epilogue.aux_ld.is_multiple_of(8) && epilogue.aux_ld >= n));
    if c.cs != 1
        || c.rs < n
        || !buffers_aligned
        || !ld_aligned(ld_a)
        || !ld_aligned(ld_b)
        || !ld_aligned(c.rs)
    {
        return false;
    }
    let (alpha, beta) = (1.0f32, 0.0f32);
    use sys::cublasOperation_t::CUBLAS_OP_T;
    super::cublaslt::gemm(
        dev,
        stream,
        (m, n, k),
        1,
        (&a, op_a == CUBLAS_OP_T, ld_a),
        (&b, op_b == CUBLAS_OP_T, ld_b),
        &c,
        (&alpha as *const f32 as *const c_void, &beta as *const f32 as *const c_void),
        false,
        Some(epilogue),
    )
}

/// Whether cuBLAS can read the plan's operands in place (see [`blas_view`]).
pub(crate) fn plan_is_expressible(p: &Batched) -> (bool, bool) {
    if p.m == 0 || p.n == 0 || p.k == 0 {
        return (true, true);
    }
    (
        blas_view(p.m, p.k, p.lhs_strides.0, p.lhs_strides.1).is_some(),
        blas_view(p.k, p.n, p.rhs_strides.0, p.rhs_strides.1).is_some(),
    )
}

/// Splits a batch into runs whose lhs and rhs offsets both step evenly: each run is one
/// strided-batched call. A broadcast `[2, 1, M, K] @ [3, K, N]` gives two runs of three.
/// Returns `(first, count, lhs step, rhs step)`.
fn even_runs(lhs: &[usize], rhs: &[usize]) -> Vec<(usize, usize, usize, usize)> {
    let step = |v: &[usize], i: usize| v[i + 1].wrapping_sub(v[i]);
    let mut runs = Vec::new();
    let mut start = 0;
    while start < lhs.len() {
        let mut end = start + 1;
        if end < lhs.len() {
            let (ls, rs) = (step(lhs, start), step(rhs, start));
            // Offsets only grow within a run (a negative step would wrap).
            if lhs[end] >= lhs[start] && rhs[end] >= rhs[start] {
                while end < lhs.len() && step(lhs, end - 1) == ls && step(rhs, end - 1) == rs {
                    end += 1;
                }
            }
            runs.push((
                start,
                end - start,
                if end - start > 1 { ls } else { 0 },
                if end - start > 1 { rs } else { 0 },
            ));
        } else {
            runs.push((start, 1, 0, 0));
        }
        start = end;
    }
    runs
}

/// The batched product of the plan into a new `[batch, m, out_ld]` storage whose rows hold the
/// `n` columns of the product first (`out_ld == n`: contiguous `[batch, m, n]`).
pub(crate) fn batched_matmul(
    lhs: &CudaStorage,
    rhs: &CudaStorage,
    p: &Batched,
    out_ld: usize,
) -> CudaStorage {
    const OP: &str = "matmul";
    assert!(out_ld >= p.n, "{OP}: an output row stride of {out_ld} for {} columns", p.n);
    let dev = lhs.device();
    let batch = p.lhs_offsets.len();
    let len = batch * p.m * out_ld;
    if p.k == 0 {
        // An empty sum: zeros, with no cuBLAS call.
        return CudaStorage::zeros(dev, lhs.dtype(), len).unwrap_or_else(|e| panic!("{OP}: {e}"));
    }
    let out = CudaStorage::alloc(dev, lhs.dtype(), len).unwrap_or_else(|e| panic!("{OP}: {e}"));
    if len == 0 {
        return out;
    }
    let stream = out.stream();
    for (first, count, ls, rs) in even_runs(&p.lhs_offsets, &p.rhs_offsets) {
        let a = Operand::new(lhs, p.lhs_offsets[first], p.lhs_strides, ls);
        let b = Operand::new(rhs, p.rhs_offsets[first], p.rhs_strides, rs);
        let c = Operand::new(&out, first * p.m * out_ld, (out_ld, 1), p.m * out_ld);
        gemm(dev, &stream, OP, (p.m, p.n, p.k), count, a, b, c, false);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};

    #[test]
    fn row_major_strides_map_to_column_major_ops() {
        // Row-major [m, k]: column-major [k, m] read as is.
        assert_eq!(blas_view(4, 3, 3, 1), Some((CUBLAS_OP_N, 3)));
        // A transposed view of a [3, 4] matrix: strides (1, 4), stored column-major.
        assert_eq!(blas_view(4, 3, 1, 4), Some((CUBLAS_OP_T, 4)));
        // Narrowed columns keep their row stride as leading dimension.
        assert_eq!(blas_view(4, 3, 10, 1), Some((CUBLAS_OP_N, 10)));
        // A stepped slice and a broadcast row cannot be expressed.
        assert_eq!(blas_view(4, 3, 6, 2), None);
        assert_eq!(blas_view(4, 3, 0, 1), None);
        // Size-1 dims take any stride.
        assert_eq!(blas_view(1, 5, 0, 1), Some((CUBLAS_OP_N, 5)));
        assert_eq!(blas_view(5, 1, 7, 7), Some((CUBLAS_OP_N, 7)));
        assert_eq!(blas_view(5, 1, 0, 3), None);
        assert_eq!(blas_view(1, 1, 9, 9), Some((CUBLAS_OP_N, 1)));
    }

    #[test]
    fn batches_split_into_evenly_stepping_runs() {
        // [2, 1] x [1, 3] broadcast to [2, 3].
        let lhs = [0, 0, 0, 12, 12, 12];
        let rhs = [0, 20, 40, 0, 20, 40];
        assert_eq!(even_runs(&lhs, &rhs), vec![(0, 3, 0, 20), (3, 3, 0, 20)]);
        assert_eq!(even_runs(&[0, 5, 10], &[7, 7, 7]), vec![(0, 3, 5, 0)]);
        assert_eq!(even_runs(&[3], &[4]), vec![(0, 1, 0, 0)]);
        // A permuted batch that steps backwards is split into single products.
        assert_eq!(even_runs(&[10, 0], &[0, 0]), vec![(0, 1, 0, 0), (1, 1, 0, 0)]);
    }
}
