//! What the two GPU backends share: their map of channels, and the per-channel log of what a
//! batch of commands did.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use wic_engine::{Command, ErrorMarker, Fill};

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
    /// `complete`'s data could not be written, so its run was not mapped. The engine has
    /// moved the slot on: only completing it again ([`marker_retries`]) wakes its warps.
    fn unfilled(&mut self, complete: Command);
}

/// Into `out`: each data completion of `unfilled` again with the timeout marker, which needs
/// no producer bytes, then one replay per GPU concerned. The warps learn that their data did
/// not come instead of staying stalled until their channel closes.
pub fn marker_retries(unfilled: &[Command], out: &mut Vec<Command>) {
    let mut gpus = Vec::new();
    for &command in unfilled {
        if let Command::Complete { gpu, channel, slot, run_va, companion_va, pages, fill: Fill::Data { .. } } = command
        {
            out.push(Command::Complete {
                gpu,
                channel,
                slot,
                run_va,
                companion_va,
                pages,
                fill: Fill::Marker(ErrorMarker::Timeout),
            });
            if !gpus.contains(&gpu) {
                gpus.push(gpu);
            }
        }
    }
    out.extend(gpus.into_iter().map(|gpu| Command::Replay { gpu }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use wic_engine::{ChannelId, DataSource};

    #[test]
    fn unfilled_data_completions_are_completed_again_with_the_timeout_marker_then_replayed() {
        let complete = |gpu, slot, fill| Command::Complete {
            gpu,
            channel: ChannelId(3),
            slot,
            run_va: 0x1000 * u64::from(slot),
            companion_va: 0,
            pages: 1,
            fill,
        };
        let data = Fill::Data { len: 64, source: DataSource::Host { offset: 0 } };
        let timeout = Fill::Marker(ErrorMarker::Timeout);
        let unfilled = [
            complete(0, 1, data),
            complete(1, 2, data),
            complete(0, 3, data),
            complete(0, 4, Fill::Marker(ErrorMarker::ChannelClosed)),
        ];
        let mut out = Vec::new();
        marker_retries(&unfilled, &mut out);
        let expected = [
            complete(0, 1, timeout),
            complete(1, 2, timeout),
            complete(0, 3, timeout),
            Command::Replay { gpu: 0 },
            Command::Replay { gpu: 1 },
        ];
        assert_eq!(out, expected, "a marker completion is never retried");
    }
}
