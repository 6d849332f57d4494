//! The Monitor's per-entry cost: decode, classify, PFQ enqueue and deadline for every fault
//! entry of 256-entry batches, with 1K to 1M registered pages; then the publishes that wake
//! those requests (DAB update, PFQ wake, the Activator's commands). Every batch faults on 256
//! distinct slots, so the work per entry is the same at every size and only the size of the
//! state differs. The slots come from the active set: 4,096 waiting warps (an H100 holds at most
//! 132 SMs x 64 warps), a window that moves on by a batch each time, so over the run every
//! registered page is used. A second figure draws them uniformly from all registered pages, the
//! worst case for caches. The baseline, measured on the same entries, is decoding alone.
//!
//! Every size is timed in short slices, one of each size per pass, each after an untimed round
//! that brings its state back into the caches. A shared machine runs slower for stretches of
//! tens of milliseconds, longer than a pass, so a size's slice and the smallest size's slice of
//! the same pass ran at the same speed: their ratio, the median over all passes, is how the
//! per-entry cost grows with the registered pages.

use std::hint::black_box;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use wic_engine::fault::AccessType;
use wic_engine::{ChannelId, ChannelSpec, Command, Engine, EngineConfig, FaultEntry, Producer, RawFaultEntry, VaWidth};

use crate::measure::{fastest, percentile, sorted};
use crate::Settings;
use wic_emu::payload::Rng;

const BATCH: usize = 256;
/// Slots with a warp waiting on them at one time.
const ACTIVE_SLOTS: u64 = 4096;
/// 16 warps x 256 B: one page per run, so N registered pages are N / 2 slots.
const MESSAGE_BYTES: u32 = 256;

#[derive(Debug, Serialize, Deserialize)]
pub struct Row {
    pub registered_pages: u32,
    /// `handle_faults` per entry: decode, classify, PFQ and deadlines, slots of the active set.
    pub monitor_ns: f64,
    pub monitor_entries_per_s: f64,
    /// The same with slots drawn from all registered pages.
    pub uniform_ns: f64,
    /// Faults and the publishes that deliver them, plus expiry, per entry.
    pub round_ns: f64,
    /// Decoding the same entries, nothing else.
    pub decode_ns: f64,
    pub monitor_over_decode: f64,
    /// The median over passes of this size's `handle_faults` slice over the smallest size's
    /// slice of the same pass.
    pub paired_over_smallest: f64,
}

/// Where a batch's slots come from.
#[derive(Clone, Copy)]
enum Slots {
    ActiveSet,
    Uniform,
}

/// One engine with one channel over all registered pages, and the traffic state driving it.
struct Workload {
    engine: Engine,
    channel: ChannelId,
    runs: Vec<[u64; 2]>,
    slots: Slots,
    generation: Vec<u8>,
    /// The round in which each slot was last picked, so that a batch's slots are distinct.
    picked_in: Vec<usize>,
    rng: Rng,
    entries: Vec<RawFaultEntry>,
    picked: Vec<u32>,
    out: Vec<Command>,
    now: u64,
    window: u64,
    rounds_done: usize,
}

/// Per-entry nanoseconds of one repetition: `handle_faults`, the whole round (faults,
/// publishes, expiry) and decoding alone.
struct Sample {
    monitor: f64,
    round: f64,
    decode: f64,
}

impl Workload {
    fn new(pages: u32, slots: Slots, seed: u64) -> Self {
        let config = EngineConfig { pool_pages: pages, max_slots: pages / 2, ..EngineConfig::default() };
        let mut engine = Engine::new(config).expect("engine");
        let spec = ChannelSpec {
            consumer_gpu: 0,
            producer: Producer::Host,
            message_bytes: MESSAGE_BYTES,
            slots: pages / 2,
            timeout_ns: 500,
        };
        let layout = engine.open_channel(spec).expect("channel");
        let runs: Vec<[u64; 2]> = layout.slots.iter().map(|s| s.runs).collect();
        Self {
            engine,
            channel: layout.id,
            generation: vec![0; runs.len()],
            picked_in: vec![usize::MAX; runs.len()],
            runs,
            slots,
            rng: Rng::new(seed),
            entries: Vec::with_capacity(BATCH),
            picked: Vec::with_capacity(BATCH),
            out: Vec::new(),
            now: 0,
            window: 0,
            rounds_done: 0,
        }
    }

