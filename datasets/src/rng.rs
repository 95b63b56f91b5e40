//! The per-sample random stream: every random choice a transform makes for sample `index` in
//! `epoch` comes from Philox4x32-10 keyed by the seed, with the (epoch, index) pair in the
//! counter. Nothing depends on which worker thread loads the sample or in which order, so the
//! loader's batches are the same for any number of workers.

use oxtrain_tensor::ops::random::philox::philox4x32_10;

/// A random stream for one sample, derived from (seed, epoch, index).
#[derive(Clone, Debug)]
pub struct SampleRng {
    key: [u32; 2],
    epoch: u32,
    index: u64,
    block: u32,
    words: [u32; 4],
    used: usize,
}

impl SampleRng {
    pub fn new(seed: u64, epoch: u64, index: u64) -> SampleRng {
        // The epoch's high bits fold into the key, so epochs past 2^32 still get their own streams.
        let key = [seed as u32, (seed >> 32) as u32 ^ ((epoch >> 32) as u32).wrapping_mul(0x9E37_79B9)];
        SampleRng { key, epoch: epoch as u32, index, block: 0, words: [0; 4], used: 4 }
    }

    pub fn next_u32(&mut self) -> u32 {
        if self.used == 4 {
            let counter = [self.block, self.epoch, self.index as u32, (self.index >> 32) as u32];
            self.words = philox4x32_10(counter, self.key);
            self.block = self.block.wrapping_add(1);
            self.used = 0;
        }
        self.used += 1;
        self.words[self.used - 1]
    }

    pub fn next_u64(&mut self) -> u64 {
        (self.next_u32() as u64) | ((self.next_u32() as u64) << 32)
    }

    /// A uniform f64 in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The draws torchvision's random transforms make, so the same algorithm can run on this crate's
/// stream or replay numbers recorded from torch (the fixtures do that).
pub trait TransformRng {
    /// A uniform number in [low, high) (`torch.empty(1).uniform_(low, high)`).
    fn uniform(&mut self, low: f64, high: f64) -> f64;
    /// A uniform integer in [low, high) (`torch.randint(low, high, (1,))`).
    fn randint(&mut self, low: i64, high: i64) -> i64;
}

impl TransformRng for SampleRng {
    fn uniform(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.next_f64()
    }

    fn randint(&mut self, low: i64, high: i64) -> i64 {
        assert!(high > low, "randint: empty range [{low}, {high})");
        // The modulo bias is below 2^-40 for any range an image can have.
        low + (self.next_u64() % (high - low) as u64) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_depend_on_seed_epoch_and_index_only() {
        let draw = |s, e, i| {
            let mut r = SampleRng::new(s, e, i);
            (0..6).map(|_| r.next_u32()).collect::<Vec<_>>()
        };
        assert_eq!(draw(1, 2, 3), draw(1, 2, 3));
        assert_ne!(draw(1, 2, 3), draw(1, 2, 4));
        assert_ne!(draw(1, 2, 3), draw(1, 3, 3));
        assert_ne!(draw(1, 2, 3), draw(2, 2, 3));
        assert_ne!(draw(1, 2, 3), draw(1, 2 + (1 << 32), 3));
    }

    #[test]
    fn uniform_and_randint_stay_in_range_and_spread() {
        let mut r = SampleRng::new(9, 0, 0);
        let mut hist = [0usize; 5];
        for _ in 0..5000 {
            let u = r.uniform(-2.0, 3.0);
            assert!((-2.0..3.0).contains(&u));
            hist[r.randint(10, 15) as usize - 10] += 1;
        }
        // Each bucket expects 1000; 5 standard deviations is about 140.
        assert!(hist.iter().all(|&c| (860..1140).contains(&c)), "{hist:?}");
    }
}
