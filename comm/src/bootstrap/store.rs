//! A small TCP key-value store hosted by rank 0, in the manner of PyTorch's `TCPStore`:
//! `set`, `get` (waits for the key), `add` (a counter), `check`, `wait`, `delete_key`,
//! `num_keys`, and a `barrier` that names the ranks that never arrived. Ranks use it to
//! exchange unique ids (`store.set("nccl_id", &bytes)`) and shared-memory names.
//!
//! Wire format, one request per round trip: `op u8, key_len u32, key, value_len u32, value,
//! timeout_ms u64`; answer: `status u8, len u32, payload` (all little-endian).

use crate::error::{CommError, Result};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_ADD: u8 = 3;
const OP_CHECK: u8 = 4;
const OP_DELETE: u8 = 5;
const OP_NUM_KEYS: u8 = 6;
const OK: u8 = 0;
const MISSING: u8 = 1;

type Table = Arc<(Mutex<HashMap<String, Vec<u8>>>, Condvar)>;

/// The store's server side, running on rank 0 until dropped.
struct Server {
    stop: Arc<AtomicBool>,
    addr: std::net::SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees `stop`.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

/// A client of the store (and on rank 0 also its host).
pub struct TcpStore {
    conn: Mutex<TcpStream>,
    _server: Option<Server>,
    port: u16,
    timeout: Duration,
    barriers: AtomicU64,
}

/// The largest key or value a request may carry. Real values are unique ids and shared-memory
/// names (bytes to kilobytes); the bound keeps a corrupt or hostile length prefix from making
/// the server allocate gigabytes.
pub const MAX_FRAME_BYTES: usize = 64 << 20;

/// The longest a `get` may ask the server to wait: longer requests are cut to this (a timeout
/// near `u64::MAX` milliseconds would overflow the deadline).
const MAX_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

fn read_frame(s: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("store: a frame of {len} bytes, over the {MAX_FRAME_BYTES}-byte limit"),
        ));
    }
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf)?;
    Ok(buf)
}

fn frame(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// One request as it came off the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Request {
    op: u8,
    key: String,
    value: Vec<u8>,
    timeout: Duration,
}

/// The next request of `s`, or `None` when the client closed the connection between
/// requests. Bytes from the network: every length is bounded, and a short or malformed
/// request is an error, never a panic.
fn read_request(s: &mut impl Read) -> std::io::Result<Option<Request>> {
    let mut op = [0u8; 1];
    if s.read_exact(&mut op).is_err() {
        return Ok(None);
    }
    let key = String::from_utf8_lossy(&read_frame(s)?).into_owned();
    let value = read_frame(s)?;
    let mut t = [0u8; 8];
    s.read_exact(&mut t)?;
    let timeout = Duration::from_millis(u64::from_le_bytes(t)).min(MAX_WAIT);
    Ok(Some(Request { op: op[0], key, value, timeout }))
}

/// Carries out `req` on the table, waiting for a `get`'s key at most `max_wait` (the
/// request's own timeout, or less), and returns the answer's status and payload.
fn answer(table: &Table, req: Request, max_wait: Duration) -> std::io::Result<(u8, Vec<u8>)> {
    let (lock, cv) = &**table;
    let mut map = lock.lock().unwrap_or_else(|e| e.into_inner());
    Ok(match req.op {
        OP_SET => {
            map.insert(req.key, req.value);
            cv.notify_all();
            (OK, vec![])
        }
        OP_GET => {
            let deadline = Instant::now() + req.timeout.min(max_wait);
            loop {
                if let Some(v) = map.get(&req.key) {
                    break (OK, v.clone());
                }
                let now = Instant::now();
                if now >= deadline {
                    break (MISSING, vec![]);
                }
                map = cv.wait_timeout(map, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
            }
        }
        OP_ADD => {
            let Ok(delta) = <[u8; 8]>::try_from(req.value.as_slice()) else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "store: add on '{}' carries {} bytes, not an 8-byte delta",
                        req.key,
                        req.value.len()
                    ),
                ));
            };
            let delta = i64::from_le_bytes(delta);
            let old =
                map.get(&req.key).and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok()).unwrap_or(0);
            // Wrapping, as PyTorch's store's int64 counters do, instead of a panic on overflow.
            let new = old.wrapping_add(delta);
            // Decimal text, as PyTorch's store keeps counters.
            map.insert(req.key, new.to_string().into_bytes());
            cv.notify_all();
            (OK, new.to_le_bytes().to_vec())
        }
        OP_CHECK => (OK, vec![u8::from(map.contains_key(&req.key))]),
        OP_DELETE => (OK, vec![u8::from(map.remove(&req.key).is_some())]),
        OP_NUM_KEYS => (OK, (map.len() as u64).to_le_bytes().to_vec()),
        other => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("unknown store op {other}"),
            ))
        }
    })
}

