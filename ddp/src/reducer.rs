//! The reducer, as PyTorch's: each parameter's gradient-ready hook marks it ready; a bucket
//! whose parameters are all ready is launched at once, in bucket order (the same on every
//! rank), while backward goes on; at the end of backward a callback waits for every bucket.
//!
//! On CPU backends a launch hands the bucket to the communicator's worker thread; on GPU
//! backends it enqueues the all-reduce on the communication stream behind an event of the
//! compute stream, and the final wait is a stream wait (the host does not block). Unused
//! parameters and `no_sync` are handled here.

use super::bucket::{view_of, Bucket, Slot};
use super::trace::{Recorder, StepStats};
use super::zero::GradShards;
use super::{Compression, Reduction};
use crate::error::tensor_error;
use crate::DdpError;
use oxtrain_autograd::{in_backward, queue_callback, BackwardError, Var};
use oxtrain_comm::{Communicator, ReduceOp, Work};
use oxtrain_tensor::{DType, Device, Tensor};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// What the reducer knows of one backward pass.
struct Pass {
    /// Whether this pass reduces (false inside `no_sync`, decided at forward).
    sync: bool,
    /// The end-of-backward callback is queued for this pass.
    finishing: bool,
    ready: Vec<bool>,
    /// Parameters that got a gradient since the last reduction (for `find_unused_parameters`:
    /// includes `no_sync` passes).
    used: Vec<bool>,
    /// Parameters not yet ready, per bucket.
    pending: Vec<usize>,
    next_launch: usize,
    in_flight: Vec<Option<InFlight>>,
    /// A failure of a launch or of the forward's buffer broadcast, returned at the end of
    /// backward.
    error: Option<DdpError>,
    backward_start: Option<Instant>,
    last_ready: Option<Instant>,
    forward: Duration,
    step: u64,
    last_stats: Option<StepStats>,
    /// On a GPU: events on the compute stream before and after its wait for the buckets;
    /// their distance is the step's exposed communication, read when asked for.
    gpu_wait: Option<GpuWait>,
}

/// Two events of the compute stream around the wait for the buckets.
struct GpuWait(oxtrain_tensor::cuda::Event, oxtrain_tensor::cuda::Event);

// SAFETY: CUDA event handles may be used from any thread of the process.
unsafe impl Send for GpuWait {}

impl GpuWait {
    fn record(device: Device) -> Option<oxtrain_tensor::cuda::Event> {
        match device {
            Device::Cuda(ordinal) => {
                oxtrain_tensor::cuda::Stream::current(ordinal).and_then(|s| s.record_event()).ok()
            }
            Device::Cpu => None,
        }
    }

    /// The device time the compute stream stood waiting (blocks until the second event).
    fn exposed(&self) -> Option<Duration> {
        self.1.synchronize().ok()?;
        let ms = self.0.elapsed_ms(&self.1).ok()?;
        Some(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }
}

struct InFlight {
    work: Work,
    launched: Instant,
    finished: Option<Instant>,
}

pub(crate) struct Reducer {
    pub comm: Arc<dyn Communicator>,
    pub names: Vec<String>,
    pub params: Vec<Var>,
    pub slots: Vec<Slot>,
    pub buckets: Vec<Bucket>,
    pub reduction: Reduction,
    pub compression: Compression,
    pub find_unused: bool,
    pub trace: Recorder,
    /// ZeRO-1: each bucket is reduce-scattered into this rank's shard instead of all-reduced.
    pub shards: Option<GradShards>,
    pass: Mutex<Pass>,
}

impl Reducer {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        comm: Arc<dyn Communicator>,
        names: Vec<String>,
        params: Vec<Var>,
        slots: Vec<Slot>,
        buckets: Vec<Bucket>,
        reduction: Reduction,
        compression: Compression,
        find_unused: bool,
        trace: Recorder,
        shards: Option<GradShards>,
    ) -> Reducer {
        let n = params.len();
        let pending = buckets.iter().map(|b| b.params.len()).collect();
        let in_flight = buckets.iter().map(|_| None).collect();
        Reducer {
            comm,
            names,
            params,
            slots,
            buckets,
            reduction,
            compression,
            find_unused,
            trace,
            shards,
            pass: Mutex::new(Pass {
                sync: true,
                finishing: false,
                ready: vec![false; n],
                used: vec![false; n],
                pending,
                next_launch: 0,
                in_flight,
                error: None,
                backward_start: None,
                last_ready: None,
                forward: Duration::ZERO,
                step: 0,
                last_stats: None,
                gpu_wait: None,
            }),
        }
    }

