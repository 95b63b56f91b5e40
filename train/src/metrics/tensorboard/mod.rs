//! TensorBoard event files: the scalars of every logged step and evaluation, which
//! `tensorboard --logdir <log.dir>` shows as they are written.
//!
//! The format is TensorFlow's record file of `Event` protocol buffers: each record is its
//! length (u64, little-endian), the masked CRC-32C of those 8 bytes, the bytes, and their
//! masked CRC-32C. The Rust crates for it (tensorboard-rs, tfrecord) are unmaintained or pull
//! in protobuf code generation for all of TensorFlow's messages; the three messages needed
//! here (`Event`, `Summary`, `SessionLog`) take a few lines of hand encoding, and the
//! checksum comes from the `crc32c` crate. [`read_events`] reads the files back to the same
//! spec, verifying every checksum.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The name TensorBoard looks for ("tfevents" in it); one file per run folder, appended to
/// on resume.
pub const EVENT_FILE: &str = "events.out.tfevents.oxtrain";

/// What the first record of every event file says.
const FILE_VERSION: &str = "brain.Event:2";

/// `SessionLog.START`: TensorBoard drops the events of every step from this one on, which a
/// resumed run logs again.
const SESSION_START: u64 = 1;

/// An event file being written.
pub struct EventWriter {
    path: PathBuf,
    file: File,
}

impl EventWriter {
    /// Starts `dir/EVENT_FILE` afresh.
    pub fn create(dir: &Path, wall_time: f64) -> std::io::Result<EventWriter> {
        let path = dir.join(EVENT_FILE);
        let file = File::create(&path)?;
        let mut w = EventWriter { path, file };
        w.write_event(&Event { wall_time, step: 0, what: What::FileVersion(FILE_VERSION.into()) })?;
        Ok(w)
    }

    /// Continues `dir/EVENT_FILE` for a run resumed from the checkpoint of `step`: the
    /// records so far stay, and a session start at `step + 1` tells TensorBoard to drop those
    /// of the steps after the checkpoint, which this run logs again.
    pub fn resume(dir: &Path, step: usize, wall_time: f64) -> std::io::Result<EventWriter> {
        let path = dir.join(EVENT_FILE);
        if !path.is_file() {
            return EventWriter::create(dir, wall_time);
        }
        let file = OpenOptions::new().append(true).open(&path)?;
        let mut w = EventWriter { path, file };
        let start = Event { wall_time, step: step as i64 + 1, what: What::SessionStart };
        w.write_event(&start)?;
        Ok(w)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One event holding the scalars `values` (tag, value) of `step`.
    pub fn scalars(&mut self, step: usize, wall_time: f64, values: &[(String, f64)]) -> std::io::Result<()> {
        self.write_event(&Event { wall_time, step: step as i64, what: What::Scalars(values.to_vec()) })
    }

    fn write_event(&mut self, event: &Event) -> std::io::Result<()> {
        let data = event.encode();
        let len = (data.len() as u64).to_le_bytes();
        let mut record = Vec::with_capacity(data.len() + 16);
        record.extend_from_slice(&len);
        record.extend_from_slice(&masked_crc(&len).to_le_bytes());
        record.extend_from_slice(&data);
        record.extend_from_slice(&masked_crc(&data).to_le_bytes());
        self.file.write_all(&record)?;
        self.file.flush()
    }
}

/// TensorFlow's masked CRC-32C (a CRC of data that holds CRCs is less prone to collide).
pub fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// The part of an `Event` that oxtrain writes.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub wall_time: f64,
    pub step: i64,
    pub what: What,
}

#[derive(Clone, Debug, PartialEq)]
pub enum What {
    FileVersion(String),
    /// `Summary` values: tag and `simple_value` (a float32 in the file).
    Scalars(Vec<(String, f64)>),
    SessionStart,
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field (wire type 2).
fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

impl Event {
    /// The protocol-buffer encoding (fields: wall_time 1, step 2, file_version 3, summary 5,
    /// session_log 7; Summary.value 1; Value.tag 1, Value.simple_value 2; SessionLog.status 1).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        varint(&mut out, 1 << 3 | 1);
        out.extend_from_slice(&self.wall_time.to_le_bytes());
        varint(&mut out, 2 << 3);
        varint(&mut out, self.step as u64);
        match &self.what {
            What::FileVersion(v) => bytes_field(&mut out, 3, v.as_bytes()),
            What::Scalars(values) => {
                let mut summary = Vec::new();
                for (tag, v) in values {
                    let mut value = Vec::new();
                    bytes_field(&mut value, 1, tag.as_bytes());
                    varint(&mut value, 2 << 3 | 5);
                    value.extend_from_slice(&(*v as f32).to_le_bytes());
                    bytes_field(&mut summary, 1, &value);
                }
                bytes_field(&mut out, 5, &summary);
            }
            What::SessionStart => {
                let mut log = Vec::new();
                varint(&mut log, 1 << 3);
                varint(&mut log, SESSION_START);
                bytes_field(&mut out, 7, &log);
            }
        }
        out
    }
}

mod read;
pub use read::{read_events, EventFileError};
