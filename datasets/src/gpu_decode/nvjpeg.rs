//! nvJPEG's batched decoder, opened at run time like the other CUDA libraries (the CUDA
//! toolkit, or pip's `nvidia-nvjpeg-cu13`; see `oxtrain_tensor::cuda::libs`), decoding into
//! interleaved RGB (`[H, W, 3]` u8) device tensors on the current stream.
//!
//! The batched call fails as a whole when one file is bad, so each file's header is read
//! first (`nvjpegGetImageInfo`: unsupported layouts are refused there) and a failed batch is
//! decoded again file by file to find the ones to refuse.

use super::BatchJpegDecoder;
use libloading::Library;
use oxtrain_tensor::cuda::libs::{self, CudaLib};
use oxtrain_tensor::cuda::Stream;
use oxtrain_tensor::{DType, Device, Storage, Tensor};
use std::ffi::{c_int, c_uchar, c_void};

type Status = c_int;
type Handle = *mut c_void;
type State = *mut c_void;
/// `NVJPEG_OUTPUT_RGBI`: interleaved RGB in `channel[0]`.
const OUTPUT_RGBI: c_int = 5;
/// `NVJPEG_CSS_UNKNOWN`.
const CSS_UNKNOWN: c_int = -1;
const MAX_COMPONENT: usize = 4;

/// `nvjpegImage_t`.
#[repr(C)]
struct NvImage {
    channel: [*mut c_uchar; MAX_COMPONENT],
    pitch: [usize; MAX_COMPONENT],
}

type CreateEx = unsafe extern "C" fn(c_int, *mut c_void, *mut c_void, u32, *mut Handle) -> Status;
type Destroy = unsafe extern "C" fn(Handle) -> Status;
type StateCreate = unsafe extern "C" fn(Handle, *mut State) -> Status;
type StateDestroy = unsafe extern "C" fn(State) -> Status;
type GetImageInfo = unsafe extern "C" fn(
    Handle,
    *const c_uchar,
    usize,
    *mut c_int,
    *mut c_int,
    *mut c_int,
    *mut c_int,
) -> Status;
type BatchedInitialize = unsafe extern "C" fn(Handle, State, c_int, c_int, c_int) -> Status;
type DecodeBatched = unsafe extern "C" fn(
    Handle,
    State,
    *const *const c_uchar,
    *const usize,
    *mut NvImage,
    *mut c_void,
) -> Status;
type Decode =
    unsafe extern "C" fn(Handle, State, *const c_uchar, usize, c_int, *mut NvImage, *mut c_void) -> Status;

/// nvJPEG's status codes, named for messages.
fn status_name(s: Status) -> &'static str {
    match s {
        1 => "NOT_INITIALIZED",
        2 => "INVALID_PARAMETER",
        3 => "BAD_JPEG",
        4 => "JPEG_NOT_SUPPORTED",
        5 => "ALLOCATOR_FAILURE",
        6 => "EXECUTION_FAILED",
        7 => "ARCH_MISMATCH",
        8 => "INTERNAL_ERROR",
        9 => "IMPLEMENTATION_NOT_SUPPORTED",
        10 => "INCOMPLETE_BITSTREAM",
        _ => "unknown status",
    }
}

fn check(what: &str, s: Status) -> Result<(), String> {
    if s == 0 {
        Ok(())
    } else {
        Err(format!("{what}: NVJPEG_STATUS_{} ({s})", status_name(s)))
    }
}

/// nvJPEG's back ends (`nvjpegBackend_t`) in the order tried: the GPU's JPEG engines (A100,
/// H100, H200: the SMs stay free for the step), Huffman decoding on the GPU, then nvJPEG's own
/// choice. `OXTRAIN_NVJPEG_BACKEND` names one to use alone.
const BACKENDS: [(&str, c_int); 4] = [("hardware", 3), ("gpu_hybrid", 2), ("hybrid", 1), ("default", 0)];

/// The back ends to try: the one `OXTRAIN_NVJPEG_BACKEND` names, or all but "hybrid" (its
/// Huffman decoding runs on the CPU, which is what decoding on the GPU is to spare).
fn backends_to_try() -> Result<Vec<(&'static str, c_int)>, String> {
    match std::env::var("OXTRAIN_NVJPEG_BACKEND") {
        Ok(name) if !name.is_empty() => {
            BACKENDS.iter().find(|(n, _)| *n == name).map(|b| vec![*b]).ok_or_else(|| {
                format!(
                    "OXTRAIN_NVJPEG_BACKEND = {name:?} is not one of hardware, gpu_hybrid, hybrid, default"
                )
            })
        }
        _ => Ok(BACKENDS.iter().copied().filter(|(n, _)| *n != "hybrid").collect()),
    }
}

/// Whether nvJPEG can be opened here (for `decode = "auto"`), or why not.
pub fn available() -> Result<(), String> {
    open_library().map(|_| ())
}

