//! When to save: every N steps, every M minutes, at the end, and when the job is told to stop
//! (SIGTERM from Slurm or Kubernetes before preemption, SIGINT from Ctrl-C). A signal only
//! raises a flag; the loop polls it between steps, saves and exits 0. A second SIGINT while
//! the flag is up ends the process at once, for a user who does not want to wait.

use super::error::{CheckpointError, Result};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::SigId;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq)]
pub struct SaveTriggers {
    pub every_steps: Option<u64>,
    pub every: Option<Duration>,
    pub at_end: bool,
    /// Save and stop on SIGTERM / SIGINT.
    pub on_signal: bool,
}

impl Default for SaveTriggers {
    fn default() -> Self {
        SaveTriggers { every_steps: None, every: None, at_end: true, on_signal: true }
    }
}

/// Why a save is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveReason {
    Steps,
    Time,
    /// SIGTERM or SIGINT arrived: save, `finish`, and exit 0.
    Signal,
    End,
}

pub struct SavePolicy {
    triggers: SaveTriggers,
    last_save: Instant,
    stop: Arc<AtomicBool>,
    handlers: Vec<SigId>,
}

impl SavePolicy {
    /// The policy; with `on_signal`, SIGTERM and SIGINT stop raising their default action
    /// (ending the process) and raise the flag [`SavePolicy::due`] reports instead.
    pub fn new(triggers: SaveTriggers) -> Result<SavePolicy> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut handlers = Vec::new();
        if triggers.on_signal {
            let fail = |e: std::io::Error| CheckpointError::Io {
                path: "signal handlers".into(),
                what: "installing the SIGTERM/SIGINT handler".into(),
                source: e,
            };
            // Registered first so it sees the flag before this signal's own handler sets it.
            handlers.push(
                signal_hook::flag::register_conditional_shutdown(SIGINT, 130, stop.clone()).map_err(fail)?,
            );
            for sig in [SIGTERM, SIGINT] {
                handlers.push(signal_hook::flag::register(sig, stop.clone()).map_err(fail)?);
            }
        }
        Ok(SavePolicy { triggers, last_save: Instant::now(), stop, handlers })
    }

    /// Call after each optimizer step (`step` counts them): whether to save now, and why.
    /// A due save restarts the timer.
    pub fn due(&mut self, step: u64) -> Option<SaveReason> {
        let reason = if self.stop_requested() {
            Some(SaveReason::Signal)
        } else if self.triggers.every_steps.is_some_and(|n| n > 0 && step.is_multiple_of(n)) {
            Some(SaveReason::Steps)
        } else if self.triggers.every.is_some_and(|d| self.last_save.elapsed() >= d) {
            Some(SaveReason::Time)
        } else {
            None
        };
        if reason.is_some() {
            self.last_save = Instant::now();
        }
        reason
    }

    /// Whether the run's end should save (`at_end`), unless the last step just did.
    pub fn at_end(&self) -> bool {
        self.triggers.at_end
    }

    /// SIGTERM or SIGINT arrived.
    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// The flag the signals raise, for a loop that wants to poll it elsewhere too.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }
}

impl Drop for SavePolicy {
    /// Gives SIGTERM and SIGINT back their default behaviour.
    fn drop(&mut self) {
        for id in self.handlers.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}
