//! The Monitor's per-entry cost: decode, classify, PFQ enqueue and deadline for every fault
//! entry of 256-entry batches, with 1K to 1M registered pages; then the publishes that wake
//! those requests (DAB update, PFQ wake, the Activator's commands). Every batch faults on 256
//! distinct slots, so the work per entry is the same at every size and only the size of the
//! state differs. The slots come from the active set: 4,096 waiting warps (an H100 holds at most
//! 132 SMs x 64 warps), a window that moves on by a batch each time, so over the run every
//! registered page is used. A second figure draws them uniformly from all registered pages, the
//! worst case for caches. The baseline, measured on the same entries, is decoding alone.

use std::hint::black_box;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use wic_engine::fault::AccessType;
use wic_engine::{ChannelSpec, Command, Engine, EngineConfig, FaultEntry, Producer, RawFaultEntry, VaWidth};

use crate::measure::fastest;
use wic_emu::payload::Rng;
use crate::Settings;

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
}

/// Where a batch's slots come from.
#[derive(Clone, Copy)]
enum Slots {
    ActiveSet,
    Uniform,
}

/// Per-entry nanoseconds of `handle_faults`, of the whole round (faults, publishes, expiry)
/// and of decoding alone, each the fastest of the repetitions.
fn measure(pages: u32, slots: Slots, settings: &Settings) -> (f64, f64, f64) {
    let config = EngineConfig { pool_pages: pages, max_slots: pages / 2, ..EngineConfig::default() };
    let mut engine = Engine::new(config).expect("engine");
    let spec = ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes: MESSAGE_BYTES, slots: pages / 2, timeout: 500 };
    let layout = engine.open_channel(spec).expect("channel");
    let runs: Vec<[u64; 2]> = layout.slots.iter().map(|s| s.runs).collect();
    let slot_count = runs.len() as u64;
    let mut generation = vec![0u8; runs.len()];
    // The round in which each slot was last picked, so that a batch's slots are distinct.
    let mut picked_in = vec![usize::MAX; runs.len()];
    let mut rng = Rng::new(settings.seed);
    let mut entries: Vec<RawFaultEntry> = Vec::with_capacity(BATCH);
    let mut picked: Vec<u32> = Vec::with_capacity(BATCH);
    let mut out: Vec<Command> = Vec::new();
    let (mut now, mut window) = (0u64, 0u64);
    let rounds = if settings.quick { 400 } else { 4000 };
    let (mut monitor, mut round, mut decode) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..settings.reps {
        let (mut monitor_ns, mut round_ns, mut decode_ns) = (0u128, 0u128, 0u128);
        for r in 0..rounds {
            let stamp = rep * rounds + r;
            entries.clear();
            picked.clear();
            while picked.len() < BATCH {
                let slot = match slots {
                    Slots::ActiveSet => ((window + rng.next_u64() % ACTIVE_SLOTS.min(slot_count)) % slot_count) as usize,
                    Slots::Uniform => (rng.next_u64() % slot_count) as usize,
                };
                if picked_in[slot] == stamp {
                    continue;
                }
                picked_in[slot] = stamp;
                entries.push(FaultEntry::replayable_gpc(runs[slot][usize::from(generation[slot] & 1)], AccessType::Read, now, 0x1000, 0, 0).encode());
                picked.push(slot as u32);
            }
            window += BATCH as u64;
            now += 1_000;
            out.clear();
            let start = Instant::now();
            engine.expire(now, &mut out);
            let faults = Instant::now();
            engine.handle_faults(now, 0, &entries, &mut out);
            let monitored = Instant::now();
            for &slot in &picked {
                engine.publish(now, layout.id, slot, &mut out).expect("each slot published once a round");
                generation[slot as usize] ^= 1;
            }
            let end = Instant::now();
            monitor_ns += (monitored - faults).as_nanos();
            round_ns += (end - start).as_nanos();
            let decode_start = Instant::now();
            for entry in &entries {
                black_box(FaultEntry::decode(black_box(entry), VaWidth::Bits57));
            }
            decode_ns += decode_start.elapsed().as_nanos();
        }
        let per_entry = |ns: u128| ns as f64 / (rounds * BATCH) as f64;
        monitor.push(per_entry(monitor_ns));
        round.push(per_entry(round_ns));
        decode.push(per_entry(decode_ns));
    }
    assert_eq!(engine.held(), 0, "every request of the bench was delivered");
    assert_eq!(engine.stats().delivered, (settings.reps * rounds * BATCH) as u64, "every fault was a request");
    (fastest(&monitor), fastest(&round), fastest(&decode))
}

fn row(pages: u32, settings: &Settings) -> Row {
    let (monitor_ns, round_ns, decode_ns) = measure(pages, Slots::ActiveSet, settings);
    let (uniform_ns, _, _) = measure(pages, Slots::Uniform, settings);
    Row {
        registered_pages: pages,
        monitor_ns,
        monitor_entries_per_s: 1e9 / monitor_ns,
        uniform_ns,
        round_ns,
        decode_ns,
        monitor_over_decode: monitor_ns / decode_ns,
    }
}

pub fn run(settings: &Settings) -> Vec<Row> {
    let sizes: &[u32] = if settings.quick { &[1 << 10, 1 << 14] } else { &[1 << 10, 1 << 14, 1 << 18, 1 << 20] };
    sizes
        .iter()
        .map(|&pages| {
            let row = row(pages, settings);
            eprintln!(
                "monitor: {pages:>8} pages  {:>6.1} ns/entry ({:>5.1} M/s), uniform slots {:>6.1} ns  with delivery {:>6.1} ns  decode alone {:>5.1} ns",
                row.monitor_ns,
                row.monitor_entries_per_s / 1e6,
                row.uniform_ns,
                row.round_ns,
                row.decode_ns
            );
            row
        })
        .collect()
}
