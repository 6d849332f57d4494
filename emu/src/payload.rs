//! Message bytes: what a producer writes and what its consumer must read back.
//!
//! Byte `i` of a slot's generation is a pure function of (workload seed, phase, slot, generation,
//! i), so a consumer checks what it received without the producer keeping copies.

/// SplitMix64's finalizer: a fast, well-mixed 64-bit permutation. The one copy in the
/// workspace: the model's message bytes and [`Rng`] draw from it, and so do the load and soak
/// tools (`wic-tests`), whose outputs stay reproducible only while its arithmetic does.
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Identifies one message: a slot of a phase at a generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageKey {
    pub seed: u64,
    pub phase: u32,
    pub slot: u32,
    pub generation: u64,
}

impl MessageKey {
    fn stream(&self) -> u64 {
        splitmix64(
            self.seed
                ^ splitmix64(u64::from(self.phase) << 40 ^ u64::from(self.slot) << 8 ^ splitmix64(self.generation)),
        )
    }

    /// Byte `at` of the message whose stream is `stream`.
    fn byte_at(stream: u64, at: u64) -> u8 {
        (splitmix64(stream ^ (at / 8)) >> (8 * (at % 8))) as u8
    }

    /// Fills `out` with bytes `offset..offset + out.len()` of the message.
    pub fn fill(&self, offset: u64, out: &mut [u8]) {
        let stream = self.stream();
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = Self::byte_at(stream, offset + i as u64);
        }
    }

    /// Whether `got` equals bytes `offset..offset + got.len()` of the message.
    pub fn matches(&self, offset: u64, got: &[u8]) -> bool {
        let stream = self.stream();
        got.iter().enumerate().all(|(i, byte)| *byte == Self::byte_at(stream, offset + i as u64))
    }
}

/// A small deterministic generator for the model's random choices.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(splitmix64(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        splitmix64(self.0)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_and_match_agree_and_differ_across_keys() {
        let key = MessageKey { seed: 1, phase: 0, slot: 3, generation: 2 };
        let mut buf = vec![0u8; 100];
        key.fill(13, &mut buf);
        assert!(key.matches(13, &buf));
        assert!(!key.matches(14, &buf));
        assert!(!MessageKey { generation: 3, ..key }.matches(13, &buf));
        assert!(!MessageKey { slot: 4, ..key }.matches(13, &buf));
        buf[50] ^= 1;
        assert!(!key.matches(13, &buf));
    }

    #[test]
    fn rng_is_deterministic_and_shuffle_is_a_permutation() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        assert_eq!(a.next_u64(), b.next_u64());
        let mut v: Vec<u32> = (0..50).collect();
        a.shuffle(&mut v);
        let mut sorted = v.clone();
        sorted.sort();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_ne!(v, sorted);
        assert!((0..1000).map(|_| a.unit()).all(|u| (0.0..1.0).contains(&u)));
    }
}
