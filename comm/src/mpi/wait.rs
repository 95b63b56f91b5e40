//! Waiting on an MPI request with a timeout, and the report that names the missing ranks.
//!
//! MPI has no timeout on a collective and cannot say which ranks entered one, so each
//! collective is started as an immediate operation and polled here. When the timeout passes,
//! the ranks that timed out tell each other (on a separate communicator) which call they are
//! stuck in; a peer that says nothing within a short grace is the one named as missing.

use mpi::request::{Request, Scope, StaticScope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::time::{Duration, Instant};

/// The collectives, as numbers a peer can send in its report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    AllReduce = 1,
    Reduce = 2,
    ReduceScatter = 3,
    AllGather = 4,
    Broadcast = 5,
    Barrier = 6,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::Reduce => "reduce",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
            Op::Broadcast => "broadcast",
            Op::Barrier => "barrier",
        }
    }

    fn from_code(c: u64) -> Option<Op> {
        [Op::AllReduce, Op::Reduce, Op::ReduceScatter, Op::AllGather, Op::Broadcast, Op::Barrier]
            .into_iter()
            .find(|op| *op as u64 == c)
    }
}

/// How long polling runs without pause: Open MPI moves a collective forward only inside
/// `MPI_Test` (it has no progress thread by default), so a short collective must not wait
/// on sleeps. Past this, the poll sleeps between tests so a rank waiting for a late peer
/// does not burn a core.
const SPIN: Duration = Duration::from_millis(2);
const FIRST_PAUSE: Duration = Duration::from_micros(50);
const MAX_PAUSE: Duration = Duration::from_micros(200);

/// Polls `req` until it completes (true) or `timeout` passes (false).
///
/// On false the request is still active inside MPI and may yet read or write its buffers:
/// the caller must leak them (`std::mem::forget`) and never use the communicator again.
pub(crate) fn poll<'a, D: ?Sized, S: Scope<'a>>(mut req: Request<'a, D, S>, timeout: Duration) -> bool {
    let start = Instant::now();
    let mut pause = FIRST_PAUSE;
    loop {
        req = match req.test() {
            Ok(_) => return true,
            Err(req) => req,
        };
        let waited = start.elapsed();
        if waited >= timeout {
            // SAFETY: this only unregisters the request from its scope (so the scope does not
            // abort the process) and drops the handle; the operation stays active in MPI, and
            // the caller keeps its buffers alive forever by leaking them, as documented above.
            let _ = unsafe { req.into_raw() };
            return false;
        }
        if waited > SPIN {
            std::thread::sleep(pause);
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }
}

/// Tag of the stuck reports on the side communicator (nothing else is sent there).
const STUCK_TAG: i32 = 7_401;

/// What a peer said after its own timeout: the number of its call (counted from 1 on this
/// communicator) and the collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stuck {
    pub seq: u64,
    pub op: Option<Op>,
}

/// After this rank's timeout in call `mine`: tells every peer so, and collects the same
/// from peers for at most `grace` (reports of peers that timed out earlier are already
/// queued). Returns each rank's report (`None` for silent peers and for this rank).
pub(crate) fn exchange_stuck(
    side: &SimpleCommunicator,
    me: usize,
    mine: Stuck,
    grace: Duration,
) -> Vec<Option<Stuck>> {
    let size = side.size() as usize;
    // The message must outlive sends that may never complete (a peer that never receives).
    let msg: &'static [u64; 2] = Box::leak(Box::new([mine.seq, mine.op.map_or(0, |op| op as u64)]));
    for r in (0..size).filter(|&r| r != me) {
        let req = side.process_at_rank(r as i32).immediate_send_with_tag(StaticScope, &msg[..], STUCK_TAG);
        // Small messages go out eagerly; a send still pending is left to MPI. SAFETY: its
        // buffer is 'static (leaked above), so MPI may finish it whenever it likes.
        if let Err(req) = req.test() {
            let _ = unsafe { req.into_raw() };
        }
    }
    let mut reports = vec![None; size];
    let deadline = Instant::now() + grace;
    let mut heard = 0;
    while heard < size - 1 && Instant::now() < deadline {
        match side.any_process().immediate_matched_probe_with_tag(STUCK_TAG) {
            Some(probed) => {
                let (v, status) = probed.matched_receive_vec::<u64>();
                let from = status.source_rank() as usize;
                if v.len() == 2 && from < size && reports[from].is_none() {
                    reports[from] = Some(Stuck { seq: v[0], op: Op::from_code(v[1]) });
                    heard += 1;
                }
            }
            None => std::thread::sleep(Duration::from_micros(200)),
        }
    }
    reports
}