    /// `rounds` rounds of 256 faults on distinct slots, each then published.
    fn sample(&mut self, rounds: usize) -> Sample {
        let slot_count = self.runs.len() as u64;
        let (mut monitor_ns, mut round_ns, mut decode_ns) = (0u128, 0u128, 0u128);
        for _ in 0..rounds {
            let stamp = self.rounds_done;
            self.rounds_done += 1;
            self.entries.clear();
            self.picked.clear();
            while self.picked.len() < BATCH {
                let slot = match self.slots {
                    Slots::ActiveSet => {
                        ((self.window + self.rng.next_u64() % ACTIVE_SLOTS.min(slot_count)) % slot_count) as usize
                    }
                    Slots::Uniform => (self.rng.next_u64() % slot_count) as usize,
                };
                if self.picked_in[slot] == stamp {
                    continue;
                }
                self.picked_in[slot] = stamp;
                let va = self.runs[slot][usize::from(self.generation[slot] & 1)];
                self.entries.push(FaultEntry::replayable_gpc(va, AccessType::Read, self.now, 0x1000, 0, 0).encode());
                self.picked.push(slot as u32);
            }
            self.window += BATCH as u64;
            self.now += 1_000;
            self.out.clear();
            let start = Instant::now();
            self.engine.expire(self.now, &mut self.out);
            let faults = Instant::now();
            self.engine.handle_faults(self.now, 0, &self.entries, &mut self.out);
            let monitored = Instant::now();
            for &slot in &self.picked {
                self.engine
                    .publish(self.now, self.channel, slot, &mut self.out)
                    .expect("each slot published once a round");
                self.generation[slot as usize] ^= 1;
            }
            let end = Instant::now();
            monitor_ns += (monitored - faults).as_nanos();
            round_ns += (end - start).as_nanos();
            let decode_start = Instant::now();
            for entry in &self.entries {
                black_box(FaultEntry::decode(black_box(entry), VaWidth::Bits57));
            }
            decode_ns += decode_start.elapsed().as_nanos();
        }
        assert_eq!(self.engine.held(), 0, "every request of the bench was delivered");
        assert_eq!(self.engine.stats().delivered, (self.rounds_done * BATCH) as u64, "every fault was a request");
        let per_entry = |ns: u128| ns as f64 / (rounds * BATCH) as f64;
        Sample { monitor: per_entry(monitor_ns), round: per_entry(round_ns), decode: per_entry(decode_ns) }
    }
}

/// Slices per repetition; a slice of 100 rounds takes about a millisecond.
const SLICES_PER_REP: usize = 40;

pub fn run(settings: &Settings) -> Vec<Row> {
    let sizes: &[u32] = if settings.quick { &[1 << 10, 1 << 14] } else { &[1 << 10, 1 << 14, 1 << 18, 1 << 20] };
    let slice_rounds = if settings.quick { 10 } else { 100 };
    let mut workloads: Vec<[Workload; 2]> = sizes
        .iter()
        .map(|&pages| [Slots::ActiveSet, Slots::Uniform].map(|slots| Workload::new(pages, slots, settings.seed)))
        .collect();
    let mut samples: Vec<[Vec<Sample>; 2]> = sizes.iter().map(|_| [Vec::new(), Vec::new()]).collect();
    for _ in 0..settings.reps * SLICES_PER_REP {
        for (pair, taken) in workloads.iter_mut().zip(&mut samples) {
            for (workload, taken) in pair.iter_mut().zip(taken.iter_mut()) {
                workload.sample(1);
                taken.push(workload.sample(slice_rounds));
            }
        }
    }
    sizes
        .iter()
        .zip(&samples)
        .map(|(&pages, [active, uniform])| {
            let best = |samples: &[Sample], of: fn(&Sample) -> f64| fastest(&samples.iter().map(of).collect::<Vec<_>>());
            let (monitor_ns, decode_ns) = (best(active, |s| s.monitor), best(active, |s| s.decode));
            let paired: Vec<f64> = active.iter().zip(&samples[0][0]).map(|(this, smallest)| this.monitor / smallest.monitor).collect();
            let row = Row {
                registered_pages: pages,
                monitor_ns,
                monitor_entries_per_s: 1e9 / monitor_ns,
                uniform_ns: best(uniform, |s| s.monitor),
                round_ns: best(active, |s| s.round),
                decode_ns,
                monitor_over_decode: monitor_ns / decode_ns,
                paired_over_smallest: percentile(&sorted(&paired), 0.5),
            };
            eprintln!(
                "monitor: {pages:>8} pages  {:>6.1} ns/entry ({:>5.1} M/s), uniform slots {:>6.1} ns  with delivery {:>6.1} ns  decode alone {:>5.1} ns  paired x{:.2}",
                row.monitor_ns,
                row.monitor_entries_per_s / 1e6,
                row.uniform_ns,
                row.round_ns,
                row.decode_ns,
                row.paired_over_smallest
            );
            row
        })
        .collect()
}
