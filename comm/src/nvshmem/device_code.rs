//! Building the NVSHMEM collective kernels at run time, with no nvcc: NVRTC compiles
//! `collectives.cu` to LTO-IR, nvJitLink links it with NVSHMEM's `libnvshmem_device.a` into a
//! cubin (NVSHMEM's documented path for NVRTC users), cached on disk like the tensor crate's
//! kernels.
//!
//! The NVSHMEM 3.x headers need three things under NVRTC (all in `collectives.cu` or below):
//! `-default-device` (a host constructor in `nvshmem_tensor.h`), `cuda/std/type_traits` pulled
//! into `std` before the includes (`reduce.cuh` uses `std::is_integral` without including it),
//! and `NVSHMEM_IBGDA_SUPPORT` undefined (else the InfiniBand headers are required). Full device
//! inlining (`NVSHMEM_ENABLE_ALL_DEVICE_INLINING`) avoids a link failure on a mangled
//! `uint64_t` mismatch between NVRTC and the archive.
//!
//! Headers are found at run time: NVSHMEM's in `OXTRAIN_NVSHMEM_HOME`/`NVSHMEM_HOME` or pip's
//! `nvidia/nvshmem`; CUDA's (`cuda.h` and CCCL's `cuda/std/...`) in `OXTRAIN_CUDA_INCLUDE_DIR`,
//! beside the NVRTC that was loaded, `CUDA_HOME`/`CUDA_PATH`, `/usr/local/cuda`, or pip's
//! `nvidia/cu13` (packages nvidia-cuda-runtime and nvidia-cuda-cccl).

use super::nvjitlink::{InputType, Linker};
use crate::error::{CommError, Result};
use cudarc::nvrtc::{result as nvrtc, sys};
use oxtrain_tensor::cuda::libs::{self, CudaLib, LibStatus};
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// The kernel source, embedded in the binary: the shared pieces, the one-shot/two-shot
/// collectives, the low-latency all-reduce, the symmetric buffers'
/// all-reduce, the heap's atomics, then the collectives' entry points.
pub const SOURCE: &str = concat!(
    include_str!("common.cu"),
    include_str!("collectives.cu"),
    include_str!("ll.cu"),
    include_str!("symmetric.cu"),
    include_str!("atomics.cu"),
    include_str!("entry.cu")
);

/// Kernel names by dtype suffix.
pub fn kernel_name(suffix: &str) -> String {
    format!("oxtrain_nvshmem_coll_{suffix}")
}

fn err(msg: impl Into<String>) -> CommError {
    CommError::Unsupported(format!("nvshmem kernels: {}", msg.into()))
}

/// Where the headers and the device library are.
#[derive(Debug, Clone)]
pub struct Toolchain {
    pub nvshmem_include: PathBuf,
    pub nvshmem_device_lib: PathBuf,
    pub cuda_include: PathBuf,
    pub cccl_include: PathBuf,
}

/// NVSHMEM's installation folder (with `include/` and `lib/`), or None.
pub fn nvshmem_home() -> Option<PathBuf> {
    let paths = super::options::NvshmemPaths::from_env();
    let mut candidates: Vec<PathBuf> = paths.home.into_iter().collect();
    if let Some(lib) = paths.lib {
        // .../lib/libnvshmem_host.so.3 -> ...
        if let Some(home) = lib.parent().and_then(Path::parent) {
            candidates.push(home.to_path_buf());
        }
    }
    // pip's nvidia/nvshmem/lib is among the tensor crate's library folders (or on the
    // loader's path).
    let ld: Vec<PathBuf> =
        std::env::var_os("LD_LIBRARY_PATH").map(|v| std::env::split_paths(&v).collect()).unwrap_or_default();
    for d in libs::search_dirs().iter().chain(&ld) {
        if d.ends_with("nvshmem/lib") {
            if let Some(home) = d.parent() {
                candidates.push(home.to_path_buf());
            }
        }
    }
    candidates.into_iter().find(|h| h.join("include/nvshmem.h").is_file())
}

