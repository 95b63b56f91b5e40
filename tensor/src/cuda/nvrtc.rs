//! Compiling kernel sources with NVRTC, cached on disk.
//!
//! Each op family ships one CUDA C source (`ops/<family>/<family>.cu`) embedded in the binary.
//! Where the binary has no ahead-of-time cubin of it for the card ([`super::aot`]), it is
//! compiled for the card's architecture to a cubin (in the background as soon as the device
//! opens, or at first use: `super::cubins`); the cubin is cached under
//! a key of (source hash, architecture, NVRTC version, options), so a second run compiles
//! nothing. Compilation needs only libnvrtc (no GPU, no driver): CI uses that to check that
//! every source compiles for every architecture we support.

use super::libs::{self, CudaLib};
use crate::{Error, Result};
use cudarc::nvrtc::{result as nvrtc, sys};
use std::ffi::CString;
use std::path::PathBuf;

/// A kernel source embedded in the binary.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// The family's name, used in cache file names and errors.
    pub name: &'static str,
    pub code: &'static str,
}

/// Options every kernel is compiled with. No fast-math: results are checked against the CPU
/// backend to 1e-5.
const OPTIONS: &[&str] = &["-std=c++17", "-default-device", "--fmad=true"];

/// The NVRTC library's version, e.g. (13, 0); errors with the search when it cannot be loaded.
pub fn version() -> Result<(i32, i32)> {
    if !libs::loadable(CudaLib::Nvrtc) {
        return Err(Error::CudaUnavailable {
            ordinal: 0,
            reason: format!("NVRTC cannot be loaded: {}", libs::describe_search(CudaLib::Nvrtc)),
        });
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| Error::Msg(format!("nvrtcVersion failed: {e:?}")))?;
    Ok((major, minor))
}

/// 64-bit FNV-1a: a stable hash for cache keys (std's hasher may change between Rust releases).
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.iter().chain(&(part.len() as u64).to_le_bytes()) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The kernel cache folder: `OXTRAIN_KERNEL_CACHE`, else `$XDG_CACHE_HOME/oxtrain/kernels`, else
/// `~/.cache/oxtrain/kernels`. `None` disables caching.
pub fn cache_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("OXTRAIN_KERNEL_CACHE") {
        return (!dir.is_empty()).then(|| dir.into());
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("oxtrain").join("kernels"))
}

/// The key of a family's cubin: a hash of its source and the compiler options, the same for
/// every architecture and NVRTC version (those are named beside it). The disk cache and the
/// ahead-of-time cubins ([`super::aot`]) both use it to tell a cubin of today's source.
pub fn cache_key(src: &KernelSource) -> u64 {
    fnv1a(&[src.code.as_bytes(), OPTIONS.join(" ").as_bytes()])
}

/// Compiles `src` for `sm_{arch}` (e.g. 90) to a cubin, through the disk cache.
pub fn compile_cached(src: &KernelSource, arch: u32) -> Result<Vec<u8>> {
    let (major, minor) = version()?;
    let key = cache_key(src);
    let file = format!("{}-{key:016x}-sm{arch}-nvrtc{major}.{minor}.cubin", src.name);
    let cached = cache_dir().map(|d| d.join(&file));
    if let Some(path) = &cached {
        if let Ok(bytes) = std::fs::read(path) {
            if !bytes.is_empty() {
                return Ok(bytes);
            }
        }
    }
    let cubin = compile(src, arch)?;
    if let Some(path) = &cached {
        // Write then rename, so a crash or a concurrent process never leaves half a file.
        // A cache that cannot be written only costs a recompile next time.
        let _ = std::fs::create_dir_all(path.parent().unwrap_or(path)).and_then(|_| {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, &cubin)?;
            std::fs::rename(&tmp, path)
        });
    }
    Ok(cubin)
}

/// Compiles `src` for `sm_{arch}` to a cubin, with no cache; errors carry NVRTC's log.
pub fn compile(src: &KernelSource, arch: u32) -> Result<Vec<u8>> {
    version()?;
    let code = CString::new(src.code).map_err(|_| Error::Msg(format!("{}: NUL byte in source", src.name)))?;
    let name = CString::new(format!("{}.cu", src.name)).expect("no NUL in a family name");
    let prog = nvrtc::create_program(&code, Some(&name))
        .map_err(|e| Error::Msg(format!("{}.cu: nvrtcCreateProgram failed: {e:?}", src.name)))?;
    let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture=sm_{arch}"));
    // SAFETY: `prog` is a live program; `code` and `name` outlive it (destroyed below).
    let result = unsafe { nvrtc::compile_program(prog, &options) };
    let out = match result {
        Ok(()) => unsafe { cubin_of(prog) },
        Err(e) => {
            let log = unsafe { nvrtc::get_program_log(prog) }
                .map(|l| l.iter().map(|&c| c as u8 as char).collect::<String>())
                .unwrap_or_default();
            Err(Error::Msg(format!(
                "{}.cu failed to compile for sm_{arch} ({e:?}):\n{}",
                src.name,
                log.trim_end_matches('\0')
            )))
        }
    };
    // SAFETY: created above, destroyed once.
    unsafe {
        let _ = nvrtc::destroy_program(prog);
    }
    out
}

/// # Safety
/// `prog` must be a successfully compiled, live program.
unsafe fn cubin_of(prog: sys::nvrtcProgram) -> Result<Vec<u8>> {
    let mut size = 0usize;
    sys::nvrtcGetCUBINSize(prog, &mut size)
        .result()
        .map_err(|e| Error::Msg(format!("nvrtcGetCUBINSize: {e:?}")))?;
    let mut buf = vec![0u8; size];
    sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _)
        .result()
        .map_err(|e| Error::Msg(format!("nvrtcGetCUBIN: {e:?}")))?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_are_stable_and_distinguish_inputs() {
        // Fixed value: the key must not change between builds, or caches would never hit.
        assert_eq!(fnv1a(&[b"a"]), fnv1a(&[b"a"]));
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        // FNV-1a's published offset basis and prime, applied by hand to "a" and its length.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in [b'a', 1, 0, 0, 0, 0, 0, 0, 0] {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        assert_eq!(fnv1a(&[b"a"]), h);
    }
}
