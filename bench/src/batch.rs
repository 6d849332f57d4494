//! One 256-entry fault batch through wicd's whole user-space path on the shim backend: the
//! record ring read, records translated to engine addresses, the engine (decode, classify,
//! deliver: every slot's data is already published), and its commands translated into the
//! kernel batch that one io_uring submission or ioctl would carry, with wicd's bookkeeping
//! around it: each delivery's channel looked up to find the producer's bytes, and again after
//! the batch ran to count the delivery. The ring lies in
//! ordinary memory, written the way the module writes it; the system call itself is not
//! included (the kernel VM figure in docs/evaluation.md is). The baseline, measured on the same
//! records in the same run, is reading the ring alone.
//!
//! Percentiles are given over the whole run and over its quietest block of batches. A shared
//! machine's other tenants slow every batch for stretches of tens of milliseconds; the block is
//! chosen by the baseline's median, so the figure it reports is not what picks it.
//!
//! A second baseline tells the path's own tail from the machine's: after every batch, a fixed
//! computation calibrated before the run to take the path's median time ([`spin`]). Its work
//! never changes, so whatever spread it shows is the machine's.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use wic_engine::fault::AccessType;
use wic_engine::{ChannelId, ChannelSpec, Command, DataSource, Engine, EngineConfig, FaultEntry, Fill, Producer};
use wic_kernel_io::{BatchPath, MemoryRing, Placement, Record, RecordRing};

use crate::measure::{percentile, sorted, spin};
use crate::Settings;

const BATCH: u32 = 256;
/// A record ring as large as the module's default, so a batch never wraps onto itself.
const RING_ENTRIES: u32 = 1024;
/// Where the channel sits in the (pretend) application's address space.
const PROCESS_BASE: u64 = 0x7000_0000_0000;
/// The module's id of the channel's (pretend) registered range, which its records carry.
const RANGE_ID: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
pub struct Row {
    pub entries: u32,
    pub batches: usize,
    /// Kernel commands per batch (a completion per delivery, and the replay).
    pub kernel_commands: usize,
    pub path_p50_us: f64,
    pub path_p99_us: f64,
    /// Medians of the path's two halves: ring read, address translation and engine; then the
    /// engine's commands translated into the kernel batch.
    pub take_faults_p50_us: f64,
    pub translate_p50_us: f64,
    pub ring_read_p50_us: f64,
    pub ring_read_p99_us: f64,
    /// p99 of the whole path over p99 of the ring read.
    pub path_over_ring_read: f64,
    /// The run cut into [`BLOCKS`] consecutive blocks of batches: the path's p50 and p99 in the
    /// block whose ring-read baseline had the lowest median, the quietest stretch of the run by
    /// a witness that is not the figure itself.
    pub quiet_path_p50_us: f64,
    pub quiet_path_p99_us: f64,
    pub quiet_ring_read_p50_us: f64,
    /// The fixed control computation, calibrated to the path's median in the warm-up and timed
    /// after every batch: over the whole run and in the quietest block. Its p99 over its p50
    /// is the tail the machine gives any work of that length.
    pub control_p50_us: f64,
    pub control_p99_us: f64,
    pub quiet_control_p50_us: f64,
    pub quiet_control_p99_us: f64,
}

/// Blocks the run is cut into to find its quietest stretch.
pub const BLOCKS: usize = 20;
/// Batches run before the timed ones: caches and branch predictors warm, and the path's
/// median for the control's calibration.
const WARM_UP: usize = 500;

