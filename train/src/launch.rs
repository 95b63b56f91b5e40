//! `oxtrain launch`: starts this node's workers with torchrun's variables (RANK, WORLD_SIZE,
//! LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR,
//! MASTER_PORT), forwards SIGINT and SIGTERM to them, and when one fails stops the others
//! and says which one failed and how.
//!
//! Workers run in their own process group, so a Ctrl-C on the terminal reaches the launcher
//! alone, which passes it on once to every worker.
//!
//! Elastic restart (`--max-restarts N`, torchrun's flag): when a worker dies (a non-zero exit,
//! a signal, or an exit after a communicator timeout) the others are stopped and waited for,
//! and all are started again, up to N times, with `TORCHELASTIC_RESTART_COUNT` counting the
//! restarts; `oxtrain train` workers get `checkpoint.resume=latest`, so the run goes on from
//! its newest valid checkpoint. Each launcher restarts the workers of its own node. With
//! `--min-nproc M` (one node) each restart starts one worker fewer, down to M: the lost worker
//! stays lost (a failed GPU), and `train` resumes its checkpoint on the smaller world.

use std::ffi::OsString;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where this node's workers sit in the job, and what they run.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    pub nproc_per_node: usize,
    pub nnodes: usize,
    pub node_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// `OXTRAIN_COMM_BACKEND` for the workers, when set.
    pub backend: Option<String>,
    /// The program and its arguments (an oxtrain subcommand is run with this executable).
    pub command: Vec<OsString>,
    /// How long workers get to exit after SIGTERM before they are killed.
    pub grace: Duration,
    /// Times the workers are restarted after one of them dies (0: the launch fails then).
    pub max_restarts: usize,
    /// With restarts: after a worker dies start one fewer, down to this many (None: as many).
    pub min_nproc: Option<usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{0}")]
    Usage(String),
    #[error("cannot start worker {local_rank} ({program}): {source}")]
    Spawn {
        local_rank: usize,
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("worker {local_rank} (rank {rank}, pid {pid}) {how}; stopped the other workers{}", restarts_note(*.restarts))]
    WorkerFailed { local_rank: usize, rank: usize, pid: u32, how: String, code: i32, restarts: usize },
    #[error("stopped by signal {signal}: forwarded it to every worker{}", if *.clean { "; all exited" } else { "; killed those that did not exit in time" })]
    Interrupted { signal: i32, clean: bool },
}

fn restarts_note(restarts: usize) -> String {
    match restarts {
        0 => String::new(),
        n => format!(" (after {n} restart(s), all that --max-restarts allows)"),
    }
}

impl LaunchError {
    /// The launcher's exit status: the failed worker's, or 128 + signal.
    pub fn exit_code(&self) -> i32 {
        match self {
            LaunchError::Usage(_) => 2,
            LaunchError::Spawn { .. } => 1,
            LaunchError::WorkerFailed { code, .. } => *code,
            LaunchError::Interrupted { signal, .. } => 128 + signal,
        }
    }
}

/// The oxtrain subcommands: run with this executable rather than looked up on PATH.
const SUBCOMMANDS: [&str; 3] = ["train", "eval", "config"];

/// The variable a worker finds this node's launcher in ([`LaunchSpec::launcher_words`]), so a
/// run stopped by a signal can print the command that continues it.
pub const LAUNCH_COMMAND_VAR: &str = "OXTRAIN_LAUNCH_COMMAND";

impl LaunchSpec {
    /// `oxtrain launch` with this node's options (those left at their defaults left out), up
    /// to the `--` before the workers' command.
    pub fn launcher_words(&self) -> String {
        let mut words = format!("oxtrain launch --nproc-per-node {}", self.nproc_per_node);
        if self.nnodes > 1 {
            words += &format!(" --nnodes {} --node-rank {}", self.nnodes, self.node_rank);
        }
        if self.master_addr != "127.0.0.1" {
            words += &format!(" --master-addr {}", self.master_addr);
        }
        if self.master_port != 29500 {
            words += &format!(" --master-port {}", self.master_port);
        }
        if let Some(b) = &self.backend {
            words += &format!(" --backend {b}");
        }
        words
    }

