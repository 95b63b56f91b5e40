//! The optimizer state of a [`ZeroOptimizer`] as it is saved: each rank's shard of every
//! bucket ([`ShardState`]), in bucket positions, so that it can be resumed on another world
//! size.
//!
//! The buckets depend on the model and the bucket caps only, never on the world size: a
//! bucket position names the same parameter element on 2 ranks as on 3. A rank's part holds,
//! per state buffer (`exp_avg`, `momentum_buffer`, ...), its [`oxtrain_comm::shard_range`] of each bucket;
//! the parts of all ranks, concatenated in rank order, are the whole bucket, and a new world
//! size takes its own shard of that. Resuming refuses parts of another model (other buckets)
//! or another optimizer (other hyper-parameters) with an error that says which.

use super::{Piece, ZeroOptimizer};
use crate::error::tensor_error;
use crate::{DdpError, Result};
use oxtrain_nn::optim::{Optimizer, OptimizerState, ParamGroupState};
use oxtrain_tensor::{DType, Device, Tensor};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// One rank's part of a sharded optimizer state.
#[derive(Debug, Clone)]
pub struct ShardState {
    pub world: usize,
    pub rank: usize,
    /// The length of every bucket: the model's layout, the same on every world size.
    pub bucket_lens: Vec<usize>,
    /// Per state buffer, per bucket: this rank's shard of the bucket (zero where no parameter
    /// lies), on the CPU.
    pub buffers: BTreeMap<String, Vec<Tensor>>,
    /// Per model parameter: the steps it took, when this rank holds state of it.
    pub steps: Vec<Option<u64>>,
    /// The inner optimizer's groups: hyper-parameters (their `params` lists are this rank's).
    pub param_groups: Vec<ParamGroupState>,
}

const META_KEY: &str = "zero_shard";

impl ShardState {
    /// Writes the part to one safetensors file (the layout and groups in its metadata).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let (tensors, meta) = self.to_safetensors();
        oxtrain_tensor::safetensors::save(tensors, Some(&meta), path.as_ref())
            .map_err(tensor_error("writing a ZeRO shard"))
    }

    /// The part as a safetensors file's tensors and metadata (what [`ShardState::save`] writes;
    /// a checkpoint writer takes them as they are).
    pub fn to_safetensors(&self) -> (Vec<(String, Tensor)>, HashMap<String, String>) {
        let meta = serde_json::json!({
            "world": self.world,
            "rank": self.rank,
            "bucket_lens": self.bucket_lens,
            "steps": self.steps,
            "param_groups": OptimizerState { tensors: BTreeMap::new(), param_groups: self.param_groups.clone() }
                .param_groups_json(),
        });
        let tensors: Vec<(String, Tensor)> = self
            .buffers
            .iter()
            .flat_map(|(name, per_bucket)| {
                per_bucket.iter().enumerate().map(move |(b, t)| (format!("{name}.{b}"), t.clone()))
            })
            .collect();
        (tensors, HashMap::from([(META_KEY.to_string(), meta.to_string())]))
    }

    /// Whether a safetensors file's metadata is a ZeRO part's.
    pub fn is_shard(metadata: &HashMap<String, String>) -> bool {
        metadata.contains_key(META_KEY)
    }

    /// Reads a part written by [`ShardState::save`].
    pub fn load(path: impl AsRef<Path>) -> Result<ShardState> {
        let path = path.as_ref();
        let file = oxtrain_tensor::safetensors::load(path).map_err(tensor_error("reading a ZeRO shard"))?;
        ShardState::from_safetensors(&file, path)
    }

    /// The part in an open safetensors file (`path` for messages).
    pub fn from_safetensors(
        file: &oxtrain_tensor::safetensors::SafetensorsFile,
        path: &Path,
    ) -> Result<ShardState> {
        let not_a_shard = || DdpError::NotAShard { path: path.to_path_buf() };
        let meta: serde_json::Value =
            serde_json::from_str(file.metadata().get(META_KEY).ok_or_else(not_a_shard)?)
                .map_err(|_| not_a_shard())?;
        let field = |k: &str| meta.get(k).cloned().ok_or_else(not_a_shard);
        let parse = |k: &str| serde_json::from_value::<usize>(field(k)?).map_err(|_| not_a_shard());
        let bucket_lens: Vec<usize> =
            serde_json::from_value(field("bucket_lens")?).map_err(|_| not_a_shard())?;
        let steps = serde_json::from_value(field("steps")?).map_err(|_| not_a_shard())?;
        let groups_json = field("param_groups")?;
        let param_groups = OptimizerState::parse_param_groups(groups_json.as_str().ok_or_else(not_a_shard)?)
            .map_err(tensor_error("reading a ZeRO shard's groups"))?;
        let mut buffers: BTreeMap<String, Vec<Tensor>> = BTreeMap::new();
        for name in file.names() {
            let (buffer, b) = name.rsplit_once('.').ok_or_else(not_a_shard)?;
            let b: usize = b.parse().map_err(|_| not_a_shard())?;
            let per_bucket = buffers.entry(buffer.to_string()).or_default();
            if per_bucket.len() <= b {
                per_bucket.resize_with(b + 1, || Tensor::zeros(0, DType::F32, Device::Cpu).expect("empty"));
            }
            per_bucket[b] = file.get(name).map_err(tensor_error("reading a ZeRO shard"))?;
        }
        Ok(ShardState {
            world: parse("world")?,
            rank: parse("rank")?,
            bucket_lens,
            buffers,
            steps,
            param_groups,
        })
    }
}

