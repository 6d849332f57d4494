//! What the two GPU backends share: their map of channels, and the per-channel log of what a
//! batch of commands did.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use wic_engine::ErrorMarker;

/// Channel id -> a backend's state for it. Channel ids are the engine's small integers, never
/// chosen by clients, so a multiplicative hash serves: a lookup per delivered command costs a
/// few instructions instead of SipHash's tens of nanoseconds.
pub type ChannelMap<V> = HashMap<u32, V, BuildHasherDefault<ChannelIdHasher>>;

/// Fibonacci hashing of a channel id (the std maps take the hash's high bits).
#[derive(Default)]
pub struct ChannelIdHasher(u64);

impl Hasher for ChannelIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte) ^ self.0.rotate_left(8));
        }
    }

    fn write_u32(&mut self, id: u32) {
        self.write_u64(u64::from(id));
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// What executing a batch of commands did, for the global counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Executed {
    pub replays: u64,
    /// Commands that could not be carried out: the module refused them, or they named pages
    /// or data the backend does not have.
    pub failed: u64,
}

/// Per-channel events of one execution.
pub trait ExecutionLog {
    /// Producer data was copied into `channel`'s run.
    fn delivered(&mut self, channel: u32);
    /// `channel`'s run was completed with `marker`.
    fn failed(&mut self, channel: u32, marker: ErrorMarker);
}
