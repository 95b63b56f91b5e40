//! Start-up of the nvshmem backend: NVSHMEM initialised by unique id through the store, the
//! kernels built and registered, the staging, signals and fault record allocated.

use super::kernels::{self, Function, MAX_BLOCKS, MAX_PES};
use super::team::{self, Kind, Team};
use super::{device_code, fault, host, nv_err, Module, NvshmemCommunicator, NvshmemOptions, State};
use crate::bootstrap::TcpStore;
use crate::error::{CommError, Result};
use crate::gpu::{cuda_err, CommStream};
use cudarc::driver::{result as drv, sys as cu};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// NVSHMEM can be initialised once per process.
static INITIALISED: AtomicBool = AtomicBool::new(false);

impl NvshmemCommunicator {
    /// Initialises NVSHMEM for PE `rank` of `world` on GPU `ordinal` (one process per GPU; the
    /// GPUs of a node joined by NVLink; `opts.ranks_per_node` per node), through `store`. Call
    /// once per process.
    pub fn connect(
        rank: usize,
        world: usize,
        ordinal: usize,
        store: &TcpStore,
        opts: NvshmemOptions,
    ) -> Result<NvshmemCommunicator> {
        let per_node = match opts.ranks_per_node {
            0 => default_ranks_per_node(world, |k| std::env::var(k).ok()),
            n => n,
        }
        .clamp(1, world);
        if !world.is_multiple_of(per_node) || per_node > MAX_PES || world / per_node > MAX_PES {
            return Err(nv_err(format!(
                "{world} PEs with {per_node} per node: the backend needs the same number of GPUs on every node, at \
                 most {MAX_PES} per node and at most {MAX_PES} nodes (set OXTRAIN_NVSHMEM_RANKS_PER_NODE), or use the \
                 nccl backend"
            )));
        }
        let api = host::api()?;
        let device = oxtrain_tensor::cuda::device(ordinal)
            .map_err(|e| cuda_err(format!("opening cuda:{ordinal}"), e))?;
        device
            .context()
            .bind_to_thread()
            .map_err(|e| cuda_err("binding the CUDA context", format!("{e:?}")))?;
        // Build the kernels before joining: a missing header fails here on every rank alike.
        let cubin = device_code::Toolchain::find()?.build_cubin_cached(device.arch())?;
        if INITIALISED.swap(true, Ordering::SeqCst) {
            return Err(nv_err(
                "NVSHMEM is already initialised in this process (one communicator per process)",
            ));
        }

        // The unique id, from rank 0 through the store.
        let key = "oxtrain/nvshmem/unique_id";
        let mut uid = host::unique_id();
        if rank == 0 {
            // SAFETY: out-parameter of the documented size.
            let st = unsafe { (api.get_uniqueid)(&mut uid) };
            if st != 0 {
                return Err(nv_err(format!("nvshmemx_get_uniqueid failed ({st})")));
            }
            store.set(key, &uid.bytes)?;
        } else {
            let bytes = store.get(key)?;
            if bytes.len() != 128 {
                return Err(CommError::BadUniqueId { backend: "nvshmem", bytes: bytes.len(), expected: 128 });
            }
            uid.bytes.copy_from_slice(&bytes);
        }
        // PEs that share this GPU (NVSHMEM runs several per GPU under CUDA MPS) share its SMs.
        let ids = gpu_ids(store, rank, world, &device)?;
        let sharing = pes_sharing(&ids, rank);
        let first_on_gpu = ids.iter().position(|id| *id == ids[rank]) == Some(rank);
        if sharing > 1 && first_on_gpu && !mps_enabled(&device) {
            // It works, in turns: the GPU time-slices the PEs' contexts, and a collective took
            // 1.2-2.3 ms instead of microseconds on one H200 (notes of bench/results/comm-1xh200-mps-checks.json).
            eprintln!(
                "oxtrain-comm warning: {sharing} PEs run on cuda:{ordinal} ({}) without CUDA MPS, so the GPU runs \
                 their kernels in turns and every collective waits milliseconds for them; start the MPS daemon \
                 (nvidia-cuda-mps-control -d) before the job, or give every PE a GPU of its own",
                ids[rank]
            );
        }
        let mut attr = host::init_attr();
        // SAFETY: `uid` and `attr` live through init (the attributes point at `uid`).
        unsafe {
            let st = (api.set_attr_uniqueid_args)(rank as i32, world as i32, &uid, &mut attr);
            if st != 0 {
                return Err(nv_err(format!("nvshmemx_set_attr_uniqueid_args failed ({st})")));
            }
            // Self-check of the hand-written layout before NVSHMEM reads it.
            let (r, n, p) = host::attr_uid_args(&attr);
            if (r, n, p) != (rank as i32, world as i32, &uid as *const _ as u64) {
                return Err(nv_err(format!(
                    "nvshmemx_init_attr_t layout mismatch (read back rank {r}, nranks {n}): this NVSHMEM ({}) is not \
                     the 3.x layout oxtrain knows",
                    api.path.display()
                )));
            }
            let st = (api.hostlib_init_attr)(host::INIT_WITH_UNIQUEID, &mut attr);
            if st != 0 {
                return Err(nv_err(format!(
                    "nvshmemx_hostlib_init_attr failed ({st}) on rank {rank} of {world}; without InfiniBand set \
                     NVSHMEM_REMOTE_TRANSPORT=none"
                )));
            }
            let (me, n) = ((api.my_pe)(), (api.n_pes)());
            if (me, n) != (rank as i32, world as i32) {
                return Err(nv_err(format!("NVSHMEM says PE {me} of {n}, expected {rank} of {world}")));
            }
        }

        // The kernels: load, register with NVSHMEM.
        let module = unsafe {
            let m = drv::module::load_data(cubin.as_ptr() as *const c_void)
                .map_err(|e| cuda_err("cuModuleLoadData (nvshmem kernels)", format!("{e:?}")))?;
            let st = (api.cumodule_init)(m as *mut c_void);
            if st != 0 {
                return Err(nv_err(format!(
                    "nvshmemx_cumodule_init failed ({st}): the device library's NVSHMEM version must match the host \
                     library's ({})",
                    api.path.display()
                )));
            }
            let get = |s: &str| {
                drv::module::get_function(
                    m,
                    std::ffi::CString::new(device_code::kernel_name(s)).expect("name"),
                )
                .map(Function)
                .map_err(|e| cuda_err(format!("kernel {}", device_code::kernel_name(s)), format!("{e:?}")))
            };
            let kernels = |dtype: &str| -> Result<kernels::Kernels> {
                Ok(kernels::Kernels {
                    coll: get(dtype)?,
                    ll: get(&format!("ll_{dtype}"))?,
                    symm: get(&format!("symm_{dtype}"))?,
                })
            };
            Module {
                module: m,
                f32: kernels("f32")?,
                bf16: kernels("bf16")?,
                f16: kernels("f16")?,
                atomic: get("atomic")?,
                nop: get("nop")?,
                nop8: get("nop8")?,
            }
        };

        // Symmetric allocations: the same sizes in the same order on every PE.
        let slot_bytes = match opts.chunk_bytes {
            0 => (128usize << 20).min((256usize << 20) / world),
            b => b,
        } / 16
            * 16;
        let slot_bytes = slot_bytes.max(16);
        // Low-latency lines carry 8 data bytes in 16.
        let ll_slot_bytes = 2 * opts.ll_max_bytes.clamp(64 << 10, 16 << 20).next_multiple_of(16);
        let signal_array = MAX_BLOCKS as u64 * world as u64 * 8;
        let stream = CommStream::new(ordinal)?;
        let node_of = |pe: usize| pe / per_node;
        let remote = |pe: usize| node_of(pe) != node_of(rank);
        let (signals, teams) = unsafe {
            // Three arrays: ready, done, and the symmetric all-reduce's buffer descriptors
            // (collectives.cu, ox_desc).
            let signals = (api.malloc)(3 * signal_array as usize) as u64;
            if signals == 0 {
                return Err(nv_err("nvshmem_malloc of the signals failed: raise NVSHMEM_SYMMETRIC_SIZE"));
            }
            // Signals start at zero on every PE before anyone can raise one.
            drv::memset_d8_sync(signals, 0, 3 * signal_array as usize)
                .map_err(|e| cuda_err("zeroing the signals", format!("{e:?}")))?;
            let everyone: Vec<usize> = (0..world).collect();
            let mut teams: [Option<Team>; 4] = [None, None, None, None];
            if per_node == world {
                teams[Kind::All as usize] = Some(Team::new(api, rank, everyone.clone(), remote, slot_bytes)?);
                teams[Kind::Ll as usize] = Some(Team::new(api, rank, everyone, remote, ll_slot_bytes)?);
            } else {
                // Across nodes every op runs in stages on these two (hier.rs).
                let (node, rail) = team::layout(rank, world, per_node);
                let slot = slot_bytes.min(32 << 20);
                teams[Kind::Node as usize] = Some(Team::new(api, rank, node, remote, slot)?);
                teams[Kind::Rail as usize] = Some(Team::new(api, rank, rail, remote, slot)?);
            }
            (api.barrier_all)();
            (signals, teams)
        };
        // SAFETY: the context is current; freed in the communicator's teardown.
        let counters = unsafe {
            let c = drv::malloc_sync(kernels::COUNTER_BYTES)
                .map_err(|e| cuda_err("allocating the launch counters", format!("{e:?}")))?;
            drv::memset_d8_sync(c, 0, kernels::COUNTER_BYTES)
                .map_err(|e| cuda_err("zeroing the launch counters", format!("{e:?}")))?;
            c
        };
        // Block b waits only for block b of the peers; with more blocks than fit at once that
        // could wait on a block that is never scheduled. So at most one wave: all SMs, split
        // between the PEs that share them.
        let resident = shared_resident(resident_blocks(&device, &module)?, sharing);
        let mut opts = opts;
        opts.max_blocks = opts.max_blocks.min(resident);
        let fault = fault::Fault::new(rank, crate::CommOptions::default().timeout)?;
        let algorithm = opts.algorithm;
        let dependent_launch = opts.dependent_launch;
        Ok(NvshmemCommunicator {
            rank,
            world,
            stream,
            opts,
            module,
            per_node,
            teams,
            signals,
            signal_array,
            counters,
            fault,
            // A dependently launched collective waits on the SMs for its predecessor, so each PE
            // holds two grids there: PEs sharing a GPU then fill it and starve one another's
            // current launch (4 PEs of 32 blocks hung on one H200 under MPS).
            dependent_launch: device.arch() >= 90 && sharing == 1 && dependent_launch,
            state: Mutex::new(State { algorithm }),
            tensors: Default::default(),
            scratch: Default::default(),
        })
    }
}

