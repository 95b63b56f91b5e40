//! Making every rank's module state rank 0's: the check that all ranks wrap the same model
//! (before any collective whose size depends on it), and coalesced broadcasts of parameters
//! and buffers.

use crate::error::tensor_error;
use crate::{DdpError, Result};
use oxtrain_comm::Communicator;
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
    // As 16-bit pieces in f32 (exact), since some backends (nvshmem) move float dtypes only.
    let pieces: Vec<f32> = mine.iter().flat_map(|&v| to_pieces(v)).collect();
    let n = pieces.len();
    let input = Tensor::from_vec(pieces, n, Device::Cpu).map_err(tensor_error("the model signature"))?;
    let output =
        Tensor::zeros(n * world, DType::F32, Device::Cpu).map_err(tensor_error("the model signature"))?;
    let (input, output) = match device_of(params) {
        Device::Cpu => (input, output),
        d => (
            input.to_device(d).map_err(tensor_error("the model signature"))?,
            output.to_device(d).map_err(tensor_error("the model signature"))?,
        ),
    };
    comm.all_gather(&output, &input)?.synchronize()?;
    let gathered: Vec<f32> =
        output.to_device(Device::Cpu).map_err(tensor_error("the model signature"))?.to_vec();
    let all: Vec<i64> = gathered.chunks(PIECES).map(from_pieces).collect();
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
            return Err(DdpError::DifferentModel { rank: r, how });
        }
    }
    Ok(())
}

/// An integer as four 16-bit pieces, each exact in f32.
const PIECES: usize = 4;

fn to_pieces(v: i64) -> [f32; PIECES] {
    let u = v as u64;
    std::array::from_fn(|i| ((u >> (16 * i)) & 0xffff) as f32)
}

fn from_pieces(p: &[f32]) -> i64 {
    p.iter().enumerate().fold(0u64, |acc, (i, &x)| acc | ((x as u64) << (16 * i))) as i64
}

fn device_of(tensors: &[(String, Tensor)]) -> Device {
    tensors.first().map(|(_, t)| t.device()).unwrap_or(Device::Cpu)
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
    for ((dtype, device), group) in groups {
        let flat: Vec<Tensor> = group.iter().map(|t| t.contiguous().reshape(t.elem_count())).collect();
        let packed = Tensor::cat(flat.as_slice(), 0);
        let values = if dtype.is_float() {
            comm.broadcast(&packed, src)?.wait()?;
            packed
        } else {
            broadcast_integers(comm, &packed, src, device)?
        };
        let mut offset = 0;
        for t in group {
            let n = t.elem_count();
            t.copy_(&values.narrow(0, offset, n).reshape(t.dims()));
            offset += n;
        }
    }
    Ok(())
}

/// Broadcasts integer values (batch counters) as 16-bit pieces in f32, which every backend
/// moves (nvshmem moves float dtypes only); they are few, so the detour costs nothing.
fn broadcast_integers(
    comm: &dyn Communicator,
    packed: &Tensor,
    src: usize,
    device: Device,
) -> Result<Tensor> {
    let host = packed.to_device(Device::Cpu).map_err(tensor_error("integer buffers"))?;
    let values: Vec<i64> = host.to_dtype(DType::I64).to_vec();
    let pieces: Vec<f32> = values.iter().flat_map(|&v| to_pieces(v)).collect();
    let n = pieces.len();
    let mut t = Tensor::from_vec(pieces, n, Device::Cpu).map_err(tensor_error("integer buffers"))?;
    if device != Device::Cpu {
        t = t.to_device(device).map_err(tensor_error("integer buffers"))?;
    }
    comm.broadcast(&t, src)?.synchronize()?;
    let got: Vec<f32> = t.to_device(Device::Cpu).map_err(tensor_error("integer buffers"))?.to_vec();
    let decoded: Vec<i64> = got.chunks(PIECES).map(from_pieces).collect();
    let len = decoded.len();
    let out = Tensor::from_vec(decoded, len, Device::Cpu)
        .map_err(tensor_error("integer buffers"))?
        .to_dtype(packed.dtype());
    match device {
        Device::Cpu => Ok(out),
        d => out.to_device(d).map_err(tensor_error("integer buffers")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_survive_the_f32_pieces() {
        for v in [0i64, 1, -1, 65_535, 65_536, 25_557_032, i64::MAX, i64::MIN, -123_456_789_012] {
            assert_eq!(from_pieces(&to_pieces(v)), v);
        }
    }
}
