//! CUDA dispatch of the fused optimizer steps (kernels in `optim.cu`).

use super::{AdamWCoefs, SgdCoefs};
use crate::cuda::{self, expect_launch, launch_cfg, CudaStorage, KernelSource};
use cudarc::driver::PushKernelArg;

pub(crate) const SOURCE: KernelSource = cuda::source!("optim", "src/ops/optim/optim.cu");

/// Address of element `offset` of a storage.
fn at(s: &CudaStorage, offset: usize) -> u64 {
    s.ptr() + (offset * s.dtype().size_in_bytes()) as u64
}

/// `buf` is the momentum buffer's address (with its offset), when momentum is used.
pub(super) fn sgd(
    p: &mut CudaStorage,
    poff: usize,
    g: &CudaStorage,
    goff: usize,
    buf: Option<u64>,
    n: usize,
    c: &SgdCoefs,
) {
    let op = "sgd_step_";
    let f = expect_launch(p.device().function(&SOURCE, &format!("sgd_step_{}", cuda::suffix(g.dtype()))), op);
    let (pp, gp, bp, n64) = (at(p, poff), at(g, goff), buf.unwrap_or(0), n as i64);
    let flags = [c.nesterov as i32, c.maximize as i32, c.has_buf as i32, c.first as i32];
    let stream = p.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&pp).arg(&gp).arg(&bp).arg(&n64);
    b.arg(&c.lr).arg(&c.momentum).arg(&c.keep).arg(&c.weight_decay);
    b.arg(&flags[0]).arg(&flags[1]).arg(&flags[2]).arg(&flags[3]);
    // SAFETY: argument types match the kernel; every buffer holds n f32 elements from its
    // address (the gradient n of its dtype), and the buffer is only read when has_buf is set.
    expect_launch(unsafe { b.launch(launch_cfg(n)) }, op);
}

/// `state` holds the addresses of exp_avg, exp_avg_sq and max_exp_avg_sq (0 without AMSGrad).
pub(super) fn adamw(
    p: &mut CudaStorage,
    poff: usize,
    g: &CudaStorage,
    goff: usize,
    state: [u64; 3],
    n: usize,
    c: &AdamWCoefs,
) {
    let op = "adamw_step_";
    let f =
        expect_launch(p.device().function(&SOURCE, &format!("adamw_step_{}", cuda::suffix(g.dtype()))), op);
    let (pp, gp, n64, maximize) = (at(p, poff), at(g, goff), n as i64, c.maximize as i32);
    let [mp, vp, vmp] = state;
    let stream = p.stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&pp).arg(&gp).arg(&mp).arg(&vp).arg(&vmp).arg(&n64);
    b.arg(&c.decay).arg(&c.one_minus_beta1).arg(&c.beta2).arg(&c.one_minus_beta2);
    b.arg(&c.step_size).arg(&c.bc2_sqrt).arg(&c.eps).arg(&maximize);
    // SAFETY: argument types match the kernel; every buffer holds n elements from its address;
    // max_exp_avg_sq is null without AMSGrad and the kernel checks for that.
    expect_launch(unsafe { b.launch(launch_cfg(n)) }, op);
}
