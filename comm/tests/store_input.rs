//! Bytes from the network into the TCP store's server: malformed, truncated and hostile
//! requests end that connection with an error, never a panic, a huge allocation or a hang,
//! and the store keeps serving everyone else.

use oxtrain_comm::bootstrap::{serve_bytes, MAX_FRAME_BYTES};
use oxtrain_comm::TcpStore;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn request(op: u8, key: &[u8], value: &[u8], timeout_ms: u64) -> Vec<u8> {
    let mut m = vec![op];
    m.extend_from_slice(&(key.len() as u32).to_le_bytes());
    m.extend_from_slice(key);
    m.extend_from_slice(&(value.len() as u32).to_le_bytes());
    m.extend_from_slice(value);
    m.extend_from_slice(&timeout_ms.to_le_bytes());
    m
}

#[test]
fn well_formed_requests_are_answered() {
    let mut bytes = request(1, b"k", b"v", 0);
    bytes.extend(request(2, b"k", b"", 0));
    bytes.extend(request(3, b"n", &5i64.to_le_bytes(), 0));
    let out = serve_bytes(&bytes);
    // set: OK, empty; get: OK, "v"; add: OK, 5.
    let mut want = vec![0, 0, 0, 0, 0, 0, 1, 0, 0, 0, b'v', 0, 8, 0, 0, 0];
    want.extend_from_slice(&5i64.to_le_bytes());
    assert_eq!(out, want);
}

#[test]
fn malformed_requests_end_the_connection_without_a_panic() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("add with a 3-byte delta", request(3, b"n", b"abc", 0)),
        ("add with no delta", request(3, b"n", b"", 0)),
        ("unknown op", request(99, b"k", b"", 0)),
        ("truncated key", vec![1, 10, 0, 0, 0, b'a']),
        ("truncated timeout", request(1, b"k", b"v", 0)[..12].to_vec()),
        ("4 GB key length", [vec![1], u32::MAX.to_le_bytes().to_vec()].concat()),
        (
            "key over the frame limit",
            [vec![1], ((MAX_FRAME_BYTES + 1) as u32).to_le_bytes().to_vec()].concat(),
        ),
        ("non-UTF-8 key", request(4, &[0xff, 0xfe], b"", 0)),
    ];
    for (what, bytes) in cases {
        let out =
            std::panic::catch_unwind(|| serve_bytes(&bytes)).unwrap_or_else(|_| panic!("{what}: panicked"));
        assert!(out.len() <= 16, "{what}: answered {out:?}");
    }
    // Counters wrap instead of overflowing.
    let mut bytes = request(3, b"n", &i64::MAX.to_le_bytes(), 0);
    bytes.extend(request(3, b"n", &1i64.to_le_bytes(), 0));
    let out = serve_bytes(&bytes);
    assert_eq!(&out[out.len() - 8..], &i64::MIN.to_le_bytes());
}

#[test]
fn a_get_asking_to_wait_for_ever_does_not_overflow_the_deadline() {
    let start = Instant::now();
    let out = serve_bytes(&request(2, b"never", b"", u64::MAX));
    assert_eq!(out, vec![1, 0, 0, 0, 0], "missing key, no payload");
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_hostile_client_does_not_take_the_store_down() {
    let store = TcpStore::host("127.0.0.1", 0, Duration::from_secs(5)).unwrap();
    let mut raw = std::net::TcpStream::connect(("127.0.0.1", store.port())).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // A set whose key claims 4 GB: the server drops the connection instead of allocating it.
    raw.write_all(&[1]).unwrap();
    raw.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(raw.read(&mut buf).unwrap_or(0), 0, "the server should close the connection");
    let mut raw = std::net::TcpStream::connect(("127.0.0.1", store.port())).unwrap();
    raw.write_all(&request(3, b"n", b"x", 0)).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(raw.read(&mut buf).unwrap_or(0), 0, "a short add delta closes the connection");
    store.set("still", b"here").unwrap();
    assert_eq!(store.get("still").unwrap(), b"here");
}
