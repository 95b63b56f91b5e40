//! CPU kernel for `cat`: the output is `outer` rows, each the parts' rows side by side; every
//! part is read through its own layout, so strided parts need no copy first.

use crate::dtype::Element;
use crate::strided::{chunk_len, Walk, PAR_THRESHOLD};
use crate::Layout;
use rayon::prelude::*;

/// Fills `dst` with the walk's elements from linear index `start` on.
fn fill_from<T: Element>(dst: &mut [T], src: &[T], walk: &Walk<1>, start: usize) {
    let mut o = 0;
    walk.for_each_run(start, start + dst.len(), |[b], [s], len| {
        let d = &mut dst[o..o + len];
        if s == 1 {
            d.copy_from_slice(&src[b..b + len]);
        } else {
            d.iter_mut().enumerate().for_each(|(j, x)| *x = src[b + j * s]);
        }
        o += len;
    });
}

pub(super) fn cat<T: Element>(parts: &[(&[T], &Layout)], dim: usize) -> Vec<T> {
    let outer: usize = parts[0].1.dims()[..dim].iter().product();
    let part_row: Vec<usize> = parts.iter().map(|(_, l)| l.dims()[dim..].iter().product()).collect();
    let row_len: usize = part_row.iter().sum();
    let mut out = vec![T::default(); outer * row_len];
    if out.is_empty() {
        return out;
    }
    let walks: Vec<Walk<1>> = parts.iter().map(|(_, l)| Walk::new([*l])).collect();
    let fill_row = |o: usize, row: &mut [T]| {
        let mut at = 0;
        for (k, &n) in part_row.iter().enumerate() {
            fill_from(&mut row[at..at + n], parts[k].0, &walks[k], o * n);
            at += n;
        }
    };
    let threads = rayon::current_num_threads();
    if out.len() < PAR_THRESHOLD {
        out.chunks_mut(row_len).enumerate().for_each(|(o, row)| fill_row(o, row));
    } else if outer >= 4 * threads {
        let min_rows = (PAR_THRESHOLD / 4 / row_len).max(1);
        out.par_chunks_mut(row_len).with_min_len(min_rows).enumerate().for_each(|(o, row)| fill_row(o, row));
    } else {
        // Few long rows (cat along dim 0): split each part's stretch of a row instead.
        for (o, row) in out.chunks_mut(row_len).enumerate() {
            let mut at = 0;
            for (k, &n) in part_row.iter().enumerate() {
                let cl = chunk_len(n);
                row[at..at + n].par_chunks_mut(cl).enumerate().for_each(|(i, dst)| {
                    fill_from(dst, parts[k].0, &walks[k], o * n + i * cl);
                });
                at += n;
            }
        }
    }
    out
}
