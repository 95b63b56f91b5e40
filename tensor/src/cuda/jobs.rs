//! Work done at most once per key, either ahead of need on background threads or by the first
//! thread that needs it: the kernel families a device has no ready cubin for are compiled in
//! parallel as soon as the device opens, and an op that needs one of them before it is done
//! waits for that compile instead of starting a second one.

use crate::Result;
use std::collections::HashMap;
use std::hash::Hash;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

enum Slot<V> {
    Running,
    Done(Result<V>),
}

/// A table of keyed jobs and their results.
pub(crate) struct JobTable<K, V> {
    slots: Mutex<HashMap<K, Slot<V>>>,
    changed: Condvar,
    /// Set at process exit: background workers start nothing new.
    stopping: AtomicBool,
}

/// Gives the key back when the job that claimed it unwinds, so a waiter runs it itself rather
/// than waiting forever.
struct Claim<'a, K: Eq + Hash, V> {
    table: &'a JobTable<K, V>,
    key: Option<K>,
}

impl<K: Eq + Hash, V> Drop for Claim<'_, K, V> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.table.slots.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
            self.table.changed.notify_all();
        }
    }
}

impl<K: Eq + Hash + Clone + Send + Sync + 'static, V: Clone + Send + 'static> JobTable<K, V> {
    pub(crate) fn new() -> Self {
        JobTable {
            slots: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            stopping: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, Slot<V>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The result of `key`: a background job's if it ran or is running (then this waits for
    /// it), else `run`'s, run here. A failure goes to the one caller that receives it and is
    /// then forgotten, so the next call runs the job again, as if there were no background.
    pub(crate) fn get(&self, key: K, run: impl FnOnce() -> Result<V>) -> Result<V> {
        let mut slots = self.lock();
        while let Some(Slot::Running) = slots.get(&key) {
            slots = self.changed.wait(slots).unwrap_or_else(|e| e.into_inner());
        }
        match slots.remove(&key) {
            Some(Slot::Done(Ok(v))) => {
                slots.insert(key, Slot::Done(Ok(v.clone())));
                return Ok(v);
            }
            Some(Slot::Done(Err(e))) => return Err(e),
            Some(Slot::Running) => unreachable!("waited above"),
            None => {}
        }
        slots.insert(key.clone(), Slot::Running);
        drop(slots);
        let (key, result) = self.run_claimed(key, run);
        let mut slots = self.lock();
        match &result {
            Ok(v) => drop(slots.insert(key, Slot::Done(Ok(v.clone())))),
            // Handed to this caller; the next one tries again.
            Err(_) => drop(slots.remove(&key)),
        }
        drop(slots);
        self.changed.notify_all();
        result
    }

    /// Runs `run` for a key this thread has marked `Running`; the caller records the result.
    fn run_claimed(&self, key: K, run: impl FnOnce() -> Result<V>) -> (K, Result<V>) {
        let mut claim = Claim { table: self, key: Some(key) };
        let result = run();
        (claim.key.take().expect("taken only here and on unwind"), result)
    }

    /// Marks `key` as running unless a job for it ran or runs already.
    fn claim(&self, key: &K) -> bool {
        let mut slots = self.lock();
        if slots.contains_key(key) {
            return false;
        }
        slots.insert(key.clone(), Slot::Running);
        true
    }

    /// Starts `run` for each key on at most `threads` new threads, in the order given (put the
    /// longest first), and returns at once. A key some caller has claimed by the time a worker
    /// reaches it is skipped. Errors are kept for the first [`JobTable::get`] of their key.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        keys: Vec<K>,
        threads: usize,
        run: impl Fn(&K) -> Result<V> + Send + Sync + 'static,
    ) -> Vec<JoinHandle<()>> {
        let keys = Arc::new(keys);
        let next = Arc::new(AtomicUsize::new(0));
        let run = Arc::new(run);
        let threads = threads.clamp(1, keys.len().max(1));
        (0..threads)
            .filter_map(|i| {
                let (table, keys, next, run) = (self.clone(), keys.clone(), next.clone(), run.clone());
                std::thread::Builder::new()
                    .name(format!("oxtrain-compile-{i}"))
                    .spawn(move || table.work(&keys, &next, &*run))
                    // No thread: the keys stay unclaimed and their first use runs them.
                    .ok()
            })
            .collect()
    }

    fn work(&self, keys: &[K], next: &AtomicUsize, run: &(dyn Fn(&K) -> Result<V> + Sync)) {
        while !self.stopping.load(Ordering::SeqCst) {
            let Some(key) = keys.get(next.fetch_add(1, Ordering::SeqCst)) else { return };
            if self.claim(key) {
                // A panic is reported by the hook as usual; the claim gives the key back and
                // this worker goes on with the next.
                let finished = catch_unwind(AssertUnwindSafe(|| self.run_claimed(key.clone(), || run(key))));
                if let Ok((key, result)) = finished {
                    self.lock().insert(key, Slot::Done(result));
                    self.changed.notify_all();
                }
            }
        }
    }

    /// Stops the background workers from starting more jobs.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Waits until no job runs.
    pub(crate) fn wait_for_running(&self) {
        let mut slots = self.lock();
        while slots.values().any(|s| matches!(s, Slot::Running)) {
            slots = self.changed.wait(slots).unwrap_or_else(|e| e.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use std::sync::mpsc;

    type Table = Arc<JobTable<&'static str, usize>>;

    fn counter() -> Arc<Mutex<HashMap<&'static str, usize>>> {
        Arc::new(Mutex::new(HashMap::new()))
    }

    fn count(calls: &Mutex<HashMap<&'static str, usize>>, key: &'static str) {
        *calls.lock().unwrap().entry(key).or_default() += 1;
    }

    #[test]
    fn a_key_needed_while_its_background_job_runs_waits_for_it_and_runs_once() {
        let table: Table = Arc::new(JobTable::new());
        let calls = counter();
        let (started_tx, started) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let c = calls.clone();
        let workers = table.spawn(vec!["attention"], 2, move |&key| {
            count(&c, key);
            started_tx.send(()).unwrap();
            release_rx.lock().unwrap().recv().unwrap();
            Ok(key.len())
        });
        started.recv().unwrap();
        let t = table.clone();
        let user = std::thread::spawn(move || t.get("attention", || panic!("compiled twice")).unwrap());
        release.send(()).unwrap();
        assert_eq!(user.join().unwrap(), "attention".len());
        workers.into_iter().for_each(|w| w.join().unwrap());
        assert_eq!(table.get("attention", || panic!("compiled twice")).unwrap(), 9);
        assert_eq!(*calls.lock().unwrap(), HashMap::from([("attention", 1)]));
    }

    #[test]
    fn every_key_runs_once_on_at_most_the_given_threads() {
        let table: Table = Arc::new(JobTable::new());
        let calls = counter();
        let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let keys = vec!["reduce", "softmax", "binary", "convert", "unary", "index", "pool"];
        let (c, r, m) = (calls.clone(), running.clone(), most.clone());
        let workers = table.spawn(keys.clone(), 3, move |&key| {
            let now = r.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            count(&c, key);
            std::thread::yield_now();
            r.fetch_sub(1, Ordering::SeqCst);
            Ok(key.len())
        });
        assert_eq!(workers.len(), 3);
        // Callers racing the workers: each key still runs once, whoever runs it.
        for &key in keys.iter().rev() {
            let c = calls.clone();
            let got = table.get(key, || {
                count(&c, key);
                Ok(key.len())
            });
            assert_eq!(got.unwrap(), key.len());
        }
        workers.into_iter().for_each(|w| w.join().unwrap());
        assert!(most.load(Ordering::SeqCst) <= 3, "{} jobs ran at once", most.load(Ordering::SeqCst));
        let calls = calls.lock().unwrap();
        assert_eq!(calls.len(), keys.len());
        assert!(calls.values().all(|&n| n == 1), "{calls:?}");
    }

    #[test]
    fn one_thread_runs_the_keys_in_the_order_given() {
        let table: Table = Arc::new(JobTable::new());
        let order = Arc::new(Mutex::new(Vec::new()));
        let o = order.clone();
        let keys = vec!["attention", "reduce", "join"];
        let workers = table.spawn(keys.clone(), 1, move |&key| {
            o.lock().unwrap().push(key);
            Ok(0)
        });
        workers.into_iter().for_each(|w| w.join().unwrap());
        assert_eq!(*order.lock().unwrap(), keys);
    }

    #[test]
    fn a_background_failure_reaches_the_first_caller_and_the_next_one_runs_again() {
        let table: Table = Arc::new(JobTable::new());
        let workers = table.spawn(vec!["typo"], 1, |_| Err(Error::Msg("typo.cu failed to compile".into())));
        workers.into_iter().for_each(|w| w.join().unwrap());
        let first = table.get("typo", || panic!("the background result comes first"));
        assert_eq!(first.unwrap_err().to_string(), "typo.cu failed to compile");
        assert_eq!(table.get("typo", || Ok(3)).unwrap(), 3);
        assert_eq!(table.get("typo", || panic!("a success is kept")).unwrap(), 3);
    }

    #[test]
    fn a_foreground_failure_is_not_kept() {
        let table: Table = Arc::new(JobTable::new());
        assert!(table.get("norm", || Err(Error::Msg("no NVRTC".into()))).is_err());
        assert_eq!(table.get("norm", || Ok(5)).unwrap(), 5);
    }

    #[test]
    fn a_panicking_job_leaves_its_key_to_the_next_caller_and_the_worker_goes_on() {
        let table: Table = Arc::new(JobTable::new());
        let workers = table.spawn(vec!["bad", "good"], 1, |&key| {
            assert_ne!(key, "bad", "a compiler bug");
            Ok(1)
        });
        workers.into_iter().for_each(|w| w.join().unwrap());
        assert_eq!(table.get("bad", || Ok(2)).unwrap(), 2);
        assert_eq!(table.get("good", || panic!("ran in the background")).unwrap(), 1);
    }

    #[test]
    fn stopping_starts_no_more_jobs_and_waiting_returns_when_the_running_one_is_done() {
        let table: Table = Arc::new(JobTable::new());
        let calls = counter();
        let (started_tx, started) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let finished = Arc::new(AtomicBool::new(false));
        let (c, f) = (calls.clone(), finished.clone());
        let workers = table.spawn(vec!["first", "second"], 1, move |&key| {
            count(&c, key);
            if key == "first" {
                started_tx.send(()).unwrap();
                release_rx.lock().unwrap().recv().unwrap();
                f.store(true, Ordering::SeqCst);
            }
            Ok(1)
        });
        started.recv().unwrap();
        table.stop();
        let t = table.clone();
        let waiter = std::thread::spawn(move || t.wait_for_running());
        release.send(()).unwrap();
        waiter.join().unwrap();
        assert!(finished.load(Ordering::SeqCst), "the wait returned before the running job ended");
        workers.into_iter().for_each(|w| w.join().unwrap());
        let calls = calls.lock().unwrap();
        assert_eq!(*calls, HashMap::from([("first", 1)]), "a job started after the stop");
    }
}