/// The names of a group's hyper-parameters (what tells one optimizer from another).
fn hyper_names(groups: &[ParamGroupState]) -> Vec<String> {
    groups
        .first()
        .map(|g| g.hyper.keys().filter(|k| *k != "initial_lr").cloned().collect())
        .unwrap_or_default()
}

impl<O: Optimizer> ZeroOptimizer<O> {
    /// This rank's part of the optimizer state, for a checkpoint (copied to the CPU).
    /// Waits for the last step's parameter gathers first: a checkpoint takes the model with
    /// its optimizer, and a gather's failure must stop the save.
    pub fn shard_state(&self) -> Result<ShardState> {
        self.wait_parameters()?;
        let state = self.inner.state_dict();
        let shards = self.shards();
        let mut buffers: BTreeMap<String, Vec<Tensor>> = BTreeMap::new();
        let mut steps = vec![None; self.reducer.params.len()];
        for (name, t) in &state.tensors {
            let Some((k, buffer)) = name.strip_prefix("state.").and_then(|r| r.split_once('.')) else {
                continue;
            };
            let Some(&piece) = k.parse::<usize>().ok().and_then(|k| self.order.get(k)) else { continue };
            let pc: &Piece = &self.pieces[piece];
            if buffer == "step" {
                steps[pc.param] = Some(t.to_f64_vec()[0] as u64);
                continue;
            }
            let per_bucket = match buffers.get_mut(buffer) {
                Some(v) => v,
                None => {
                    let zeros = shards
                        .buckets
                        .iter()
                        .map(|s| Tensor::zeros(s.range.len(), t.dtype(), Device::Cpu))
                        .collect::<oxtrain_tensor::Result<Vec<_>>>()
                        .map_err(tensor_error("a state shard"))?;
                    buffers.entry(buffer.to_string()).or_insert(zeros)
                }
            };
            let cpu = t.to_device(Device::Cpu).map_err(tensor_error("a state shard"))?;
            per_bucket[pc.bucket].narrow(0, pc.at_shard, pc.len).copy_(&cpu.reshape(pc.len));
            steps[pc.param].get_or_insert(0);
        }
        let (world, rank) = (self.reducer.comm.world_size(), self.reducer.comm.rank());
        let bucket_lens = self.reducer.buckets.iter().map(|b| b.flat.elem_count()).collect();
        Ok(ShardState { world, rank, bucket_lens, buffers, steps, param_groups: state.param_groups })
    }

