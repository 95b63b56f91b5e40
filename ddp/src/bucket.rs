//! Gradient buckets: which parameters are reduced together, and the flat memory they share.
//!
//! As PyTorch's reducer: parameters go into buckets in reverse registration order (backward
//! produces the last layers' gradients first), the first bucket small (1 MiB) so the first
//! all-reduce starts early, the rest up to `bucket_cap_mb`; a bucket never mixes dtypes or
//! devices. Each bucket is one flat tensor from [`Communicator::symmetric_tensor`] (on
//! `nvshmem` the symmetric heap, where the all-reduce needs no staging copy), and each
//! parameter's gradient is a view into it (gradient as bucket view): backward accumulates
//! straight into bucket memory.

use crate::Result;
use oxtrain_autograd::Var;
use oxtrain_comm::Communicator;
use oxtrain_tensor::{DType, Device, Tensor};

/// Gradient views start on 64-byte boundaries, so a vectorised kernel reading one gradient
/// finds it aligned (the padding stays zero on every rank and reduces to zero).
const ALIGN_BYTES: usize = 64;

/// One parameter's place in the buckets.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    /// Index in the bucket list.
    pub bucket: usize,
    /// First element in the bucket's flat tensor.
    pub offset: usize,
    pub len: usize,
}

/// A group of parameters reduced by one collective.
pub(crate) struct Bucket {
    /// The flat gradient memory.
    pub flat: Tensor,
    /// Parameter indices (into the module's `named_parameters()`), in the order they were
    /// placed (reverse registration order).
    pub params: Vec<usize>,
    /// A bf16 copy that is communicated instead of `flat` when compression is on.
    pub compressed: Option<Tensor>,
}

impl Bucket {
    pub fn bytes(&self) -> usize {
        self.flat.elem_count() * self.flat.dtype().size_in_bytes()
    }
}

/// Which parameters share a bucket: indices into `sizes` (`(elements, dtype, device)` per
/// parameter in registration order), buckets in launch order. The first bucket of each dtype
/// closes at `first_cap` bytes, later ones at `cap`; a bucket closes once it reaches its cap
/// (a parameter larger than the cap gets a bucket of its own), as PyTorch's
/// `compute_bucket_assignment_by_size`.
pub(crate) fn assign(sizes: &[(usize, DType, Device)], first_cap: usize, cap: usize) -> Vec<Vec<usize>> {
    struct Open {
        key: (DType, Device),
        params: Vec<usize>,
        bytes: usize,
        first: bool,
    }
    let mut open: Vec<Open> = Vec::new();
    let mut done: Vec<Vec<usize>> = Vec::new();
    let mut seen_keys: Vec<(DType, Device)> = Vec::new();
    for i in (0..sizes.len()).rev() {
        let (len, dtype, device) = sizes[i];
        let key = (dtype, device);
        let at = match open.iter().position(|o| o.key == key) {
            Some(at) => at,
            None => {
                let first = !seen_keys.contains(&key);
                seen_keys.push(key);
                open.push(Open { key, params: Vec::new(), bytes: 0, first });
                open.len() - 1
            }
        };
        let o = &mut open[at];
        o.params.push(i);
        o.bytes += len * dtype.size_in_bytes();
        let limit = if o.first { first_cap } else { cap };
        if o.bytes >= limit {
            done.push(std::mem::take(&mut open.remove(at).params));
        }
    }
    done.extend(open.into_iter().map(|o| o.params).filter(|p| !p.is_empty()));
    done
}

fn aligned(n: usize, dtype: DType) -> usize {
    let per = (ALIGN_BYTES / dtype.size_in_bytes()).max(1);
    n.div_ceil(per) * per
}

/// Allocates the buckets (collectively: every rank in the same order) and points each
/// parameter's gradient at its slot. Returns the buckets and each parameter's slot.
pub(crate) fn build(
    comm: &dyn Communicator,
    params: &[Var],
    assignment: &[Vec<usize>],
    compress_bf16: bool,
) -> Result<(Vec<Bucket>, Vec<Slot>)> {
    let mut slots: Vec<Option<Slot>> = vec![None; params.len()];
    let mut buckets = Vec::with_capacity(assignment.len());
    for (b, members) in assignment.iter().enumerate() {
        let (dtype, device) = (params[members[0]].dtype(), params[members[0]].device());
        let mut offset = 0;
        for &i in members {
            let len = params[i].elem_count();
            slots[i] = Some(Slot { bucket: b, offset, len });
            offset += aligned(len, dtype);
        }
        let flat = comm.symmetric_tensor(offset.into(), dtype, device)?;
        let compressed = match compress_bf16 && dtype != DType::BF16 && dtype.is_float() {
            true => Some(comm.symmetric_tensor(offset.into(), DType::BF16, device)?),
            false => None,
        };
        for &i in members {
            let s = slots[i].as_ref().expect("just placed");
            let view = view_of(&flat, s, params[i].dims());
            // A gradient from before wrapping moves into the bucket.
            if let Some(g) = params[i].grad() {
                view.copy_(&g);
                params[i].set_grad(Some(view.clone()));
            }
            params[i].set_grad_buffer(Some(view));
        }
        buckets.push(Bucket { flat, params: members.clone(), compressed });
    }
    let slots = slots.into_iter().map(|s| s.expect("every parameter is in a bucket")).collect();
    Ok((buckets, slots))
}

/// The parameter's gradient as a view of the bucket's flat memory.
pub(crate) fn view_of(flat: &Tensor, slot: &Slot, dims: &[usize]) -> Tensor {
    flat.narrow(0, slot.offset, slot.len).reshape(dims)
}

#[cfg(test)]
mod tests {
    use super::*;

    const F32: DType = DType::F32;
    const CPU: Device = Device::Cpu;

    #[test]
    fn reverse_order_small_first_bucket_then_the_cap() {
        // 10 parameters of 102_400 bytes each (25_600 f32): the first bucket closes once it
        // reaches 200_000 bytes (2 params), later ones at 300_000 (3 params).
        let sizes = vec![(25_600, F32, CPU); 10];
        let b = assign(&sizes, 200_000, 300_000);
        assert_eq!(b, vec![vec![9, 8], vec![7, 6, 5], vec![4, 3, 2], vec![1, 0]]);
        let b = assign(&sizes, 102_400, 102_400 * 4);
        assert_eq!(b, vec![vec![9], vec![8, 7, 6, 5], vec![4, 3, 2, 1], vec![0]]);
    }

    #[test]
    fn a_large_parameter_gets_its_own_bucket_and_dtypes_never_mix() {
        let sizes = vec![(10, F32, CPU), (1_000_000, F32, CPU), (10, DType::BF16, CPU), (10, F32, CPU)];
        let b = assign(&sizes, 1 << 20, 25 << 20);
        // Reverse order: 3 (f32), 2 (bf16), 1 (f32, 4 MB: closes the first f32 bucket), 0.
        assert_eq!(b, vec![vec![3, 1], vec![2], vec![0]]);
        for bucket in &b {
            assert!(bucket.iter().all(|&i| sizes[i].1 == sizes[bucket[0]].1));
        }
    }

    #[test]
    fn every_parameter_is_placed_once() {
        let sizes: Vec<_> = (0..37).map(|i| ((i * 7919) % 5000 + 1, F32, CPU)).collect();
        for (first, cap) in [(1, 1), (4000, 8000), (1 << 20, 1 << 30)] {
            let mut all: Vec<usize> = assign(&sizes, first, cap).concat();
            all.sort();
            assert_eq!(all, (0..37).collect::<Vec<_>>());
        }
    }
}
