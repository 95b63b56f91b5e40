//! Multi-tensor optimizer steps (PyTorch's `fused=True`): one CUDA launch updates every
//! parameter of a list, with the per-tensor kernels' arithmetic, so the results are the same
//! bits as one `sgd_step_` / `adamw_step_` per parameter.
//!
//! The kernel reads the list from a device table that [`MultiTensorStep`] uploads once and
//! reuses while the parameters, their state and their kept casts keep their memory; the
//! gradients, which are new tensors every step, and the hyper-parameters (learning rate, step
//! count) travel in the launch's arguments, so a steady step copies nothing to the device and
//! allocates nothing. A parameter with a kept cast (autocast's 16-bit copy, see
//! `Tensor::to_dtype_cached`) gets it rewritten by the same launch and marked current.
//!
//! Everything the launch cannot take runs the per-tensor op, in the list's order: CPU
//! tensors, zero-size ones, and parameters whose storage (or their state's) appears twice.
//! `OXTRAIN_DISABLE_MULTI_TENSOR=1` sends everything there.

use super::multi_cuda::{self, Launch, TableCache};
use super::{AdamWCoefs, AdamWStep, SgdCoefs, SgdStep};
use crate::{DType, Device, Tensor};
use std::collections::{BTreeMap, HashSet};
use std::sync::OnceLock;

/// One parameter of a multi-tensor SGD step: `momentum_buf` as for `Tensor::sgd_step_`.
#[derive(Debug, Clone)]
pub struct SgdParam {
    pub param: Tensor,
    pub grad: Tensor,
    pub momentum_buf: Option<Tensor>,
}

/// One parameter of a multi-tensor AdamW step, its moments as for `Tensor::adamw_step_`.
#[derive(Debug, Clone)]
pub struct AdamWParam {
    pub param: Tensor,
    pub grad: Tensor,
    pub exp_avg: Tensor,
    pub exp_avg_sq: Tensor,
    pub max_exp_avg_sq: Option<Tensor>,
}

/// Runs SGD and AdamW steps over lists of parameters, one launch per device and gradient
/// dtype, and keeps their device tables between steps (an optimizer owns one).
#[derive(Default)]
pub struct MultiTensorStep {
    tables: TableCache,
}

/// A parameter as the launch sees it: the tensors it writes (parameter, state) and reads.
pub(super) struct Member {
    pub param: Tensor,
    pub grad: Tensor,
    pub state: [Option<Tensor>; 3],
}

/// The hyper-parameters of one launch.
pub(super) enum Coefs {
    Sgd(SgdCoefs),
    AdamW(AdamWCoefs),
}

fn multi_tensor_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("OXTRAIN_DISABLE_MULTI_TENSOR").map_or(true, |v| v != "1"))
}

impl MultiTensorStep {
    pub fn new() -> MultiTensorStep {
        MultiTensorStep::default()
    }

    /// `Tensor::sgd_step_` on every parameter of `params` (same checks, same results).
    pub fn sgd_step_(&mut self, params: &[SgdParam], first: bool, cfg: &SgdStep) {
        let members = params
            .iter()
            .map(|sp| {
                let (grad, buf) = sp.param.check_sgd(&sp.grad, sp.momentum_buf.as_ref(), cfg);
                Member { param: sp.param.clone(), grad, state: [buf.cloned(), None, None] }
            })
            .collect();
        let rest = self.run(members, Coefs::Sgd(SgdCoefs::new(cfg, first)));
        for i in rest {
            let sp = &params[i];
            sp.param.sgd_step_(&sp.grad, sp.momentum_buf.as_ref(), first, cfg);
        }
    }

    /// `Tensor::adamw_step_` on every parameter of `params` (same checks, same results).
    pub fn adamw_step_(&mut self, params: &[AdamWParam], cfg: &AdamWStep) {
        let coefs = AdamWCoefs::new(cfg);
        let members = params
            .iter()
            .map(|ap| {
                let vmax = ap.max_exp_avg_sq.as_ref();
                let grad = ap.param.check_adamw(&ap.grad, &ap.exp_avg, &ap.exp_avg_sq, vmax);
                let state = [Some(ap.exp_avg.clone()), Some(ap.exp_avg_sq.clone()), vmax.cloned()];
                Member { param: ap.param.clone(), grad, state }
            })
            .collect();
        let rest = self.run(members, Coefs::AdamW(coefs));
        for i in rest {
            let ap = &params[i];
            ap.param.adamw_step_(&ap.grad, &ap.exp_avg, &ap.exp_avg_sq, ap.max_exp_avg_sq.as_ref(), cfg);
        }
    }

    /// Launches what can go in one launch per (device, gradient dtype); returns the indices of
    /// the members left to the per-tensor op, in order.
    fn run(&mut self, members: Vec<Member>, coefs: Coefs) -> Vec<usize> {
        if !multi_tensor_enabled() {
            return (0..members.len()).collect();
        }
        let (launches, rest) = partition(&members);
        for ((_, _), indices) in launches {
            let group: Vec<&Member> = indices.iter().map(|&i| &members[i]).collect();
            multi_cuda::launch(&mut self.tables, &Launch { members: &group, coefs: &coefs });
        }
        rest
    }
}

/// Splits members into launches keyed by (device ordinal, gradient dtype) and the rest. A
/// launch writes each storage once and reads no storage it writes, so a member whose
/// parameter or state storage is already taken, or whose gradient lies in written memory,
/// goes to the rest (the per-tensor op runs it after the launch, as the list orders it).
#[allow(clippy::type_complexity)]
fn partition(members: &[Member]) -> (BTreeMap<(usize, DType), Vec<usize>>, Vec<usize>) {
    let mut written = HashSet::new();
    let mut candidates = Vec::new();
    let mut rest = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let Device::Cuda(ordinal) = m.param.device() else {
            rest.push(i);
            continue;
        };
        if m.param.elem_count() == 0 {
            continue;
        }
        let keys: Vec<usize> =
            std::iter::once(&m.param).chain(m.state.iter().flatten()).map(Tensor::storage_key).collect();
        let unique = keys.iter().collect::<HashSet<_>>().len() == keys.len();
        if unique && keys.iter().all(|k| !written.contains(k)) {
            written.extend(keys);
            candidates.push((i, ordinal));
        } else {
            rest.push(i);
        }
    }
    let mut launches: BTreeMap<(usize, DType), Vec<usize>> = BTreeMap::new();
    for (i, ordinal) in candidates {
        let m = &members[i];
        if written.contains(&m.grad.storage_key()) {
            rest.push(i);
        } else {
            launches.entry((ordinal, m.grad.dtype())).or_default().push(i);
        }
    }
    rest.sort_unstable();
    (launches, rest)
}