    fn pass(&self) -> MutexGuard<'_, Pass> {
        self.pass.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called by the wrapper's forward: whether the coming backward reduces.
    pub fn prepare_forward(&self, sync: bool, forward: Duration) {
        let mut p = self.pass();
        p.sync = sync;
        p.forward = forward;
    }

    /// A failure before backward (the buffer broadcast), returned at the end of backward.
    pub fn record_error(&self, e: DdpError) {
        self.pass().error.get_or_insert(e);
    }

    /// The last step's figures; on a GPU this waits for that step's end of backward on the
    /// device (to read its events), so ask at logging intervals, not every step.
    pub fn last_stats(&self) -> Option<StepStats> {
        let mut p = self.pass();
        if let Some(w) = p.gpu_wait.take() {
            if let (Some(d), Some(s)) = (w.exposed(), p.last_stats.as_mut()) {
                s.exposed_comm = d;
            }
        }
        p.last_stats.clone()
    }

    /// Backward reached the wrapper's output: the model's backward starts now.
    pub fn backward_started(self: &Arc<Self>) {
        let mut p = self.pass();
        if p.sync && p.backward_start.is_none() {
            p.backward_start = Some(Instant::now());
        }
        self.queue_finish(&mut p);
    }

    fn queue_finish(self: &Arc<Self>, p: &mut Pass) {
        if p.sync && !p.finishing && in_backward() {
            p.finishing = true;
            let me = Arc::downgrade(self);
            queue_callback(move || finish_weak(&me));
        }
    }

    /// The gradient-ready hook of parameter `i`.
    pub fn mark_ready(self: &Arc<Self>, i: usize) {
        let mut p = self.pass();
        p.used[i] = true;
        if !p.sync {
            return;
        }
        self.queue_finish(&mut p);
        let now = Instant::now();
        p.backward_start.get_or_insert(now);
        p.last_ready = Some(now);
        if p.ready[i] {
            p.error.get_or_insert(DdpError::GradientTwice(self.names[i].clone()));
            return;
        }
        p.ready[i] = true;
        let b = self.slots[i].bucket;
        p.pending[b] -= 1;
        self.launch_ready(&mut p);
        poll(&mut p, now);
    }

    /// Launches every bucket that is complete, in bucket order (a complete bucket waits for
    /// the ones before it, so every rank issues the same collectives in the same order).
    fn launch_ready(&self, p: &mut Pass) {
        while p.next_launch < self.buckets.len() && p.pending[p.next_launch] == 0 {
            let b = p.next_launch;
            p.next_launch += 1;
            if p.error.is_some() {
                continue;
            }
            match self.launch(b) {
                Ok(work) => {
                    p.in_flight[b] = Some(InFlight { work, launched: Instant::now(), finished: None })
                }
                Err(e) => {
                    p.error.get_or_insert(e);
                }
            }
        }
    }

    fn launch(&self, b: usize) -> crate::Result<Work> {
        let bucket = &self.buckets[b];
        let op = match self.reduction {
            Reduction::Mean => ReduceOp::Avg,
            Reduction::Sum => ReduceOp::Sum,
        };
        if let Some(shards) = &self.shards {
            return Ok(self.comm.reduce_scatter(&shards.buckets[b].grad, &bucket.flat, op)?);
        }
        let work = match (&bucket.compressed, self.compression) {
            (Some(c), Compression::Bf16) => {
                c.copy_(&bucket.flat);
                self.comm.all_reduce(c, op)
            }
            _ => self.comm.all_reduce(&bucket.flat, op),
        };
        Ok(work?)
    }

