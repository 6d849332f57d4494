//! wicd's fast-path benchmarks, each figure next to a baseline measured in the same run, and
//! the evaluation report built from them and from the emulator (`wic-bench`, `wic-report`).

pub mod batch;
pub mod bitmap;
pub mod doorbell;
pub mod interrupter;
pub mod measure;
pub mod monitor;
pub mod paper;
pub mod svg;
pub mod wicd;

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long and how often the benchmarks measure.
pub struct Settings {
    pub quick: bool,
    pub reps: usize,
    pub seed: u64,
    /// How long one repetition of a per-operation loop runs.
    pub budget: Duration,
}

impl Settings {
    /// `reps` repetitions of full-length loops, or short ones with `quick` (a smoke run).
    pub fn new(quick: bool, reps: usize, seed: u64) -> Self {
        Self { quick, reps, seed, budget: Duration::from_millis(if quick { 5 } else { 100 }) }
    }
}

/// A benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Bench {
    Interrupter,
    Monitor,
    Batch,
    Doorbell,
}

/// Runs `benches` (all when empty).
pub fn run(settings: &Settings, benches: &[Bench]) -> Results {
    let wanted = |bench| benches.is_empty() || benches.contains(&bench);
    Results {
        machine: machine(),
        interrupter: if wanted(Bench::Interrupter) { interrupter::run(settings) } else { Vec::new() },
        monitor: if wanted(Bench::Monitor) { monitor::run(settings) } else { Vec::new() },
        batch: wanted(Bench::Batch).then(|| batch::run(settings)),
        doorbell: wanted(Bench::Doorbell).then(|| doorbell::run(settings)),
    }
}

/// Every benchmark's rows, and the machine they were measured on.
#[derive(Default, Serialize, Deserialize)]
pub struct Results {
    pub machine: String,
    pub interrupter: Vec<interrupter::Row>,
    pub monitor: Vec<monitor::Row>,
    pub batch: Option<batch::Row>,
    pub doorbell: Option<doorbell::Row>,
}

/// The machine's CPU and how many cores it has (all of them, not only those this process may
/// run on: the benchmarks are single-threaded and may be pinned to one).
pub fn machine() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = info
        .lines()
        .find_map(|l| l.strip_prefix("model name").map(|m| m.trim_start_matches([' ', '\t', ':']).to_string()))
        .unwrap_or_else(|| "an unknown CPU".into());
    let cores = info.lines().filter(|l| l.starts_with("processor")).count().max(1);
    format!("{cores} cores of {cpu}")
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT MET"
    }
}

/// The results against their targets, one line each, with whether each target is met.
pub fn summary(results: &Results) -> Vec<String> {
    let mut lines = Vec::new();
    let find = |pages: u32, fragmented: bool| {
        results.interrupter.iter().find(|r| r.pages == pages && r.fragmented == fragmented)
    };
    if let (Some(small), Some(target)) = (find(1 << 10, true), find(1 << 14, true)) {
        lines.push(format!(
            "interrupter at 16K pages, fragmented: {:.1} ns per alloc + free (target <= 100: {}), {:.1}x the bitmap (target >= 10: {})",
            target.segment_tree_ns,
            verdict(target.segment_tree_ns <= 100.0),
            target.speedup,
            verdict(target.speedup >= 10.0)
        ));
        if let Some(large) = find(1 << 20, true) {
            lines.push(format!(
                "interrupter growth 1K -> 1M pages: segment tree x{:.2} (log2 ratio 2.0; O(log n): {}), bitmap x{:.0}",
                large.segment_tree_ns / small.segment_tree_ns,
                // Logarithmic: no more than the ratio of the logarithms, with 25% for noise.
                verdict(large.segment_tree_ns / small.segment_tree_ns <= 2.0 * 1.25),
                large.bitmap_ns / small.bitmap_ns
            ));
        }
    }
    if let (Some(first), Some(last)) = (results.monitor.first(), results.monitor.last()) {
        let slowest = results.monitor.iter().map(|r| r.monitor_ns).fold(0.0, f64::max);
        let rise = 100.0 * (last.paired_over_smallest - 1.0);
        lines.push(format!(
            "monitor: {:.1} M entries/s at the slowest size (target >= 20: {}), {:.2}x decoding alone; {} -> {} pages {rise:+.1}% per entry, paired in time (target flat, within 25%: {})",
            1e3 / slowest,
            verdict(1e3 / slowest >= 20.0),
            first.monitor_over_decode,
            first.registered_pages,
            last.registered_pages,
            verdict(rise <= 25.0)
        ));
    }
    if let Some(batch) = &results.batch {
        lines.push(format!(
            "batch of {} entries, ring -> engine -> kernel commands: p99 {:.2} us in the run's quietest block (target <= 10: {}), {:.2} us over the whole run, {:.1}x reading the ring alone; p99 / p50 in that block {:.2}, {:.2} for a fixed computation of about the same length",
            batch.entries,
            batch.quiet_path_p99_us,
            verdict(batch.quiet_path_p99_us <= 10.0),
            batch.path_p99_us,
            batch.path_over_ring_read,
            batch.quiet_path_p99_us / batch.quiet_path_p50_us,
            batch.quiet_control_p99_us / batch.quiet_control_p50_us
        ));
    }
    if let Some(doorbell) = &results.doorbell {
        lines.push(format!(
            "doorbell: a libwic publish wakes wicd asleep {:.0} us: doorbell write -> fast path p50 {:.2} us p99 {:.2} us, {:.2}x / {:.2}x a bare eventfd wake in io_uring (p50 {:.2} us, p99 {:.2} us; in read(2) p50 {:.2} us); the publish call p50 {:.2} us p99 {:.2} us; publish -> engine p50 {:.2} us p99 {:.2} us",
            doorbell.gap_us,
            doorbell.wakeup_p50_ns / 1e3,
            doorbell.wakeup_p99_ns / 1e3,
            doorbell.wakeup_over_uring_p50,
            doorbell.wakeup_over_uring_p99,
            doorbell.uring_wake_p50_ns / 1e3,
            doorbell.uring_wake_p99_ns / 1e3,
            doorbell.read_wake_p50_ns / 1e3,
            doorbell.publish_p50_ns / 1e3,
            doorbell.publish_p99_ns / 1e3,
            doorbell.span_p50_ns / 1e3,
            doorbell.span_p99_ns / 1e3
        ));
    }
    lines
}
