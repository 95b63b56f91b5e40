//! NVSHMEM's host library (`libnvshmem_host.so.3`), loaded at run time with libloading.
//!
//! Found as `OXTRAIN_NVSHMEM_LIB` (a file), else in `OXTRAIN_NVSHMEM_HOME/lib`,
//! `NVSHMEM_HOME/lib`, or pip's `nvidia/nvshmem/lib` (package nvidia-nvshmem-cu13).
//! `nvshmem_init` is a static inline of the headers, so initialisation goes through
//! `nvshmemx_hostlib_init_attr` with a unique id, as NVIDIA's Python bindings do; the structs
//! it takes are laid out by hand below (sizes and offsets checked by the headers'
//! static_asserts in NVSHMEM 3.x).

use crate::error::{CommError, Result};
use std::ffi::c_void;
use std::path::PathBuf;

pub(crate) type CuStream = *mut c_void;

/// `nvshmemx_uniqueid_t`: 128 bytes, a version word first.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct UniqueId {
    pub bytes: [u8; 128],
}

/// `nvshmemx_init_attr_t` (v2, 144 bytes): version at 0, mpi_comm at 8, then the 128-byte
/// `nvshmemx_init_args_t`: its version at 16, `uid_args` {version at 24, id pointer at 32,
/// myrank at 40, nranks at 44}, cuda_device_id at 48, padding to 144.
#[repr(C, align(8))]
pub(crate) struct InitAttr {
    pub bytes: [u8; 144],
}

const _: () = assert!(std::mem::size_of::<UniqueId>() == 128 && std::mem::size_of::<InitAttr>() == 144);

/// `NVSHMEMX_INIT_WITH_UNIQUEID`.
pub(crate) const INIT_WITH_UNIQUEID: u32 = 1 << 3;
/// `NVSHMEM_SIGNAL_SET` / `_ADD`.
pub(crate) const SIGNAL_SET: i32 = 9;
pub(crate) const SIGNAL_ADD: i32 = 10;

/// The host functions the collectives need.
pub(crate) struct Api {
    pub get_uniqueid: unsafe extern "C" fn(*mut UniqueId) -> i32,
    pub set_attr_uniqueid_args: unsafe extern "C" fn(i32, i32, *const UniqueId, *mut InitAttr) -> i32,
    pub hostlib_init_attr: unsafe extern "C" fn(u32, *mut InitAttr) -> i32,
    pub hostlib_finalize: unsafe extern "C" fn(),
    pub my_pe: unsafe extern "C" fn() -> i32,
    pub n_pes: unsafe extern "C" fn() -> i32,
    pub malloc: unsafe extern "C" fn(usize) -> *mut c_void,
    pub free: unsafe extern "C" fn(*mut c_void),
    pub ptr: unsafe extern "C" fn(*const c_void, i32) -> *mut c_void,
    pub cumodule_init: unsafe extern "C" fn(*mut c_void) -> i32,
    pub cumodule_finalize: unsafe extern "C" fn(*mut c_void) -> i32,
    pub barrier_all: unsafe extern "C" fn(),
    /// The one-sided calls of `SymmetricMemory`; None when this NVSHMEM lacks one of them
    /// (the collectives do not need them).
    pub one_sided: std::result::Result<OneSided, String>,
    pub path: PathBuf,
    _lib: libloading::Library,
}

/// Host-initiated one-sided operations (stream-ordered puts and gets, signals).
pub(crate) struct OneSided {
    pub quiet_on_stream: unsafe extern "C" fn(CuStream),
    pub putmem_on_stream: unsafe extern "C" fn(*mut c_void, *const c_void, usize, i32, CuStream),
    pub getmem_on_stream: unsafe extern "C" fn(*mut c_void, *const c_void, usize, i32, CuStream),
    pub putmem_signal_on_stream:
        unsafe extern "C" fn(*mut c_void, *const c_void, usize, *mut u64, u64, i32, i32, CuStream),
    pub signal_op_on_stream: unsafe extern "C" fn(*mut u64, u64, i32, i32, CuStream),
}

fn candidates() -> Vec<PathBuf> {
    const NAME: &str = "libnvshmem_host.so.3";
    let mut c: Vec<PathBuf> = vec![];
    if let Some(p) = super::options::NvshmemPaths::from_env().lib {
        c.push(p);
    }
    if let Some(home) = super::device_code::nvshmem_home() {
        c.push(home.join("lib").join(NAME));
    }
    for d in oxtrain_tensor::cuda::libs::search_dirs() {
        c.push(d.join(NAME));
    }
    c.into_iter().filter(|p| p.is_file()).collect()
}

/// The host library, loaded once per process.
pub(crate) fn api() -> Result<&'static Api> {
    static API: std::sync::OnceLock<std::result::Result<Api, String>> = std::sync::OnceLock::new();
    API.get_or_init(load).as_ref().map_err(|e| CommError::Unsupported(format!("nvshmem: {e}")))
}