    /// The end of backward: launches what is left (unused parameters), waits for every
    /// bucket, and points the gradients at the reduced buckets.
    fn finish(&self) -> Result<(), BackwardError> {
        let mut p = self.pass();
        let wait_start = Instant::now();
        let unready: Vec<usize> = (0..self.params.len()).filter(|&i| !p.ready[i]).collect();
        let mut unused_error = None;
        let mut used_map = None;
        if !unready.is_empty() {
            if self.find_unused {
                for &i in &unready {
                    let s = &self.slots[i];
                    // Its slot holds a stale or no gradient: it contributes zero.
                    if self.params[i].grad().is_none() {
                        view_of(&self.buckets[s.bucket].flat, s, self.params[i].dims()).zero_();
                    }
                    p.ready[i] = true;
                    p.pending[s.bucket] -= 1;
                }
                self.launch_ready(&mut p);
            } else {
                unused_error = Some(unused_parameters_error(&self.names, &unready));
            }
        }
        if self.find_unused && p.error.is_none() && unused_error.is_none() {
            // Which parameters any rank used: a parameter unused everywhere keeps no
            // gradient (the optimizer skips it, as in one process).
            let map: Vec<f32> = p.used.iter().map(|&u| if u { 1.0 } else { 0.0 }).collect();
            let device = self.buckets.first().map(|b| b.flat.device()).unwrap_or(Device::Cpu);
            match Tensor::from_vec(map, self.params.len(), Device::Cpu)
                .map_err(tensor_error("the used-parameter map"))
                .and_then(|t| match device {
                    Device::Cpu => Ok(t),
                    d => t.to_device(d).map_err(tensor_error("the used-parameter map")),
                })
                .and_then(|t| Ok(self.comm.all_reduce(&t, ReduceOp::Max).map(|w| (t, w))?))
            {
                Ok((t, w)) => used_map = Some((t, w)),
                Err(e) => {
                    p.error.get_or_insert(e);
                }
            }
        }
        // Wait for every launched bucket, in order, even after a failure, so no collective of
        // this step is left running into the next.
        let mut done_during_backward = 0;
        let last_ready = p.last_ready.unwrap_or(wait_start);
        let device = self.buckets.first().map(|b| b.flat.device()).unwrap_or(Device::Cpu);
        let gpu_before = GpuWait::record(device);
        let mut wait_error = None;
        for b in 0..self.buckets.len() {
            let Some(mut f) = p.in_flight[b].take() else { continue };
            if f.finished.is_none() && f.work.is_completed() {
                f.finished = Some(Instant::now());
            }
            let result = f.work.wait();
            let end = f.finished.unwrap_or_else(Instant::now);
            if end <= last_ready {
                done_during_backward += 1;
            }
            let collective = if self.shards.is_some() { "reduce_scatter" } else { "all_reduce" };
            self.trace.span_with(
                format!("{collective} bucket {b}"),
                "comm",
                f.launched,
                end,
                vec![
                    ("bytes", self.buckets[b].bytes().to_string()),
                    ("params", self.buckets[b].params.len().to_string()),
                ],
            );
            if let Err(e) = result {
                wait_error.get_or_insert(DdpError::from(e));
            }
        }
        let used = match used_map {
            Some((t, w)) => match w.wait() {
                Ok(()) => Some(t.to_device(Device::Cpu).map(|t| t.to_vec::<f32>()).unwrap_or_default()),
                Err(e) => {
                    wait_error.get_or_insert(DdpError::from(e));
                    None
                }
            },
            None => None,
        };
        let wait_end = Instant::now();
        p.gpu_wait = gpu_before.zip(GpuWait::record(device)).map(|(a, b)| GpuWait(a, b));
        if let (Some(shards), None, None, None) = (&self.shards, &p.error, &wait_error, &unused_error) {
            // Every rank must agree on skipping a step for an overflow (the grad scaler), but
            // each sees only its shard: the flag is all-reduced here.
            if let Err(e) = shards.share_overflow(&*self.comm) {
                wait_error = Some(e);
            }
        }
        let error = p.error.take().or(wait_error).map(BackwardError::new).or(unused_error);
        if error.is_none() {
            for bucket in &self.buckets {
                if let (Some(c), Compression::Bf16) = (&bucket.compressed, self.compression) {
                    bucket.flat.copy_(c);
                }
            }
            for &i in &unready {
                let globally_used = used.as_ref().is_none_or(|u| u.get(i).is_some_and(|&v| v > 0.0));
                let s = &self.slots[i];
                if globally_used {
                    self.params[i].set_grad(Some(view_of(
                        &self.buckets[s.bucket].flat,
                        s,
                        self.params[i].dims(),
                    )));
                } else {
                    self.params[i].set_grad(None);
                }
            }
        }
        // The step's figures and trace.
        let start = p.backward_start.unwrap_or(wait_start);
        self.trace.span("backward", "compute", start, wait_end);
        // Up to the last gradient: what backward computed while buckets were in flight.
        self.trace.span("backward compute", "compute", start, last_ready.max(start));
        if wait_end > wait_start {
            self.trace.span("wait for all-reduce", "compute", wait_start, wait_end);
        }
        let stats = StepStats {
            step: p.step,
            forward: p.forward,
            backward: wait_end - start,
            exposed_comm: wait_end - wait_start,
            buckets: self.buckets.len(),
            bytes: self.buckets.iter().map(Bucket::bytes).sum(),
            buckets_done_during_backward: done_during_backward,
        };
        p.last_stats = Some(stats);
        p.step += 1;
        // Ready for the next pass.
        p.finishing = false;
        p.ready.iter_mut().for_each(|r| *r = false);
        p.used.iter_mut().for_each(|u| *u = false);
        for (b, bucket) in self.buckets.iter().enumerate() {
            p.pending[b] = bucket.params.len();
        }
        p.next_launch = 0;
        p.backward_start = None;
        p.last_ready = None;
        error.map_or(Ok(()), Err)
    }
}

