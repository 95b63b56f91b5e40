//! Finding the CUDA libraries at run time.
//!
//! cudarc opens libraries by their sonames (`libnvrtc.so.13`), which only works when they sit
//! on the loader's search path. Users of PyTorch have them elsewhere: in `CUDA_HOME`,
//! `/usr/local/cuda`, or pip's `nvidia-*` packages. We search those folders, open each library by
//! its full path with `RTLD_GLOBAL` first, and from then on the loader answers cudarc's soname
//! lookups with the copy already loaded. No LD_LIBRARY_PATH is needed.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A CUDA library oxtrain can use, with the file names (sonames) to look for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaLib {
    /// The driver API (`libcuda.so.1`), installed with the GPU driver.
    Driver,
    Nvrtc,
    Cublas,
    CublasLt,
    Cudnn,
    Curand,
    Nccl,
    NvJitLink,
    /// JPEG decoding on the GPU (the data loader's `decode = "gpu"`).
    NvJpeg,
}

impl CudaLib {
    pub fn file_names(self) -> &'static [&'static str] {
        match self {
            CudaLib::Driver => &["libcuda.so.1", "libcuda.so"],
            CudaLib::Nvrtc => &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
            CudaLib::Cublas => &["libcublas.so.13", "libcublas.so.12", "libcublas.so"],
            CudaLib::CublasLt => &["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"],
            CudaLib::Cudnn => &["libcudnn.so.9", "libcudnn.so"],
            CudaLib::Curand => &["libcurand.so.10", "libcurand.so"],
            CudaLib::Nccl => &["libnccl.so.2", "libnccl.so"],
            CudaLib::NvJitLink => &["libnvJitLink.so.13", "libnvJitLink.so.12", "libnvJitLink.so"],
            CudaLib::NvJpeg => &["libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so"],
        }
    }

    pub fn name(self) -> &'static str {
        self.file_names()[0]
    }
}

/// The folders searched, in order: `OXTRAIN_CUDA_LIB_DIRS` (colon-separated), then
/// `LD_LIBRARY_PATH` (as the system loader would), `CUDA_HOME` / `CUDA_PATH`, `/usr/local/cuda`,
/// the driver's usual folders, and the `nvidia` package of every Python site-packages folder we
/// can find (virtualenv, conda, user and system installs). `LD_LIBRARY_PATH` comes early because
/// cuDNN opens its sub-libraries (`libcudnn_ops`, `libcudnn_engines_*`) by name through the system
/// loader: a `libcudnn` loaded from elsewhere than where those resolve fails with
/// `CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH` when two cuDNN installs differ.
pub fn search_dirs() -> &'static [PathBuf] {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let mut dirs: Vec<PathBuf> = Vec::new();
        if let Ok(extra) = std::env::var("OXTRAIN_CUDA_LIB_DIRS") {
            dirs.extend(std::env::split_paths(&extra));
        }
        if let Ok(paths) = std::env::var("LD_LIBRARY_PATH") {
            dirs.extend(std::env::split_paths(&paths).filter(|p| !p.as_os_str().is_empty()));
        }
        for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
            if let Ok(home) = std::env::var(var) {
                dirs.push(Path::new(&home).join("lib64"));
                dirs.push(Path::new(&home).join("lib"));
            }
        }
        dirs.push("/usr/local/cuda/lib64".into());
        for d in ["/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/wsl/lib"] {
            dirs.push(d.into());
        }
        for site in site_packages_dirs() {
            let nvidia = site.join("nvidia");
            if let Ok(entries) = std::fs::read_dir(&nvidia) {
                let mut libs: Vec<PathBuf> =
                    entries.flatten().map(|e| e.path().join("lib")).filter(|p| p.is_dir()).collect();
                // `cu13` before `cu12`: the newest toolkit first.
                libs.sort();
                libs.reverse();
                dirs.extend(libs);
            }
        }
        let mut seen = std::collections::HashSet::new();
        dirs.retain(|d| d.is_dir() && seen.insert(d.clone()));
        dirs
    })
}

/// Python site-packages folders: the active virtualenv or conda env, then user and system ones.
fn site_packages_dirs() -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Ok(p) = std::env::var(var) {
            prefixes.push(p.into());
        }
    }
    if let Ok(home) = std::env::var("HOME") {
        prefixes.push(Path::new(&home).join(".local"));
    }
    prefixes.extend(["/usr/local", "/usr", "/opt/conda"].map(PathBuf::from));
    let mut out = Vec::new();
    for prefix in prefixes {
        let lib = prefix.join("lib");
        let Ok(entries) = std::fs::read_dir(&lib) else { continue };
        for e in entries.flatten() {
            let name = e.file_name();
            if name.to_string_lossy().starts_with("python3") {
                out.push(e.path().join("site-packages"));
                out.push(e.path().join("dist-packages"));
            }
        }
    }
    if let Ok(pythonpath) = std::env::var("PYTHONPATH") {
        out.extend(std::env::split_paths(&pythonpath));
    }
    out
}