pub fn run(settings: &Settings) -> Row {
    let mut engine = Engine::new(EngineConfig::default()).expect("engine");
    let spec = ChannelSpec {
        consumer_gpu: 0,
        producer: Producer::Host,
        message_bytes: 256,
        slots: BATCH,
        timeout_ns: u64::MAX / 4,
    };
    let layout = engine.open_channel(spec).expect("channel");
    let placement = Placement::new(&layout, 1, PROCESS_BASE);
    let process_runs: Vec<[u64; 2]> =
        layout.slots.iter().map(|slot| slot.runs.map(|run| placement.process_va(run).expect("a placed run"))).collect();
    let mut path = BatchPath::new(engine.config());
    path.add(&placement, &[RANGE_ID]);
    let mut memory = MemoryRing::new(RING_ENTRIES);
    // SAFETY: `memory` owns the ring's bytes, is not moved, and outlives both readers.
    let mut ring = unsafe { RecordRing::new(memory.base(), memory.bytes()) }.expect("a well-formed ring");
    // SAFETY: as above.
    let mut baseline_ring = unsafe { RecordRing::new(memory.base(), memory.bytes()) }.expect("a well-formed ring");
    // Per channel id, where its producer's bytes are mapped in the daemon, and its deliveries.
    let mut data_base = vec![None; layout.id.0 as usize + 1];
    data_base[layout.id.0 as usize] = Some(0x5000_0000_0000u64);
    let mut deliveries = vec![0u64; data_base.len()];
    let host_data = |channel: ChannelId, source: DataSource, _: u64| match source {
        DataSource::Host { offset } => Some(data_base.get(channel.0 as usize).copied()?? + offset),
        DataSource::Gpu { .. } => None,
    };

    let (warm_up, batches) = if settings.quick { (20, 200) } else { (WARM_UP, 20_000) };
    let (mut out, mut records): (Vec<Command>, Vec<Record>) = (Vec::new(), Vec::new());
    let (mut seq, mut kernel_commands) = (0u64, 0);
    // One batch; returns the microseconds of the ring read alone, of the path, and of its
    // two halves.
    let mut one_batch = |generation: usize| {
        // The producer has published every slot; each warp's fault then finds its data.
        out.clear();
        for slot in 0..BATCH {
            engine.publish(generation as u64, layout.id, slot, &mut out).expect("publish");
        }
        let side = generation % 2;
        let first = seq;
        for runs in &process_runs {
            let va = runs[side];
            let entry = FaultEntry::replayable_gpc(va, AccessType::Read, seq, 0x1000, 0, 0).encode();
            memory.write(
                seq,
                &Record {
                    seq,
                    space_id: 1,
                    gpu_id: 0,
                    range_id: RANGE_ID,
                    pat: false,
                    expired: false,
                    unsupported_gpu: false,
                    held_ns: 0,
                    entry,
                },
            );
            seq += 1;
        }
        memory.publish(seq);

        let start = Instant::now();
        baseline_ring.read(&mut records, usize::MAX);
        let read_us = start.elapsed().as_secs_f64() * 1e6;
        assert_eq!(records.len(), BATCH as usize, "the baseline read the whole batch");
        records.clear();

        out.clear();
        let start = Instant::now();
        let read = path.take_faults(&mut ring, &mut engine.intake(generation as u64, &mut out));
        let taken = Instant::now();
        let batch = path.translate(&out, host_data, &mut |command, _| panic!("{command:?} did not translate"), &mut 0);
        kernel_commands = batch.len();
        for command in &out {
            if let Command::Complete { channel, fill: Fill::Data { .. }, .. } = *command {
                deliveries[channel.0 as usize] += 1;
            }
        }
        let end = Instant::now();
        assert_eq!(read as u64, seq - first, "the path read the whole batch");
        let us = |from: Instant, to: Instant| (to - from).as_secs_f64() * 1e6;
        [read_us, us(start, end), us(start, taken), us(taken, end)]
    };

    let warm: Vec<f64> = (0..warm_up).map(|generation| one_batch(generation)[1]).collect();
    let (mut table, rounds) = calibrated_control(percentile(&sorted(&warm), 0.5));
    let (mut path_us, mut read_us) = (Vec::with_capacity(batches), Vec::with_capacity(batches));
    let (mut take_us, mut translate_us) = (Vec::with_capacity(batches), Vec::with_capacity(batches));
    let mut control_us = Vec::with_capacity(batches);
    for generation in warm_up..warm_up + batches {
        let [read, whole, take, translate] = one_batch(generation);
        read_us.push(read);
        path_us.push(whole);
        take_us.push(take);
        translate_us.push(translate);
        control_us.push(timed_spin(&mut table, rounds));
    }
    let total = (warm_up + batches) as u64 * u64::from(BATCH);
    assert_eq!(deliveries[layout.id.0 as usize], total, "every delivery was counted");
    assert_eq!(engine.stats().delivered, total, "every fault was delivered");
    assert_eq!(kernel_commands, BATCH as usize + 1, "one completion per fault, and one replay");
    let block = batches / BLOCKS;
    let read_medians: Vec<f64> = read_us.chunks_exact(block).map(|samples| percentile(&sorted(samples), 0.5)).collect();
    let quiet = (0..read_medians.len()).min_by(|&a, &b| read_medians[a].total_cmp(&read_medians[b])).expect("blocks");
    let quiet_path = sorted(&path_us[quiet * block..][..block]);
    let quiet_control = sorted(&control_us[quiet * block..][..block]);
    for samples in [&mut path_us, &mut read_us, &mut take_us, &mut translate_us, &mut control_us] {
        samples.sort_by(f64::total_cmp);
    }
    let row = Row {
        entries: BATCH,
        batches,
        kernel_commands,
        path_p50_us: percentile(&path_us, 0.5),
        path_p99_us: percentile(&path_us, 0.99),
        take_faults_p50_us: percentile(&take_us, 0.5),
        translate_p50_us: percentile(&translate_us, 0.5),
        ring_read_p50_us: percentile(&read_us, 0.5),
        ring_read_p99_us: percentile(&read_us, 0.99),
        path_over_ring_read: percentile(&path_us, 0.99) / percentile(&read_us, 0.99),
        quiet_path_p50_us: percentile(&quiet_path, 0.5),
        quiet_path_p99_us: percentile(&quiet_path, 0.99),
        quiet_ring_read_p50_us: read_medians[quiet],
        control_p50_us: percentile(&control_us, 0.5),
        control_p99_us: percentile(&control_us, 0.99),
        quiet_control_p50_us: percentile(&quiet_control, 0.5),
        quiet_control_p99_us: percentile(&quiet_control, 0.99),
    };
    eprintln!(
        "batch: {BATCH} entries, {batches} batches: path p50 {:.2} us p99 {:.2} us (p50 ring to engine {:.2} us, command translation {:.2} us); ring read alone p50 {:.2} us p99 {:.2} us; quietest block: path p50 {:.2} us p99 {:.2} us, ring read p50 {:.2} us; same-length control p50 {:.2} us p99 {:.2} us, in the quietest block p50 {:.2} us p99 {:.2} us",
        row.path_p50_us,
        row.path_p99_us,
        row.take_faults_p50_us,
        row.translate_p50_us,
        row.ring_read_p50_us,
        row.ring_read_p99_us,
        row.quiet_path_p50_us,
        row.quiet_path_p99_us,
        row.quiet_ring_read_p50_us,
        row.control_p50_us,
        row.control_p99_us,
        row.quiet_control_p50_us,
        row.quiet_control_p99_us
    );
    row
}

/// Microseconds [`spin`] takes for `rounds` rounds.
fn timed_spin(table: &mut [u64; 512], rounds: u32) -> f64 {
    let start = Instant::now();
    spin(table, rounds);
    start.elapsed().as_secs_f64() * 1e6
}

/// A table for [`spin`] and the rounds that make it take `target_us`: the rounds are scaled
/// three times by the target over the median of 50 trials.
fn calibrated_control(target_us: f64) -> ([u64; 512], u32) {
    let mut table = [1u64; 512];
    let mut rounds = 1_000u32;
    for _ in 0..3 {
        let trials: Vec<f64> = (0..50).map(|_| timed_spin(&mut table, rounds)).collect();
        let median = percentile(&sorted(&trials), 0.5).max(1e-3);
        rounds = ((f64::from(rounds) * target_us / median).round() as u32).max(1);
    }
    (table, rounds)
}