    fn check(&self) -> Result<(), LaunchError> {
        let usage = |m: String| Err(LaunchError::Usage(m));
        if self.nproc_per_node == 0 {
            return usage("--nproc-per-node must be at least 1 (one worker per GPU, or CPU workers)".into());
        }
        if self.nnodes == 0 {
            return usage("--nnodes must be at least 1".into());
        }
        if self.node_rank >= self.nnodes {
            return usage(format!("--node-rank {} must be below --nnodes {}", self.node_rank, self.nnodes));
        }
        if let Some(min) = self.min_nproc {
            if min == 0 || min > self.nproc_per_node {
                return usage(format!(
                    "--min-nproc {min} must be between 1 and --nproc-per-node {}",
                    self.nproc_per_node
                ));
            }
            if self.nnodes > 1 {
                return usage(
                    "--min-nproc shrinks one node's workers, and with --nnodes > 1 every node would have to \
                     agree on the new world size: use it with one node"
                        .into(),
                );
            }
            if self.max_restarts == 0 {
                return usage("--min-nproc acts at a restart: give --max-restarts too".into());
            }
        }
        if self.command.is_empty() {
            return usage("nothing to run: put the command after `--`, e.g. `oxtrain launch --nproc-per-node 2 -- train`".into());
        }
        Ok(())
    }

    /// The environment of local worker `local_rank` (at the first start).
    pub fn worker_env(&self, local_rank: usize) -> Vec<(String, String)> {
        self.worker_env_at(local_rank, 0)
    }

    /// The environment of local worker `local_rank` after `restart` restarts.
    pub fn worker_env_at(&self, local_rank: usize, restart: usize) -> Vec<(String, String)> {
        let world = self.nnodes * self.nproc_per_node;
        let rank = self.node_rank * self.nproc_per_node + local_rank;
        let mut env = vec![
            ("RANK".into(), rank.to_string()),
            ("WORLD_SIZE".into(), world.to_string()),
            ("LOCAL_RANK".into(), local_rank.to_string()),
            ("LOCAL_WORLD_SIZE".into(), self.nproc_per_node.to_string()),
            ("GROUP_RANK".into(), self.node_rank.to_string()),
            ("GROUP_WORLD_SIZE".into(), self.nnodes.to_string()),
            ("ROLE_RANK".into(), rank.to_string()),
            ("ROLE_WORLD_SIZE".into(), world.to_string()),
            ("MASTER_ADDR".into(), self.master_addr.clone()),
            ("MASTER_PORT".into(), self.master_port.to_string()),
            ("TORCHELASTIC_RESTART_COUNT".into(), restart.to_string()),
            ("TORCHELASTIC_MAX_RESTARTS".into(), self.max_restarts.to_string()),
        ];
        if let Some(b) = &self.backend {
            env.push(("OXTRAIN_COMM_BACKEND".into(), b.clone()));
        }
        env.push((LAUNCH_COMMAND_VAR.into(), self.launcher_words()));
        // CPU workers share the cores: each gets its share of threads unless told otherwise.
        if self.nproc_per_node > 1 && std::env::var_os("RAYON_NUM_THREADS").is_none() {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            env.push(("RAYON_NUM_THREADS".into(), (cores / self.nproc_per_node).max(1).to_string()));
        }
        env
    }

    fn command_for(&self, local_rank: usize, restart: usize) -> Result<Command, LaunchError> {
        let first = self.command[0].to_string_lossy().into_owned();
        let mut cmd = if SUBCOMMANDS.contains(&first.as_str()) {
            let exe = std::env::current_exe().map_err(|source| LaunchError::Spawn {
                local_rank,
                program: "oxtrain".into(),
                source,
            })?;
            let mut c = Command::new(exe);
            c.args(&self.command);
            if restart > 0 && first == "train" {
                // Last, so it wins over a resume among the user's overrides.
                c.arg("checkpoint.resume=latest");
            }
            c
        } else {
            let mut c = Command::new(&self.command[0]);
            c.args(&self.command[1..]);
            c
        };
        cmd.envs(self.worker_env_at(local_rank, restart));
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        Ok(cmd)
    }
}

struct Worker {
    local_rank: usize,
    rank: usize,
    child: Child,
    status: Option<ExitStatus>,
}

fn describe(status: ExitStatus) -> (String, i32) {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return (format!("was killed by signal {sig}"), 128 + sig);
        }
    }
    let code = status.code().unwrap_or(1);
    (format!("exited with status {code}"), code)
}

fn killed_by_signal(status: ExitStatus) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        status.signal().is_some()
    }
    #[cfg(not(unix))]
    {
        let _ = status;
        false
    }
}

fn signal(workers: &[Worker], sig: i32) {
    for w in workers.iter().filter(|w| w.status.is_none()) {
        // SAFETY: kill(2) on a child's pid we still own (not yet reaped).
        unsafe {
            libc::kill(w.child.id() as libc::pid_t, sig);
        }
    }
}

