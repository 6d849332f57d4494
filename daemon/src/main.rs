//! wicd: the WIC daemon.

// Input reaches this crate from clients, devices and files: failures are errors, never panics.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod calibrate;
mod config;
mod demo;
mod logging;
mod nvml;
mod serve;
mod service;
mod systemd;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use wic_emu::compare::RowError;
use wic_emu::{workload, Calibration};

#[derive(Parser)]
#[command(name = "wicd", version, about = "Warp-level interrupt-based GPU communication daemon")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the paper's ten applications with push, WIC and the naive baseline (alg1) on the emulated GPU.
    Demo(DemoArgs),
    /// Run the daemon: serve applications on the Unix socket.
    Serve(serve::ServeArgs),
    /// Measure daemon.submission_ns and daemon.per_page_ns from two `wicctl stats --json`
    /// snapshots and write them into a calibration file for `wicd demo --calibration`.
    ///
    /// The snapshots are of one wicd on the shim backend (the patched NVIDIA driver), taken
    /// before and after cases that submit command batches of different sizes: a least-squares
    /// fit of each batch's time against the pages it maps or unmaps gives the two constants.
    /// The file written is the base (default: the built-in calibration) with those two
    /// constants measured, their source naming the batches and `--machine`.
    Calibrate(calibrate::CalibrateArgs),
    /// List the GPUs NVIDIA's driver reports (NVML) and whether each keeps wic's held faults
    /// from stalling other contexts: compute mode EXCLUSIVE_PROCESS, or MIG on.
    Gpus(GpusArgs),
}

#[derive(clap::Args)]
struct GpusArgs {
    /// Configuration file whose `[shim] gpus` marks wic's GPUs (default: /etc/wic/wicd.toml if
    /// present).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print only the UUIDs of `[shim] gpus`, one per line (nothing when the list is empty),
    /// and ask NVML nothing: for scripts (deploy/wic-compute-mode).
    #[arg(long)]
    listed: bool,
}

#[derive(clap::Args)]
struct DemoArgs {
    /// Consumer threads per kernel: one value, or a sweep like `64,1K,16K,1M` (paper Fig. 16);
    /// from 32 to 16M.
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
    /// Skip the co-run table, what each mode's waiting costs a neighbour kernel sharing the
    /// emulated GPU's SMs (printed whatever `--only` picks; it adds a few seconds).
    #[arg(long)]
    no_corun: bool,
    /// How WIC's host producers hand over their batches: in-place (they write the run, wicd
    /// writes 8 bytes a page), copy (wicd copies each batch, the path before in place) or
    /// copy-engine (nvidia-uvm's copy engine, a lower bound). The co-run keeps in place.
    #[arg(long, default_value = "in-place", value_parser = demo::parse_host_fill)]
    host_fill: wic_emu::Mode,
}

/// The fewest consumer threads `--scale` takes: one warp.
const MIN_SCALE: u64 = 32;

/// The most consumer threads `--scale` takes, 16M: a run of the largest workload (C_SRS) then
/// holds about 1.6 GiB and takes half a minute (at a million threads: 100 MiB and a second).
/// Below it, what the machine can hold decides: `demo::plan` refuses a row whose run needs more
/// memory than is available.
const MAX_SCALE: u64 = 16 << 20;

