//! Random generator state: a seed and a position in its Philox stream, plus the process-wide
//! default generator that `Tensor::rand` and friends draw from (as `torch.manual_seed` sets).

use super::philox::key_of;
use crate::{Error, Result};
use std::sync::{Mutex, MutexGuard};

/// PyTorch's default seed, so an unseeded program starts from a fixed, documented state.
pub const DEFAULT_SEED: u64 = 67_280_421_310_721;

/// A seeded Philox4x32-10 stream. Each draw takes the next blocks of the stream (one block is
/// 128 random bits) and advances the offset past them; equal states give equal draws.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generator {
    seed: u64,
    offset: u64,
}

/// Everything needed to resume a [`Generator`]: save it in a checkpoint and restore it with
/// [`Generator::set_state`] to continue the same random stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct GeneratorState {
    pub seed: u64,
    /// Philox blocks consumed so far.
    pub offset: u64,
}

impl GeneratorState {
    pub const BYTES: usize = 16;

    /// Seed then offset, little-endian.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut out = [0; Self::BYTES];
        out[..8].copy_from_slice(&self.seed.to_le_bytes());
        out[8..].copy_from_slice(&self.offset.to_le_bytes());
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<GeneratorState> {
        let bytes: &[u8; Self::BYTES] = bytes.try_into().map_err(|_| {
            Error::Msg(format!(
                "a generator state is {} bytes (seed and offset), got {}; pass the bytes of \
                 GeneratorState::to_bytes unchanged",
                Self::BYTES,
                bytes.len()
            ))
        })?;
        let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        Ok(GeneratorState { seed: word(0), offset: word(8) })
    }
}

impl Generator {
    pub const fn new(seed: u64) -> Generator {
        Generator { seed, offset: 0 }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Restarts the stream of `seed` from its beginning.
    pub fn manual_seed(&mut self, seed: u64) {
        *self = Generator::new(seed);
    }

    pub fn state(&self) -> GeneratorState {
        GeneratorState { seed: self.seed, offset: self.offset }
    }

    pub fn set_state(&mut self, state: GeneratorState) {
        *self = Generator { seed: state.seed, offset: state.offset };
    }

    /// Takes the next `blocks` blocks of the stream for one draw.
    pub(crate) fn reserve(&mut self, blocks: u64) -> Stream {
        let stream = Stream { key: key_of(self.seed), first_block: self.offset };
        self.offset = self.offset.wrapping_add(blocks);
        stream
    }
}

impl Default for Generator {
    fn default() -> Generator {
        Generator::new(DEFAULT_SEED)
    }
}

/// The blocks one draw owns: `first_block..first_block + n` under `key`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stream {
    pub key: [u32; 2],
    pub first_block: u64,
}

static DEFAULT: Mutex<Generator> = Mutex::new(Generator::new(DEFAULT_SEED));

/// The process-wide generator behind `Tensor::rand`, `randn`, ... (not the `_with` variants).
/// Hold the guard only briefly: the random ops lock it too.
pub fn default_generator() -> MutexGuard<'static, Generator> {
    DEFAULT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Seeds the default generator, as `torch.manual_seed`.
pub fn manual_seed(seed: u64) {
    default_generator().manual_seed(seed);
}

/// The default generator's state, for a checkpoint. One generator serves every device (a CUDA
/// draw advances the same Philox counter as a CPU one), so this is the whole random state of
/// `Tensor::rand`, dropout and init.
pub fn default_generator_state() -> GeneratorState {
    default_generator().state()
}

/// Restores what [`default_generator_state`] returned: the next draws continue that stream.
pub fn set_default_generator_state(state: GeneratorState) {
    default_generator().set_state(state);
}