/// Answers the requests of one connection until it closes or sends something malformed.
fn serve(mut s: impl Read + Write, table: Table, max_wait: Duration) -> std::io::Result<()> {
    while let Some(req) = read_request(&mut s)? {
        let (status, payload) = answer(&table, req, max_wait)?;
        let mut out = vec![status];
        frame(&mut out, &payload);
        s.write_all(&out)?;
    }
    Ok(())
}

/// Feeds `bytes` to the server as if one client had sent them, over a fresh table, with no
/// waiting: the entry point of the fuzz target and its regression test. Returns the answers
/// the server wrote before it stopped.
#[doc(hidden)]
pub fn serve_bytes(bytes: &[u8]) -> Vec<u8> {
    struct Duplex<'a>(std::io::Cursor<&'a [u8]>, Vec<u8>);
    impl Read for Duplex<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.0.read(buf)
        }
    }
    impl Write for Duplex<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.1.write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let table: Table = Arc::new((Mutex::new(HashMap::new()), Condvar::new()));
    let mut duplex = Duplex(std::io::Cursor::new(bytes), Vec::new());
    let _ = serve(&mut duplex, table, Duration::ZERO);
    duplex.1
}

impl TcpStore {
    /// Hosts the store on `addr:port` (port 0 picks a free one, see [`TcpStore::port`]) and
    /// connects to it.
    pub fn host(addr: &str, port: u16, timeout: Duration) -> Result<TcpStore> {
        let listener = TcpListener::bind((addr, port)).map_err(|e| {
            CommError::io(
                format!("store: cannot listen on {addr}:{port} (is MASTER_PORT already in use?)"),
                e,
            )
        })?;
        let local = listener.local_addr().map_err(|e| CommError::io("store: local address", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let table: Table = Arc::new((Mutex::new(HashMap::new()), Condvar::new()));
        let stop2 = stop.clone();
        std::thread::Builder::new()
            .name("oxtrain-store".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(conn) = conn {
                        let table = table.clone();
                        let _ =
                            std::thread::Builder::new().name("oxtrain-store-conn".into()).spawn(move || {
                                let _ = conn.set_nodelay(true);
                                serve(conn, table, MAX_WAIT)
                            });
                    }
                }
            })
            .map_err(|e| CommError::io("store: spawning the server thread", e))?;
        let connect_addr = if local.ip().is_unspecified() {
            format!("127.0.0.1:{}", local.port())
        } else {
            local.to_string()
        };
        let mut store = TcpStore::connect_to(&connect_addr, timeout)?;
        store.port = local.port();
        store._server = Some(Server { stop, addr: connect_addr.parse().expect("socket address") });
        Ok(store)
    }

    /// Connects to a store hosted elsewhere, retrying until `timeout` (rank 0 may start late).
    pub fn connect(addr: &str, port: u16, timeout: Duration) -> Result<TcpStore> {
        TcpStore::connect_to(&format!("{addr}:{port}"), timeout)
    }

    /// `TCPStore(host, port, is_master, timeout)`: hosts when `is_master`, else connects.
    pub fn new(addr: &str, port: u16, is_master: bool, timeout: Duration) -> Result<TcpStore> {
        if is_master {
            TcpStore::host(addr, port, timeout)
        } else {
            TcpStore::connect(addr, port, timeout)
        }
    }

    fn connect_to(target: &str, timeout: Duration) -> Result<TcpStore> {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        while Instant::now() < deadline {
            let addrs = target
                .to_socket_addrs()
                .map_err(|e| CommError::io(format!("store: resolving {target}"), e))?;
            for a in addrs {
                match TcpStream::connect_timeout(&a, Duration::from_millis(500)) {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        let port = a.port();
                        return Ok(TcpStore {
                            conn: Mutex::new(s),
                            _server: None,
                            port,
                            timeout,
                            barriers: AtomicU64::new(0),
                        });
                    }
                    Err(e) => last = Some(e),
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(CommError::StoreUnreachable {
            addr: target.to_string(),
            timeout,
            last: last.map(std::sync::Arc::new),
        })
    }

    /// The port the store listens on (useful after hosting on port 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn request(&self, op: u8, key: &str, value: &[u8], timeout: Duration) -> Result<(u8, Vec<u8>)> {
        let mut msg = vec![op];
        frame(&mut msg, key.as_bytes());
        frame(&mut msg, value);
        msg.extend_from_slice(&(timeout.as_millis() as u64).to_le_bytes());
        let mut s = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let io = |e| {
            CommError::io(
                format!("store: request on key '{key}' (rank 0, which hosts the store, may have exited)"),
                e,
            )
        };
        s.set_read_timeout(Some(timeout + Duration::from_secs(10))).map_err(io)?;
        s.write_all(&msg).map_err(io)?;
        let mut status = [0u8; 1];
        s.read_exact(&mut status).map_err(io)?;
        let payload = read_frame(&mut *s).map_err(io)?;
        Ok((status[0], payload))
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.request(OP_SET, key, value, Duration::ZERO).map(|_| ())
    }

    /// The value of `key`, waiting for it up to the store's timeout.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.get_timeout(key, self.timeout)
    }