/// Parses `512`, `16K` or `1M` (`K` = 1024): a thread count from 32 to 16M.
fn parse_count(text: &str) -> Result<u32, String> {
    let (digits, unit) = match text.trim().to_ascii_uppercase() {
        t if t.ends_with('K') => (t[..t.len() - 1].to_string(), 1 << 10),
        t if t.ends_with('M') => (t[..t.len() - 1].to_string(), 1 << 20),
        t => (t, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("`{text}` is not a count like 512, 16K or 1M"));
    }
    let range = || format!("--scale takes from {MIN_SCALE} to {MAX_SCALE} (16M) consumer threads");
    // Digits past u64 are more than any count allowed.
    let n = digits.parse::<u64>().ok().and_then(|n| n.checked_mul(unit));
    match n {
        Some(n) if n < MIN_SCALE => Err(format!("`{text}` is {n} threads, fewer than one warp: {}", range())),
        Some(n) if n <= MAX_SCALE => u32::try_from(n).map_err(|_| range()),
        Some(n) => Err(format!("`{text}` is {n} threads, more than the maximum: {}", range())),
        None => Err(format!("`{text}` is more threads than the maximum: {}", range())),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => run_demo(args),
        Command::Serve(args) => serve::run(args),
        Command::Calibrate(args) => calibrate::run(&args),
        Command::Gpus(args) => run_gpus(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("wicd: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run_gpus(args: &GpusArgs) -> Result<(), String> {
    // A named file must be right; the default one only marks wic's GPUs in the listing, which
    // must not fail for it.
    let config = match (&args.config, serve::default_config()) {
        (Some(path), _) => config::Config::load(path)?,
        (None, Some(path)) if !args.listed => config::Config::load(&path).unwrap_or_else(|e| {
            eprintln!("wicd: {e}: listing the GPUs without its [shim] gpus");
            config::Config::default()
        }),
        (None, Some(path)) => config::Config::load(&path)?,
        (None, None) => config::Config::default(),
    };
    let listed = config.shim.allowed_gpus()?;
    if args.listed {
        // As nvidia-smi -i takes them: a MIG instance's with its prefix, any other as a GPU's.
        for (text, uuid) in config.shim.gpus.iter().zip(&listed) {
            let prefix = if text.trim().to_ascii_uppercase().starts_with("MIG-") { "MIG" } else { "GPU" };
            println!("{prefix}-{uuid}");
        }
        return Ok(());
    }
    let gpus = nvml::survey().map_err(|e| e.to_string())?;
    if gpus.is_empty() {
        println!("NVML reports no GPU");
    }
    for gpu in &gpus {
        let mig = if gpu.mig { ", MIG on" } else { "" };
        let verdict = match service::sharing::shared(gpu) {
            None => "safe for held faults".to_string(),
            Some(why) => format!("shared: {why}"),
        };
        let theirs = wic_types::uvm_gpu::Uuid::parse(&gpu.uuid).is_some_and(|uuid| !listed.contains(&uuid));
        let scope = if !listed.is_empty() && theirs { " (not in [shim] gpus: wic does not use it)" } else { "" };
        println!(
            "GPU {} {} {}{scope}: compute mode {}{mig}; {verdict}",
            gpu.index, gpu.name, gpu.uuid, gpu.compute_mode
        );
    }
    Ok(())
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
    println!(
        "wic demo: emulated GPU (model of an H100 on the stock UVM fault path; calibration below), seed {}",
        args.seed
    );
    let scales: Vec<Option<u32>> =
        if args.scale.is_empty() { vec![None] } else { args.scale.iter().copied().map(Some).collect() };
    let started = Instant::now();
    let mut not_run = Vec::new();
    for scale in scales {
        let set: Vec<_> = workloads
            .iter()
            .cloned()
            .map(|w| match scale {
                Some(threads) => w.with_threads(threads),
                None => w,
            })
            .collect();
        if let Some(threads) = scale {
            println!("\n== {threads} consumer threads per kernel ==");
        }
        // A row whose run needs more memory than there is says so; the others run on as many
        // workers as the memory holds.
        let plan = demo::plan(&set, threads, demo::available_memory());
        let runnable: Vec<_> =
            set.iter().zip(&plan.refused).filter(|(_, why)| why.is_none()).map(|(w, _)| w.clone()).collect();
        let mut ran = wic_emu::compare::try_compare_with(
            &runnable,
            args.host_fill,
            &cal,
            args.seed,
            plan.workers,
            demo::stderr_progress(started),
        )
        .into_iter();
        let rows: Vec<_> = set
            .iter()
            .zip(plan.refused)
            .map(|(w, why)| match why {
                Some(reason) => Err(RowError { workload: w.name, reason }),
                None => ran.next().unwrap_or_else(|| Err(RowError { workload: w.name, reason: "no result".into() })),
            })
            .collect();
        print!("{}", demo::table(&rows));
        for e in rows.iter().filter_map(|r| r.as_ref().err()) {
            not_run.push(match scale {
                Some(threads) => format!("{} at {threads} threads ({})", e.workload, e.reason),
                None => format!("{} ({})", e.workload, e.reason),
            });
        }
        if rows.iter().flatten().any(|r| r.naive.corrupt_messages + r.fault.corrupt_messages > 0) {
            return Err("some messages arrived corrupted".into());
        }
    }
    if !args.no_corun {
        let rows = demo::corun_rows(&cal, args.seed, threads);
        print!("\n{}", demo::corun_table(&rows));
        for row in &rows {
            if let Err(reason) = &row.throughput {
                not_run.push(format!("co-run {} ({reason})", demo::corun_row_label(row)));
            }
        }
    }
    println!(
        "\nColumns: runtimes of the emulated run; consumer overhead = share of consumer SM time lost waiting for data;\n\
         overlap = share of waiting time its SM still computed (paper Fig. 14); WIC ovh = wicd busy time / runtime (Fig. 15);\n\
         faults = fault-buffer entries wicd handled; checked = every message compared byte for byte with what its producer wrote."
    );
    println!("{}", demo::host_fill_legend(args.host_fill));
    println!("{}", wic_emu::compare::calibration_summary(&cal));
    if let Some(path) = &args.calibration {
        println!("{}", demo::calibration_file_changes(path, &cal));
    }
    println!("{}", demo::MODEL_LIMITS);
    println!("Elapsed: {:.1}s", started.elapsed().as_secs_f64());
    if !not_run.is_empty() {
        return Err(format!("{} row(s) did not run: {}", not_run.len(), not_run.join("; ")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scale_error(text: &str) -> String {
        parse_count(text).expect_err(text)
    }

    #[test]
    fn scales_from_one_warp_to_16m_threads_are_accepted() {
        for (text, threads) in [
            ("32", 32),
            ("64", 64),
            ("1K", 1024),
            ("16k", 16 << 10),
            (" 1M ", 1 << 20),
            ("16M", 16 << 20),
            ("16777216", 16 << 20),
        ] {
            assert_eq!(parse_count(text), Ok(threads), "{text}");
        }
    }

    #[test]
    fn absurd_scales_are_refused_naming_the_value_and_the_limit() {
        // 2048M used to be accepted and abort allocating 64 GiB; 512M panicked in the engine.
        for (text, threads) in [
            ("2048M", "2147483648"),
            ("512M", "536870912"),
            ("17M", "17825792"),
            ("16777217", "16777217"),
            ("4194304K", "4294967296"),
        ] {
            let e = scale_error(text);
            assert!(e.contains(text) && e.contains(threads) && e.contains("from 32 to 16777216 (16M)"), "{e}");
        }
        let e = scale_error("99999999999999999999999M");
        assert!(e.contains("more threads than the maximum") && e.contains("16777216"), "{e}");
        let e = scale_error("16");
        assert!(e.contains("fewer than one warp") && e.contains("from 32"), "{e}");
        for text in ["", "M", "-1", "1.5K", "1G", "ten"] {
            assert!(scale_error(text).contains("is not a count"), "{text}");
        }
    }

    #[test]
    fn the_parser_refuses_a_sweep_with_one_value_past_the_limit() {
        let Err(e) = Cli::try_parse_from(["wicd", "demo", "--scale", "64,1K,2048M"]) else { panic!("2048M accepted") };
        let message = e.to_string();
        assert!(message.contains("2048M") && message.contains("16777216"), "{message}");
        let Ok(Cli { command: Command::Demo(args) }) = Cli::try_parse_from(["wicd", "demo", "--scale", "64,1K,16K,1M"])
        else {
            panic!("the README's sweep is refused")
        };
        assert_eq!(args.scale, [64, 1024, 16384, 1 << 20]);
    }
}
