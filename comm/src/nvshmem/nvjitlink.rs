//! nvJitLink, loaded at run time: links the LTO-IR NVRTC makes from our kernels with NVSHMEM's
//! device library (`libnvshmem_device.a`) into a cubin. cudarc does not bind it, so this opens
//! `libnvJitLink.so.13` (found by the tensor crate's library search) with libloading.
//!
//! The library exports versioned names (`__nvJitLinkCreate_13_0`; the header maps the plain
//! names onto them), so we look those up.

use crate::error::{CommError, Result};
use oxtrain_tensor::cuda::libs::{self, CudaLib, LibStatus};
use std::ffi::{c_char, c_void, CString};
use std::path::Path;

type Handle = *mut c_void;
type Status = i32;

/// `nvJitLinkInputType`.
#[derive(Debug, Clone, Copy)]
#[repr(i32)]
pub enum InputType {
    Cubin = 1,
    Ptx = 2,
    LtoIr = 3,
    Fatbin = 4,
    Object = 5,
    Library = 6,
}

struct Api {
    create: unsafe extern "C" fn(*mut Handle, u32, *const *const c_char) -> Status,
    destroy: unsafe extern "C" fn(*mut Handle) -> Status,
    add_data: unsafe extern "C" fn(Handle, i32, *const c_void, usize, *const c_char) -> Status,
    add_file: unsafe extern "C" fn(Handle, i32, *const c_char) -> Status,
    complete: unsafe extern "C" fn(Handle) -> Status,
    cubin_size: unsafe extern "C" fn(Handle, *mut usize) -> Status,
    cubin: unsafe extern "C" fn(Handle, *mut c_void) -> Status,
    error_log_size: unsafe extern "C" fn(Handle, *mut usize) -> Status,
    error_log: unsafe extern "C" fn(Handle, *mut c_char) -> Status,
    info_log_size: unsafe extern "C" fn(Handle, *mut usize) -> Status,
    info_log: unsafe extern "C" fn(Handle, *mut c_char) -> Status,
    _lib: libloading::Library,
}

fn err(msg: impl Into<String>) -> CommError {
    CommError::Unsupported(format!("nvJitLink: {}", msg.into()))
}

fn api() -> Result<&'static Api> {
    static API: std::sync::OnceLock<std::result::Result<Api, String>> = std::sync::OnceLock::new();
    API.get_or_init(load).as_ref().map_err(|e| err(e.clone()))
}

fn load() -> std::result::Result<Api, String> {
    let path = match libs::preload(CudaLib::NvJitLink) {
        LibStatus::Loaded(p) => p.clone(),
        _ => CudaLib::NvJitLink.name().into(),
    };
    // SAFETY: loading the library runs its initialisers only.
    let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| {
        format!(
            "cannot load {} ({e}); install nvidia-nvjitlink (pip) or set OXTRAIN_CUDA_LIB_DIRS; {}",
            path.display(),
            libs::describe_search(CudaLib::NvJitLink)
        )
    })?;
    // The newest ABI first that this library knows; 13.0 is in every CUDA 13 release.
    let suffix = ["13_0", "12_0"]
        .into_iter()
        .find(|s| {
            unsafe { lib.get::<unsafe extern "C" fn()>(format!("__nvJitLinkCreate_{s}\0").as_bytes()) }
                .is_ok()
        })
        .ok_or_else(|| format!("{} exports no __nvJitLinkCreate_13_0 or _12_0", path.display()))?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the signature is the one nvJitLink.h declares for this ABI version.
            *unsafe { lib.get(format!("__nvJitLink{}_{suffix}\0", $name).as_bytes()) }
                .map_err(|e| format!("{}: missing __nvJitLink{}_{suffix}: {e}", path.display(), $name))?
        };
    }
    Ok(Api {
        create: sym!("Create"),
        destroy: sym!("Destroy"),
        add_data: sym!("AddData"),
        add_file: sym!("AddFile"),
        complete: sym!("Complete"),
        cubin_size: sym!("GetLinkedCubinSize"),
        cubin: sym!("GetLinkedCubin"),
        error_log_size: sym!("GetErrorLogSize"),
        error_log: sym!("GetErrorLog"),
        info_log_size: sym!("GetInfoLogSize"),
        info_log: sym!("GetInfoLog"),
        _lib: lib,
    })
}

