//! Cubins compiled in this process: in the background as soon as a device opens, for every
//! family it has no embedded cubin for, or by the first op that needs one. Shared by all
//! devices of one architecture.
//!
//! `OXTRAIN_DISABLE_BACKGROUND_COMPILE=1` compiles each family at first use only, one after
//! another, as before; `OXTRAIN_KERNEL_COMPILE_THREADS=N` sets how many compile at once
//! (default: one per core, at most 16). `OXTRAIN_KERNEL_LOG=1` says on stderr where each
//! family's cubin came from and how long it took.

use super::jobs::JobTable;
use super::nvrtc::{self, KernelSource};
use crate::Result;
use std::sync::{Arc, Once, OnceLock};
use std::time::Instant;

type Cubin = Arc<Vec<u8>>;

fn table() -> &'static Arc<JobTable<(&'static str, u32), Cubin>> {
    static TABLE: OnceLock<Arc<JobTable<(&'static str, u32), Cubin>>> = OnceLock::new();
    TABLE.get_or_init(|| Arc::new(JobTable::new()))
}

/// Whether `OXTRAIN_KERNEL_LOG` asks for a line per family loaded.
pub(crate) fn log_enabled() -> bool {
    static LOG: OnceLock<bool> = OnceLock::new();
    *LOG.get_or_init(|| flag("OXTRAIN_KERNEL_LOG"))
}

fn flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `src` compiled for `sm_{arch}` (through the disk cache): the background compile's result if
/// one ran or runs (then this waits for it), else compiled here. Errors are NVRTC's, as they
/// would be with no background.
pub(crate) fn compiled(src: &KernelSource, arch: u32) -> Result<Cubin> {
    let start = Instant::now();
    let cubin = table().get((src.name, arch), || nvrtc::compile_cached(src, arch).map(Arc::new))?;
    if log_enabled() {
        let waited = start.elapsed().as_secs_f64();
        eprintln!("oxtrain: {}.cu for sm_{arch}: compiled cubin ready after {waited:.2} s", src.name);
    }
    Ok(cubin)
}

/// How many families compile at once in the background; 0 when that is turned off.
fn background_threads() -> usize {
    if flag("OXTRAIN_DISABLE_BACKGROUND_COMPILE") {
        return 0;
    }
    if let Some(n) = std::env::var("OXTRAIN_KERNEL_COMPILE_THREADS").ok().and_then(|v| v.parse().ok()) {
        return n;
    }
    std::thread::available_parallelism().map_or(4, |n| n.get()).min(16)
}

/// Starts compiling `sources` for `sm_{arch}` on background threads, in the order given (the
/// longest first), and returns at once. Families some op already asked for are skipped.
pub(crate) fn start_background(sources: Vec<KernelSource>, arch: u32) {
    let threads = background_threads();
    if sources.is_empty() || threads == 0 {
        return;
    }
    // Without NVRTC every compile fails at once; the first use of each family says so.
    if nvrtc::version().is_err() {
        return;
    }
    wait_for_compiles_at_exit(arch);
    if log_enabled() {
        let names: Vec<&str> = sources.iter().map(|s| s.name).collect();
        eprintln!(
            "oxtrain: compiling for sm_{arch} in the background on {threads} threads: {}",
            names.join(", ")
        );
    }
    let keys = sources.iter().map(|s| (s.name, arch)).collect();
    table().spawn(keys, threads, move |&(name, arch)| {
        let src = sources.iter().find(|s| s.name == name).expect("a key comes from a source");
        nvrtc::compile_cached(src, arch).map(Arc::new)
    });
}

/// Makes the process wait at exit for the compiles that are running (and start no more).
///
/// NVRTC's C++ globals are destroyed at exit while the process's other threads still run; a
/// compile running then could read freed memory. An `atexit` handler runs before the
/// destructors registered earlier than itself, so it is registered after NVRTC has loaded and
/// compiled a tiny kernel once (which creates the globals it creates lazily).
fn wait_for_compiles_at_exit(arch: u32) {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        let tiny = KernelSource { name: "nvrtc_warm_up", code: "extern \"C\" __global__ void k() {}" };
        let _ = nvrtc::compile(&tiny, arch);
        extern "C" fn at_exit() {
            table().stop();
            table().wait_for_running();
        }
        // SAFETY: registers a plain function that never unwinds (nothing in it panics).
        unsafe { libc::atexit(at_exit) };
    });
}
