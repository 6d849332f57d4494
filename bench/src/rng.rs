//! A small deterministic generator (xorshift64*): the same seed gives the same workload, so two
//! runs, and the measured code and its baseline within a run, see identical inputs.

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0), close enough for workloads.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
