//! Processes of a namespace test: started with their output captured, watched against a
//! hard deadline, killed past it (a hang fails the test, it never blocks it).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A started process whose stdout and stderr are read into one shared text as they come, a
/// whole line at a time, so a line of one stream is never split by the other.
pub struct Proc {
    pub name: String,
    child: Child,
    text: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

/// How a process ended.
pub struct Ended {
    pub name: String,
    pub success: bool,
    /// Whether it was killed at the deadline.
    pub killed: bool,
    pub output: String,
    /// When it ended, from the start of the wait.
    pub after: Duration,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command) -> Proc {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let text = Arc::new(Mutex::new(String::new()));
        let mut readers = vec![];
        let pipes: Vec<Box<dyn Read + Send>> =
            vec![Box::new(child.stdout.take().unwrap()), Box::new(child.stderr.take().unwrap())];
        for pipe in pipes {
            let text = text.clone();
            readers.push(std::thread::spawn(move || {
                let mut pipe = BufReader::new(pipe);
                let mut line = vec![];
                // The last line may lack its newline: it is pushed as it is at the end.
                while matches!(pipe.read_until(b'\n', &mut line), Ok(n) if n > 0) {
                    text.lock().unwrap().push_str(&String::from_utf8_lossy(&line));
                    line.clear();
                }
            }));
        }
        Proc { name: name.to_string(), child, text, readers }
    }

    /// The output so far.
    pub fn output(&self) -> String {
        self.text.lock().unwrap().clone()
    }

    /// Waits until the output contains `needle`, up to `limit`; false when it did not come.
    pub fn wait_for(&self, needle: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.output().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

/// Waits for every process, killing those still running at `limit` from now.
pub fn wait_all(procs: Vec<Proc>, limit: Duration) -> Vec<Ended> {
    let start = Instant::now();
    let mut ended: Vec<Option<Ended>> = procs.iter().map(|_| None).collect();
    let mut procs: Vec<Option<Proc>> = procs.into_iter().map(Some).collect();
    loop {
        let mut running = 0;
        for (slot, done) in procs.iter_mut().zip(ended.iter_mut()) {
            let Some(p) = slot else { continue };
            let status = p.child.try_wait().expect("waiting for a test process");
            let killed = status.is_none() && start.elapsed() > limit;
            if killed {
                let _ = p.child.kill();
            }
            let status = match status {
                Some(s) => Some(s),
                None if killed => Some(p.child.wait().expect("waiting for a killed process")),
                None => None,
            };
            match status {
                None => running += 1,
                Some(s) => {
                    let mut p = slot.take().unwrap();
                    for r in p.readers.drain(..) {
                        let _ = r.join();
                    }
                    *done = Some(Ended {
                        name: p.name.clone(),
                        success: s.success() && !killed,
                        killed,
                        output: p.output(),
                        after: start.elapsed(),
                    });
                }
            }
        }
        if running == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ended.into_iter().map(Option::unwrap).collect()
}

/// Everything the processes printed, for a failing assertion's message.
pub fn all_output(ended: &[Ended]) -> String {
    ended
        .iter()
        .map(|e| {
            format!(
                "--- {} (success {}, killed {}, after {:?}):\n{}",
                e.name, e.success, e.killed, e.after, e.output
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
