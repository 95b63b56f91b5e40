//! A checkpoint file's bytes laid out in memory exactly as they go to disk, in page-aligned
//! memory kept from one save to the next.
//!
//! The training step copies each tensor once, straight to its place in the file; the writer
//! thread then hands that memory to the disk as it is (with O_DIRECT where the file system
//! allows, see `durable.rs`), so no serialisation copy and no page-cache copy follow. Reusing
//! the memory keeps page faults (as costly as the copy itself) out of every save but the first.

use super::error::Result;
use oxtrain_tensor::{Device, Storage, Tensor};
use std::alloc::Layout;
use std::collections::HashMap;
use std::path::Path;
use std::ptr::NonNull;

/// The alignment of an image's memory: a page, which also satisfies O_DIRECT's alignment of
/// buffers to the device's logical block on every common device.
pub(crate) const ALIGN: usize = 4096;

/// Big tensors are copied in pieces of this size, so both cores share one large tensor.
const COPY_PIECE: usize = 4 << 20;

/// Zero-initialised, `ALIGN`-aligned heap memory.
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// At least `len` bytes (rounded up to whole pages).
    pub(crate) fn new(len: usize) -> AlignedBuf {
        let cap = len.max(1).next_multiple_of(ALIGN);
        let layout = Layout::from_size_align(cap, ALIGN).expect("a checkpoint image fits the address space");
        // SAFETY: the layout has a non-zero size. Zeroed, so every byte is initialised even
        // where a file leaves a gap (large zeroed allocations come from fresh pages, at no cost).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, cap }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `cap` initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.cap) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `cap` initialised bytes owned exclusively by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.cap, ALIGN).expect("the layout it was allocated with");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// One file's bytes: the first `len` bytes of a page-aligned buffer.
pub(crate) struct FileImage {
    buf: AlignedBuf,
    len: usize,
}

impl FileImage {
    pub fn bytes(&self) -> &[u8] {
        &self.buf.as_slice()[..self.len]
    }

    /// The memory, for the next save's image of the same file.
    pub fn into_buffer(self) -> AlignedBuf {
        self.buf
    }
}

/// The safetensors file of `tensors` (what `oxtrain_tensor::safetensors::write_to` writes,
/// byte for byte), built in `reuse` when it is large enough. Copies each tensor to the host
/// once, on all cores.
pub(crate) fn safetensors_image(
    tensors: &[(String, Tensor)],
    metadata: Option<&HashMap<String, String>>,
    reuse: Option<AlignedBuf>,
    name: &Path,
) -> Result<FileImage> {
    use rayon::prelude::*;
    let plan = oxtrain_tensor::safetensors::plan(tensors, metadata, name)?;
    let mut buf = match reuse {
        Some(b) if b.cap >= plan.len => b,
        _ => AlignedBuf::new(plan.len),
    };
    let bytes = &mut buf.as_mut_slice()[..plan.len];
    let (prefix, mut rest) = bytes.split_at_mut(plan.prefix.len());
    prefix.copy_from_slice(&plan.prefix);
    // The tensors' places in file order, split off one after the other so each copy gets
    // its own disjoint slice.
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| plan.ranges[i].start);
    let mut at = plan.prefix.len();
    let mut jobs: Vec<(&Tensor, &mut [u8])> = Vec::with_capacity(order.len());
    for i in order {
        let range = &plan.ranges[i];
        debug_assert_eq!(range.start, at, "a safetensors plan leaves no gaps");
        let (dst, tail) = std::mem::take(&mut rest).split_at_mut(range.len());
        rest = tail;
        at = range.end;
        jobs.push((&tensors[i].1, dst));
    }
    jobs.into_par_iter().try_for_each(|(t, dst)| copy_row_major(t, dst))?;
    Ok(FileImage { buf, len: plan.len })
}

