//! The Activator's output: the commands a backend (the shim, the emulated GPU) executes, paper
//! section 5.5.
//!
//! A wake-up is always the same sequence: fill the faulting run (data or error marker), unmap its
//! companion run so the slot's next request faults again, map the run, and finally one replay per
//! GPU for the whole engine step, because a replay is global to the GPU anyway. The first three
//! steps are one [`Command::Complete`], which the backend carries out in that order: one command
//! per request keeps the fault path's output a third of the size of three.

pub use wic_types::ErrorMarker;

use crate::{ChannelId, GpuId};

/// Where the producer's bytes for a slot live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataSource {
    /// In the host buffer the client shares with the daemon, at this byte offset.
    Host { offset: u64 },
    /// In a producer GPU's memory at this virtual address.
    Gpu { gpu: GpuId, va: u64 },
}

/// What a completion writes into the run before mapping it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// `len` bytes of producer data from `source`.
    Data { len: u64, source: DataSource },
    /// `marker` at the start of each page.
    Marker(ErrorMarker),
    /// The head words of a host producer's in-place batch at the start of each page (the
    /// producer wrote the rest of the run itself; [`crate::Engine::publish_in_place`]); the
    /// backend finds them by the command's channel and slot.
    Heads,
}

/// One action for the backend, in the order emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Completes a held request on `slot` of `channel`, in this order: write `fill` into the
    /// `pages` pages at `run_va` (host-resident, unmapped on the consumer `gpu`); unmap the
    /// companion run at `companion_va` from `gpu` and wait for the TLB invalidate, so the
    /// slot's next request faults; map the run (read-only) on `gpu`, so the replayed access
    /// finds the fill. The channel and slot spare the backend a lookup by address to find the
    /// producer's bytes and count the delivery.
    Complete { gpu: GpuId, channel: ChannelId, slot: u32, run_va: u64, companion_va: u64, pages: u32, fill: Fill },
    /// Map the PAT page at `va` writable on the producer `gpu`, so its write completes.
    ServicePat { gpu: GpuId, va: u64 },
    /// Revoke `gpu`'s write access to the PAT page at `va`, so its next publish faults again.
    RearmPat { gpu: GpuId, va: u64 },
    /// Replay `gpu`'s faults: stalled warps whose pages are now mapped resume.
    Replay { gpu: GpuId },
    /// The in-place publish of `slot` of `channel` will never be delivered: its generation
    /// ended without it. Count it missed and let the producer publish again.
    MissedPublish { channel: ChannelId, slot: u32 },
    /// The backend's own bound ended the current generation of host-produced `slot` of
    /// `channel` ([`crate::Engine::expired_elsewhere`]): the slot's companion run at
    /// `companion_va` is unmapped, so its producer may write it in place next; `missed`: an
    /// in-place publish waiting for that generation was dropped, as by [`Command::MissedPublish`].
    Expired { channel: ChannelId, slot: u32, companion_va: u64, missed: bool },
}

/// The slot a wake-up completes and the pages it touches: the run that faulted and its
/// companion.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wake {
    pub gpu: GpuId,
    pub channel: ChannelId,
    pub slot: u32,
    pub run_va: u64,
    pub companion_va: u64,
    pub pages: u32,
}

/// Emits the command sequence that completes a held request, and keeps the set of GPUs owed a
/// replay until [`Activator::flush_replays`].
#[derive(Default)]
pub(crate) struct Activator {
    replay_owed: Vec<GpuId>,
}

impl Activator {
    /// Completes `wake` with `len` bytes of producer data from `source`.
    #[inline]
    pub fn deliver(&mut self, wake: Wake, len: u64, source: DataSource, out: &mut Vec<Command>) {
        self.complete(wake, Fill::Data { len, source }, out);
    }

    /// Completes `wake` with the head words of an in-place batch.
    #[inline]
    pub fn deliver_heads(&mut self, wake: Wake, out: &mut Vec<Command>) {
        self.complete(wake, Fill::Heads, out);
    }

    /// Completes `wake` with `marker` instead of data.
    pub fn fail(&mut self, wake: Wake, marker: ErrorMarker, out: &mut Vec<Command>) {
        self.complete(wake, Fill::Marker(marker), out);
    }

    /// Lets a producer's PAT write complete.
    pub fn release_pat(&mut self, gpu: GpuId, va: u64, out: &mut Vec<Command>) {
        out.push(Command::ServicePat { gpu, va });
        self.owe_replay(gpu);
    }

    #[inline]
    fn complete(&mut self, wake: Wake, fill: Fill, out: &mut Vec<Command>) {
        let Wake { gpu, channel, slot, run_va, companion_va, pages } = wake;
        out.push(Command::Complete { gpu, channel, slot, run_va, companion_va, pages, fill });
        self.owe_replay(gpu);
    }

    #[inline]
    fn owe_replay(&mut self, gpu: GpuId) {
        // A batch's faults come from one GPU: the last entry is almost always the one, and
        // that check stays inline at every wake-up.
        if self.replay_owed.last() != Some(&gpu) {
            self.owe_replay_to_another(gpu);
        }
    }

    #[cold]
    fn owe_replay_to_another(&mut self, gpu: GpuId) {
        if !self.replay_owed.contains(&gpu) {
            self.replay_owed.push(gpu);
        }
    }

    /// Emits one replay per GPU that needs one, in the order they first needed it.
    pub fn flush_replays(&mut self, out: &mut Vec<Command>) {
        out.extend(self.replay_owed.drain(..).map(|gpu| Command::Replay { gpu }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completion_carries_its_run_companion_and_fill_and_replays_once_per_gpu() {
        let mut act = Activator::default();
        let mut out = Vec::new();
        let wake = |gpu, run_va| Wake {
            gpu,
            channel: ChannelId(4),
            slot: 3,
            run_va,
            companion_va: run_va + 0x10000,
            pages: 2,
        };
        act.deliver(wake(0, 0x1000), 100, DataSource::Host { offset: 0 }, &mut out);
        act.fail(wake(0, 0x4000), ErrorMarker::Timeout, &mut out);
        act.deliver(wake(1, 0x8000), 100, DataSource::Gpu { gpu: 2, va: 0 }, &mut out);
        act.flush_replays(&mut out);
        let data = Fill::Data { len: 100, source: DataSource::Host { offset: 0 } };
        let complete = Command::Complete {
            gpu: 0,
            channel: ChannelId(4),
            slot: 3,
            run_va: 0x1000,
            companion_va: 0x11000,
            pages: 2,
            fill: data,
        };
        assert_eq!(out[0], complete);
        assert!(matches!(out[1], Command::Complete { run_va: 0x4000, fill: Fill::Marker(ErrorMarker::Timeout), .. }));
        assert_eq!(&out[3..], [Command::Replay { gpu: 0 }, Command::Replay { gpu: 1 }]);
        out.clear();
        act.flush_replays(&mut out);
        assert!(out.is_empty(), "replays are owed once");
    }
}
