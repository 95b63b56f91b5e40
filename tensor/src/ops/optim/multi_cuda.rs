//! CUDA side of the multi-tensor steps: the device table (`MtTensor` and `MtChunk` in
//! `optim.cu`), its cache, and the launches.

use super::cuda::SOURCE;
use super::multi::{Coefs, Member};
use crate::cuda::{self, expect_launch, CudaStorage};
use crate::{CpuStorage, DType, Storage, Tensor};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use std::sync::RwLockWriteGuard;

/// Tensors one launch takes (`MT_MAX_TENSORS` in `optim.cu`): their gradients' addresses fill
/// the launch arguments (8 bytes each, well inside the 4 KiB kernels may take).
const MAX_TENSORS: usize = 320;
/// Elements one block updates, and its threads.
const CHUNK: usize = 32768;
const THREADS: u32 = 256;
/// Tables kept: a few parameter groups, times the first step's and the later steps' lists.
const CACHED_TABLES: usize = 8;

/// `MtTensor` in `optim.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
struct TensorEntry {
    p: u64,
    s0: u64,
    s1: u64,
    s2: u64,
    shadow: u64,
    n: i64,
    shadow_kind: i32,
    pad: i32,
}

/// `MtChunk` in `optim.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ChunkEntry {
    tensor: i32,
    pad: i32,
    start: i64,
}

/// `MtGrads` in `optim.cu`: the gradients' addresses, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct GradList {
    g: [u64; MAX_TENSORS],
}

// SAFETY: plain old data with the C layouts `optim.cu` declares.
unsafe impl DeviceRepr for GradList {}

/// One launch's slice of a table: `tensors` entries from `first`, and its chunks, at byte
/// offsets into the table.
#[derive(Debug, Clone, Copy)]
struct Batch {
    first: usize,
    tensors: usize,
    tensor_bytes: usize,
    chunk_bytes: usize,
    chunks: usize,
}

struct CachedTable {
    /// The stream and every entry the table was built from.
    key: Vec<u64>,
    table: CudaStorage,
    batches: Vec<Batch>,
}

/// The device tables of recent launches, most recently used last.
#[derive(Default)]
pub(super) struct TableCache {
    tables: Vec<CachedTable>,
}

/// The members of one launch (one device, one gradient dtype) and its hyper-parameters.
pub(super) struct Launch<'a> {
    pub members: &'a [&'a Member],
    pub coefs: &'a Coefs,
}

fn address(s: &Storage, offset: usize) -> u64 {
    match s {
        Storage::Cuda(s) => s.ptr() + (offset * s.dtype().size_in_bytes()) as u64,
        Storage::Cpu(_) => unreachable!("multi-tensor launches take CUDA tensors only"),
    }
}

fn shadow_kind(dtype: DType) -> i32 {
    match dtype {
        DType::BF16 => 1,
        DType::F16 => 2,
        DType::F64 => 3,
        other => unreachable!("kept casts of f32 parameters are float copies, got {other}"),
    }
}