/// How many blocks of the collective kernels stay resident at once on this GPU: block b waits
/// for block b of the peers, so every block of a launch must run at once.
fn resident_blocks(device: &oxtrain_tensor::cuda::CudaDevice, module: &Module) -> Result<u32> {
    let sms = device
        .context()
        .attribute(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| cuda_err("reading the SM count", format!("{e:?}")))?;
    let mut per_sm = i32::MAX;
    for f in [module.f32, module.bf16, module.f16].iter().flat_map(|k| k.all()) {
        // SAFETY: a loaded kernel.
        let n =
            unsafe { drv::occupancy::max_active_block_per_multiprocessor(f.0, kernels::THREADS as i32, 0) }
                .map_err(|e| cuda_err("reading the collective kernel's occupancy", format!("{e:?}")))?;
        per_sm = per_sm.min(n);
    }
    Ok((sms.max(1) * per_sm.max(1)) as u32)
}

/// Every PE's GPU as "host/PCI bus id", exchanged through the store.
fn gpu_ids(
    store: &TcpStore,
    rank: usize,
    world: usize,
    device: &oxtrain_tensor::cuda::CudaDevice,
) -> Result<Vec<String>> {
    let mut bus = [0 as std::ffi::c_char; 32];
    // SAFETY: the buffer outlives the call and its length is passed.
    unsafe { cu::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, device.context().cu_device()) }
        .result()
        .map_err(|e| cuda_err("reading the GPU's PCI bus id", format!("{e:?}")))?;
    // SAFETY: the driver wrote a NUL-terminated string into the buffer.
    let bus = unsafe { std::ffi::CStr::from_ptr(bus.as_ptr()) }.to_string_lossy().into_owned();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let key = |r: usize| format!("oxtrain/nvshmem/gpu/{r}");
    store.set(&key(rank), format!("{host}/{bus}").as_bytes())?;
    (0..world).map(|r| Ok(String::from_utf8_lossy(&store.get(&key(r))?).into_owned())).collect()
}

