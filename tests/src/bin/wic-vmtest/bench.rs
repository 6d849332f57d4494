//! Latency of the kernel path in the VM: a batch of faults injected into the shim (as
//! nvidia-uvm's bottom half would classify them) until the module executes the daemon's map
//! command for each, with the data already published. The daemon is a thread blocked in
//! poll() on /dev/wic, as wicd's fast path is; commands go back by io_uring or by ioctl.
//!
//! Each latency is the fake GPU's timestamp of a page's map minus its timestamp just before
//! the batch was classified, both CLOCK_MONOTONIC in the VM's kernel.
//!
//! Then what parallel activation gains here: the shim backend's execution of a batch that
//! completes runs of two applications (address spaces), a lane each against one chain,
//! alternating in one run.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use wic_engine::fault::AccessType;
use wic_engine::{Command, Fill};
use wic_kernel_io::fakegpu::{self, FakeGpu};
use wic_kernel_io::Submission;

use crate::rig::{drain_log, ensure, fault, host_spec, wait_events, Daemon, Memory, GPU};

const SLOTS: u32 = 256;
const WARMUP: usize = 20;

pub fn run() -> Result<(), String> {
    let mut results = Vec::new();
    for submission in [Submission::Uring, Submission::Ioctl] {
        for (batch, rounds) in [(1usize, 400usize), (16, 200), (256, 60)] {
            let mut latencies = measure(submission, batch, rounds)?;
            latencies.sort_unstable();
            let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0;
            let name = if submission == Submission::Uring { "io_uring" } else { "ioctl" };
            println!(
                "bench {name} batch {batch}: p50 {:.1} us, p99 {:.1} us, max {:.1} us over {} faults",
                pct(0.5),
                pct(0.99),
                pct(1.0),
                latencies.len()
            );
            results.push(serde_json::json!({
                "submission": name, "batch": batch, "faults": latencies.len(),
                "p50_us": pct(0.5), "p99_us": pct(0.99), "max_us": pct(1.0),
            }));
        }
    }
    let mut lanes = Vec::new();
    for gpus in [2, 1] {
        let (chain, parallel) = measure_lanes(gpus)?;
        // Each batch in lanes against the one-chain batch before it: pairs a few milliseconds
        // apart see the same state of the emulated machine.
        let mut ratios: Vec<f64> = chain.iter().zip(&parallel).map(|(c, p)| *c as f64 / *p as f64).collect();
        ratios.sort_by(f64::total_cmp);
        let quantile = |v: &[f64], q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        let p50_us = |v: &[u64]| {
            let mut v = v.to_vec();
            v.sort_unstable();
            v[v.len() / 2] as f64 / 1000.0
        };
        let (chain_us, lanes_us) = (p50_us(&chain), p50_us(&parallel));
        let (low, mid, high) = (quantile(&ratios, 0.25), quantile(&ratios, 0.5), quantile(&ratios, 0.75));
        println!(
            "bench lanes, 2 applications on {gpus} GPU(s), {LANE_RUNS} runs of 4 KiB each: one chain p50 {chain_us:.1} \
             us, a lane each p50 {lanes_us:.1} us; chain over lanes, pair by pair: p25 {low:.2}, p50 {mid:.2}, p75 \
             {high:.2}"
        );
        lanes.push(serde_json::json!({
            "spaces": 2, "gpus": gpus, "runs_per_space": LANE_RUNS, "batches": chain.len(),
            "chain_p50_us": chain_us, "lanes_p50_us": lanes_us,
            "ratio_p25": low, "ratio_p50": mid, "ratio_p75": high,
        }));
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let doc = serde_json::json!({
        "where": "VM kernel (qemu)", "kernel": kernel.trim(), "results": results, "lanes": lanes,
    });
    println!("WIC-VM-FILE-BEGIN kernel-bench.json");
    println!("{}", serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?);
    println!("WIC-VM-FILE-END kernel-bench.json");
    Ok(())
}

/// Per-fault latencies (ns) of `rounds` batches of `batch` faults, after a warm-up.
fn measure(submission: Submission, batch: usize, rounds: usize) -> Result<Vec<u64>, String> {
    let fake = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
    let mut memory = Memory::new(&fake, 8 << 20)?;
    let mut daemon = Daemon::open(submission)?;
    let space = daemon.backend.device().attach(fake.fd()).map_err(|e| e.to_string())?;
    let (layout, placed) = daemon.channel(host_spec(SLOTS, 64), space, &mut memory)?;
    ensure(layout.pages_per_run == 1, || "one page per run expected".into())?;
    let slot_of: HashMap<u64, u32> =
        layout.slots.iter().enumerate().flat_map(|(s, slot)| slot.runs.map(|va| (va, s as u32))).collect();
    for slot in 0..SLOTS {
        let now = daemon.now();
        daemon.engine.publish(now, layout.id, slot, &mut daemon.commands).map_err(|e| e.to_string())?;
    }
    let runs: Vec<[u64; 2]> =
        layout.slots.iter().map(|s| s.runs.map(|va| placed.placement.process_va(va).expect("placed"))).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let stop = stop.clone();
        std::thread::spawn(move || serve(daemon, slot_of, layout.id, &stop))
    };
    let mut generation = vec![0usize; SLOTS as usize];
    let mut latencies = Vec::with_capacity(batch * rounds);
    let outcome = (|| {
        for round in 0..WARMUP + rounds {
            let entries: Vec<_> = (0..batch).map(|s| fault(runs[s][generation[s] % 2], AccessType::Read)).collect();
            let (verdicts, injected) = fake.inject(GPU, &entries).map_err(|e| e.to_string())?;
            ensure(verdicts.iter().all(|v| *v == fakegpu::VERDICT_HOLD), || "a fault was not held".into())?;
            let events = wait_events(&fake, Duration::from_secs(10), |seen| {
                seen.iter().filter(|e| e.kind == fakegpu::EVENT_MAP).count() == batch
            })?;
            if round >= WARMUP {
                latencies.extend(
                    events.iter().filter(|e| e.kind == fakegpu::EVENT_MAP).map(|e| e.ns.saturating_sub(injected)),
                );
            }
            generation[..batch].iter_mut().for_each(|g| *g += 1);
        }
        Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    let served = server.join().map_err(|_| "the daemon thread panicked".to_string())?;
    outcome.and(served)?;
    Ok(latencies)
}

/// Runs completed per application in each batch of [`measure_lanes`].
const LANE_RUNS: u32 = 16;
/// Batches timed each way, after [`WARMUP`] of each.
const LANE_ROUNDS: usize = 300;

/// The shim backend's execution of batches that each complete [`LANE_RUNS`] runs of 4 KiB for
/// each of two applications (address spaces; held faults, then every slot published): times in
/// ns with one chain and with a lane each, the two ways alternating. The applications' channels
/// are on `gpus` GPUs (2: one each; 1: both on the first).
fn measure_lanes(gpus: u32) -> Result<(Vec<u64>, Vec<u64>), String> {
    let spaces = 2;
    let mut daemon = Daemon::open(Submission::Uring)?;
    let mut fakes = Vec::new();
    let mut memories = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..spaces {
        let fake = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
        memories.push(Memory::new(&fake, 4 << 20)?);
        ids.push(daemon.backend.device().attach(fake.fd()).map_err(|e| e.to_string())?);
        fakes.push(fake);
    }
    // Per application: its GPU, its space's index, its channel and each slot's runs in it.
    let mut channels = Vec::new();
    for space in 0..spaces {
        let gpu = GPU + space as u32 % gpus;
        let spec = wic_engine::ChannelSpec { consumer_gpu: gpu as u16, ..host_spec(LANE_RUNS, 256) };
        let (layout, placed) = daemon.channel(spec, ids[space], &mut memories[space])?;
        let runs: Vec<[u64; 2]> =
            layout.slots.iter().map(|s| s.runs.map(|va| placed.placement.process_va(va).expect("placed"))).collect();
        channels.push((gpu, space, layout.id, runs));
    }
    let (mut chain, mut parallel) = (Vec::new(), Vec::new());
    for round in 0..2 * (WARMUP + LANE_ROUNDS) {
        for (gpu, space, _, runs) in &channels {
            let entries: Vec<_> = runs.iter().map(|r| fault(r[round % 2], AccessType::Read)).collect();
            let (verdicts, _) = fakes[*space].inject(*gpu, &entries).map_err(|e| e.to_string())?;
            ensure(verdicts.iter().all(|v| *v == fakegpu::VERDICT_HOLD), || "a fault was not held".into())?;
        }
        let held = daemon.take_faults();
        ensure(held == 2 * LANE_RUNS as usize, || format!("{held} records for {} faults", 2 * LANE_RUNS))?;
        for (_, _, id, _) in &channels {
            for slot in 0..LANE_RUNS {
                let now = daemon.now();
                daemon.engine.publish(now, *id, slot, &mut daemon.commands).map_err(|e| e.to_string())?;
            }
        }
        let lanes = round % 2 == 1;
        daemon.backend.set_parallel(lanes);
        let start = std::time::Instant::now();
        daemon.execute()?;
        let took = start.elapsed().as_nanos() as u64;
        if round >= 2 * WARMUP {
            if lanes { &mut parallel } else { &mut chain }.push(took);
        }
        drain_log(&fakes[0])?;
    }
    for id in ids {
        daemon.backend.device().detach(id).map_err(|e| e.to_string())?;
    }
    Ok((chain, parallel))
}

/// The daemon thread: waits in poll() for records, runs the engine, publishes the next
/// generation of every slot just delivered (so the next batch finds its data), submits.
fn serve(
    mut daemon: Daemon,
    slot_of: HashMap<u64, u32>,
    channel: wic_engine::ChannelId,
    stop: &AtomicBool,
) -> Result<(), String> {
    let fd = daemon.backend.device().fd().as_raw_fd();
    let mut delivered = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: the session's descriptor, owned by `daemon`, which outlives this borrow.
        let session = unsafe { BorrowedFd::borrow_raw(fd) };
        let mut fds = [PollFd::new(session, PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::from(100u16)).map_err(|e| format!("poll: {e}"))?;
        if daemon.take_faults() == 0 {
            continue;
        }
        delivered.clear();
        delivered.extend(daemon.commands.iter().filter_map(|c| match c {
            Command::Complete { run_va, fill: Fill::Data { .. }, .. } => slot_of.get(run_va).copied(),
            _ => None,
        }));
        for &slot in &delivered {
            let now = daemon.now();
            let mut none = Vec::new();
            daemon.engine.publish(now, channel, slot, &mut none).map_err(|e| e.to_string())?;
        }
        daemon.execute()?;
    }
    Ok(())
}