fn finish_weak(me: &Weak<Reducer>) -> Result<(), BackwardError> {
    match me.upgrade() {
        Some(r) => r.finish(),
        // The wrapper was dropped during backward: nothing left to reduce.
        None => Ok(()),
    }
}

/// Notes buckets that finished since the last look (for the trace and the figures).
fn poll(p: &mut Pass, now: Instant) {
    for f in p.in_flight.iter_mut().flatten() {
        if f.finished.is_none() && f.work.is_completed() {
            f.finished = Some(now);
        }
    }
}

fn unused_parameters_error(names: &[String], unready: &[usize]) -> BackwardError {
    const SHOWN: usize = 8;
    let mut list: Vec<String> = unready.iter().take(SHOWN).map(|&i| format!("`{}`", names[i])).collect();
    if unready.len() > SHOWN {
        list.push(format!("and {} more", unready.len() - SHOWN));
    }
    BackwardError::new(format!(
        "DDP: {} of {} parameters got no gradient in this backward pass: {}. Every parameter must take part \
         in the loss on every rank, or DDP waits for gradients that never come. If some are unused on purpose \
         (a branch not taken, a frozen head), wrap the model with \
         DdpConfig {{ find_unused_parameters: true, .. }}",
        unready.len(),
        names.len(),
        list.join(", ")
    ))
}

/// Whether `dtype` can be all-reduced (the reducer only buckets floating-point parameters).
pub(crate) fn reducible(dtype: DType) -> bool {
    dtype.is_float()
}