/// Sends `sig` to the running workers, waits up to `grace` for them, kills the rest. Returns
/// whether all exited on their own.
fn stop_all(workers: &mut [Worker], sig: i32, grace: Duration) -> bool {
    signal(workers, sig);
    let deadline = Instant::now() + grace;
    loop {
        poll(workers);
        if workers.iter().all(|w| w.status.is_some()) {
            return true;
        }
        if Instant::now() >= deadline {
            signal(workers, libc::SIGKILL);
            for w in workers.iter_mut().filter(|w| w.status.is_none()) {
                w.status = w.child.wait().ok();
            }
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn poll(workers: &mut [Worker]) {
    for w in workers.iter_mut().filter(|w| w.status.is_none()) {
        if let Ok(Some(s)) = w.child.try_wait() {
            w.status = Some(s);
        }
    }
}

/// Runs the workers to the end, restarting them all up to `max_restarts` times when one dies.
/// Ok when every worker of the last start exited with status 0.
pub fn launch(spec: &LaunchSpec) -> Result<(), LaunchError> {
    spec.check()?;
    let pending = Arc::new(AtomicUsize::new(0));
    for sig in [libc::SIGINT, libc::SIGTERM] {
        signal_hook::flag::register_usize(sig, pending.clone(), sig as usize)
            .map_err(|e| LaunchError::Usage(format!("cannot catch signal {sig}: {e}")))?;
    }
    let mut restart = 0;
    let mut spec = spec.clone();
    loop {
        match run_workers(&spec, restart, &pending) {
            Err(LaunchError::WorkerFailed { local_rank, rank, how, .. }) if restart < spec.max_restarts => {
                restart += 1;
                let lost = spec.min_nproc.is_some_and(|min| spec.nproc_per_node > min);
                if lost {
                    spec.nproc_per_node -= 1;
                }
                let what = match lost {
                    true => format!(
                        "continuing with {} workers (--min-nproc {})",
                        spec.nproc_per_node,
                        spec.min_nproc.unwrap_or(0)
                    ),
                    false => format!("starting all {} workers again", spec.nproc_per_node),
                };
                eprintln!(
                    "oxtrain launch: worker {local_rank} (rank {rank}) {how}; the other workers are stopped; restart \
                     {restart} of {}: {what} from the latest valid checkpoint",
                    spec.max_restarts
                );
            }
            Err(LaunchError::WorkerFailed { local_rank, rank, pid, how, code, .. }) => {
                return Err(LaunchError::WorkerFailed { local_rank, rank, pid, how, code, restarts: restart })
            }
            other => return other,
        }
    }
}

/// One start of every worker, watched to the end.
fn run_workers(spec: &LaunchSpec, restart: usize, pending: &AtomicUsize) -> Result<(), LaunchError> {
    let mut workers: Vec<Worker> = Vec::with_capacity(spec.nproc_per_node);
    for local_rank in 0..spec.nproc_per_node {
        let spawned = spec.command_for(local_rank, restart).and_then(|mut c| {
            c.spawn().map_err(|source| LaunchError::Spawn {
                local_rank,
                program: spec.command[0].to_string_lossy().into_owned(),
                source,
            })
        });
        match spawned {
            Ok(child) => workers.push(Worker {
                local_rank,
                rank: spec.node_rank * spec.nproc_per_node + local_rank,
                child,
                status: None,
            }),
            Err(e) => {
                stop_all(&mut workers, libc::SIGTERM, spec.grace);
                return Err(e);
            }
        }
    }
    loop {
        let sig = pending.swap(0, Ordering::SeqCst);
        if sig != 0 {
            let clean = stop_all(&mut workers, sig as i32, spec.grace);
            return Err(LaunchError::Interrupted { signal: sig as i32, clean });
        }
        poll(&mut workers);
        // A worker killed by a signal is named before those that exited with an error in the
        // same poll: these are usually its peers, ending on their communicator's error about it.
        let failed = workers
            .iter()
            .filter(|w| w.status.is_some_and(|s| !s.success()))
            .min_by_key(|w| !w.status.is_some_and(killed_by_signal));
        if let Some(w) = failed {
            let (how, code) = describe(w.status.expect("found by its status"));
            let (local_rank, rank, pid) = (w.local_rank, w.rank, w.child.id());
            eprintln!("oxtrain launch: worker {local_rank} (rank {rank}) {how}; stopping the other workers");
            stop_all(&mut workers, libc::SIGTERM, spec.grace);
            return Err(LaunchError::WorkerFailed { local_rank, rank, pid, how, code, restarts: 0 });
        }
        if workers.iter().all(|w| w.status.is_some()) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
