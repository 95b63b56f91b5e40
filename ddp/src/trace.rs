//! What a DDP step did and when: spans of forward, backward, each bucket's all-reduce and the
//! optimizer, written as Chrome trace JSON (opens in Perfetto or chrome://tracing), and the
//! per-step figures the trainer logs ([`StepStats`]).
//!
//! Timestamps are host times. On CPU backends a bucket's all-reduce runs on the
//! communicator's worker thread, so its span runs from the launch to the moment the reducer
//! saw it finished (polled as backward goes on, or waited for at its end). The exposed
//! communication of a step is the time the end of backward spent waiting for buckets: the
//! part of the all-reduces that backward's compute did not hide.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// At most this many events are kept (a long run keeps its first steps), so tracing a whole
/// run cannot grow without bound.
const MAX_EVENTS: usize = 200_000;

/// Figures of one synchronised step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepStats {
    /// Steps counted from 0 (synchronised backward passes).
    pub step: u64,
    /// The wrapped forward.
    pub forward: Duration,
    /// From the start of the model's backward to the end of the reducer's wait.
    pub backward: Duration,
    /// Time the end of backward waited for all-reduces (communication not hidden by compute).
    pub exposed_comm: Duration,
    /// Buckets reduced, and their bytes.
    pub buckets: usize,
    pub bytes: usize,
    /// Buckets whose all-reduce had finished before backward's last gradient was ready.
    pub buckets_done_during_backward: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub name: String,
    /// "compute" or "comm": the track it is drawn on.
    pub track: &'static str,
    pub start: Instant,
    pub end: Instant,
    pub args: Vec<(&'static str, String)>,
}

/// Records spans when on; `enabled == false` records nothing (but [`StepStats`] are kept).
pub(crate) struct Recorder {
    enabled: std::sync::atomic::AtomicBool,
    rank: usize,
    origin: (Instant, SystemTime),
    events: Mutex<Vec<Event>>,
    dropped: Mutex<usize>,
}

impl Recorder {
    pub fn new(rank: usize, enabled: bool) -> Recorder {
        Recorder {
            enabled: std::sync::atomic::AtomicBool::new(enabled),
            rank,
            origin: (Instant::now(), SystemTime::now()),
            events: Mutex::new(Vec::new()),
            dropped: Mutex::new(0),
        }
    }

    pub fn span(&self, name: impl Into<String>, track: &'static str, start: Instant, end: Instant) {
        self.span_with(name, track, start, end, Vec::new());
    }

    pub fn span_with(
        &self,
        name: impl Into<String>,
        track: &'static str,
        start: Instant,
        end: Instant,
        args: Vec<(&'static str, String)>,
    ) {
        if !self.enabled.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        if events.len() >= MAX_EVENTS {
            *self.dropped.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            return;
        }
        events.push(Event { name: name.into(), track, start, end, args });
    }

    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Microseconds since the Unix epoch, so the traces of several ranks line up.
    fn micros(&self, t: Instant) -> f64 {
        let base = self.origin.1.duration_since(UNIX_EPOCH).unwrap_or_default();
        let since = t.saturating_duration_since(self.origin.0);
        (base + since).as_secs_f64() * 1e6
    }

    /// The events as Chrome trace JSON ("X" complete events; one process per rank, one
    /// thread per track).
    pub fn to_json(&self) -> String {
        let events = self.events();
        let mut out = Vec::with_capacity(events.len() + 3);
        let meta = |tid: usize, name: &str| serde_json::json!({"ph": "M", "name": "thread_name", "pid": self.rank, "tid": tid, "args": {"name": name}});
        out.push(serde_json::json!({"ph": "M", "name": "process_name", "pid": self.rank,
            "args": {"name": format!("rank {}", self.rank)}}));
        out.push(meta(0, "compute"));
        out.push(meta(1, "comm"));
        for e in &events {
            let args: serde_json::Map<String, serde_json::Value> =
                e.args.iter().map(|(k, v)| (k.to_string(), serde_json::Value::String(v.clone()))).collect();
            out.push(serde_json::json!({
                "name": e.name, "ph": "X", "pid": self.rank, "tid": usize::from(e.track == "comm"),
                "ts": self.micros(e.start),
                "dur": e.end.saturating_duration_since(e.start).as_secs_f64() * 1e6,
                "args": args,
            }));
        }
        let dropped = *self.dropped.lock().unwrap_or_else(|e| e.into_inner());
        serde_json::json!({"traceEvents": out, "otherData": {"dropped_events": dropped}}).to_string()
    }

    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut f = std::fs::File::create(path)?;
        f.write_all(self.to_json().as_bytes())?;
        f.sync_all()
    }
}

/// `trace.json` for one rank, `trace.rank3.json` for rank 3 of several.
pub(crate) fn rank_path(path: &Path, rank: usize, world: usize) -> PathBuf {
    if world == 1 {
        return path.to_path_buf();
    }
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "trace".into());
    let name = match path.extension() {
        Some(ext) => format!("{stem}.rank{rank}.{}", ext.to_string_lossy()),
        None => format!("{stem}.rank{rank}"),
    };
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chrome_trace_has_one_complete_event_per_span() {
        let r = Recorder::new(2, true);
        let t0 = Instant::now();
        r.span("forward", "compute", t0, t0 + Duration::from_micros(1500));
        r.span_with(
            "all_reduce bucket 0",
            "comm",
            t0,
            t0 + Duration::from_micros(250),
            vec![("bytes", "64".into())],
        );
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        let spans: Vec<_> = v["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0]["name"], "forward");
        assert_eq!(spans[0]["pid"], 2);
        assert!((spans[0]["dur"].as_f64().unwrap() - 1500.0).abs() < 1e-6);
        assert_eq!(spans[1]["tid"], 1);
        assert_eq!(spans[1]["args"]["bytes"], "64");
        assert_eq!(spans[0]["ts"], spans[1]["ts"]);
    }

    #[test]
    fn a_disabled_recorder_keeps_nothing() {
        let r = Recorder::new(0, false);
        r.span("forward", "compute", Instant::now(), Instant::now());
        assert!(r.events().is_empty());
    }

    #[test]
    fn rank_paths() {
        assert_eq!(rank_path(Path::new("out/t.json"), 0, 1), PathBuf::from("out/t.json"));
        assert_eq!(rank_path(Path::new("out/t.json"), 3, 4), PathBuf::from("out/t.rank3.json"));
        assert_eq!(rank_path(Path::new("t"), 1, 2), PathBuf::from("t.rank1"));
    }
}
