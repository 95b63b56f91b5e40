//! "Hosts" on one machine: each a network namespace with its own address on a private /24,
//! joined by veth pairs to a bridge that lives in a namespace of its own (the switch), so
//! nothing is added to the machine's own network and no traffic leaves the namespaces.
//!
//! A [`Net`] removes its namespaces (and ends the processes the test started in them) when it
//! is dropped, also when the test panics. Names carry the test process's pid, so a later run
//! removes what a killed run left behind ([`sweep_stale`]); `scripts/netns/sweep.sh` does
//! the same by hand.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Every namespace of these tests is named `oxtnet-<pid>-<n>-...`.
const PREFIX: &str = "oxtnet-";
/// The hosts' subnet: host i is 10.77.0.(i+1). It exists only inside the namespaces.
const SUBNET: &str = "10.77.0";

static NETS: AtomicUsize = AtomicUsize::new(0);

/// Runs `ip ARGS`, returning its stdout or a message with its stderr.
fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Why namespaces cannot be made here, if they cannot.
fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("network namespaces need root (run the tests as root, or in CI)".into());
    }
    if let Err(e) = ip(&["netns", "list"]) {
        return Some(format!("`ip netns` is not available ({e}): install iproute2"));
    }
    None
}

/// Whether the namespace tests can run; prints why not. Under `CI=true` they must run, so a
/// missing prerequisite fails the test instead.
pub fn available(test: &str) -> bool {
    match unavailable() {
        None => true,
        Some(why) if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") => {
            panic!("{test}: CI=true but the namespace tests cannot run: {why}")
        }
        Some(why) => {
            eprintln!("SKIPPED {test}: {why}");
            false
        }
    }
}

/// Namespaces `oxtnet-<pid>-...` whose test process is gone (a run killed before its guards
/// ran): their processes are ended and the namespaces deleted.
pub fn sweep_stale() {
    let Ok(list) = ip(&["netns", "list"]) else { return };
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(rest) = name.strip_prefix(PREFIX) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            kill_all_in(name);
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// Ends the processes running in namespace `ns` (only tests' processes run there).
fn kill_all_in(ns: &str) {
    for _ in 0..3 {
        let pids = ip(&["netns", "pids", ns]).unwrap_or_default();
        let pids: Vec<i32> = pids.lines().filter_map(|p| p.trim().parse().ok()).collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            // SAFETY: a plain signal to a process of our namespace.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// One "host": a namespace with an address.
pub struct Host {
    pub ns: String,
    pub addr: String,
}

/// `n` hosts on one switch; removed when dropped.
pub struct Net {
    pub hosts: Vec<Host>,
    switch: String,
    /// Every namespace made so far, removed in [`Drop`] (filled as they are made, so a
    /// failure half-way through setting up still removes what exists).
    made: Vec<String>,
}

impl Net {
    /// Makes `n` hosts 10.77.0.1..n, each with `eth0` on the switch's bridge and `lo` up.
    pub fn new(n: usize) -> Net {
        sweep_stale();
        let id = format!("{PREFIX}{}-{}", std::process::id(), NETS.fetch_add(1, Ordering::SeqCst));
        let mut net = Net { hosts: vec![], switch: format!("{id}-sw"), made: vec![] };
        net.add_ns(&net.switch.clone());
        let sw = net.switch.clone();
        must(ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"]));
        must(ip(&["-n", &sw, "link", "set", "br0", "up"]));
        for i in 0..n {
            let ns = format!("{id}-h{i}");
            net.add_ns(&ns);
            let port = format!("p{i}");
            // Both ends are made inside their namespaces: nothing appears in the machine's own.
            must(ip(&[
                "link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", &port, "netns", &sw,
            ]));
            must(ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"]));
            let addr = format!("{SUBNET}.{}", i + 1);
            must(ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"]));
            must(ip(&["-n", &ns, "link", "set", "eth0", "up"]));
            must(ip(&["-n", &ns, "link", "set", "lo", "up"]));
            net.hosts.push(Host { ns, addr });
        }
        net
    }

    fn add_ns(&mut self, ns: &str) {
        must(ip(&["netns", "add", ns]));
        self.made.push(ns.to_string());
    }

    /// `program` to be run on host `i`: in its namespace, under its own host name (the
    /// namespace's name, in a UTS namespace of its own, as on a separate machine).
    pub fn command(&self, i: usize, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.hosts[i].ns, "unshare", "--uts", "sh", "-c"])
            .arg(r#"hostname "$0" && exec "$@""#)
            .arg(&self.hosts[i].ns)
            .arg(program);
        c
    }

    /// `ADDR=NAMESPACE,...` for `scripts/netns/rsh-agent.sh` (the mpirun tests).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub fn host_map(&self) -> String {
        self.hosts.iter().map(|h| format!("{}={}", h.addr, h.ns)).collect::<Vec<_>>().join(",")
    }

    /// Cuts host `i` off: its end of the veth goes down, so its packets go nowhere and the
    /// others' packets to it are lost (no reset: peers see silence, as with a dead link).
    pub fn cut(&self, i: usize) {
        must(ip(&["-n", &self.hosts[i].ns, "link", "set", "eth0", "down"]));
    }

    /// Bytes received and sent on host `i`'s `eth0` (traffic between hosts, never loopback).
    pub fn eth0_bytes(&self, i: usize) -> (u64, u64) {
        let out = must(ip(&["-n", &self.hosts[i].ns, "-s", "link", "show", "eth0"]));
        // "RX: bytes packets ..." then the figures, then the same for TX.
        let figures: Vec<u64> = out
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("RX:"))
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect();
        (figures.first().copied().unwrap_or(0), figures.get(1).copied().unwrap_or(0))
    }
}

fn must(r: Result<String, String>) -> String {
    r.unwrap_or_else(|e| panic!("setting up the network namespaces: {e}"))
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.made.iter().rev() {
            kill_all_in(ns);
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("netns cleanup: {e}");
            }
        }
    }
}