fn cuda_include_candidates() -> Vec<PathBuf> {
    let mut c: Vec<PathBuf> = super::options::NvshmemPaths::from_env().cuda_include_dir.into_iter().collect();
    // The headers of the toolkit whose NVRTC we run first: NVRTC and its headers must agree.
    if let LibStatus::Loaded(p) = libs::preload(CudaLib::Nvrtc) {
        if let Some(root) = p.parent().and_then(Path::parent) {
            c.push(root.join("include"));
        }
    }
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Ok(v) = std::env::var(var) {
            c.push(Path::new(&v).join("include"));
        }
    }
    c.push("/usr/local/cuda/include".into());
    let ld: Vec<PathBuf> =
        std::env::var_os("LD_LIBRARY_PATH").map(|v| std::env::split_paths(&v).collect()).unwrap_or_default();
    for d in libs::search_dirs().iter().chain(&ld) {
        if let Some(root) = d.parent() {
            c.push(root.join("include"));
        }
    }
    c
}

impl Toolchain {
    /// Finds everything, or says what is missing and which pip packages provide it.
    pub fn find() -> Result<Toolchain> {
        let home = nvshmem_home().ok_or_else(|| {
            err("NVSHMEM's headers were not found: `pip install nvidia-nvshmem-cu13` or set OXTRAIN_NVSHMEM_HOME to \
                 the folder holding include/nvshmem.h and lib/libnvshmem_device.a")
        })?;
        let device_lib = home.join("lib/libnvshmem_device.a");
        if !device_lib.is_file() {
            return Err(err(format!("{} is missing (NVSHMEM's device library)", device_lib.display())));
        }
        // cuda.h and CCCL from one toolkit when one has both, else wherever each is.
        let candidates = cuda_include_candidates();
        let cccl_of = |d: &Path| {
            [d.join("cccl"), d.to_path_buf()].into_iter().find(|c| c.join("cuda/std/type_traits").is_file())
        };
        let both = candidates.iter().find(|d| d.join("cuda.h").is_file() && cccl_of(d).is_some());
        let (cuda_include, cccl) = match both {
            Some(d) => (d.clone(), cccl_of(d).expect("checked")),
            None => {
                let cuda = candidates.iter().find(|d| d.join("cuda.h").is_file()).ok_or_else(|| {
                    err("CUDA's headers (cuda.h) were not found: set CUDA_HOME or OXTRAIN_CUDA_INCLUDE_DIR, or `pip \
                         install nvidia-cuda-runtime nvidia-cuda-cccl`")
                })?;
                let cccl = candidates.iter().find_map(|d| cccl_of(d)).ok_or_else(|| {
                    err("CCCL's headers (cuda/std/type_traits) were not found: `pip install nvidia-cuda-cccl` or use a \
                         full CUDA toolkit (CUDA_HOME)")
                })?;
                (cuda.clone(), cccl)
            }
        };
        Ok(Toolchain {
            nvshmem_include: home.join("include"),
            nvshmem_device_lib: device_lib,
            cuda_include,
            cccl_include: cccl,
        })
    }

    fn nvrtc_options(&self, arch: u32) -> Vec<String> {
        vec![
            "-std=c++17".into(),
            "-default-device".into(),
            "-rdc=true".into(),
            "-dlto".into(),
            "-DNVSHMEM_ENABLE_ALL_DEVICE_INLINING".into(),
            format!("--gpu-architecture=sm_{arch}"),
            format!("-I{}", self.nvshmem_include.display()),
            format!("-I{}", self.cccl_include.display()),
            format!("-I{}", self.cuda_include.display()),
        ]
    }

