//! [`ValueGate`]: a parameter whose value is still on its way (ZeRO-1's all-gather of the
//! updated parameters, FSDP's prefetched shards) is made ready the first time it is read.
//!
//! Every [`Parameter`](crate::Parameter) owns a gate. Whoever produces its value later arms the
//! gate with a [`PendingValue`]; [`Parameter::var`](crate::Parameter::var) and
//! [`Parameter::tensor`](crate::Parameter::tensor) pass the gate before they read, which costs
//! one atomic load while the gate is open and runs the pending value once when it is armed.
//! The gate lives here and not on autograd's `Var`: `Var::tensor` is read by every op in the
//! middle of the math, while a module reads its parameters through `Parameter` once per
//! forward, which is where a wait belongs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// What an armed gate runs before the parameter is read: waits for the value and writes it into
/// the parameter's storage. One `PendingValue` may be shared by the gates of many parameters
/// (one communication bucket), so `resolve` must be idempotent: its first call does the work,
/// later ones return once it is done. It cannot fail (readers take no `Result`): an error
/// belongs with whoever armed the gate, to be returned from its next fallible call.
pub trait PendingValue: Send + Sync {
    fn resolve(&self);
}

/// The gate of one parameter: open (the value is final) or armed with a [`PendingValue`].
/// Thread-safe: a module is read from several threads (DDP's ranks as threads, data loaders);
/// every reader of an armed gate waits until the value is written, and the pending value is
/// taken out under a lock, so it runs at most once per arming.
#[derive(Default)]
pub struct ValueGate {
    /// Only changed with `pending` locked, so the two never disagree for long: the fast path
    /// reads this flag alone.
    armed: AtomicBool,
    pending: Mutex<Option<Arc<dyn PendingValue>>>,
}

impl ValueGate {
    pub fn new() -> ValueGate {
        ValueGate::default()
    }

    /// Arms the gate: the next read of the parameter runs `pending` first. Replaces a pending
    /// value not yet run (the caller resolves what it armed before arming again).
    pub fn arm(&self, pending: Arc<dyn PendingValue>) {
        let mut slot = self.lock();
        *slot = Some(pending);
        self.armed.store(true, Ordering::Release);
    }

    /// Whether a read would wait first.
    pub fn is_armed(&self) -> bool {
        self.armed.load(Ordering::Acquire)
    }

    /// Makes the value final: nothing while the gate is open (one acquire load, which also
    /// makes the writes of the run that opened it visible), else runs the pending value.
    #[inline]
    pub fn pass(&self) {
        if self.armed.load(Ordering::Acquire) {
            self.open();
        }
    }

    #[cold]
    fn open(&self) {
        let mut slot = self.lock();
        // Under the lock: a second reader waits here until the first has written the value,
        // then finds the slot empty.
        if let Some(pending) = slot.take() {
            pending.resolve();
        }
        self.armed.store(false, Ordering::Release);
    }

    fn lock(&self) -> MutexGuard<'_, Option<Arc<dyn PendingValue>>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for ValueGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ValueGate {{ armed: {} }}", self.is_armed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parameter_gates, Module, Parameter, Visitor};
    use oxtrain_autograd::Var;
    use oxtrain_tensor::{Device, Tensor};
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// Writes `value` into `target` (slowly, so that readers pile up), counting its runs.
    struct Fill {
        target: Var,
        value: f32,
        runs: AtomicUsize,
    }

    impl PendingValue for Fill {
        fn resolve(&self) {
            if self.runs.fetch_add(1, Ordering::SeqCst) == 0 {
                std::thread::sleep(Duration::from_millis(50));
                self.target.tensor().fill_(f64::from(self.value));
            }
        }
    }

    fn param(v: f32) -> Parameter {
        Parameter::new(Tensor::from_vec(vec![v; 4], 4, Device::Cpu).unwrap())
    }

    fn fill(p: &Parameter, value: f32) -> Arc<Fill> {
        Arc::new(Fill { target: p.var(), value, runs: AtomicUsize::new(0) })
    }

    #[test]
    fn concurrent_readers_of_an_armed_parameter_all_see_the_value_of_one_run() {
        let p = Arc::new(param(0.0));
        let pending = fill(&p, 3.0);
        p.gate().arm(pending.clone());
        let readers: Vec<_> = (0..8)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || p.tensor().to_vec::<f32>())
            })
            .collect();
        for r in readers {
            assert_eq!(r.join().unwrap(), vec![3.0; 4]);
        }
        assert_eq!(pending.runs.load(Ordering::SeqCst), 1, "run once per arming");
        assert!(!p.gate().is_armed());
        // Armed again, it runs again.
        let again = fill(&p, 5.0);
        p.gate().arm(again.clone());
        assert_eq!(p.var().tensor().to_vec::<f32>(), vec![5.0; 4]);
        assert_eq!(again.runs.load(Ordering::SeqCst), 1);
    }

    struct Two {
        a: Parameter,
        b: Parameter,
    }

    impl Module for Two {
        fn visit(&self, v: &mut dyn Visitor) {
            v.param("a", &self.a);
            v.param("b", &self.b);
        }
    }

    #[test]
    fn shape_reads_skip_the_gate_and_value_reads_wait() {
        let m = Two { a: param(1.0), b: param(2.0) };
        let gates = parameter_gates(&m);
        assert_eq!(gates.len(), 2);
        assert!(Arc::ptr_eq(&gates[1].1, m.b.gate()));
        let pending = fill(&m.b, 7.0);
        gates[1].1.arm(pending.clone());
        assert_eq!((m.b.dims(), m.b.requires_grad()), (vec![4], true));
        assert!(m.b.gate().is_armed(), "dims and requires_grad do not wait");
        assert_eq!(pending.runs.load(Ordering::SeqCst), 0);
        let state = m.state_dict();
        assert_eq!(state[1].1.to_vec::<f32>(), vec![7.0; 4], "state_dict waits");
        assert!(!m.b.gate().is_armed());
    }
}