/// `t`'s elements in row-major order as little-endian bytes into `dst` (as safetensors stores
/// them). Host tensors that are contiguous are copied straight from their storage; others
/// (GPU, strided views) come through a contiguous host copy first.
fn copy_row_major(t: &Tensor, dst: &mut [u8]) -> Result<()> {
    use rayon::prelude::*;
    if dst.is_empty() {
        return Ok(());
    }
    let host = if t.device() == Device::Cpu && t.is_contiguous() {
        t.clone()
    } else {
        let h = t.to_device(Device::Cpu)?;
        if h.is_contiguous() {
            h
        } else {
            h.copy()
        }
    };
    let size = host.dtype().size_in_bytes();
    let start = host.layout().offset() * size;
    let storage = host.storage();
    let Storage::Cpu(s) = &*storage else { unreachable!("copied to the host above") };
    let src = &s.as_bytes()[start..start + dst.len()];
    dst.par_chunks_mut(COPY_PIECE).zip(src.par_chunks(COPY_PIECE)).for_each(|(d, s)| copy_streaming(d, s));
    Ok(())
}

/// `dst.copy_from_slice(src)` with non-temporal stores: the image is read next by the device
/// and the checksum, not by this core, so its lines need not pass through the cache, and a
/// copy that does not first read each destination line runs about 30% faster here
/// (memcpy picks such stores only for copies larger than most of the cache).
fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_streaming: lengths differ");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        const LANE: usize = 16;
        let head = dst.as_ptr().align_offset(LANE).min(dst.len());
        dst[..head].copy_from_slice(&src[..head]);
        let body = (dst.len() - head) / LANE * LANE;
        let (d, s) = (dst[head..].as_mut_ptr(), src[head..].as_ptr());
        for i in (0..body).step_by(LANE) {
            // SAFETY: i + 16 <= body, within both slices past `head`; `d + i` is 16-byte
            // aligned as the stream store needs; loads are unaligned. SSE2 is part of x86_64.
            unsafe {
                _mm_stream_si128(d.add(i).cast::<__m128i>(), _mm_loadu_si128(s.add(i).cast::<__m128i>()))
            };
        }
        // SAFETY: orders the stream stores before anything this thread does next (the hand-over
        // of the image to the writer thread).
        unsafe { _mm_sfence() };
        dst[head + body..].copy_from_slice(&src[head + body..]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxtrain_tensor::DType;

    fn written_by_write_to(tensors: &[(String, Tensor)], metadata: &HashMap<String, String>) -> Vec<u8> {
        let mut out = Vec::new();
        oxtrain_tensor::safetensors::write_to(tensors, Some(metadata), &mut out, Path::new("x")).unwrap();
        out
    }

    #[test]
    fn an_image_is_the_file_write_to_writes_and_reuses_its_memory() {
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        let big = Tensor::arange(0.0, (3 * COPY_PIECE / 4) as f64, 1.0, DType::F32, Device::Cpu).unwrap();
        let grid = Tensor::arange(0.0, 12.0, 1.0, DType::F64, Device::Cpu).unwrap().reshape([3, 4]);
        let mut tensors = vec![
            ("big".to_string(), big.reshape([3, COPY_PIECE / 4])),
            ("transposed".to_string(), grid.t()),
            ("steps".to_string(), Tensor::scalar(7i64, Device::Cpu).unwrap()),
            ("empty".to_string(), Tensor::zeros([0, 3], DType::F32, Device::Cpu).unwrap()),
        ];
        let image = safetensors_image(&tensors, Some(&metadata), None, Path::new("x")).unwrap();
        assert!(image.bytes() == written_by_write_to(&tensors, &metadata), "first image");
        assert_eq!(image.bytes().as_ptr().align_offset(ALIGN), 0);

        // A smaller state in the same memory: the old, longer content must not leak into it.
        let memory = image.into_buffer();
        let address = memory.as_slice().as_ptr();
        tensors.remove(0);
        let image = safetensors_image(&tensors, Some(&metadata), Some(memory), Path::new("x")).unwrap();
        assert_eq!(image.bytes().as_ptr(), address, "the memory was reused");
        assert!(image.bytes() == written_by_write_to(&tensors, &metadata), "second image");
    }

    #[test]
    fn duplicate_names_are_an_error_not_a_panic() {
        let t = Tensor::zeros([2], DType::F32, Device::Cpu).unwrap();
        let tensors = vec![("a".to_string(), t.clone()), ("a".to_string(), t)];
        let Err(err) = safetensors_image(&tensors, None, None, Path::new("model.safetensors")) else {
            panic!("two tensors named a were accepted");
        };
        assert!(err.to_string().contains("unique"), "{err}");
    }
}