    /// NVRTC: `collectives.cu` to LTO-IR for `sm_{arch}`.
    pub fn compile_ltoir(&self, arch: u32) -> Result<Vec<u8>> {
        if !libs::loadable(CudaLib::Nvrtc) {
            return Err(err(format!("NVRTC cannot be loaded: {}", libs::describe_search(CudaLib::Nvrtc))));
        }
        let code = CString::new(SOURCE).expect("no NUL in the kernel source");
        let name = CString::new("collectives.cu").expect("name");
        let prog = nvrtc::create_program(&code, Some(&name))
            .map_err(|e| err(format!("nvrtcCreateProgram: {e:?}")))?;
        let options = self.nvrtc_options(arch);
        // SAFETY: `prog` is live until destroyed below; `code` and `name` outlive it.
        let out = unsafe {
            match nvrtc::compile_program(prog, &options) {
                Ok(()) => ltoir_of(prog),
                Err(e) => {
                    let log = nvrtc::get_program_log(prog)
                        .map(|l| l.iter().map(|&c| c as u8 as char).collect::<String>())
                        .unwrap_or_default();
                    Err(err(format!(
                        "collectives.cu failed to compile for sm_{arch} ({e:?}) with options {options:?}:\n{}",
                        log.trim_end_matches('\0')
                    )))
                }
            }
        };
        // SAFETY: created above, destroyed once.
        unsafe {
            let _ = nvrtc::destroy_program(prog);
        }
        out
    }

    /// NVRTC then nvJitLink: the loadable cubin for `sm_{arch}`, no cache.
    pub fn build_cubin(&self, arch: u32) -> Result<Vec<u8>> {
        self.build_cubin_verbose(arch, false).map(|(c, _)| c)
    }

    /// `build_cubin`, with nvJitLink's info log (`verbose`: registers and spills per kernel).
    pub fn build_cubin_verbose(&self, arch: u32, verbose: bool) -> Result<(Vec<u8>, String)> {
        let ltoir = self.compile_ltoir(arch)?;
        let mut options = vec![format!("-arch=sm_{arch}"), "-lto".into()];
        if verbose {
            options.push("-verbose".into());
        }
        let mut linker = Linker::new(&options)?;
        linker.add_data(InputType::LtoIr, &ltoir, "collectives.ltoir")?;
        linker.add_file(InputType::Library, &self.nvshmem_device_lib)?;
        linker.finish_with_log()
    }

    /// `build_cubin` through the tensor crate's kernel cache folder, keyed by the source,
    /// the options, the device library's size and NVRTC's version.
    pub fn build_cubin_cached(&self, arch: u32) -> Result<Vec<u8>> {
        let (major, minor) = oxtrain_tensor::cuda::nvrtc::version().map_err(|e| err(e.to_string()))?;
        let lib_len = std::fs::metadata(&self.nvshmem_device_lib).map(|m| m.len()).unwrap_or(0);
        let key = fnv1a(&[
            SOURCE.as_bytes(),
            self.nvrtc_options(arch).join(" ").as_bytes(),
            &lib_len.to_le_bytes(),
            self.nvshmem_device_lib.to_string_lossy().as_bytes(),
        ]);
        let file = format!("nvshmem-coll-{key:016x}-sm{arch}-nvrtc{major}.{minor}.cubin");
        let cached = oxtrain_tensor::cuda::nvrtc::cache_dir().map(|d| d.join(file));
        if let Some(path) = &cached {
            if let Ok(bytes) = std::fs::read(path) {
                if !bytes.is_empty() {
                    return Ok(bytes);
                }
            }
        }
        let cubin = self.build_cubin(arch)?;
        if let Some(path) = &cached {
            // Write then rename: a concurrent rank never reads half a file.
            let _ = std::fs::create_dir_all(path.parent().unwrap_or(path)).and_then(|_| {
                let tmp = path.with_extension(format!("tmp{}", std::process::id()));
                std::fs::write(&tmp, &cubin)?;
                std::fs::rename(&tmp, path)
            });
        }
        Ok(cubin)
    }
}

/// # Safety
/// `prog` must be a successfully compiled, live program.
unsafe fn ltoir_of(prog: sys::nvrtcProgram) -> Result<Vec<u8>> {
    let mut size = 0usize;
    sys::nvrtcGetLTOIRSize(prog, &mut size).result().map_err(|e| err(format!("nvrtcGetLTOIRSize: {e:?}")))?;
    let mut buf = vec![0u8; size];
    sys::nvrtcGetLTOIR(prog, buf.as_mut_ptr() as *mut _)
        .result()
        .map_err(|e| err(format!("nvrtcGetLTOIR: {e:?}")))?;
    Ok(buf)
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.iter().chain(&(part.len() as u64).to_le_bytes()) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}
