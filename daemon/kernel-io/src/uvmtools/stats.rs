use std::collections::VecDeque;

use wic_engine::Histogram;

use super::event::ClientType;
use super::event::Event;

/// A watched fault waiting for its replay.
#[derive(Debug, Clone, Copy)]
struct Pending {
    gpu: u16,
    client: ClientType,
    batch: u32,
    cpu_ns: u64,
    gpu_ns: u64,
}

/// Counts and times the faults on watched pages (sans-IO: fed [`Event`]s).
///
/// A fault is watched if its address lies in one of the ranges `[start, end)`. A watched fault
/// waits for the replay that ends its batch: the next replay from the same GPU and client type
/// (replayable and non-replayable faults have separate batch counters) with the fault's batch
/// id and a CPU timestamp no earlier than the fault's. Matching the batch id, rather than taking
/// the next replay on the GPU, matters: the driver queues a replay only once it completed on
/// the GPU, so faults of the next batch often come before the previous batch's replay, and it
/// sends every VA space's replays to every tracker. Each pair gives a latency sample: replay
/// CPU time - fault CPU time (the driver's servicing of that batch from this fault on) and,
/// where both GPU timestamps are there, replay GPU time - fault GPU time (fault buffer write to
/// replay done: the stall the GPU saw). A waiting fault whose batch is more than
/// [`FaultStats::STALE_BATCHES`] behind a replay of its GPU, or that is pushed out of a full
/// wait list, is counted as unpaired (its replay was dropped or never sent, e.g. a cancelled
/// batch).
#[derive(Debug, Clone)]
pub struct FaultStats {
    /// Sorted, disjoint, non-empty.
    ranges: Vec<(u64, u64)>,
    watched_faults: u64,
    other_faults: u64,
    replays: u64,
    paired: u64,
    unpaired: u64,
    fatal_watched: u64,
    fatal_other: u64,
    latency_cpu: Histogram,
    latency_gpu: Histogram,
    pending: VecDeque<Pending>,
}

impl FaultStats {
    /// Batches a replay may run ahead of a waiting fault's batch before the fault is given up.
    pub const STALE_BATCHES: u32 = 64;
    /// Watched faults that may wait for their replay at once.
    pub const MAX_PENDING: usize = 1 << 16;
    /// Disjoint ranges one space may watch: every fault is looked up among them, and a client
    /// adding ranges without end must not grow wicd's memory or the fast path's work.
    pub const MAX_RANGES: usize = 1024;

    /// Statistics over the watched `ranges` (`start..end`; empty ones are ignored, overlapping
    /// ones merged; past [`Self::MAX_RANGES`] disjoint ones, the rest are left out).
    pub fn new(ranges: impl IntoIterator<Item = std::ops::Range<u64>>) -> Self {
        let mut stats = Self {
            ranges: Vec::new(),
            watched_faults: 0,
            other_faults: 0,
            replays: 0,
            paired: 0,
            unpaired: 0,
            fatal_watched: 0,
            fatal_other: 0,
            latency_cpu: Histogram::default(),
            latency_gpu: Histogram::default(),
            pending: VecDeque::new(),
        };
        for range in ranges {
            stats.watch(range);
        }
        stats
    }

    /// Adds `range` to the watched ones (empty ranges are ignored, overlapping ones merged);
    /// `false`, with nothing changed, if that would make more than [`Self::MAX_RANGES`].
    pub fn watch(&mut self, range: std::ops::Range<u64>) -> bool {
        if range.start >= range.end {
            return true;
        }
        let at = self.ranges.partition_point(|&(start, _)| start < range.start);
        let mut ranges = self.ranges.clone();
        ranges.insert(at, (range.start, range.end));
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (start, end) in ranges {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        if merged.len() > Self::MAX_RANGES {
            return false;
        }
        self.ranges = merged;
        true
    }

    /// Whether `address` lies in a watched range.
    pub fn watched(&self, address: u64) -> bool {
        let after = self.ranges.partition_point(|&(start, _)| start <= address);
        after > 0 && address < self.ranges[after - 1].1
    }

    /// Accounts one event.
    pub fn record(&mut self, event: &Event) {
        match *event {
            Event::Fault(fault) => {
                if !self.watched(fault.address) {
                    self.other_faults += 1;
                    return;
                }
                self.watched_faults += 1;
                if self.pending.len() == Self::MAX_PENDING {
                    self.pending.pop_front();
                    self.unpaired += 1;
                }
                self.pending.push_back(Pending {
                    gpu: fault.gpu_index,
                    client: fault.client,
                    batch: fault.batch_id,
                    cpu_ns: fault.cpu_ns,
                    gpu_ns: fault.gpu_ns,
                });
            }
            Event::Replay(replay) => {
                self.replays += 1;
                let (mut paired, mut unpaired) = (0, 0);
                let (latency_cpu, latency_gpu) = (&mut self.latency_cpu, &mut self.latency_gpu);
                self.pending.retain(|p| {
                    if p.gpu != replay.gpu_index || p.client != replay.client {
                        return true;
                    }
                    if p.batch == replay.batch_id && replay.cpu_ns >= p.cpu_ns {
                        latency_cpu.record(replay.cpu_ns - p.cpu_ns);
                        if p.gpu_ns != 0 && replay.gpu_ns >= p.gpu_ns {
                            latency_gpu.record(replay.gpu_ns - p.gpu_ns);
                        }
                        paired += 1;
                        return false;
                    }
                    let behind = replay.batch_id.wrapping_sub(p.batch) as i32;
                    if behind > Self::STALE_BATCHES as i32 {
                        unpaired += 1;
                        return false;
                    }
                    true
                });
                self.paired += paired;
                self.unpaired += unpaired;
            }
            Event::Fatal(fatal) => {
                if self.watched(fatal.address) {
                    self.fatal_watched += 1;
                } else {
                    self.fatal_other += 1;
                }
            }
        }
    }

    /// Accounts every event of `events`.
    pub fn record_all<'a>(&mut self, events: impl IntoIterator<Item = &'a Event>) {
        for event in events {
            self.record(event);
        }
    }

    /// The watched ranges, sorted and merged.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// Faults on watched pages.
    pub fn watched_faults(&self) -> u64 {
        self.watched_faults
    }

    /// Faults outside the watched ranges.
    pub fn other_faults(&self) -> u64 {
        self.other_faults
    }

    /// Replays seen (every VA space's).
    pub fn replays(&self) -> u64 {
        self.replays
    }

    /// Watched faults paired with their replay.
    pub fn paired(&self) -> u64 {
        self.paired
    }

    /// Watched faults given up without a replay.
    pub fn unpaired(&self) -> u64 {
        self.unpaired
    }

    /// Watched faults still waiting for their replay.
    pub fn waiting(&self) -> usize {
        self.pending.len()
    }

    /// Fatal faults on watched pages, and elsewhere.
    pub fn fatal(&self) -> (u64, u64) {
        (self.fatal_watched, self.fatal_other)
    }

    /// Replay CPU time - fault CPU time, ns, per paired fault.
    pub fn latency_cpu(&self) -> &Histogram {
        &self.latency_cpu
    }

    /// Replay GPU time - fault GPU time, ns, per paired fault with both GPU timestamps.
    pub fn latency_gpu(&self) -> &Histogram {
        &self.latency_gpu
    }
}
