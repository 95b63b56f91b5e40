//! Making every rank's module state rank 0's: the check that all ranks wrap the same model
//! (before any collective whose size depends on it), and coalesced broadcasts of parameters
//! and buffers.

use crate::Communicator;
use crate::{CommError, Result};
use oxtrain_tensor::{DType, Device, Tensor};
use std::hash::{Hash, Hasher};

/// A summary of a model's structure that every rank can compare: parameter count, values,
/// buffer count, and a hash of every name, shape and dtype.
fn signature(params: &[(String, Tensor)], buffers: &[(String, Tensor)]) -> [i64; 5] {
    // FNV-1a: the same on every machine and build (std's DefaultHasher is not promised to be).
    struct Fnv(u64);
    impl Hasher for Fnv {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    for (name, t) in params.iter().chain(buffers) {
        name.hash(&mut h);
        t.dims().hash(&mut h);
        t.dtype().to_string().hash(&mut h);
    }
    let values: usize = params.iter().map(|(_, t)| t.elem_count()).sum();
    let bits = h.finish();
    [
        params.len() as i64,
        values as i64,
        buffers.len() as i64,
        (bits >> 32) as i64,
        (bits & 0xffff_ffff) as i64,
    ]
}

/// Fails on every rank, with the same message, when some rank's model differs from rank 0's.
/// The exchange has the same size on every rank whatever the models are, so a mismatch is an
/// error here rather than a hang in a later collective.
pub(crate) fn check_same_model(
    comm: &dyn Communicator,
    params: &[(String, Tensor)],
    buffers: &[(String, Tensor)],
) -> Result<()> {
    let world = comm.world_size();
    if world == 1 {
        return Ok(());
    }
    let mine = signature(params, buffers);
    let input = Tensor::from_vec(mine.to_vec(), 5, Device::Cpu).map_err(io("the model signature"))?;
    let output = Tensor::zeros(5 * world, DType::I64, Device::Cpu).map_err(io("the model signature"))?;
    let (input, output) = match device_of(params) {
        Device::Cpu => (input, output),
        d => (
            input.to_device(d).map_err(io("the model signature"))?,
            output.to_device(d).map_err(io("the model signature"))?,
        ),
    };
    comm.all_gather(&output, &input)?.synchronize()?;
    let all: Vec<i64> = output.to_device(Device::Cpu).map_err(io("the model signature"))?.to_vec();
    let first = &all[0..5];
    for r in 1..world {
        let other = &all[5 * r..5 * r + 5];
        if other != first {
            let describe = |s: &[i64]| format!("{} parameters ({} values) and {} buffers", s[0], s[1], s[2]);
            let how = if other[..3] == first[..3] {
                "the same counts but other names, shapes or dtypes".to_string()
            } else {
                format!("{} against rank 0's {}", describe(other), describe(first))
            };
            return Err(CommError::Unsupported(format!(
                "DDP: rank {r} wraps a different model than rank 0 ({how}); every rank must build the same \
                 model (same architecture and configuration) before wrapping it"
            )));
        }
    }
    Ok(())
}

fn device_of(tensors: &[(String, Tensor)]) -> Device {
    tensors.first().map(|(_, t)| t.device()).unwrap_or(Device::Cpu)
}

fn io(what: &'static str) -> impl Fn(oxtrain_tensor::Error) -> CommError {
    move |e| CommError::Io { what: what.to_string(), message: e.to_string() }
}

/// Every rank's `tensors` become rank `src`'s, in one broadcast per dtype and device (the
/// values are packed into a flat tensor, broadcast, and copied back).
pub(crate) fn broadcast_coalesced(comm: &dyn Communicator, tensors: &[Tensor], src: usize) -> Result<()> {
    if comm.world_size() == 1 || tensors.is_empty() {
        return Ok(());
    }
    let mut groups: Vec<((DType, Device), Vec<&Tensor>)> = Vec::new();
    for t in tensors.iter().filter(|t| t.elem_count() > 0) {
        let key = (t.dtype(), t.device());
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.push(t),
            None => groups.push((key, vec![t])),
        }
    }
    for (_, group) in groups {
        let flat: Vec<Tensor> = group.iter().map(|t| t.contiguous().reshape(t.elem_count())).collect();
        let packed = Tensor::cat(flat.as_slice(), 0);
        comm.broadcast(&packed, src)?.wait()?;
        let mut offset = 0;
        for t in group {
            let n = t.elem_count();
            t.copy_(&packed.narrow(0, offset, n).reshape(t.dims()));
            offset += n;
        }
    }
    Ok(())
}
