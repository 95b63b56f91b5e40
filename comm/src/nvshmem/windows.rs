//! How one collective splits into kernel launches over windows of the staging slots, and which
//! two-shot windows leave their copy-out to the next launch.
//!
//! A two-shot window ends by copying the peers' reduced sub-shards out of this PE's slots into
//! the output, a local copy during which the link idles. Deferred, that copy runs in the next
//! window's launch, beside its NVLink traffic (`ox_copy_out_prev` in collectives.cu says why the
//! slots are still intact then); only the last window copies its own out.

/// One launch: the window `[lo, hi)` of the tensor's elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub lo: usize,
    pub hi: usize,
    /// This window's copy-out is left to the next launch.
    pub defer_out: bool,
    /// The previous window, whose copy-out this launch does.
    pub prev: Option<(usize, usize)>,
}

/// The windows of a collective on `count` elements, `window` elements each (the last may be
/// shorter; a tensor of 0 elements still gets one launch). `defer`: a two-shot all-reduce whose
/// windows all take the kernel's whole-pack path (16-byte aligned tensors, windows of whole
/// packs), the only case the kernel defers.
pub(crate) fn windows(count: usize, window: usize, defer: bool) -> Windows {
    Windows { count, window: window.max(1), defer, lo: 0, prev: None, done: false }
}

/// How many launches `windows(count, window, _)` makes.
pub(crate) fn launches(count: usize, window: usize) -> usize {
    count.div_ceil(window.max(1)).max(1)
}

/// `windows(count, window, defer)`, then empty windows (at `count`, where a launch moves
/// nothing and only exchanges its signals) up to `at_least` launches in all. A PE whose part of
/// a stage takes fewer windows than another's pads this way: every PE must make as many
/// launches, because a launch's epoch is the PE's launch count (entry.cu).
pub(crate) fn padded(
    count: usize,
    window: usize,
    defer: bool,
    at_least: usize,
) -> impl Iterator<Item = Window> {
    let empty = Window { lo: count, hi: count, defer_out: false, prev: None };
    windows(count, window, defer)
        .chain(std::iter::repeat_n(empty, at_least.saturating_sub(launches(count, window))))
}

/// A copy of `bytes` from `src` to `dst`, both device addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Copy {
    pub src: u64,
    pub dst: u64,
    pub bytes: usize,
}

/// For a launch whose puts cross nodes: the NIC reads a put's source only from the symmetric
/// heap (or memory registered with NVSHMEM), not from an ordinary tensor. So window `w`'s part
/// of the input (elements `[in_lo, in_hi)` at `in_base`, `esz` bytes each) is first copied to
/// `heap`, element `w.lo` at its start; returns that copy (none when the window has no input)
/// and the input base the launch then takes (element `i` at `heap + (i - w.lo) * esz`).
pub(crate) fn through_heap(
    in_base: u64,
    in_lo: usize,
    in_hi: usize,
    w: &Window,
    esz: usize,
    heap: u64,
) -> (Option<Copy>, u64) {
    let base = heap.wrapping_sub((w.lo * esz) as u64);
    let (lo, hi) = (in_lo.max(w.lo), in_hi.min(w.hi));
    let copy = (lo < hi).then(|| Copy {
        src: in_base + (lo * esz) as u64,
        dst: base + (lo * esz) as u64,
        bytes: (hi - lo) * esz,
    });
    (copy, base)
}

pub(crate) struct Windows {
    count: usize,
    window: usize,
    defer: bool,
    lo: usize,
    prev: Option<(usize, usize)>,
    done: bool,
}

impl Iterator for Windows {
    type Item = Window;

