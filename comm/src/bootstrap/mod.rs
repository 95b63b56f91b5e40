//! Getting ranks together: the launcher's environment and the TCP store. Below the
//! backends (they exchange their ids through the store); the choice of a backend is above
//! them, in [`init_from_env`](crate::init_from_env).

mod env;
mod store;

pub use env::{LaunchEnv, Launcher};
pub use store::{serve_bytes, TcpStore, MAX_FRAME_BYTES};

use crate::error::Result;

/// Connects to (rank 0: hosts) the store at `MASTER_ADDR:MASTER_PORT`.
pub fn store_from_env(env: &LaunchEnv, timeout: std::time::Duration) -> Result<TcpStore> {
    if env.rank == 0 {
        // Rank 0 listens on every interface when the address is not this host's loopback,
        // since MASTER_ADDR names it as the others see it.
        let bind = if env.master_addr == "127.0.0.1" || env.master_addr == "localhost" {
            env.master_addr.as_str()
        } else {
            "0.0.0.0"
        };
        TcpStore::host(bind, env.master_port, timeout)
    } else {
        TcpStore::connect(&env.master_addr, env.master_port, timeout)
    }
}
