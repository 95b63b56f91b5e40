//! One GPU: its context, streams, compiled kernels and memory.

use super::alloc::{CachingAllocator, MemoryStats};
use super::host_waits::{self, ErrorRecordArg, HostWaits, Wait, WaitCounters};
use super::libs::{self, CudaLib};
use super::nvrtc::KernelSource;
use super::{aot, cubins};
use crate::{Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// A CUDA device as oxtrain uses it; get one with [`device`].
pub struct CudaDevice {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    /// The stream ops run on unless a [`super::StreamGuard`] says otherwise.
    default_stream: Arc<CudaStream>,
    arch: u32,
    name: String,
    allocator: Arc<CachingAllocator>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    functions: Mutex<HashMap<(&'static str, String), CudaFunction>>,
    waits: WaitCounters,
    /// Cleared when the driver refuses an embedded cubin (one newer than it, say): from then on
    /// every family is compiled.
    embedded_loads: AtomicBool,
}

pub(crate) fn driver_error(ordinal: usize, what: &str, e: impl std::fmt::Debug) -> Error {
    Error::CudaUnavailable { ordinal, reason: format!("{what}: {e:?}") }
}

/// Checks that the driver library loads, with an error that says what was searched.
fn check_driver(ordinal: usize) -> Result<()> {
    if libs::loadable(CudaLib::Driver) {
        Ok(())
    } else {
        Err(Error::CudaUnavailable {
            ordinal,
            reason: format!(
                "the CUDA driver library cannot be loaded (no NVIDIA driver on this machine?): {}",
                libs::describe_search(CudaLib::Driver)
            ),
        })
    }
}

/// The number of CUDA devices (0 when there is no driver).
pub fn device_count() -> usize {
    if check_driver(0).is_err() {
        return 0;
    }
    CudaContext::device_count().map(|n| n.max(0) as usize).unwrap_or(0)
}

/// Whether `Device::Cuda(ordinal)` can be used.
pub fn is_available(ordinal: usize) -> bool {
    ordinal < device_count()
}

/// The device with this ordinal, created on first use and shared after.
pub fn device(ordinal: usize) -> Result<Arc<CudaDevice>> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
    let mut devices = DEVICES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = devices.get(&ordinal) {
        return Ok(d.clone());
    }
    let d = Arc::new(CudaDevice::open(ordinal)?);
    d.prepare_kernels();
    devices.insert(ordinal, d.clone());
    Ok(d)
}

impl CudaDevice {
    fn open(ordinal: usize) -> Result<CudaDevice> {
        check_driver(ordinal)?;
        let count = device_count();
        if ordinal >= count {
            return Err(Error::CudaUnavailable {
                ordinal,
                reason: format!("the driver reports {count} CUDA device(s)"),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| driver_error(ordinal, "creating the context", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| driver_error(ordinal, "reading the compute capability", e))?;
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        // A stream of our own rather than the legacy default stream, which synchronises with
        // every other stream and would serialise compute with communication.
        let default_stream = ctx.new_stream().map_err(|e| driver_error(ordinal, "creating a stream", e))?;
        Ok(CudaDevice {
            ordinal,
            allocator: CachingAllocator::new(ctx.clone()),
            ctx,
            default_stream,
            arch: (major * 10 + minor) as u32,
            name,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            waits: WaitCounters::default(),
            embedded_loads: AtomicBool::new(!aot::disabled()),
        })
    }

    /// Loads one embedded cubin to learn whether the driver takes them, then starts compiling
    /// in the background every family that has none this device can use, the longest first,
    /// so that the first step waits for the slowest family rather than for all in turn.
    fn prepare_kernels(&self) {
        let sources = super::all_kernel_sources();
        let probe = sources.iter().filter(|s| aot::has_embedded(s, self.arch)).min_by_key(|s| s.code.len());
        if let Some(src) = probe {
            if let Some(module) = self.load_embedded(src) {
                self.modules.lock().unwrap_or_else(|e| e.into_inner()).insert(src.name, module);
            }
        }
        let embedded = self.embedded_loads.load(Ordering::SeqCst);
        let mut missing: Vec<KernelSource> =
            sources.into_iter().filter(|s| !(embedded && aot::has_embedded(s, self.arch))).collect();
        missing.sort_by_key(|s| std::cmp::Reverse(aot::compile_ms_hint(s)));
        cubins::start_background(missing, self.arch);
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Compute capability as one number: 90 for sm_90 (H100, H200).
    pub fn arch(&self) -> u32 {
        self.arch
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn default_stream(&self) -> &Arc<CudaStream> {
        &self.default_stream
    }

    pub fn allocator(&self) -> &Arc<CachingAllocator> {
        &self.allocator
    }

    pub fn memory_stats(&self) -> MemoryStats {
        self.allocator.stats()
    }

    /// Waits for all work queued on this device.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.synchronize().map_err(|e| driver_error(self.ordinal, "synchronizing", e))?;
        self.waited(Wait::Synchronization);
        Ok(())
    }

    /// How often the host has waited for this device (see [`HostWaits`]).
    pub fn host_waits(&self) -> HostWaits {
        self.waits.read()
    }

    /// Counts a wait that just ended, then reports what kernels found meanwhile: every kernel
    /// queued before the wait has finished, so the error record is complete.
    pub(crate) fn waited(&self, wait: Wait) {
        self.waits.count(wait);
        self.check_device_errors();
    }

    /// Panics with the first error this thread's kernels recorded since the last check, if
    /// any: a bad index is a programmer error, as on the CPU, only found later.
    pub(crate) fn check_device_errors(&self) {
        if let Some(message) = host_waits::take_thread_error(self.ordinal) {
            panic!("{message}");
        }
    }

    /// This thread's error record, for a checking kernel that `op` launches.
    pub(crate) fn error_record(&self, op: &'static str) -> Result<ErrorRecordArg> {
        let record = host_waits::thread_record(self.ordinal, &self.ctx)?;
        record.note_op(op);
        Ok(record.arg())
    }

    /// A kernel of an op family's source, compiling and loading the module on first use.
    pub fn function(&self, src: &KernelSource, name: &str) -> Result<CudaFunction> {
        let key = (src.name, name.to_string());
        if let Some(f) = self.functions.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(f.clone());
        }
        let module = self.module(src)?;
        let f = module
            .load_function(name)
            .map_err(|e| Error::Msg(format!("{}.cu has no kernel `{name}`: {e:?}", src.name)))?;
        self.functions.lock().unwrap_or_else(|e| e.into_inner()).insert(key, f.clone());
        Ok(f)
    }

    fn module(&self, src: &KernelSource) -> Result<Arc<CudaModule>> {
        if let Some(m) = self.modules.lock().unwrap_or_else(|e| e.into_inner()).get(src.name) {
            return Ok(m.clone());
        }
        // Not under the lock: a family still compiling must not hold up the others.
        let module = match self.load_embedded(src) {
            Some(module) => module,
            None => {
                let cubin = cubins::compiled(src, self.arch)?;
                self.ctx
                    .load_module(cudarc::nvrtc::Ptx::from_binary(cubin.to_vec()))
                    .map_err(|e| Error::Msg(format!("loading {}.cu for sm_{}: {e:?}", src.name, self.arch)))?
            }
        };
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        Ok(modules.entry(src.name).or_insert(module).clone())
    }

    /// The module of the embedded cubin of `src`, if this binary has one this device runs and
    /// the driver takes it (a refusal is said once; from then on every family is compiled).
    fn load_embedded(&self, src: &KernelSource) -> Option<Arc<CudaModule>> {
        if !self.embedded_loads.load(Ordering::SeqCst) {
            return None;
        }
        let cubin = aot::embedded_cubin(src, self.arch)?;
        match self.ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin)) {
            Ok(module) => {
                if cubins::log_enabled() {
                    eprintln!("oxtrain: {}.cu for sm_{}: embedded cubin", src.name, self.arch);
                }
                Some(module)
            }
            Err(e) => {
                if self.embedded_loads.swap(false, Ordering::SeqCst) {
                    eprintln!(
                        "oxtrain: the driver refused the embedded cubin of {}.cu on cuda:{} ({e:?}); \
                         kernels are compiled with NVRTC instead (an older driver than the cubins need?)",
                        src.name, self.ordinal
                    );
                }
                None
            }
        }
    }
}
