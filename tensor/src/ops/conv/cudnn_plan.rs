//! Which cuDNN algorithm runs a convolution: chosen once per (device, direction, dtype, shapes,
//! layout, math) and kept for the life of the process, as `torch.backends.cudnn.benchmark`
//! does. In benchmark mode (the default) cuDNN times every algorithm on the real buffers
//! (`cudnnFind*AlgorithmEx`) and the fastest wins; otherwise its heuristics pick without running
//! anything. Heuristics alone pick badly for some channels-last 16-bit shapes on Hopper (a
//! ResNet-50 3x3 convolution ran 40x slower than the measured best), hence the default.

use super::cpu::Geometry;
use super::cudnn::{math_allowed, Buffers, Descriptors, Direction};
use crate::ops::matmul::cuda::allow_tf32;
use crate::DType;
use cudarc::cudnn::{result as dnn, sys};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

/// An algorithm of one of the three directions.
#[derive(Clone, Copy, Debug)]
pub(super) enum Algo {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    BackwardData(sys::cudnnConvolutionBwdDataAlgo_t),
    BackwardFilter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

/// The chosen algorithm and the math type it was rated with.
#[derive(Clone, Copy, Debug)]
pub(super) struct Plan {
    pub algo: Algo,
    pub math: sys::cudnnMathType_t,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    device: usize,
    direction: Direction,
    dtype: DType,
    geometry: Geometry,
    channels_last: bool,
    tf32: bool,
    benchmark: bool,
}

/// Requested from each query: every algorithm cuDNN knows, best first.
const ALGOS: usize = 16;

/// Largest workspace benchmark mode offers the algorithms it times.
const WORKSPACE_LIMIT: usize = 1 << 30;

fn benchmark_flag() -> &'static AtomicBool {
    static FLAG: OnceLock<AtomicBool> = OnceLock::new();
    FLAG.get_or_init(|| {
        let off = std::env::var("OXTRAIN_CUDNN_BENCHMARK").is_ok_and(|v| v == "0");
        AtomicBool::new(!off)
    })
}

/// Whether cuDNN algorithms are chosen by timing them on first use of each shape (on by
/// default; `OXTRAIN_CUDNN_BENCHMARK=0` turns it off at start) or by cuDNN's heuristics alone,
/// as `torch.backends.cudnn.benchmark`. Process-wide.
pub fn set_cudnn_benchmark(enabled: bool) {
    benchmark_flag().store(enabled, Ordering::Relaxed);
}

/// See [`set_cudnn_benchmark`].
pub fn cudnn_benchmark() -> bool {
    benchmark_flag().load(Ordering::Relaxed)
}