/// Updates every member in as few launches as the table allows, rewriting the kept casts of
/// the parameters that have one, and marks those casts current.
pub(super) fn launch(cache: &mut TableCache, l: &Launch) {
    // Kept casts are looked up before any storage lock is taken (the cast cache locks first).
    let shadows: Vec<Option<Tensor>> = l.members.iter().map(|m| m.param.kept_cast_to_refresh()).collect();
    let mut guards: Vec<RwLockWriteGuard<'_, Storage>> = Vec::new();
    let mut entries = Vec::with_capacity(l.members.len());
    let mut grads = Vec::with_capacity(l.members.len());
    let mut refreshed = Vec::new();
    for (m, shadow) in l.members.iter().zip(&shadows) {
        let (pg, p_version) = m.param.storage_mut_versioned();
        let mut e = TensorEntry {
            p: address(&pg, m.param.layout().offset()),
            s0: 0,
            s1: 0,
            s2: 0,
            shadow: 0,
            n: m.param.elem_count() as i64,
            shadow_kind: 0,
            pad: 0,
        };
        guards.push(pg);
        for (slot, t) in [&mut e.s0, &mut e.s1, &mut e.s2].into_iter().zip(&m.state) {
            if let Some(t) = t {
                let g = t.storage_mut();
                *slot = address(&g, t.layout().offset());
                guards.push(g);
            }
        }
        if let Some(copy) = shadow {
            let (g, copy_version) = copy.storage_mut_versioned();
            (e.shadow, e.shadow_kind) = (address(&g, 0), shadow_kind(copy.dtype()));
            guards.push(g);
            refreshed.push((&m.param, copy, p_version, copy_version));
        }
        grads.push(address(&m.grad.storage(), m.grad.layout().offset()));
        entries.push(e);
    }
    debug_assert!(!l.members.is_empty(), "a launch has members");
    let (device, stream) = match &*guards[0] {
        Storage::Cuda(s) => (s.device().clone(), s.stream()),
        Storage::Cpu(_) => unreachable!("multi-tensor launches take CUDA tensors only"),
    };
    let table = cache.table(&entries, &device, stream.cu_stream() as usize as u64);
    let grad_dtype = l.members[0].grad.dtype();
    for batch in &table.batches {
        let mut list = GradList { g: [0; MAX_TENSORS] };
        list.g[..batch.tensors].copy_from_slice(&grads[batch.first..batch.first + batch.tensors]);
        let tensors = table.table.ptr() + batch.tensor_bytes as u64;
        let chunks = table.table.ptr() + batch.chunk_bytes as u64;
        let cfg = LaunchConfig {
            grid_dim: (batch.chunks as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch_batch(&device, &stream, (&list, tensors, chunks), grad_dtype, l.coefs, cfg);
    }
    drop(guards);
    for (param, copy, p_version, copy_version) in refreshed {
        param.kept_cast_refreshed(copy, p_version, copy_version);
    }
}

/// One kernel launch over a batch's chunks.
fn launch_batch(
    device: &cuda::CudaDevice,
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    (list, tensors, chunks): (&GradList, u64, u64),
    grad_dtype: DType,
    coefs: &Coefs,
    cfg: LaunchConfig,
) {
    let chunk = CHUNK as i64;
    let (name, op) = match coefs {
        Coefs::Sgd(_) => ("sgd_multi", "sgd_step_"),
        Coefs::AdamW(_) => ("adamw_multi", "adamw_step_"),
    };
    let f = expect_launch(device.function(&SOURCE, &format!("{name}_{}", cuda::suffix(grad_dtype))), op);
    let (sgd_flags, adamw_flag) = match coefs {
        Coefs::Sgd(c) => ([c.nesterov as i32, c.maximize as i32, c.has_buf as i32, c.first as i32], 0),
        Coefs::AdamW(c) => ([0; 4], c.maximize as i32),
    };
    let mut b = stream.launch_builder(&f);
    b.arg(list).arg(&tensors).arg(&chunks).arg(&chunk);
    match coefs {
        Coefs::Sgd(c) => {
            b.arg(&c.lr).arg(&c.momentum).arg(&c.keep).arg(&c.weight_decay);
            b.arg(&sgd_flags[0]).arg(&sgd_flags[1]).arg(&sgd_flags[2]).arg(&sgd_flags[3]);
        }
        Coefs::AdamW(c) => {
            b.arg(&c.decay).arg(&c.one_minus_beta1).arg(&c.beta2).arg(&c.one_minus_beta2);
            b.arg(&c.step_size).arg(&c.bc2_sqrt).arg(&c.eps).arg(&adamw_flag);
        }
    }
    // SAFETY: argument types match the kernel. Every table entry holds the addresses of a
    // parameter and its state (n f32 elements each, null where absent: the momentum buffer is
    // read only with has_buf, max_exp_avg_sq only when non-null) and of its kept cast (n
    // elements of its kind); the gradient list holds each entry's gradient (n elements of
    // `grad_dtype`). Each chunk names an entry of this batch and a start below its n. The
    // caller holds the written storages' locks and every tensor alive while this is queued.
    expect_launch(unsafe { b.launch(cfg) }, op);
}

impl TableCache {
    /// The table of `entries` on `stream`: a kept one when one was built from the same
    /// entries, else a new one (one upload, which waits for the copy).
    fn table(
        &mut self,
        entries: &[TensorEntry],
        device: &std::sync::Arc<cuda::CudaDevice>,
        stream: u64,
    ) -> &CachedTable {
        let key = table_key(entries, stream);
        if let Some(i) = self.tables.iter().position(|t| t.key == key) {
            let hit = self.tables.remove(i);
            self.tables.push(hit);
        } else {
            let (bytes, batches) = build_table(entries);
            let table =
                expect_launch(CudaStorage::from_cpu(&CpuStorage::U8(bytes), device), "multi-tensor table");
            if self.tables.len() == CACHED_TABLES {
                self.tables.remove(0);
            }
            self.tables.push(CachedTable { key, table, batches });
        }
        self.tables.last().expect("a table was just kept")
    }
}

fn table_key(entries: &[TensorEntry], stream: u64) -> Vec<u64> {
    let mut key = Vec::with_capacity(1 + entries.len() * 7);
    key.push(stream);
    for e in entries {
        key.extend([e.p, e.s0, e.s1, e.s2, e.shadow, e.n as u64, e.shadow_kind as u64]);
    }
    key
}

/// The table's bytes, all tensor entries then all chunk entries, and its batches of at most
/// `MAX_TENSORS` tensors (chunk entries name tensors by their index within the batch).
fn build_table(entries: &[TensorEntry]) -> (Vec<u8>, Vec<Batch>) {
    let tensor_size = std::mem::size_of::<TensorEntry>();
    let mut tensor_bytes: Vec<u8> = Vec::with_capacity(std::mem::size_of_val(entries));
    let mut chunk_list: Vec<ChunkEntry> = Vec::new();
    let mut batches = Vec::new();
    for (b, group) in entries.chunks(MAX_TENSORS).enumerate() {
        let chunk_start = chunk_list.len();
        for (local, e) in group.iter().enumerate() {
            for start in (0..e.n as usize).step_by(CHUNK) {
                chunk_list.push(ChunkEntry { tensor: local as i32, pad: 0, start: start as i64 });
            }
        }
        batches.push(Batch {
            first: b * MAX_TENSORS,
            tensors: group.len(),
            tensor_bytes: b * MAX_TENSORS * tensor_size,
            chunk_bytes: chunk_start,
            chunks: chunk_list.len() - chunk_start,
        });
    }
    for e in entries {
        push_words(&mut tensor_bytes, &[e.p, e.s0, e.s1, e.s2, e.shadow, e.n as u64]);
        tensor_bytes.extend_from_slice(&e.shadow_kind.to_le_bytes());
        tensor_bytes.extend_from_slice(&e.pad.to_le_bytes());
    }
    let chunks_at = tensor_bytes.len();
    for b in &mut batches {
        b.chunk_bytes = chunks_at + b.chunk_bytes * std::mem::size_of::<ChunkEntry>();
    }
    let mut bytes = tensor_bytes;
    for c in &chunk_list {
        bytes.extend_from_slice(&c.tensor.to_le_bytes());
        bytes.extend_from_slice(&c.pad.to_le_bytes());
        bytes.extend_from_slice(&c.start.to_le_bytes());
    }
    (bytes, batches)
}

fn push_words(bytes: &mut Vec<u8>, words: &[u64]) {
    for w in words {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: i64) -> TensorEntry {
        TensorEntry { p: 0x1000, s0: 0, s1: 0, s2: 0, shadow: 0, n, shadow_kind: 0, pad: 0 }
    }

    fn word(bytes: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
    }

    #[test]
    fn the_table_lays_out_entries_and_chunks_as_optim_cu_reads_them() {
        assert_eq!(std::mem::size_of::<TensorEntry>(), 56);
        assert_eq!(std::mem::size_of::<ChunkEntry>(), 16);
        // 1 element, a chunk and one more element, then enough tensors to need a second batch.
        let mut entries = vec![entry(1), entry(CHUNK as i64 + 1)];
        entries.extend((0..MAX_TENSORS).map(|_| entry(3)));
        let (bytes, batches) = build_table(&entries);
        assert_eq!(batches.len(), 2);
        let (b0, b1) = (batches[0], batches[1]);
        assert_eq!((b0.first, b0.tensors, b0.chunks), (0, MAX_TENSORS, 1 + 2 + (MAX_TENSORS - 2)));
        assert_eq!((b1.first, b1.tensors, b1.chunks), (MAX_TENSORS, 2, 2));
        assert_eq!(b1.tensor_bytes, MAX_TENSORS * 56);
        let tensors_end = entries.len() * 56;
        assert_eq!(b0.chunk_bytes, tensors_end);
        assert_eq!(b1.chunk_bytes, tensors_end + b0.chunks * 16);
        assert_eq!(bytes.len(), tensors_end + (b0.chunks + b1.chunks) * 16);
        // The second tensor's n, and its second chunk: tensor 1, start CHUNK.
        assert_eq!(word(&bytes, 56 + 40), CHUNK as u64 + 1);
        let second_chunk = b0.chunk_bytes + 2 * 16;
        assert_eq!(u32::from_le_bytes(bytes[second_chunk..second_chunk + 4].try_into().unwrap()), 1);
        assert_eq!(word(&bytes, second_chunk + 8), CHUNK as u64);
        // The second batch's chunks name tensors 0 and 1 of that batch.
        let c = b1.chunk_bytes;
        assert_eq!(u32::from_le_bytes(bytes[c + 16..c + 20].try_into().unwrap()), 1);
    }
}
