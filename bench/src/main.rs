//! wic-bench: wicd's fast-path benchmarks. Each prints its figure next to a baseline measured
//! in the same run, and the ratio the performance targets are stated in:
//!
//! - `interrupter`: allocate + free of a run, segment tree vs a linear-scan first-fit bitmap,
//!   empty and fragmented pools of 1K to 1M pages (target: <= 100 ns at 16K, >= 10x the
//!   bitmap when fragmented, O(log n) growth);
//! - `monitor`: per fault entry, decode + classify + PFQ/DAB, 1K to 1M registered pages
//!   (target: >= 20 M entries/s, flat in the pages), against decoding alone.
//!
//! `--json FILE` writes every row; `--quick` runs small sizes only (a smoke run, not a figure).

mod bitmap;
mod interrupter;
mod measure;
mod monitor;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Bench {
    Interrupter,
    Monitor,
}

#[derive(Debug, Parser)]
#[command(about = "wicd's fast-path benchmarks against same-run baselines")]
struct Args {
    /// Benchmarks to run (all by default).
    benches: Vec<Bench>,
    /// Small sizes and short loops: checks that the benchmarks run, measures nothing.
    #[arg(long)]
    quick: bool,
    /// Repetitions per figure (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Workload seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Writes the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub struct Settings {
    pub quick: bool,
    pub reps: usize,
    pub seed: u64,
    /// How long one repetition of a per-operation loop runs.
    pub budget: Duration,
}

#[derive(Default, Serialize)]
struct Results {
    interrupter: Vec<interrupter::Row>,
    monitor: Vec<monitor::Row>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.reps == 0 {
        eprintln!("wic-bench: --reps must be at least 1");
        return ExitCode::FAILURE;
    }
    let settings = Settings {
        quick: args.quick,
        reps: args.reps,
        seed: args.seed,
        budget: Duration::from_millis(if args.quick { 5 } else { 100 }),
    };
    let all = args.benches.is_empty();
    let mut results = Results::default();
    if all || args.benches.contains(&Bench::Interrupter) {
        results.interrupter = interrupter::run(&settings);
    }
    if all || args.benches.contains(&Bench::Monitor) {
        results.monitor = monitor::run(&settings);
    }
    print_summary(&results);
    if let Some(path) = args.json {
        let text = serde_json::to_string_pretty(&results).expect("results serialize");
        if let Err(e) = std::fs::write(&path, text + "\n") {
            eprintln!("wic-bench: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

fn print_summary(results: &Results) {
    let find = |pages: u32, fragmented: bool| results.interrupter.iter().find(|r| r.pages == pages && r.fragmented == fragmented);
    if let (Some(small), Some(target)) = (find(1 << 10, true), find(1 << 14, true)) {
        println!(
            "interrupter at 16K pages, fragmented: {:.1} ns per alloc + free (target <= 100), {:.1}x the bitmap (target >= 10)",
            target.segment_tree_ns, target.speedup
        );
        if let Some(large) = find(1 << 20, true) {
            println!(
                "interrupter growth 1K -> 1M pages: segment tree x{:.2} (log2 ratio 2.0), bitmap x{:.0}",
                large.segment_tree_ns / small.segment_tree_ns,
                large.bitmap_ns / small.bitmap_ns
            );
        }
    }
    if let (Some(first), Some(last)) = (results.monitor.first(), results.monitor.last()) {
        let slowest = results.monitor.iter().map(|r| r.monitor_ns).fold(0.0, f64::max);
        println!(
            "monitor: {:.1} M entries/s at the slowest size (target >= 20), {:.2}x decoding alone; {} -> {} pages x{:.2} (target flat)",
            1e3 / slowest,
            first.monitor_over_decode,
            first.registered_pages,
            last.registered_pages,
            last.monitor_ns / first.monitor_ns
        );
    }
}