fn load() -> std::result::Result<Api, String> {
    let path = candidates().into_iter().next().ok_or_else(|| {
        "libnvshmem_host.so.3 not found: `pip install nvidia-nvshmem-cu13`, or set OXTRAIN_NVSHMEM_LIB to the file \
         (or OXTRAIN_NVSHMEM_HOME to the folder holding lib/)"
            .to_string()
    })?;
    // SAFETY: loading runs the library's initialisers only; RTLD_GLOBAL lets its bootstrap
    // plugins (dlopened by NVSHMEM from the same folder) resolve its symbols.
    let lib: libloading::Library = unsafe {
        libloading::os::unix::Library::open(
            Some(&path),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
        )
    }
    .map_err(|e| format!("loading {}: {e}", path.display()))?
    .into();
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the signature is the one NVSHMEM's headers declare.
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{} has no {}: {e}", path.display(), $name))?
        };
    }
    let one_sided = (|| -> std::result::Result<OneSided, String> {
        Ok(OneSided {
            quiet_on_stream: sym!("nvshmemx_quiet_on_stream"),
            putmem_on_stream: sym!("nvshmemx_putmem_on_stream"),
            getmem_on_stream: sym!("nvshmemx_getmem_on_stream"),
            putmem_signal_on_stream: sym!("nvshmemx_putmem_signal_on_stream"),
            signal_op_on_stream: sym!("nvshmemx_signal_op_on_stream"),
        })
    })();
    Ok(Api {
        get_uniqueid: sym!("nvshmemx_get_uniqueid"),
        set_attr_uniqueid_args: sym!("nvshmemx_set_attr_uniqueid_args"),
        hostlib_init_attr: sym!("nvshmemx_hostlib_init_attr"),
        hostlib_finalize: sym!("nvshmemx_hostlib_finalize"),
        my_pe: sym!("nvshmem_my_pe"),
        n_pes: sym!("nvshmem_n_pes"),
        malloc: sym!("nvshmem_malloc"),
        free: sym!("nvshmem_free"),
        ptr: sym!("nvshmem_ptr"),
        cumodule_init: sym!("nvshmemx_cumodule_init"),
        cumodule_finalize: sym!("nvshmemx_cumodule_finalize"),
        barrier_all: sym!("nvshmem_barrier_all"),
        one_sided,
        path,
        _lib: lib,
    })
}

/// Fills the init attributes for PE `rank` of `world` with `uid` exactly as
/// `nvshmemx_set_attr_uniqueid_args` does (we call it too; this only pre-sets the version
/// words, which the headers' `NVSHMEMX_INIT_ATTR_INITIALIZER` would).
pub(crate) fn init_attr() -> InitAttr {
    let mut a = InitAttr { bytes: [0; 144] };
    let put32 =
        |a: &mut InitAttr, off: usize, v: i32| a.bytes[off..off + 4].copy_from_slice(&v.to_le_bytes());
    put32(&mut a, 0, (2 << 16) + 144); // nvshmemx_init_attr_t version
    put32(&mut a, 16, (2 << 16) + 128); // nvshmemx_init_args_t version
    put32(&mut a, 24, (1 << 16) + 24); // nvshmemx_uniqueid_args_t version
    put32(&mut a, 40, -1); // myrank, unset
    put32(&mut a, 44, -1); // nranks, unset
    put32(&mut a, 48, -1); // cuda_device_id: the current context's device
    a
}

/// An empty unique id with its version word, as `NVSHMEMX_UNIQUEID_INITIALIZER`.
pub(crate) fn unique_id() -> UniqueId {
    let mut u = UniqueId { bytes: [0; 128] };
    u.bytes[..4].copy_from_slice(&((1i32 << 16) + 128).to_le_bytes());
    u
}

/// Reads back (rank, nranks, uid pointer) from the attributes, to check the layout after
/// `nvshmemx_set_attr_uniqueid_args` filled them.
pub(crate) fn attr_uid_args(a: &InitAttr) -> (i32, i32, u64) {
    let get32 = |off: usize| i32::from_le_bytes(a.bytes[off..off + 4].try_into().expect("4 bytes"));
    let ptr = u64::from_le_bytes(a.bytes[32..40].try_into().expect("8 bytes"));
    (get32(40), get32(44), ptr)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every symbol the backend uses resolves in the installed host library (no GPU needed).
    /// Skipped when NVSHMEM is not installed, unless OXTRAIN_REQUIRE_NVSHMEM_BUILD=1 (CI, which
    /// installs pip's nvidia-nvshmem-cu13) says it is.
    #[test]
    fn host_library_has_every_symbol() {
        if candidates().is_empty() {
            let required = std::env::var("OXTRAIN_REQUIRE_NVSHMEM_BUILD").is_ok_and(|v| v == "1");
            assert!(!required, "OXTRAIN_REQUIRE_NVSHMEM_BUILD=1 but libnvshmem_host.so.3 is not found");
            eprintln!("skipped: libnvshmem_host.so.3 not found");
            return;
        }
        let api = api().unwrap_or_else(|e| panic!("{e}"));
        if let Err(e) = &api.one_sided {
            panic!("one-sided calls missing: {e}");
        }
        // The hand-written attribute layout, as nvshmemx_set_attr_uniqueid_args fills it.
        let mut uid = unique_id();
        // SAFETY: out-parameters of the documented sizes; no GPU is needed for these calls.
        let st = unsafe { (api.get_uniqueid)(&mut uid) };
        eprintln!("nvshmemx_get_uniqueid: {st}");
        let mut attr = init_attr();
        let st = unsafe { (api.set_attr_uniqueid_args)(1, 2, &uid, &mut attr) };
        assert_eq!(st, 0);
        assert_eq!(attr_uid_args(&attr), (1, 2, &uid as *const UniqueId as u64));
        assert_eq!(i32::from_le_bytes(attr.bytes[0..4].try_into().unwrap()), 0x20090, "attr version changed");
    }

    #[test]
    fn init_attr_version_words_match_the_headers() {
        let a = init_attr();
        assert_eq!(i32::from_le_bytes(a.bytes[0..4].try_into().unwrap()), 0x20090);
        assert_eq!(i32::from_le_bytes(a.bytes[16..20].try_into().unwrap()), 0x20080);
        assert_eq!(i32::from_le_bytes(a.bytes[24..28].try_into().unwrap()), 0x10018);
        assert_eq!(attr_uid_args(&a), (-1, -1, 0));
        assert_eq!(&unique_id().bytes[..4], &0x10080i32.to_le_bytes());
    }
}