/// How long a timed-out rank listens for its peers' reports: peers that entered the same
/// call up to this much later than this rank also time out within it.
pub(crate) fn grace(timeout: Duration) -> Duration {
    (timeout / 10).clamp(Duration::from_millis(500), Duration::from_secs(10))
}

/// The ranks to name as missing and the hint of the timeout error, from the reports.
pub(crate) fn describe(
    me: usize,
    mine: Stuck,
    reports: &[Option<Stuck>],
    timeout: Duration,
    grace: Duration,
) -> (Vec<usize>, String) {
    let peers = (0..reports.len()).filter(|&r| r != me);
    let same: Vec<usize> = peers.clone().filter(|&r| reports[r] == Some(mine)).collect();
    let missing: Vec<usize> = peers.clone().filter(|&r| reports[r] != Some(mine)).collect();
    let mut hint = String::new();
    if !same.is_empty() {
        hint += &format!("rank(s) {same:?} reported being stuck in this same call; ");
    }
    for r in peers.clone().filter(|&r| reports[r].is_some() && reports[r] != Some(mine)) {
        let s = reports[r].expect("filtered on is_some");
        let op = s.op.map_or("an unknown collective", Op::name);
        hint += &format!("rank {r} reported being stuck in its call #{} ({op}); ", s.seq);
    }
    let silent: Vec<usize> = peers.filter(|&r| reports[r].is_none()).collect();
    if !silent.is_empty() {
        hint += &format!(
            "rank(s) {silent:?} sent no report within {grace:?} after this rank's timeout, so they \
             never entered this call, are blocked outside this communicator, or reached it much \
             later; "
        );
    }
    if missing.is_empty() {
        hint += "every rank is stuck in this call, so the ranks' calls probably disagree in size, \
                 dtype or root; ";
    }
    let me_op = mine.op.map_or("collective", Op::name);
    hint += &format!(
        "(MPI cannot tell which ranks entered a collective: the ranks named are those that did \
         not report being stuck in this rank's call #{} ({me_op}).) Check that every rank calls \
         the same collectives in the same order with the same sizes (OXTRAIN_COMM_CHECK=1 \
         checks it) and that none is hung elsewhere, or raise the timeout (CommOptions::timeout \
         or OXTRAIN_COMM_TIMEOUT=<seconds>, now {:.3} s). MPI cannot cancel a collective, so \
         this communicator is unusable from now on (as NCCL's after a timeout): end the job",
        mine.seq,
        timeout.as_secs_f64()
    );
    (missing, hint)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seq: u64, op: Op) -> Option<Stuck> {
        Some(Stuck { seq, op: Some(op) })
    }

    #[test]
    fn names_the_silent_and_the_mismatched_ranks_as_missing() {
        let mine = Stuck { seq: 5, op: Some(Op::AllReduce) };
        let reports = [None, at(5, Op::AllReduce), None, at(5, Op::Barrier)];
        let (missing, hint) =
            describe(0, mine, &reports, Duration::from_secs(2), grace(Duration::from_secs(2)));
        assert_eq!(missing, vec![2, 3]);
        assert!(hint.contains("rank(s) [1] reported being stuck in this same call"), "{hint}");
        assert!(hint.contains("rank 3 reported being stuck in its call #5 (barrier)"), "{hint}");
        assert!(hint.contains("rank(s) [2] sent no report within 500ms"), "{hint}");
        assert!(hint.contains("call #5 (all_reduce)"), "{hint}");
        assert!(hint.contains("unusable"), "{hint}");
    }

    #[test]
    fn every_rank_stuck_in_the_same_call_points_at_mismatched_arguments() {
        let mine = Stuck { seq: 2, op: Some(Op::Broadcast) };
        let reports = [at(2, Op::Broadcast), None];
        let (missing, hint) =
            describe(1, mine, &reports, Duration::from_secs(300), grace(Duration::from_secs(300)));
        assert!(missing.is_empty());
        assert!(hint.contains("disagree in size"), "{hint}");
    }

    #[test]
    fn grace_is_a_tenth_of_the_timeout_within_bounds() {
        assert_eq!(grace(Duration::from_secs(2)), Duration::from_millis(500));
        assert_eq!(grace(Duration::from_secs(30)), Duration::from_secs(3));
        assert_eq!(grace(Duration::from_secs(300)), Duration::from_secs(10));
    }
}
