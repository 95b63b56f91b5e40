//! [`Communicator`] on the nvshmem backend: every op as a launch of the collective kernel in
//! the right mode (see `collectives.cu`), on the team it needs.

use super::hier;
use super::kernels::{self, CollArgs};
use super::team::Kind;
use super::{Algorithm, NvshmemCommunicator, Stage};
use crate::communicator::Communicator;
use crate::error::Result;
use crate::gpu::{check_root, check_shards};
use crate::op::{shard_range, ReduceOp};
use crate::work::Work;
use oxtrain_tensor::{DType, Device, Shape, Tensor};

impl Communicator for NvshmemCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn backend(&self) -> &str {
        "nvshmem"
    }

    fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work> {
        let v = self.view("all_reduce", tensor)?;
        let f = self.function("all_reduce", v.dtype, true)?;
        let esz = v.dtype.size_in_bytes();
        if self.is_hierarchical() {
            return self.launch("nvshmem all_reduce", f, esz, &hier::all_reduce(&self.span(), &v, op), false);
        }
        // A tensor on the symmetric heap (symmetric_tensor) needs no staging copy.
        if self.algorithm() == Algorithm::Auto
            && v.bytes() >= super::symmetric::SYMMETRIC_MIN_BYTES
            && self.is_symmetric(v.ptr, v.bytes())
        {
            return self.symmetric_all_reduce(f, v.ptr, v.len, esz, op);
        }
        let mut a = CollArgs::in_place(v.ptr, v.len, op);
        a.mode = self.all_reduce_mode(&v);
        a.src = kernels::SRC_REDUCE;
        a.out = kernels::OUT_ALL;
        let kind = if a.mode == kernels::LL { Kind::Ll } else { Kind::All };
        self.launch("nvshmem all_reduce", f, esz, &[Stage::on(kind, a)], false)
    }

    fn reduce(&self, tensor: &Tensor, dst: usize, op: ReduceOp) -> Result<Work> {
        check_root("reduce", dst, self.world);
        let v = self.view("reduce", tensor)?;
        let f = self.function("reduce", v.dtype, true)?;
        let esz = v.dtype.size_in_bytes();
        if self.is_hierarchical() {
            let s = self.span();
            let scratch = self.scratch(hier::reduce_scratch(&s, v.len, dst) * esz)?;
            return self.launch("nvshmem reduce", f, esz, &hier::reduce(&s, &v, dst, op, scratch.ptr), false);
        }
        let mut a = CollArgs::in_place(v.ptr, v.len, op);
        a.mode = kernels::ONESHOT;
        a.src = kernels::SRC_REDUCE;
        a.out = kernels::OUT_ROOT;
        a.root = dst as i32;
        self.launch("nvshmem reduce", f, esz, &[Stage::on(Kind::All, a)], false)
    }

    fn reduce_scatter(&self, output: &Tensor, input: &Tensor, op: ReduceOp) -> Result<Work> {
        check_shards("reduce_scatter", input, output, self.world, self.rank);
        let i = self.view("reduce_scatter", input)?;
        let o = self.view("reduce_scatter", output)?;
        let f = self.function("reduce_scatter", i.dtype, true)?;
        let esz = i.dtype.size_in_bytes();
        if self.is_hierarchical() {
            let s = self.span();
            let scratch = self.scratch(hier::reduce_scatter_scratch(&s, i.len) * esz)?;
            let stages = hier::reduce_scatter(&s, &o, &i, op, scratch.ptr);
            return self.launch("nvshmem reduce_scatter", f, esz, &stages, false);
        }
        let shard = shard_range(i.len, self.world, self.rank);
        let mut a = CollArgs::in_place(i.ptr, i.len, op);
        // Output element i (a global index of the input) at out.ptr + (i - shard.start) * esz.
        a.out_base = o.ptr.wrapping_sub((shard.start * esz) as u64);
        a.mode = kernels::ONESHOT;
        a.src = kernels::SRC_REDUCE;
        a.out = kernels::OUT_SHARD;
        self.launch("nvshmem reduce_scatter", f, esz, &[Stage::on(Kind::All, a)], false)
    }

    fn all_gather(&self, output: &Tensor, input: &Tensor) -> Result<Work> {
        check_shards("all_gather", output, input, self.world, self.rank);
        let i = self.view("all_gather", input)?;
        let o = self.view("all_gather", output)?;
        let f = self.function("all_gather", i.dtype, false)?;
        let esz = i.dtype.size_in_bytes();
        if self.is_hierarchical() {
            return self.launch("nvshmem all_gather", f, esz, &hier::all_gather(&self.span(), &o, &i), false);
        }
        let shard = shard_range(o.len, self.world, self.rank);
        let mut a = CollArgs::in_place(o.ptr, o.len, ReduceOp::Sum);
        a.in_base = i.ptr.wrapping_sub((shard.start * esz) as u64);
        a.in_lo = shard.start as i64;
        a.in_hi = shard.end as i64;
        a.mode = kernels::ONESHOT;
        a.src = kernels::SRC_OWNER;
        a.out = kernels::OUT_ALL;
        self.launch("nvshmem all_gather", f, esz, &[Stage::on(Kind::All, a)], false)
    }

    fn broadcast(&self, tensor: &Tensor, src: usize) -> Result<Work> {
        check_root("broadcast", src, self.world);
        let v = self.view("broadcast", tensor)?;
        let f = self.function("broadcast", v.dtype, false)?;
        let esz = v.dtype.size_in_bytes();
        if self.is_hierarchical() {
            return self.launch("nvshmem broadcast", f, esz, &hier::broadcast(&self.span(), &v, src), false);
        }
        let mut a = CollArgs::in_place(v.ptr, v.len, ReduceOp::Sum);
        if self.rank != src {
            a.in_hi = 0;
        }
        a.mode = kernels::ONESHOT;
        a.src = kernels::SRC_ROOT;
        a.out = kernels::OUT_NOT_ROOT;
        a.root = src as i32;
        self.launch("nvshmem broadcast", f, esz, &[Stage::on(Kind::All, a)], false)
    }

    fn symmetric_tensor(&self, shape: Shape, dtype: DType, device: Device) -> Result<Tensor> {
        self.alloc_symmetric(shape, dtype, device)
    }

    fn barrier(&self) -> Result<Work> {
        if self.is_hierarchical() {
            return self.launch("nvshmem barrier", self.module.f32, 4, &hier::barrier(), true);
        }
        let a = CollArgs::in_place(0, 0, ReduceOp::Sum);
        self.launch("nvshmem barrier", self.module.f32, 4, &[Stage::on(Kind::All, a)], true)
    }
}
