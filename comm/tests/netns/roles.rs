//! What each rank process does inside its namespace. The test binary re-runs itself as a rank
//! (test `netns_rank`), with `OXTRAIN_NETNS_ROLE` naming the role and the launcher's variables
//! (torchrun's, Slurm's or Open MPI's) saying where it sits. Ranks report on stdout in lines
//! the parent test reads; a failed check panics (the process fails).

use oxtrain_comm::bootstrap::store_from_env;
use oxtrain_comm::{CommOptions, LaunchEnv, TcpStore};
use std::time::{Duration, Instant};

pub const ROLE: &str = "OXTRAIN_NETNS_ROLE";

/// This "host"'s name (each namespace has its own UTS namespace).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
}

/// 128 bytes from the kernel, as an NCCL or NVSHMEM unique id is: opaque, different each run.
fn random_id() -> Vec<u8> {
    use std::io::Read;
    let mut id = vec![0u8; 128];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut id))
        .expect("reading /dev/urandom");
    id
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The rendezvous: where this rank sits by the launcher's variables, then the store of
/// rank 0 across hosts, then rank 0's unique id handed to all (under the key the nccl backend
/// uses), then every rank's host name exchanged (as the nvshmem backend does to find the PEs
/// of a node): the ranks that share this rank's host must be exactly LOCAL_WORLD_SIZE, with
/// this rank at LOCAL_RANK among them.
pub fn rendezvous(store: &TcpStore, env: &LaunchEnv) -> String {
    let (rank, world) = (env.rank, env.world_size);
    let key = "oxtrain/nccl/0/unique_id";
    let id = if rank == 0 {
        let id = random_id();
        store.set(key, &id).unwrap();
        id
    } else {
        store.get(key).unwrap()
    };
    assert_eq!(id.len(), 128, "rank {rank}: the unique id has {} bytes", id.len());
    let host = host_name();
    store.set(&format!("test/host/{rank}"), host.as_bytes()).unwrap();
    store.barrier(rank, world).unwrap();
    let hosts: Vec<String> = (0..world)
        .map(|r| String::from_utf8_lossy(&store.get(&format!("test/host/{r}")).unwrap()).into_owned())
        .collect();
    let local: Vec<usize> = (0..world).filter(|&r| hosts[r] == host).collect();
    assert_eq!(local.len(), env.local_world_size, "rank {rank}: ranks on {host}: {local:?}");
    assert_eq!(
        local.iter().position(|&r| r == rank),
        Some(env.local_rank),
        "rank {rank}: ranks on {host}: {local:?}"
    );
    format!(
        "RANK {rank} WORLD {world} LOCAL_RANK {} LOCAL_WORLD {} HOST {host} LAUNCHER {:?} ID {}",
        env.local_rank,
        env.local_world_size,
        env.launcher,
        hex(&id)
    )
}

/// Role `rendezvous`: the store across hosts from the launcher's variables.
pub fn rendezvous_role() {
    let env = LaunchEnv::from_env().unwrap();
    let store = store_from_env(&env, CommOptions::default().timeout).unwrap();
    println!("{}", rendezvous(&store, &env));
    // Without the mpi feature, several hosts and no backend named: the error that says what
    // to do (the GPU backends need a GPU, which is where this check stops).
    #[cfg(not(feature = "mpi"))]
    if std::env::var("OXTRAIN_COMM_BACKEND").is_err() {
        let err = oxtrain_comm::init_from_env()
            .err()
            .expect("init_from_env across hosts without a network backend");
        println!("INIT-ERROR {err}");
    }
    leave(&store, &env);
}

/// Rank 0 hosts the store, so it must leave last: the others say they are done with it (their
/// last request), and rank 0 waits for all of them.
pub fn leave(store: &TcpStore, env: &LaunchEnv) {
    if env.rank != 0 {
        store.set(&format!("test/left/{}", env.rank), b"1").unwrap();
    } else {
        let keys: Vec<String> = (1..env.world_size).map(|r| format!("test/left/{r}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        store.wait(&keys, store.timeout()).unwrap();
        // The server stores a rank's last key before it answers that rank: give the answers
        // time to go out before this process (and the server with it) ends.
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Role `store-loop`: the rendezvous, then store barriers every 20 ms until one fails (a host
/// was cut off); prints how long the failing call took and its error.
pub fn store_loop_role() {
    let env = LaunchEnv::from_env().unwrap();
    let timeout = CommOptions::default().timeout;
    let store = store_from_env(&env, timeout).unwrap();
    println!("{}", rendezvous(&store, &env));
    println!("READY {}", env.rank);
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let start = Instant::now();
        if let Err(e) = store.barrier(env.rank, env.world_size) {
            println!("FAILED rank {} after {:.2}s: {e}", env.rank, start.elapsed().as_secs_f64());
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("rank {}: no barrier failed within 60 s", env.rank);
}

/// Role `store-error`: one rank's way into the store (and a barrier), printing the error it
/// meets; used to produce the messages of the troubleshooting table.
pub fn store_error_role() {
    let env = LaunchEnv::from_env().unwrap();
    let timeout = CommOptions::default().timeout;
    let start = Instant::now();
    let result = store_from_env(&env, timeout).and_then(|store| {
        println!("JOINED {}", env.rank);
        let r = store.barrier(env.rank, env.world_size);
        // Rank 0 keeps the store up a little for the others to read their errors from it.
        if env.rank == 0 {
            std::thread::sleep(Duration::from_millis(500));
        }
        r
    });
    match result {
        Ok(()) => println!("NO-ERROR rank {}", env.rank),
        Err(e) => println!("ERROR rank {} after {:.2}s: {e}", env.rank, start.elapsed().as_secs_f64()),
    }
}