/// How many PEs (this one included) run on PE `rank`'s GPU.
fn pes_sharing(ids: &[String], rank: usize) -> usize {
    ids.iter().filter(|id| **id == ids[rank]).count()
}

/// This PE's share of the `resident` blocks its GPU holds at once, when `sharing` PEs use it.
fn shared_resident(resident: u32, sharing: usize) -> u32 {
    (resident / sharing.max(1) as u32).max(1)
}

/// Whether contexts on this GPU run under CUDA MPS (kernels of several processes at once); a
/// driver too old to say counts as off.
fn mps_enabled(device: &oxtrain_tensor::cuda::CudaDevice) -> bool {
    device.context().attribute(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED).is_ok_and(|v| v == 1)
}

/// GPUs per node when the options do not say: the launcher's local world size (torchrun's
/// `LOCAL_WORLD_SIZE`, Open MPI's `OMPI_COMM_WORLD_LOCAL_SIZE`, Slurm's tasks per node; see
/// [`LaunchEnv`](crate::bootstrap::LaunchEnv)) when its world is this one, else
/// `LOCAL_WORLD_SIZE` alone (a program that starts its own processes), else one node.
fn default_ranks_per_node(world: usize, get: impl Fn(&str) -> Option<String>) -> usize {
    match crate::bootstrap::LaunchEnv::from_vars(&get) {
        Ok(env) if env.world_size == world && env.launcher != crate::bootstrap::Launcher::Single => {
            env.local_world_size
        }
        _ => get("LOCAL_WORLD_SIZE").and_then(|v| v.trim().parse().ok()).unwrap_or(world),
    }
}