/// Where each library was found and loaded, or why not.
#[derive(Debug, Clone)]
pub enum LibStatus {
    Loaded(PathBuf),
    /// Not found in the search folders; the system loader may still find it by name.
    NotFound,
    Failed(PathBuf, String),
}

/// Opens `lib` from the search folders (once per process) so that cudarc finds it by soname.
pub fn preload(lib: CudaLib) -> &'static LibStatus {
    static STATUS: OnceLock<std::sync::Mutex<Vec<(CudaLib, &'static LibStatus)>>> = OnceLock::new();
    let table = STATUS.get_or_init(Default::default);
    let mut table = table.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, s)) = table.iter().find(|(l, _)| *l == lib) {
        return s;
    }
    let status: &'static LibStatus = Box::leak(Box::new(load_from_dirs(lib)));
    table.push((lib, status));
    status
}

fn load_from_dirs(lib: CudaLib) -> LibStatus {
    if lib == CudaLib::Cudnn {
        return load_cudnn();
    }
    load_first(lib)
}

/// cuDNN 9 is a front library (`libcudnn.so.9`) that opens its sub-libraries
/// (`libcudnn_ops.so.9`, `libcudnn_engines_*.so.9`, ...) by soname, and cudarc opens the front
/// by the bare name `libcudnn.so` before `libcudnn.so.9`. Preloading a front from elsewhere
/// than where that bare name resolves puts two fronts in the process, and the second one's
/// calls fail with `CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH` (seen on the H200 machine, which
/// has the system's cuDNN and pip's). So the front is the one the system loader gives for
/// cudarc's first name when there is one, else ours from the search folders.
fn load_cudnn() -> LibStatus {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: as in `load_first`: cuDNN's initialisers run, as they would under cudarc.
    match unsafe { Library::open(Some("libcudnn.so"), RTLD_NOW | RTLD_GLOBAL) } {
        Ok(l) => {
            std::mem::forget(l);
            mapped_file("libcudnn.so").map_or(LibStatus::NotFound, LibStatus::Loaded)
        }
        Err(_) => load_first(CudaLib::Cudnn),
    }
}

/// The file behind a library this process has mapped whose name starts with `prefix`.
fn mapped_file(prefix: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(PathBuf::from)
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix)))
}

fn load_first(lib: CudaLib) -> LibStatus {
    for name in lib.file_names() {
        for dir in search_dirs() {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            // SAFETY: loading a CUDA library runs its initialisers, which is what cudarc would
            // do a moment later anyway. The handle is leaked: the library stays loaded for the
            // life of the process, which the soname lookups rely on.
            let opened = unsafe {
                libloading::os::unix::Library::open(
                    Some(&path),
                    libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
                )
            };
            return match opened {
                Ok(l) => {
                    std::mem::forget(l);
                    if lib == CudaLib::Nvrtc {
                        preload_nvrtc_builtins(dir);
                    }
                    LibStatus::Loaded(path)
                }
                Err(e) => LibStatus::Failed(path, e.to_string()),
            };
        }
    }
    LibStatus::NotFound
}

/// NVRTC opens `libnvrtc-builtins.so.<version>` by name when it compiles. Pip's NVRTC 13.0
/// has no `$ORIGIN` run path, so the loader would not look beside it; loaded here first, the
/// library is found by its soname instead. A failure is NVRTC's to report, at compile time.
fn preload_nvrtc_builtins(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for path in entries.flatten().map(|e| e.path()) {
        if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libnvrtc-builtins.so.")) {
            // SAFETY: as in `load_first`; NVRTC would load this library itself.
            let opened = unsafe {
                libloading::os::unix::Library::open(
                    Some(&path),
                    libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
                )
            };
            if let Ok(l) = opened {
                std::mem::forget(l);
            }
        }
    }
}

/// Whether the system loader can open `lib` by name (after `preload`).
pub fn loadable(lib: CudaLib) -> bool {
    if let LibStatus::Loaded(_) = preload(lib) {
        return true;
    }
    lib.file_names().iter().any(|name| {
        // SAFETY: as in `load_from_dirs`; this handle is dropped right away.
        unsafe { libloading::Library::new(*name).is_ok() }
    })
}

/// A human-readable account of the search, for error messages.
pub fn describe_search(lib: CudaLib) -> String {
    let dirs: Vec<String> = search_dirs().iter().map(|d| d.display().to_string()).collect();
    let status = match preload(lib) {
        LibStatus::Loaded(p) => format!("loaded {}", p.display()),
        LibStatus::NotFound => format!("{} not found", lib.name()),
        LibStatus::Failed(p, e) => format!("{} failed to load: {e}", p.display()),
    };
    format!(
        "{status}; searched the loader's path and [{}]; set CUDA_HOME or OXTRAIN_CUDA_LIB_DIRS to the folder that holds {}",
        dirs.join(", "),
        lib.name()
    )
}