    /// Checks that `parts` are every rank's part of one save of this model's state, by an
    /// optimizer of this kind; returns them in rank order.
    fn check_parts<'a>(&self, parts: &'a [ShardState]) -> Result<Vec<&'a ShardState>> {
        let world = parts.first().map_or(0, |p| p.world);
        let mut by_rank: Vec<Option<&ShardState>> = vec![None; world];
        for p in parts {
            if p.world == world && p.rank < world {
                by_rank[p.rank] = Some(p);
            }
        }
        if world == 0 || by_rank.iter().any(Option::is_none) || parts.len() != world {
            let found = parts.iter().map(|p| (p.rank, p.world)).collect();
            return Err(DdpError::IncompleteShards { world, found });
        }
        let by_rank: Vec<&ShardState> = by_rank.into_iter().flatten().collect();
        let now: Vec<usize> = self.reducer.buckets.iter().map(|b| b.flat.elem_count()).collect();
        let mine = self.inner.state_dict_shared().param_groups;
        for p in &by_rank {
            if p.bucket_lens != now || p.steps.len() != self.reducer.params.len() {
                return Err(DdpError::OtherModel { saved: p.bucket_lens.clone(), now });
            }
            if p.param_groups.len() != mine.len() || hyper_names(&p.param_groups) != hyper_names(&mine) {
                let (saved, now) = (hyper_names(&p.param_groups), hyper_names(&mine));
                return Err(DdpError::OtherOptimizer {
                    saved,
                    now,
                    groups: (p.param_groups.len(), mine.len()),
                });
            }
            if p.buffers.keys().ne(by_rank[0].buffers.keys()) {
                return Err(DdpError::IncompleteShards { world, found: vec![(p.rank, p.world)] });
            }
        }
        Ok(by_rank)
    }

    /// Bucket `b` of buffer `name`, whole: the parts' shards in rank order.
    fn whole_bucket(parts: &[&ShardState], name: &str, b: usize) -> Result<Tensor> {
        let shards: Vec<&Tensor> = parts.iter().map(|p| &p.buffers[name][b]).collect();
        let whole = Tensor::cat(&shards, 0);
        if whole.elem_count() != parts[0].bucket_lens[b] {
            let found = parts.iter().map(|p| (p.rank, p.world)).collect();
            return Err(DdpError::IncompleteShards { world: parts[0].world, found });
        }
        Ok(whole)
    }

    /// Resumes from every rank's part of a save made on any world size: gathers each bucket
    /// from the parts in rank order and keeps this rank's [`oxtrain_comm::shard_range`] of it. Refuses parts
    /// of another model or another optimizer, changing nothing.
    /// Waits for the last step's parameter gathers first, so none lands after the resume.
    pub fn load_shard_states(&mut self, parts: &[ShardState]) -> Result<()> {
        self.wait_parameters()?;
        let parts = self.check_parts(parts)?;
        let shards = self.shards();
        let mut state = OptimizerState { tensors: BTreeMap::new(), param_groups: Vec::new() };
        for name in parts[0].buffers.keys() {
            for (b, shard) in shards.buckets.iter().enumerate() {
                let mine =
                    Self::whole_bucket(&parts, name, b)?.narrow(0, shard.range.start, shard.range.len());
                for (k, &piece) in self.order.iter().enumerate() {
                    let pc = &self.pieces[piece];
                    if pc.bucket == b && parts.iter().any(|p| p.steps[pc.param].is_some()) {
                        let t = mine.narrow(0, pc.at_shard, pc.len).copy();
                        state.tensors.insert(format!("state.{k}.{name}"), t);
                    }
                }
            }
        }
        for (k, &piece) in self.order.iter().enumerate() {
            let param = self.pieces[piece].param;
            match parts.iter().filter_map(|p| p.steps[param]).max() {
                Some(step) if step > 0 => {
                    let t = Tensor::scalar(step as i64, Device::Cpu).map_err(tensor_error("a step count"))?;
                    state.tensors.insert(format!("state.{k}.step"), t);
                }
                _ => {}
            }
        }
        state.param_groups = self.inner.state_dict_shared().param_groups;
        for (g, saved) in state.param_groups.iter_mut().zip(&parts[0].param_groups) {
            g.hyper = saved.hyper.clone();
        }
        self.inner.load_state_dict(&state).map_err(tensor_error("loading the resharded state"))
    }

    /// The state of `parts` as an unsharded optimizer over the same groups holds it (tensors
    /// in the parameters' shapes, numbered by position over the groups): to compare with, or
    /// to resume without ZeRO.
    pub fn unsharded_state(&self, parts: &[ShardState]) -> Result<OptimizerState> {
        let parts = self.check_parts(parts)?;
        let mut tensors = BTreeMap::new();
        for name in parts[0].buffers.keys() {
            let wholes = (0..self.reducer.buckets.len())
                .map(|b| Self::whole_bucket(&parts, name, b))
                .collect::<Result<Vec<_>>>()?;
            for (u, &i) in self.unsharded_order.iter().enumerate() {
                if parts.iter().all(|p| p.steps[i].is_none()) {
                    continue;
                }
                let (p, slot) = (&self.reducer.params[i], &self.reducer.slots[i]);
                let t = wholes[slot.bucket].narrow(0, slot.offset, slot.len).reshape(p.dims()).copy();
                tensors.insert(format!("state.{u}.{name}"), t);
            }
        }
        for (u, &i) in self.unsharded_order.iter().enumerate() {
            if let Some(step) = parts.iter().filter_map(|p| p.steps[i]).max().filter(|&s| s > 0) {
                let t = Tensor::scalar(step as i64, Device::Cpu).map_err(tensor_error("a step count"))?;
                tensors.insert(format!("state.{u}.step"), t);
            }
        }
        let mut param_groups = parts[0].param_groups.clone();
        let mut next = 0;
        for (g, &n) in param_groups.iter_mut().zip(&self.group_sizes) {
            g.params = (next..next + n).collect();
            next += n;
        }
        Ok(OptimizerState { tensors, param_groups })
    }
}