fn open_library() -> Result<Library, String> {
    libs::preload(CudaLib::NvJpeg);
    CudaLib::NvJpeg
        .file_names()
        .iter()
        // SAFETY: nvJPEG's initialisers have no preconditions; the symbols are checked below.
        .find_map(|name| unsafe { Library::new(*name).ok() })
        .ok_or_else(|| libs::describe_search(CudaLib::NvJpeg))
}

/// Says once per process which back end decodes (every worker makes its own decoder).
fn announce(backend: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        eprintln!("oxtrain-datasets: decoding JPEGs on the GPU with nvJPEG's {backend} back end")
    });
}

/// The function `name` of `lib`, as a pointer of type `T`.
///
/// # Safety
/// `T` must be the function's type in nvjpeg.h.
unsafe fn symbol<T: Copy>(lib: &Library, name: &[u8]) -> Result<T, String> {
    // SAFETY: the caller's.
    unsafe { lib.get::<T>(name) }.map(|s| *s).map_err(|e| format!("nvJPEG lacks a symbol: {e}"))
}

/// A decoder on device `ordinal` with its own nvJPEG handle and state (one per thread).
pub struct NvJpegDecoder {
    ordinal: usize,
    backend: &'static str,
    handle: Handle,
    state: State,
    initialized_for: usize,
    get_image_info: GetImageInfo,
    batched_initialize: BatchedInitialize,
    decode_batched: DecodeBatched,
    decode_one: Decode,
    destroy: Destroy,
    state_destroy: StateDestroy,
    _lib: Library,
}

// SAFETY: the handle and state are used by one thread at a time (`&mut self`).
unsafe impl Send for NvJpegDecoder {}

impl NvJpegDecoder {
    pub fn new(ordinal: usize) -> Result<NvJpegDecoder, String> {
        Device::Cuda(ordinal).check_available().map_err(|e| e.to_string())?;
        let lib = open_library()?;
        // SAFETY: the types are those of nvjpeg.h for these symbols.
        unsafe {
            let create: CreateEx = symbol(&lib, b"nvjpegCreateEx\0")?;
            let state_create: StateCreate = symbol(&lib, b"nvjpegJpegStateCreate\0")?;
            let mut tried = Vec::new();
            let mut chosen = None;
            for (name, backend) in backends_to_try()? {
                let mut handle: Handle = std::ptr::null_mut();
                let s = create(backend, std::ptr::null_mut(), std::ptr::null_mut(), 0, &mut handle);
                match check("nvjpegCreateEx", s) {
                    Ok(()) => {
                        chosen = Some((name, handle));
                        break;
                    }
                    Err(e) => tried.push(format!("{name}: {e}")),
                }
            }
            let Some((backend, handle)) = chosen else {
                return Err(format!("no nvJPEG back end could be created ({})", tried.join("; ")));
            };
            announce(backend);
            let mut state: State = std::ptr::null_mut();
            check("nvjpegJpegStateCreate", state_create(handle, &mut state))?;
            Ok(NvJpegDecoder {
                ordinal,
                backend,
                handle,
                state,
                initialized_for: 0,
                get_image_info: symbol(&lib, b"nvjpegGetImageInfo\0")?,
                batched_initialize: symbol(&lib, b"nvjpegDecodeBatchedInitialize\0")?,
                decode_batched: symbol(&lib, b"nvjpegDecodeBatched\0")?,
                decode_one: symbol(&lib, b"nvjpegDecode\0")?,
                destroy: symbol(&lib, b"nvjpegDestroy\0")?,
                state_destroy: symbol(&lib, b"nvjpegJpegStateDestroy\0")?,
                _lib: lib,
            })
        }
    }

    /// The back end in use ("hardware", "gpu_hybrid", "hybrid" or "default").
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// (width, height) from the header, or why nvJPEG will not take the file.
    fn image_info(&self, bytes: &[u8]) -> Result<(usize, usize), String> {
        let (mut comps, mut css) = (0, 0);
        let (mut w, mut h) = ([0 as c_int; MAX_COMPONENT], [0 as c_int; MAX_COMPONENT]);
        // SAFETY: `bytes` is valid for its length; the arrays hold NVJPEG_MAX_COMPONENT.
        let s = unsafe {
            (self.get_image_info)(
                self.handle,
                bytes.as_ptr(),
                bytes.len(),
                &mut comps,
                &mut css,
                w.as_mut_ptr(),
                h.as_mut_ptr(),
            )
        };
        check("reading the header", s)?;
        if css == CSS_UNKNOWN || !(comps == 1 || comps == 3) {
            return Err(format!("{comps} components, chroma subsampling {css} (CMYK or unusual)"));
        }
        Ok((w[0] as usize, h[0] as usize))
    }