    pub fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        match self.request(OP_GET, key, &[], timeout)? {
            (OK, v) => Ok(v),
            _ => Err(CommError::StoreKeyMissing { key: key.to_string(), timeout }),
        }
    }

    /// Adds `delta` to the counter `key` (0 if unset) and returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let (_, v) = self.request(OP_ADD, key, &delta.to_le_bytes(), Duration::ZERO)?;
        Ok(i64::from_le_bytes(v[..8].try_into().unwrap_or([0; 8])))
    }

    /// Whether every key is set, without waiting.
    pub fn check(&self, keys: &[&str]) -> Result<bool> {
        for k in keys {
            if self.request(OP_CHECK, k, &[], Duration::ZERO)?.1 != [1] {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Waits until every key is set, up to `timeout` in all.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        for k in keys {
            self.get_timeout(k, deadline.saturating_duration_since(Instant::now()))?;
        }
        Ok(())
    }

    pub fn delete_key(&self, key: &str) -> Result<bool> {
        Ok(self.request(OP_DELETE, key, &[], Duration::ZERO)?.1 == [1])
    }

    pub fn num_keys(&self) -> Result<u64> {
        let (_, v) = self.request(OP_NUM_KEYS, "", &[], Duration::ZERO)?;
        Ok(u64::from_le_bytes(v[..8].try_into().unwrap_or([0; 8])))
    }

    /// Counts this rank out of barrier `base`; the host returns only once every rank has. A run
    /// often ends with a barrier, and the host's process exiting right after it took the store
    /// down while another rank still waited for its reply to `done` (seen in CI under load).
    fn leave_barrier(&self, base: &str, world: usize) -> Result<()> {
        if self.add(&format!("{base}/left"), 1)? == world as i64 {
            self.set(&format!("{base}/all_left"), b"1")?;
        }
        if self._server.is_some() {
            self.get(&format!("{base}/all_left"))?;
        }
        Ok(())
    }

    /// Waits until all `world` ranks have called `barrier` the same number of times; on
    /// timeout the error names the ranks that never arrived.
    pub fn barrier(&self, rank: usize, world: usize) -> Result<()> {
        let n = self.barriers.fetch_add(1, Ordering::SeqCst);
        let base = format!("oxtrain/barrier/{n}");
        // The rank's own key goes last: a rank cut off between its requests has then left
        // no key, so a timeout always names someone. (Set first, a rank that set its key
        // but never counted itself left every key set and the error naming nobody.)
        if self.add(&format!("{base}/count"), 1)? == world as i64 {
            self.set(&format!("{base}/done"), b"1")?;
        }
        self.set(&format!("{base}/rank/{rank}"), b"1")?;
        match self.get(&format!("{base}/done")) {
            Ok(_) => self.leave_barrier(&base, world),
            Err(_) => {
                let mut missing = vec![];
                for r in 0..world {
                    if !self.check(&[&format!("{base}/rank/{r}")])? {
                        missing.push(r);
                    }
                }
                Err(CommError::Timeout {
                    op: format!("store barrier #{n}"),
                    me: rank,
                    ranks: missing,
                    timeout: self.timeout,
                    hint: "those ranks never reached the barrier (not started, crashed, or stuck)".into(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's barrier returns only after every rank has made its last barrier request (the
    /// count of ranks that left is `world`), so the host's process may exit right after it and
    /// take the store down without cutting another rank off mid-barrier.
    #[test]
    fn the_host_leaves_a_barrier_last() {
        let timeout = Duration::from_secs(10);
        for world in [2, 3] {
            let host = TcpStore::host("127.0.0.1", 0, timeout).unwrap();
            let port = host.port();
            let others: Vec<_> = (1..world)
                .map(|rank| {
                    std::thread::spawn(move || {
                        let store = TcpStore::connect("127.0.0.1", port, timeout)?;
                        // Arrive late, so that the host waits in `done` first.
                        std::thread::sleep(Duration::from_millis(20 * rank as u64));
                        store.barrier(rank, world)
                    })
                })
                .collect();
            host.barrier(0, world).unwrap();
            let left = host.add("oxtrain/barrier/0/left", 0).unwrap();
            assert_eq!(left, world as i64, "the host left barrier 0 before the others");
            for o in others {
                o.join().unwrap().unwrap();
            }
        }
    }
}
