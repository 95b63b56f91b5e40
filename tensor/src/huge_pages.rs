//! Transparent huge pages for large fresh CPU buffers. The allocator hands out a buffer of
//! more than a few MB as a new mapping, so every 4 KiB page of it faults on first write: for
//! GPT-2's `[1024, 50257]` logits and their gradient, 50 000 faults each, every step, a fifth
//! of a CPU training step's time. Advised before the first write, such a buffer faults in
//! 2 MiB pages instead (on Linux with transparent huge pages in `madvise` or `always` mode;
//! elsewhere this does nothing).

/// Buffers smaller than this keep normal pages: they come from the allocator's reused heap.
const MIN_BYTES: usize = 8 << 20;

/// Asks the kernel to back `v`'s allocation with huge pages where they fit (the 2 MiB-aligned
/// part of it). Call it on a buffer not yet written (fresh from `Vec::with_capacity` or
/// `vec![0; n]`, whose pages the allocator leaves untouched).
pub(crate) fn advise<T>(v: &Vec<T>) {
    let bytes = v.capacity() * std::mem::size_of::<T>();
    if bytes < MIN_BYTES {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = v.as_ptr() as usize;
        let (first, end) = (start.next_multiple_of(HUGE), (start + bytes) / HUGE * HUGE);
        if end > first {
            // SAFETY: the range lies inside `v`'s allocation; MADV_HUGEPAGE changes only how
            // the kernel backs those pages, never their contents. A failure (no THP support)
            // leaves normal pages, which is fine.
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_advised_buffer_keeps_its_contents() {
        let mut v: Vec<f32> = vec![0.0; 5 << 20];
        super::advise(&v);
        v.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as f32));
        let small = vec![1u8; 16];
        super::advise(&small);
        assert_eq!(small, [1; 16]);
    }
}
