//! What the two GPU backends share: the index from an engine run to its channel slot, and the
//! per-channel log of what a batch of commands did.

use std::collections::HashMap;

use wic_engine::ErrorMarker;

/// Where a run lives: its channel, slot and generation parity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunPlace {
    pub channel: u32,
    pub slot: u32,
    pub side: usize,
}

/// Engine run start -> the channel slot it belongs to.
#[derive(Debug, Default)]
pub struct RunIndex(HashMap<u64, RunPlace>);

impl RunIndex {
    /// Adds a channel whose runs start at `runs[slot][side]`.
    pub fn add(&mut self, channel: u32, runs: impl IntoIterator<Item = [u64; 2]>) {
        for (slot, pair) in runs.into_iter().enumerate() {
            for (side, va) in pair.into_iter().enumerate() {
                self.0.insert(va, RunPlace { channel, slot: slot as u32, side });
            }
        }
    }

    /// Forgets a channel's runs.
    pub fn remove(&mut self, channel: u32) {
        self.0.retain(|_, place| place.channel != channel);
    }

    /// The run that starts at `va`.
    pub fn place(&self, va: u64) -> Option<RunPlace> {
        self.0.get(&va).copied()
    }
}

/// What executing a batch of commands did, for the global counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Executed {
    pub replays: u64,
}

/// Per-channel events of one execution.
pub trait ExecutionLog {
    /// Producer data was copied into `channel`'s run.
    fn delivered(&mut self, channel: u32);
    /// `channel`'s run was completed with `marker`.
    fn failed(&mut self, channel: u32, marker: ErrorMarker);
}