    fn next(&mut self) -> Option<Window> {
        if self.done {
            return None;
        }
        let (lo, hi) = (self.lo, (self.lo + self.window).min(self.count));
        let last = hi >= self.count;
        let w = Window { lo, hi, defer_out: self.defer && !last, prev: self.prev };
        self.prev = w.defer_out.then_some((lo, hi));
        self.lo = hi;
        self.done = last;
        Some(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cover_the_tensor_once_in_order() {
        for count in [0usize, 1, 5, 1000, 1024, 1025, 4096] {
            for window in [1usize, 7, 256, 1024, 5000] {
                let ws: Vec<Window> = windows(count, window, false).collect();
                assert_eq!(ws[0].lo, 0);
                assert_eq!(ws.last().unwrap().hi, count);
                for pair in ws.windows(2) {
                    assert_eq!(pair[0].hi, pair[1].lo);
                }
                assert!(ws.iter().all(|w| w.hi - w.lo <= window && (w.hi > w.lo || count == 0)));
                assert!(ws.iter().all(|w| !w.defer_out && w.prev.is_none()));
                assert_eq!(ws.len(), launches(count, window));
                let pad: Vec<Window> = padded(count, window, false, ws.len() + 2).collect();
                assert_eq!(pad[..ws.len()], ws[..]);
                assert!(pad[ws.len()..].iter().all(|w| w.lo == count && w.hi == count && w.prev.is_none()));
                assert_eq!(padded(count, window, false, 1).count(), ws.len());
            }
        }
    }

    /// Every window's copy-out happens exactly once: in its own launch, or deferred to the next
    /// one, which names it; the last window never defers.
    #[test]
    fn every_deferred_copy_out_is_taken_by_the_next_launch() {
        for count in [1usize, 1024, 1025, 3 * 1024, 10_000] {
            let ws: Vec<Window> = windows(count, 1024, true).collect();
            let mut copied = vec![0u32; count];
            for (i, w) in ws.iter().enumerate() {
                if !w.defer_out {
                    copied[w.lo..w.hi].iter_mut().for_each(|c| *c += 1);
                }
                if let Some((lo, hi)) = w.prev {
                    assert_eq!(Some((lo, hi)), ws.get(i.wrapping_sub(1)).map(|p| (p.lo, p.hi)));
                    assert!(ws[i - 1].defer_out);
                    copied[lo..hi].iter_mut().for_each(|c| *c += 1);
                }
            }
            assert!(!ws.last().unwrap().defer_out);
            assert!(copied.iter().all(|&c| c == 1), "count {count}");
        }
    }

    /// The staged input lands where the launch looks for it, inside the window's slot, and
    /// the copy takes exactly the window's part of the input.
    #[test]
    fn input_through_the_heap_lands_where_the_launch_reads_it() {
        let (input, heap) = (0x10_0000u64, 0x90_0000u64);
        for esz in [2usize, 4] {
            for (count, window) in [(100usize, 7usize), (64, 64), (5, 16), (0, 8)] {
                for (in_lo, in_hi) in [(0, count), (count / 3, count / 2), (0, 0), (count / 2, count)] {
                    for w in windows(count, window, false) {
                        let (copy, base) = through_heap(input, in_lo, in_hi, &w, esz, heap);
                        let wanted: Vec<usize> =
                            (w.lo..w.hi).filter(|i| (in_lo..in_hi).contains(i)).collect();
                        let Some(c) = copy else {
                            assert!(wanted.is_empty());
                            continue;
                        };
                        assert_eq!(c.bytes, wanted.len() * esz);
                        assert_eq!(c.src, input + (wanted[0] * esz) as u64);
                        assert!(c.dst >= heap && c.dst + c.bytes as u64 <= heap + (window * esz) as u64);
                        for &i in &wanted {
                            let at = base.wrapping_add((i * esz) as u64);
                            assert_eq!(at, c.dst + ((i - wanted[0]) * esz) as u64, "element {i}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_gigabyte_of_f32_takes_eight_windows_of_128_mib() {
        let ws: Vec<Window> = windows(1 << 28, (128 << 20) / 4, true).collect();
        assert_eq!(ws.len(), 8);
        assert_eq!(ws.iter().filter(|w| w.defer_out).count(), 7);
        assert_eq!(ws.iter().filter(|w| w.prev.is_some()).count(), 7);
    }
}
