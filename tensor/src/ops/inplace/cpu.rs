//! Host kernel of `copy_`: a strided walk over destination and source together.

use crate::strided::Walk;
use crate::{CpuStorage, Layout};

/// `dst[dst_layout(i)] = src[src_layout(i)]`; both storages hold the same dtype.
pub(super) fn copy_into(dst: &mut CpuStorage, dst_layout: &Layout, src: &CpuStorage, src_layout: &Layout) {
    let walk = Walk::new([dst_layout, src_layout]);
    with_cpu_storage!(dst, d, T => {
        let s: &[T] = src.as_slice::<T>();
        walk.for_each_run(0, walk.numel(), |[db, sb], [ds, ss], len| {
            if ds == 1 && ss == 1 {
                d[db..db + len].copy_from_slice(&s[sb..sb + len]);
            } else {
                for j in 0..len {
                    d[db + j * ds] = s[sb + j * ss];
                }
            }
        })
    })
}