    /// One device buffer for every image of `sizes` ((width, height) each), and per image its
    /// `[h, w, 3]` view with the nvJPEG descriptor of its memory: one allocation per batch, not
    /// one per image.
    fn destinations(&self, sizes: &[(usize, usize)]) -> Result<Vec<(Tensor, NvImage)>, String> {
        let total: usize = sizes.iter().map(|(w, h)| w * h * 3).sum();
        let all = Tensor::zeros([total.max(1)], DType::U8, Device::Cuda(self.ordinal))
            .map_err(|e| e.to_string())?;
        let base = match &*all.storage() {
            Storage::Cuda(s) => s.ptr(),
            Storage::Cpu(_) => return Err("a device tensor on the CPU".into()),
        };
        let mut at = 0usize;
        let mut out = Vec::with_capacity(sizes.len());
        for &(w, h) in sizes {
            let view = all.narrow(0, at, w * h * 3).reshape([h, w, 3]);
            let mut img =
                NvImage { channel: [std::ptr::null_mut(); MAX_COMPONENT], pitch: [0; MAX_COMPONENT] };
            img.channel[0] = (base + at as u64) as *mut c_uchar;
            img.pitch[0] = w * 3;
            out.push((view, img));
            at += w * h * 3;
        }
        Ok(out)
    }

    fn stream(&self) -> Result<*mut c_void, String> {
        let s = Stream::current(self.ordinal).map_err(|e| e.to_string())?;
        Ok(s.raw().cu_stream() as *mut c_void)
    }

    fn decode_each(&mut self, files: &[&[u8]], outs: &mut [(Tensor, NvImage)]) -> Vec<Result<(), String>> {
        let stream = match self.stream() {
            Ok(s) => s,
            Err(e) => return files.iter().map(|_| Err(e.clone())).collect(),
        };
        files
            .iter()
            .zip(outs.iter_mut())
            .map(|(bytes, (_, img))| {
                // SAFETY: as in `decode_batch`, for one file.
                let s = unsafe {
                    (self.decode_one)(
                        self.handle,
                        self.state,
                        bytes.as_ptr(),
                        bytes.len(),
                        OUTPUT_RGBI,
                        img,
                        stream,
                    )
                };
                check("nvjpegDecode", s)
            })
            .collect()
    }
}

impl BatchJpegDecoder for NvJpegDecoder {
    type Image = Tensor;

    fn decode_batch(&mut self, files: &[&[u8]]) -> Vec<Result<Tensor, String>> {
        let mut results: Vec<Result<Tensor, String>> = Vec::with_capacity(files.len());
        let (mut taken, mut sizes) = (Vec::new(), Vec::new());
        for (i, bytes) in files.iter().enumerate() {
            match self.image_info(bytes) {
                Ok(size) => {
                    taken.push(i);
                    sizes.push(size);
                    results.push(Err(String::new()));
                }
                Err(why) => results.push(Err(why)),
            }
        }
        let mut outs = match self.destinations(&sizes) {
            Ok(outs) => outs,
            Err(why) => return files.iter().map(|_| Err(why.clone())).collect(),
        };
        let batch: Vec<&[u8]> = taken.iter().map(|&i| files[i]).collect();
        let whole = self.run_batched(&batch, &mut outs);
        let each: Vec<Result<(), String>> = match whole {
            Ok(()) => batch.iter().map(|_| Ok(())).collect(),
            // One bad file fails the batched call: find which, one by one.
            Err(_) => self.decode_each(&batch, &mut outs),
        };
        for ((i, (t, _)), r) in taken.into_iter().zip(outs).zip(each) {
            results[i] = r.map(|()| t);
        }
        results
    }
}

impl NvJpegDecoder {
    fn run_batched(&mut self, batch: &[&[u8]], outs: &mut [(Tensor, NvImage)]) -> Result<(), String> {
        if batch.is_empty() {
            return Ok(());
        }
        if self.initialized_for != batch.len() {
            // SAFETY: handle and state are live; a batch size and thread count of ours.
            let s = unsafe {
                (self.batched_initialize)(self.handle, self.state, batch.len() as c_int, 1, OUTPUT_RGBI)
            };
            check("nvjpegDecodeBatchedInitialize", s)?;
            self.initialized_for = batch.len();
        }
        let stream = self.stream()?;
        let ptrs: Vec<*const c_uchar> = batch.iter().map(|b| b.as_ptr()).collect();
        let lens: Vec<usize> = batch.iter().map(|b| b.len()).collect();
        let mut images: Vec<NvImage> =
            outs.iter().map(|(_, i)| NvImage { channel: i.channel, pitch: i.pitch }).collect();
        // SAFETY: `ptrs`/`lens` describe live host buffers; each destination is a device
        // tensor of h x w x 3 bytes with pitch w * 3, alive until the stream's work is done
        // (the tensors are queued on the same stream by the caching allocator).
        let s = unsafe {
            (self.decode_batched)(
                self.handle,
                self.state,
                ptrs.as_ptr(),
                lens.as_ptr(),
                images.as_mut_ptr(),
                stream,
            )
        };
        check("nvjpegDecodeBatched", s)
    }
}

impl Drop for NvJpegDecoder {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            (self.state_destroy)(self.state);
            (self.destroy)(self.handle);
        }
    }
}
