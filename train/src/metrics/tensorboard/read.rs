//! Reading event files back, to the record format's spec: every length and every payload
//! checksum is verified, and the `Event` fields oxtrain writes are decoded.

use super::{masked_crc, Event, What, SESSION_START};
use std::path::{Path, PathBuf};

/// Why an event file does not read back.
#[derive(Debug, thiserror::Error)]
pub enum EventFileError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: the record at byte {offset} is cut short (the file ends inside it)", path.display())]
    Truncated { path: PathBuf, offset: usize },
    #[error("{}: the {part} checksum of the record at byte {offset} does not match", path.display())]
    Checksum { path: PathBuf, offset: usize, part: &'static str },
    #[error("{}: the record at byte {offset} is not an Event: {reason}", path.display())]
    NotAnEvent { path: PathBuf, offset: usize, reason: &'static str },
}

/// Every event of `path`, in order.
pub fn read_events(path: &Path) -> Result<Vec<Event>, EventFileError> {
    let bytes = std::fs::read(path).map_err(|source| EventFileError::Io { path: path.into(), source })?;
    let mut events = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let offset = at;
        let cut = || EventFileError::Truncated { path: path.into(), offset };
        let crc = |part| EventFileError::Checksum { path: path.into(), offset, part };
        let take = |from: usize, n: usize| bytes.get(from..from + n).ok_or_else(cut);
        let len_bytes = take(at, 8)?;
        let stored = u32::from_le_bytes(take(at + 8, 4)?.try_into().expect("4 bytes"));
        if masked_crc(len_bytes) != stored {
            return Err(crc("length"));
        }
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes")) as usize;
        let data = take(at + 12, len)?;
        let stored = u32::from_le_bytes(take(at + 12 + len, 4)?.try_into().expect("4 bytes"));
        if masked_crc(data) != stored {
            return Err(crc("data"));
        }
        let event = decode_event(data).map_err(|reason| EventFileError::NotAnEvent {
            path: path.into(),
            offset,
            reason,
        })?;
        events.push(event);
        at += 16 + len;
    }
    Ok(events)
}

/// A field's value: varint (wire type 0), 64-bit (1), bytes (2) or 32-bit (5).
enum Value<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(&'a [u8]),
    Fixed32([u8; 4]),
}

/// The (field number, value) pairs of a message.
fn fields(mut data: &[u8]) -> Result<Vec<(u64, Value<'_>)>, &'static str> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let key = read_varint(&mut data)?;
        let value = match key & 7 {
            0 => Value::Varint(read_varint(&mut data)?),
            1 => Value::Fixed64(split(&mut data, 8)?.try_into().expect("8 bytes")),
            2 => {
                let n = read_varint(&mut data)? as usize;
                Value::Bytes(split(&mut data, n)?)
            }
            5 => Value::Fixed32(split(&mut data, 4)?.try_into().expect("4 bytes")),
            _ => return Err("a wire type other than 0, 1, 2 and 5"),
        };
        out.push((key >> 3, value));
    }
    Ok(out)
}

fn split<'a>(data: &mut &'a [u8], n: usize) -> Result<&'a [u8], &'static str> {
    if data.len() < n {
        return Err("a field runs past the end of its message");
    }
    let (head, rest) = data.split_at(n);
    *data = rest;
    Ok(head)
}

fn read_varint(data: &mut &[u8]) -> Result<u64, &'static str> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *split(data, 1)?.first().expect("1 byte");
        v |= ((b & 0x7f) as u64) << shift;
        if b < 0x80 {
            return Ok(v);
        }
    }
    Err("a varint longer than 10 bytes")
}

fn decode_event(data: &[u8]) -> Result<Event, &'static str> {
    let mut event = Event { wall_time: 0.0, step: 0, what: What::Scalars(vec![]) };
    for (field, value) in fields(data)? {
        match (field, value) {
            (1, Value::Fixed64(b)) => event.wall_time = f64::from_le_bytes(b),
            (2, Value::Varint(v)) => event.step = v as i64,
            (3, Value::Bytes(b)) => {
                event.what =
                    What::FileVersion(String::from_utf8(b.to_vec()).map_err(|_| "file_version not UTF-8")?)
            }
            (5, Value::Bytes(b)) => event.what = What::Scalars(decode_summary(b)?),
            (7, Value::Bytes(b)) => {
                let start =
                    fields(b)?.iter().any(|(f, v)| *f == 1 && matches!(v, Value::Varint(SESSION_START)));
                if !start {
                    return Err("a session log other than START");
                }
                event.what = What::SessionStart;
            }
            _ => return Err("a field oxtrain does not write"),
        }
    }
    Ok(event)
}

fn decode_summary(data: &[u8]) -> Result<Vec<(String, f64)>, &'static str> {
    let mut values = Vec::new();
    for (field, value) in fields(data)? {
        let (1, Value::Bytes(b)) = (field, value) else { return Err("a summary field other than value") };
        let (mut tag, mut simple) = (None, None);
        for (f, v) in fields(b)? {
            match (f, v) {
                (1, Value::Bytes(t)) => {
                    tag = Some(String::from_utf8(t.to_vec()).map_err(|_| "tag not UTF-8")?)
                }
                (2, Value::Fixed32(x)) => simple = Some(f32::from_le_bytes(x) as f64),
                _ => return Err("a summary value other than tag and simple_value"),
            }
        }
        values.push((tag.ok_or("a value without a tag")?, simple.ok_or("a value without simple_value")?));
    }
    Ok(values)
}
