//! wic-bench: wicd's fast-path benchmarks. Each prints its figure next to a baseline measured
//! in the same run, and the ratio the performance targets are stated in:
//!
//! - `interrupter`: allocate + free of a run, segment tree vs a linear-scan first-fit bitmap,
//!   empty and fragmented pools of 1K to 1M pages (target: <= 100 ns at 16K, >= 10x the
//!   bitmap when fragmented, O(log n) growth);
//! - `monitor`: per fault entry, decode + classify + PFQ/DAB, 1K to 1M registered pages
//!   (target: >= 20 M entries/s, flat in the pages), against decoding alone;
//! - `batch`: a 256-entry fault batch through the whole user-space path, ring read -> engine
//!   -> kernel command batch (target: p99 <= 10 us), against reading the ring alone and a
//!   fixed computation of the same median length, which shows the machine's own tail;
//! - `doorbell`: a host producer's libwic publish waking a sleeping wicd (this build, emulated
//!   GPU), from the doorbell write to the fast path's handler, against a bare eventfd wake of a
//!   thread blocked in io_uring, and in read(2).
//!
//! `--json FILE` writes every row; `--quick` runs small sizes only (a smoke run, not a figure).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use wic_bench::{run, summary, Bench, Settings};

#[derive(Debug, Parser)]
#[command(about = "wicd's fast-path benchmarks against same-run baselines")]
struct Args {
    /// Benchmarks to run (all by default).
    benches: Vec<Bench>,
    /// Small sizes and short loops: checks that the benchmarks run, measures nothing.
    #[arg(long)]
    quick: bool,
    /// Repetitions per figure (the fastest is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Workload seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Writes the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.reps == 0 {
        eprintln!("wic-bench: --reps must be at least 1");
        return ExitCode::FAILURE;
    }
    let settings = Settings::new(args.quick, args.reps, args.seed);
    let results = run(&settings, &args.benches);
    for line in summary(&results) {
        println!("{line}");
    }
    if let Some(path) = args.json {
        let text = serde_json::to_string_pretty(&results).expect("results serialize");
        if let Err(e) = std::fs::write(&path, text + "\n") {
            eprintln!("wic-bench: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