/// One link: inputs in, a cubin out.
pub struct Linker {
    api: &'static Api,
    handle: Handle,
}

impl Linker {
    /// `options` as nvJitLink takes them, e.g. `["-arch=sm_90", "-lto"]`.
    pub fn new(options: &[String]) -> Result<Linker> {
        let api = api()?;
        let c: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()).map_err(|_| err("NUL in an option")))
            .collect::<Result<_>>()?;
        let ptrs: Vec<*const c_char> = c.iter().map(|s| s.as_ptr()).collect();
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: the option strings live through the call; nvJitLink copies them.
        let st = unsafe { (api.create)(&mut handle, ptrs.len() as u32, ptrs.as_ptr()) };
        if st != 0 || handle.is_null() {
            return Err(err(format!("nvJitLinkCreate({options:?}) failed with status {st}")));
        }
        Ok(Linker { api, handle })
    }

    fn check(&self, st: Status, what: &str) -> Result<()> {
        if st == 0 {
            return Ok(());
        }
        Err(err(format!("{what} failed with status {st}:\n{}", self.error_log())))
    }

    fn error_log(&self) -> String {
        self.log(self.api.error_log_size, self.api.error_log)
    }

    /// The linker's informational output (with `-verbose`: registers and spills per kernel).
    pub fn info_log(&self) -> String {
        self.log(self.api.info_log_size, self.api.info_log)
    }

    fn log(
        &self,
        size: unsafe extern "C" fn(Handle, *mut usize) -> Status,
        get: unsafe extern "C" fn(Handle, *mut c_char) -> Status,
    ) -> String {
        let mut n = 0usize;
        // SAFETY: a live handle and plain out-parameters.
        unsafe {
            if size(self.handle, &mut n) != 0 || n == 0 {
                return String::new();
            }
            let mut buf = vec![0u8; n];
            if get(self.handle, buf.as_mut_ptr() as *mut c_char) != 0 {
                return String::new();
            }
            String::from_utf8_lossy(&buf).trim_end_matches('\0').to_string()
        }
    }

    pub fn add_data(&mut self, kind: InputType, data: &[u8], name: &str) -> Result<()> {
        let cname = CString::new(name).map_err(|_| err("NUL in an input name"))?;
        // SAFETY: `data` is read during the call (nvJitLink copies its inputs).
        let st = unsafe {
            (self.api.add_data)(
                self.handle,
                kind as i32,
                data.as_ptr() as *const c_void,
                data.len(),
                cname.as_ptr(),
            )
        };
        self.check(st, &format!("nvJitLinkAddData({name})"))
    }

    pub fn add_file(&mut self, kind: InputType, path: &Path) -> Result<()> {
        let cpath = CString::new(path.to_string_lossy().as_bytes()).map_err(|_| err("NUL in a path"))?;
        // SAFETY: a live handle and a NUL-terminated path.
        let st = unsafe { (self.api.add_file)(self.handle, kind as i32, cpath.as_ptr()) };
        self.check(st, &format!("nvJitLinkAddFile({})", path.display()))
    }

    /// Links everything added and returns the cubin.
    pub fn finish(self) -> Result<Vec<u8>> {
        self.finish_with_log().map(|(c, _)| c)
    }

    /// `finish`, also returning the info log.
    pub fn finish_with_log(self) -> Result<(Vec<u8>, String)> {
        // SAFETY: a live handle; buffers sized by the library's own answer.
        unsafe {
            self.check((self.api.complete)(self.handle), "nvJitLinkComplete")?;
            let mut n = 0usize;
            self.check((self.api.cubin_size)(self.handle, &mut n), "nvJitLinkGetLinkedCubinSize")?;
            let mut out = vec![0u8; n];
            self.check(
                (self.api.cubin)(self.handle, out.as_mut_ptr() as *mut c_void),
                "nvJitLinkGetLinkedCubin",
            )?;
            Ok((out, self.info_log()))
        }
    }
}

impl Drop for Linker {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            let _ = (self.api.destroy)(&mut self.handle);
        }
    }
}
