//! torch's `DistributedSampler`: each of `num_replicas` ranks reads a disjoint shard of the
//! (shuffled) indices; `set_epoch` reshuffles with seed + epoch; without `drop_last` the index
//! list is padded by repeating its start so every rank gets the same count. Beyond torch, the
//! sampler remembers how far the epoch has gone, and `state_dict` / `load_state_dict` resume
//! mid-epoch with the same remaining order.

use crate::error::{Error, Result};
use oxtrain_tensor::{Device, Generator, Tensor};
use serde::{Deserialize, Serialize};

#[cfg(test)]
mod tests;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistributedSampler {
    len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    epoch: u64,
    /// How many of this rank's samples of the epoch have been consumed.
    position: usize,
}

/// Where a sampler stands; saved with a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerState {
    pub epoch: u64,
    pub position: usize,
    pub seed: u64,
    pub shuffle: bool,
    pub drop_last: bool,
    pub len: usize,
    pub num_replicas: usize,
    pub rank: usize,
}

impl DistributedSampler {
    /// The sampler of `rank` among `num_replicas` over a dataset of `len`, shuffled with seed 0
    /// and padded (torch's defaults).
    pub fn new(len: usize, num_replicas: usize, rank: usize) -> Result<DistributedSampler> {
        if num_replicas == 0 || rank >= num_replicas {
            return Err(Error::State(format!(
                "rank {rank} is not in [0, {num_replicas}): check RANK and WORLD_SIZE"
            )));
        }
        Ok(DistributedSampler {
            len,
            num_replicas,
            rank,
            shuffle: true,
            seed: 0,
            drop_last: false,
            epoch: 0,
            position: 0,
        })
    }

    /// One process reading everything (a plain `RandomSampler` / `SequentialSampler`).
    pub fn single(len: usize) -> DistributedSampler {
        DistributedSampler::new(len, 1, 0).expect("rank 0 of 1")
    }

