//! wicd: the WIC daemon.

// Input reaches this crate from clients, devices and files: failures are errors, never panics.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod config;
mod demo;
mod logging;
mod serve;
mod service;
mod systemd;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use wic_emu::{workload, Calibration};

#[derive(Parser)]
#[command(name = "wicd", version, about = "Warp-level interrupt-based GPU communication daemon")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the paper's ten applications, naive polling vs WIC, on the emulated GPU.
    Demo(DemoArgs),
    /// Run the daemon: serve applications on the Unix socket.
    Serve(serve::ServeArgs),
}

#[derive(clap::Args)]
struct DemoArgs {
    /// Consumer threads per kernel: one value, or a sweep like `64,1K,16K,1M` (paper Fig. 16).
    #[arg(long, value_delimiter = ',', value_parser = parse_count)]
    scale: Vec<u32>,
    /// Only these workloads (names as in the table, e.g. C_CG,G_STN).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Seed of the model's random choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// A calibration file to use instead of the built-in one.
    #[arg(long)]
    calibration: Option<PathBuf>,
}

/// Parses `512`, `16K` or `1M` (powers of two).
fn parse_count(text: &str) -> Result<u32, String> {
    let (digits, shift) = match text.trim().to_ascii_uppercase() {
        t if t.ends_with('K') => (t[..t.len() - 1].to_string(), 10),
        t if t.ends_with('M') => (t[..t.len() - 1].to_string(), 20),
        t => (t, 0),
    };
    let n: u32 = digits.parse().map_err(|_| format!("`{text}` is not a count like 512, 16K or 1M"))?;
    n.checked_shl(shift).filter(|v| *v >> shift == n && *v >= 32).ok_or_else(|| format!("`{text}` must be between 32 and 2^31 threads"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => run_demo(args),
        Command::Serve(args) => serve::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("wicd: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run_demo(args: DemoArgs) -> Result<(), String> {
    let cal = match &args.calibration {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            Calibration::from_toml(&text)?
        }
        None => Calibration::built_in(),
    };
    let mut workloads = workload::all();
    if !args.only.is_empty() {
        for name in &args.only {
            if workload::by_name(name).is_none() {
                let known: Vec<_> = workloads.iter().map(|w| w.name).collect();
                return Err(format!("unknown workload `{name}` (known: {})", known.join(", ")));
            }
        }
        workloads.retain(|w| args.only.iter().any(|n| n.eq_ignore_ascii_case(w.name)));
    }
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    println!("wic demo: emulated GPU (model of an H100 on the stock UVM fault path; calibration below), seed {}", args.seed);
    let scales: Vec<Option<u32>> = if args.scale.is_empty() { vec![None] } else { args.scale.iter().copied().map(Some).collect() };
    let started = Instant::now();
    for scale in scales {
        let set: Vec<_> = workloads.iter().cloned().map(|w| match scale {
            Some(threads) => w.with_threads(threads),
            None => w,
        }).collect();
        if let Some(threads) = scale {
            println!("\n== {threads} consumer threads per kernel ==");
        }
        let rows = wic_emu::compare::compare(&set, &cal, args.seed, threads, demo::stderr_progress(started));
        print!("{}", demo::table(&rows));
        if rows.iter().any(|r| r.poll.corrupt_messages + r.fault.corrupt_messages > 0) {
            return Err("some messages arrived corrupted".into());
        }
    }
    println!(
        "\nColumns: runtimes of the emulated run; consumer overhead = share of consumer SM time lost waiting for data;\n\
         overlap = share of waiting time its SM still computed (paper Fig. 14); WIC ovh = wicd busy time / runtime (Fig. 15);\n\
         faults = fault-buffer entries wicd handled; checked = every message compared byte for byte with what its producer wrote."
    );
    println!("{}", wic_emu::compare::calibration_summary(&cal));
    println!("Elapsed: {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}