pub(super) fn log_choices() -> bool {
    static LOG: OnceLock<bool> = OnceLock::new();
    *LOG.get_or_init(|| std::env::var("OXTRAIN_CUDNN_LOG").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// One rated algorithm, whatever its direction.
struct Candidate {
    algo: Algo,
    status: sys::cudnnStatus_t,
    time_ms: f32,
    memory: usize,
    math: sys::cudnnMathType_t,
}

macro_rules! candidates {
    ($perf:expr, $count:expr, $variant:ident) => {
        $perf[..$count.max(0) as usize]
            .iter()
            .map(|p| Candidate {
                algo: Algo::$variant(p.algo),
                status: p.status,
                time_ms: p.time,
                memory: p.memory,
                math: p.mathType,
            })
            .collect::<Vec<_>>()
    };
}

/// The plan for this convolution, from the cache or chosen now (`None`: cuDNN supports no
/// algorithm for it, and the caller falls back to im2col). Called with the handle locked and
/// bound to the current stream; benchmark mode runs the candidates on `bufs`, which are
/// scratch at this point (the output is written afterwards by the chosen algorithm).
pub(super) fn plan(
    handle: sys::cudnnHandle_t,
    d: &Descriptors,
    direction: Direction,
    dtype: DType,
    device: usize,
    bufs: &Buffers,
    workspace: impl Fn(usize) -> Option<crate::Tensor>,
) -> Option<Plan> {
    static PLANS: OnceLock<Mutex<HashMap<Key, Option<Plan>>>> = OnceLock::new();
    let key = Key {
        device,
        direction,
        dtype,
        geometry: d.geometry,
        channels_last: d.channels_last,
        tf32: allow_tf32(),
        benchmark: cudnn_benchmark(),
    };
    let plans = PLANS.get_or_init(Default::default);
    if let Some(p) = plans.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return *p;
    }
    let usable =
        |c: &Candidate| c.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS && math_allowed(dtype, c.math);
    let rated = heuristics(handle, d, direction);
    let mut choice =
        rated.iter().find(|c| usable(c)).map(|c| (Plan { algo: c.algo, math: c.math }, c.time_ms));
    if key.benchmark && choice.is_some() {
        let limit =
            rated.iter().filter(|c| usable(c)).map(|c| c.memory).max().unwrap_or(0).min(WORKSPACE_LIMIT);
        let ws = workspace(limit);
        let ws_ptr = ws.as_ref().map_or(std::ptr::null_mut(), |t| super::cuda::first_ptr(t) as *mut c_void);
        let timed = timed(handle, d, direction, bufs, ws_ptr, if ws.is_some() { limit } else { 0 });
        if let Some(best) = timed.iter().find(|c| usable(c) && c.memory <= limit) {
            choice = Some((Plan { algo: best.algo, math: best.math }, best.time_ms));
        }
    }
    if log_choices() {
        match &choice {
            Some((p, ms)) => {
                eprintln!("oxtrain: cuDNN {} {}: {:?} with {:?} ({ms:.3} ms)", d.op, d.shapes, p.algo, p.math)
            }
            None => eprintln!("oxtrain: cuDNN {} {}: no algorithm", d.op, d.shapes),
        }
    }
    let plan = choice.map(|(p, _)| p);
    plans.lock().unwrap_or_else(|e| e.into_inner()).insert(key, plan);
    plan
}

/// cuDNN's heuristic ratings (the `_v7` queries run nothing).
fn heuristics(h: sys::cudnnHandle_t, d: &Descriptors, direction: Direction) -> Vec<Candidate> {
    let mut count = 0;
    // SAFETY (each arm): live handle and descriptors; the perf array holds ALGOS entries, and
    // all-zero bits are valid for each of its fields.
    unsafe {
        match direction {
            Direction::Forward => {
                let mut perf: [sys::cudnnConvolutionFwdAlgoPerf_t; ALGOS] = std::mem::zeroed();
                d.check(
                    "cudnnGetConvolutionForwardAlgorithm_v7",
                    dnn::get_convolution_forward_algorithm(
                        h,
                        d.x,
                        d.w,
                        d.conv,
                        d.y,
                        ALGOS as i32,
                        &mut count,
                        perf.as_mut_ptr(),
                    ),
                );
                candidates!(perf, count, Forward)
            }
            Direction::BackwardData => {
                let mut perf: [sys::cudnnConvolutionBwdDataAlgoPerf_t; ALGOS] = std::mem::zeroed();
                d.check(
                    "cudnnGetConvolutionBackwardDataAlgorithm_v7",
                    dnn::get_convolution_backward_data_algorithm(
                        h,
                        d.w,
                        d.y,
                        d.conv,
                        d.x,
                        ALGOS as i32,
                        &mut count,
                        perf.as_mut_ptr(),
                    ),
                );
                candidates!(perf, count, BackwardData)
            }
            Direction::BackwardFilter => {
                let mut perf: [sys::cudnnConvolutionBwdFilterAlgoPerf_t; ALGOS] = std::mem::zeroed();
                d.check(
                    "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                    dnn::get_convolution_backward_filter_algorithm(
                        h,
                        d.x,
                        d.y,
                        d.conv,
                        d.w,
                        ALGOS as i32,
                        &mut count,
                        perf.as_mut_ptr(),
                    ),
                );
                candidates!(perf, count, BackwardFilter)
            }
        }
    }
}

/// Every algorithm run and timed on the real buffers, fastest first. A failure of the query
/// itself gives an empty list (the heuristic choice stands).
fn timed(
    h: sys::cudnnHandle_t,
    d: &Descriptors,
    direction: Direction,
    b: &Buffers,
    ws: *mut c_void,
    ws_bytes: usize,
) -> Vec<Candidate> {
    let mut count = 0;
    let (x, w, y) = (b.x as *mut c_void, b.w as *mut c_void, b.y as *mut c_void);
    // SAFETY (each arm): live handle and descriptors; buffers laid out as the descriptors
    // say; the workspace holds ws_bytes; the perf array holds ALGOS entries.
    unsafe {
        match direction {
            Direction::Forward => {
                let mut perf: [sys::cudnnConvolutionFwdAlgoPerf_t; ALGOS] = std::mem::zeroed();
                let r = sys::cudnnFindConvolutionForwardAlgorithmEx(
                    h,
                    d.x,
                    x,
                    d.w,
                    w,
                    d.conv,
                    d.y,
                    y,
                    ALGOS as i32,
                    &mut count,
                    perf.as_mut_ptr(),
                    ws,
                    ws_bytes,
                );
                if r.result().is_err() {
                    return Vec::new();
                }
                candidates!(perf, count, Forward)
            }
            Direction::BackwardData => {
                let mut perf: [sys::cudnnConvolutionBwdDataAlgoPerf_t; ALGOS] = std::mem::zeroed();
                let r = sys::cudnnFindConvolutionBackwardDataAlgorithmEx(
                    h,
                    d.w,
                    w,
                    d.y,
                    y,
                    d.conv,
                    d.x,
                    x,
                    ALGOS as i32,
                    &mut count,
                    perf.as_mut_ptr(),
                    ws,
                    ws_bytes,
                );
                if r.result().is_err() {
                    return Vec::new();
                }
                candidates!(perf, count, BackwardData)
            }
            Direction::BackwardFilter => {
                let mut perf: [sys::cudnnConvolutionBwdFilterAlgoPerf_t; ALGOS] = std::mem::zeroed();
                let r = sys::cudnnFindConvolutionBackwardFilterAlgorithmEx(
                    h,
                    d.x,
                    x,
                    d.y,
                    y,
                    d.conv,
                    d.w,
                    w,
                    ALGOS as i32,
                    &mut count,
                    perf.as_mut_ptr(),
                    ws,
                    ws_bytes,
                );
                if r.result().is_err() {
                    return Vec::new();
                }
                candidates!(perf, count, BackwardFilter)
            }
        }
    }
}