#[cfg(test)]
mod tests {
    use super::{default_ranks_per_node, pes_sharing, shared_resident};

    // Two hosts with the same bus ids: only the PEs of one host on one GPU share it.
    #[test]
    fn pes_sharing_a_gpu_are_those_of_its_host_and_bus() {
        let ids: Vec<String> =
            ["a/0000:18:00.0", "a/0000:18:00.0", "a/0000:2a:00.0", "b/0000:18:00.0"].map(String::from).into();
        assert_eq!(pes_sharing(&ids, 0), 2);
        assert_eq!(pes_sharing(&ids, 1), 2);
        assert_eq!(pes_sharing(&ids, 2), 1);
        assert_eq!(pes_sharing(&ids, 3), 1);
        // 4 PEs on a GPU holding 264 blocks at once get 66 each; never none.
        assert_eq!(shared_resident(264, 4), 66);
        assert_eq!(shared_resident(264, 1), 264);
        assert_eq!(shared_resident(2, 8), 1);
    }

    fn with<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    // The README's mpirun and srun lines start 2 nodes of 8 without LOCAL_WORLD_SIZE: each
    // launcher's own variables must give the 8, or every PE would take the others for NVLink peers.
    #[test]
    fn every_launcher_gives_the_gpus_per_node() {
        let torchrun = [("RANK", "9"), ("WORLD_SIZE", "16"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "8")];
        assert_eq!(default_ranks_per_node(16, with(&torchrun)), 8);
        let mpirun = [
            ("OMPI_COMM_WORLD_RANK", "9"),
            ("OMPI_COMM_WORLD_SIZE", "16"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "8"),
        ];
        assert_eq!(default_ranks_per_node(16, with(&mpirun)), 8);
        let srun = [
            ("SLURM_PROCID", "9"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS_PER_NODE", "8"),
        ];
        assert_eq!(default_ranks_per_node(16, with(&srun)), 8);
        // A program that starts its own processes (comm-bench) says LOCAL_WORLD_SIZE alone.
        assert_eq!(default_ranks_per_node(2, with(&[("LOCAL_WORLD_SIZE", "1")])), 1);
        // Nothing set: one node.
        assert_eq!(default_ranks_per_node(4, with(&[])), 4);
        // A launcher's world that is not this communicator's (a subgroup) says nothing.
        assert_eq!(default_ranks_per_node(4, with(&srun)), 4);
    }
}