    pub fn shuffle(mut self, on: bool) -> Self {
        self.shuffle = on;
        self
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    pub fn drop_last(mut self, on: bool) -> Self {
        self.drop_last = on;
        self
    }

    /// Starts `epoch` from its beginning (`sampler.set_epoch(epoch)`).
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.position = 0;
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn seed_value(&self) -> u64 {
        self.seed
    }

    pub fn position(&self) -> usize {
        self.position
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn num_replicas(&self) -> usize {
        self.num_replicas
    }

    /// Samples per rank and epoch (`len(sampler)`).
    pub fn num_samples(&self) -> usize {
        let (n, r) = (self.len, self.num_replicas);
        if self.drop_last && n % r != 0 {
            // Drop the tail so each rank gets the same count: ceil((n - r) / r).
            n.saturating_sub(r).div_ceil(r)
        } else {
            n.div_ceil(r)
        }
    }

    /// This rank's indices for the current epoch, all of them.
    pub fn epoch_indices(&self) -> Vec<usize> {
        let mut indices: Vec<usize> = if self.shuffle {
            let mut g = Generator::new(self.seed.wrapping_add(self.epoch));
            let perm = Tensor::randperm_with(&mut g, self.len, Device::Cpu).expect("randperm on the CPU");
            perm.to_vec::<i64>().into_iter().map(|i| i as usize).collect()
        } else {
            (0..self.len).collect()
        };
        let total = self.num_samples() * self.num_replicas;
        if !self.drop_last && total > indices.len() && !indices.is_empty() {
            // Pad by repeating the list from its start, as often as needed.
            let pad = total - indices.len();
            let base = indices.clone();
            indices.extend(base.iter().cycle().take(pad));
        } else {
            indices.truncate(total);
        }
        indices.into_iter().skip(self.rank).step_by(self.num_replicas).collect()
    }

    /// The indices not yet consumed this epoch.
    pub fn remaining(&self) -> Vec<usize> {
        self.epoch_indices().into_iter().skip(self.position).collect()
    }

    /// Marks `n` more samples as consumed (the loader calls this as it hands out batches).
    pub fn advance(&mut self, n: usize) {
        self.position = (self.position + n).min(self.num_samples());
    }

    /// Marks the epoch as fully consumed (a loader that drops an incomplete last batch).
    pub fn finish_epoch(&mut self) {
        self.position = self.num_samples();
    }

    pub fn state_dict(&self) -> SamplerState {
        SamplerState {
            epoch: self.epoch,
            position: self.position,
            seed: self.seed,
            shuffle: self.shuffle,
            drop_last: self.drop_last,
            len: self.len,
            num_replicas: self.num_replicas,
            rank: self.rank,
        }
    }

    /// Restores a saved position. The dataset size, world size, rank and shuffling settings
    /// must be those of the run that saved it, or the remaining order would differ.
    pub fn load_state_dict(&mut self, state: &SamplerState) -> Result<()> {
        let mine = (self.len, self.num_replicas, self.rank, self.shuffle, self.drop_last, self.seed);
        let saved = (state.len, state.num_replicas, state.rank, state.shuffle, state.drop_last, state.seed);
        if mine != saved {
            return Err(Error::State(format!(
                "sampler saved with (len, world size, rank, shuffle, drop_last, seed) = {saved:?}, \
                 this one has {mine:?}; resume with the same dataset and launch configuration"
            )));
        }
        if state.position > self.num_samples() {
            return Err(Error::State(format!(
                "position {} past the epoch's {} samples",
                state.position,
                self.num_samples()
            )));
        }
        self.epoch = state.epoch;
        self.position = state.position;
        Ok(())
    }

    /// Restores a position saved on this world size ([`DistributedSampler::load_state_dict`])
    /// or on another one ([`DistributedSampler::load_resharded`]), as the state says.
    pub fn load_state_dict_any_world(&mut self, state: &SamplerState) -> Result<()> {
        match state.num_replicas == self.num_replicas {
            true => self.load_state_dict(state),
            false => self.load_resharded(state),
        }
    }

    /// Restores a position saved by any rank of a run on another world size (a resume after
    /// losing or adding workers). The epoch's order is one permutation whatever the world
    /// size, dealt round-robin: sample `p` of it goes to rank `p % world` at local position
    /// `p / world`. So when every rank of the saving run consumed `position` samples, the
    /// global position is `position * saved_world`, and this rank continues from there; the
    /// remaining global order is the same. Needs the global position to be a multiple of
    /// this world size (a global batch that both world sizes divide). Near the epoch's end the
    /// padding (or the dropped tail) depends on the world size and may differ.
    pub fn load_resharded(&mut self, state: &SamplerState) -> Result<()> {
        let mine = (self.len, self.shuffle, self.drop_last, self.seed);
        let saved = (state.len, state.shuffle, state.drop_last, state.seed);
        if mine != saved {
            return Err(Error::State(format!(
                "sampler saved with (len, shuffle, drop_last, seed) = {saved:?}, this one has {mine:?}; \
                 resume with the same dataset and shuffling"
            )));
        }
        let saved_per_rank = match state.drop_last {
            true => state.len / state.num_replicas,
            false => state.len.div_ceil(state.num_replicas),
        };
        if state.position >= saved_per_rank {
            // The epoch was used up (padding included): so it is here, whatever its length.
            self.epoch = state.epoch;
            self.position = self.num_samples();
            return Ok(());
        }
        let global = state.position * state.num_replicas;
        if !global.is_multiple_of(self.num_replicas) {
            return Err(Error::State(format!(
                "{global} samples were consumed on {} ranks, which {} ranks cannot split evenly; resume \
                 on a world size that divides the global batch",
                state.num_replicas, self.num_replicas
            )));
        }
        self.epoch = state.epoch;
        self.position = (global / self.num_replicas).min(self.num_samples());
        Ok(())
    }
}
