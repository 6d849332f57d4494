//! Soak: randomized communications on the emulator, through the real engine, until a message
//! count is reached, with the invariants of every run checked (`wic_tests::check_runs`: every
//! message delivered once with intact bytes, every request woken exactly once, the PFQ empty
//! and the pool whole at the end).
//!
//! Usage: `wic-soak [--messages N] [--seed S] [--jobs J]` (defaults: 1,000,000 messages, seed 1,
//! one job per core). Each run takes one of the ten workloads with a random consumer thread
//! count, iteration count, jitter, request probability and producer speed, runs it both ways
//! (alg1, the naive baseline, and WIC) with its own seed, and checks it. Progress goes to stderr; the last
//! line on stdout is a JSON summary. Exits 1 at the first broken invariant, naming the run so it
//! can be replayed (`--seed` and the run number fix it).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use wic_emu::payload::splitmix64;
use wic_emu::{run, workload, Calibration, Mode, Workload};

struct Options {
    messages: u64,
    seed: u64,
    jobs: usize,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut options = Options { messages: 1_000_000, seed: 1, jobs };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || value.parse::<u64>().map_err(|_| format!("{flag}: {value:?} is not a number"));
        match flag.as_str() {
            "--messages" => options.messages = number()?,
            "--seed" => options.seed = number()?,
            "--jobs" => options.jobs = number()?.max(1) as usize,
            other => return Err(format!("unknown option {other:?} (--messages, --seed, --jobs)")),
        }
    }
    Ok(options)
}

/// Run `index`'s workload: one of the ten, its parameters drawn from `(seed, index)`.
fn randomized(all: &[Workload], seed: u64, index: u64) -> Workload {
    let mut draw = {
        let mut state = splitmix64(seed ^ splitmix64(index));
        move || {
            state = splitmix64(state);
            state
        }
    };
    let unit = |x: u64| (x >> 11) as f64 / (1u64 << 53) as f64;
    let base = &all[(index % all.len() as u64) as usize];
    let threads = [64, 256, 1024, 4096, 16384][(draw() % 5) as usize];
    let mut w = base.clone().with_threads(threads);
    w.iterations = 1 + (draw() % 3) as u32;
    for phase in &mut w.phases {
        phase.jitter = unit(draw());
        phase.request_probability = 0.05 + 0.95 * unit(draw());
        phase.produce_ns = (phase.produce_ns as f64 * (0.25 + 1.75 * unit(draw()))) as u64;
    }
    w
}

#[derive(Default)]
struct Totals {
    runs: AtomicU64,
    messages: AtomicU64,
    bytes: AtomicU64,
    faults: AtomicU64,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse(&args) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("wic-soak: {e}");
            return ExitCode::from(2);
        }
    };
    let all = workload::all();
    let cal = Calibration::built_in();
    let totals = Totals::default();
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let failure: Mutex<Option<String>> = Mutex::new(None);
    let started = Instant::now();
    let last_report = Mutex::new(Instant::now());
    std::thread::scope(|scope| {
        for _ in 0..options.jobs {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) && totals.messages.load(Ordering::Relaxed) < options.messages {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let w = randomized(&all, options.seed, index);
                    let run_seed = splitmix64(options.seed.wrapping_add(index));
                    let (alg1, fault) = (run(&w, Mode::Alg1, &cal, run_seed), run(&w, Mode::Fault, &cal, run_seed));
                    let warps_per_batch = u64::from(w.phases[0].warps_per_cta);
                    if let Err(e) = wic_tests::check_runs(&alg1, &fault, warps_per_batch) {
                        *failure.lock().expect("failure lock") =
                            Some(format!("run {index} (seed {}): {e}", options.seed));
                        stop.store(true, Ordering::Relaxed);
                        return;
                    }
                    totals.runs.fetch_add(1, Ordering::Relaxed);
                    totals.messages.fetch_add(fault.messages_checked, Ordering::Relaxed);
                    totals.bytes.fetch_add(alg1.bytes_checked + fault.bytes_checked, Ordering::Relaxed);
                    totals.faults.fetch_add(fault.gpu_faults, Ordering::Relaxed);
                    let mut last = last_report.lock().expect("report lock");
                    if last.elapsed() >= Duration::from_secs(5) {
                        *last = Instant::now();
                        eprintln!(
                            "wic-soak: {} runs, {} of {} messages, {:.0} s",
                            totals.runs.load(Ordering::Relaxed),
                            totals.messages.load(Ordering::Relaxed),
                            options.messages,
                            started.elapsed().as_secs_f64()
                        );
                    }
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().expect("failure lock") {
        println!("wic-soak: FAILED {e}");
        return ExitCode::FAILURE;
    }
    println!(
        "{{\"runs\":{},\"messages_each_mode\":{},\"bytes_checked\":{},\"wic_gpu_faults\":{},\"seed\":{},\"jobs\":{},\"seconds\":{:.1}}}",
        totals.runs.load(Ordering::Relaxed),
        totals.messages.load(Ordering::Relaxed),
        totals.bytes.load(Ordering::Relaxed),
        totals.faults.load(Ordering::Relaxed),
        options.seed,
        options.jobs,
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}
