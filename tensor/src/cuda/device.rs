//! One GPU: its context, streams, compiled kernels and memory.

use super::alloc::{CachingAllocator, MemoryStats};
use super::host_waits::{self, ErrorRecordArg, HostWaits, Wait, WaitCounters};
use super::libs::{self, CudaLib};
use super::nvrtc::{self, KernelSource};
use crate::{Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use std::collections::HashMap;
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
        })
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
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = modules.get(src.name) {
            return Ok(m.clone());
        }
        let cubin = nvrtc::compile_cached(src, self.arch)?;
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
            .map_err(|e| Error::Msg(format!("loading {}.cu for sm_{}: {e:?}", src.name, self.arch)))?;
        modules.insert(src.name, module.clone());
        Ok(module)
    }
}
