//! A light op-timing hook: while [`record`] runs a closure, every differentiable op's forward
//! and backward time is added up per op name, so a user (and `oxtrain bench --profile`) can see
//! where a training step goes. Off, it costs one relaxed atomic load per op.
//!
//! Forward time is measured between consecutive ops of the recording thread: the time since
//! the previous op was recorded (or since `record` began) is charged to the op being recorded,
//! which is exact for a model whose work happens inside its ops. Backward time is each node's
//! gradient function, timed around its call. Work outside autograd ops (the optimizer's step,
//! an untracked tensor op after the last op) lands in "other".

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ON: AtomicBool = AtomicBool::new(false);
/// Calls and time per (phase, op kind).
type Times = BTreeMap<(&'static str, &'static str), (usize, Duration)>;
static TIMES: Mutex<Times> = Mutex::new(BTreeMap::new());

thread_local! {
    static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
    /// Waits for the device before each reading of the clock (see [`record_synced`]).
    static SYNC: Cell<Option<&'static (dyn Fn() + Sync)>> = const { Cell::new(None) };
}

/// Waits for the queued device work of the recording thread, when [`record_synced`] asked.
fn sync() {
    if let Some(s) = SYNC.with(|c| c.get()) {
        s();
    }
}

fn add(phase: &'static str, name: &'static str, d: Duration) {
    let mut t = TIMES.lock().unwrap_or_else(|e| e.into_inner());
    let e = t.entry((phase, name)).or_insert((0, Duration::ZERO));
    e.0 += 1;
    e.1 += d;
}

/// Called by `Var::from_op` when op `name` has computed its output.
pub(crate) fn forward_done(name: &'static str) {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    sync();
    let now = Instant::now();
    if let Some(last) = LAST.with(|l| l.replace(Some(now))) {
        add("forward", name, now - last);
    }
}

/// `f` timed under `name` when recording, else `f` itself.
pub(crate) fn timed<R>(name: &'static str, f: impl FnOnce() -> R) -> R {
    region("backward", name, f)
}

/// `f` timed under `(phase, name)` while a recording runs (else just `f`): work outside
/// differentiable ops that a profile should name, such as the optimizer's step or the
/// backward walk's gradient sums.
pub fn region<R>(phase: &'static str, name: &'static str, f: impl FnOnce() -> R) -> R {
    if !ON.load(Ordering::Relaxed) {
        return f();
    }
    sync();
    let t = Instant::now();
    let r = f();
    sync();
    add(phase, name, t.elapsed());
    // The next forward op must not be charged for this backward.
    LAST.with(|l| l.set(Some(Instant::now())));
    r
}

/// Time per op kind of one run of a closure.
#[derive(Debug, Clone)]
pub struct Profile {
    /// `(phase, op, calls, time)`, phase "forward" or "backward", longest first.
    pub ops: Vec<(&'static str, &'static str, usize, Duration)>,
    pub total: Duration,
}

impl Profile {
    /// A table: one line per (phase, op) with its share of the total, then the rest as "other".
    pub fn table(&self) -> String {
        let total = self.total.as_secs_f64().max(1e-12);
        let mut s = format!("{:<9} {:<24} {:>6} {:>10} {:>6}\n", "phase", "op", "calls", "ms", "%");
        let mut counted = 0.0;
        for (phase, op, calls, d) in &self.ops {
            let ms = d.as_secs_f64() * 1e3;
            counted += d.as_secs_f64();
            s += &format!(
                "{phase:<9} {op:<24} {calls:>6} {ms:>10.2} {:>6.1}\n",
                100.0 * d.as_secs_f64() / total
            );
        }
        let other = (total - counted).max(0.0);
        s += &format!(
            "{:<9} {:<24} {:>6} {:>10.2} {:>6.1}\n",
            "other",
            "(outside ops)",
            "",
            other * 1e3,
            100.0 * other / total
        );
        s += &format!("{:<9} {:<24} {:>6} {:>10.2}\n", "total", "", "", total * 1e3);
        s
    }
}

/// [`record`] for work queued on a device: `sync` (e.g. a CUDA device synchronisation) runs
/// before every reading of the clock, so each op is charged its own device time and not the
/// time the host waited for earlier ops. The synchronisations slow the step itself down.
pub fn record_synced(sync: &'static (dyn Fn() + Sync), f: impl FnOnce()) -> Profile {
    SYNC.with(|c| c.set(Some(sync)));
    sync();
    let p = record(f);
    SYNC.with(|c| c.set(None));
    p
}

/// Runs `f` with op timing on and returns what it measured. Recordings do not nest.
pub fn record(f: impl FnOnce()) -> Profile {
    TIMES.lock().unwrap_or_else(|e| e.into_inner()).clear();
    let start = Instant::now();
    LAST.with(|l| l.set(Some(start)));
    ON.store(true, Ordering::Relaxed);
    f();
    ON.store(false, Ordering::Relaxed);
    let total = start.elapsed();
    LAST.with(|l| l.set(None));
    let mut ops: Vec<_> = std::mem::take(&mut *TIMES.lock().unwrap_or_else(|e| e.into_inner()))
        .into_iter()
        .map(|((phase, op), (calls, d))| (phase, op, calls, d))
        .collect();
    ops.sort_by_key(|o| std::cmp::Reverse(o.3));
    Profile { ops, total }
}
