//! A daemon killed with faults held: the module completes every one with the daemon-gone
//! marker, maps it and replays, within [`BOUND`]; a new daemon then opens the device and
//! delivers.
//!
//! The killed daemon is a second process (this binary with [`HOLDER_ARG`]) running the same
//! shim backend and engine; the application's fake UVM file is inherited by it, as wicd would
//! receive it over its socket.

use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use wic_engine::fault::AccessType;
use wic_kabi::WIC_MARKER_DAEMON_GONE;
use wic_kernel_io::fakegpu::{self, Fail, FakeGpu};
use wic_kernel_io::Submission;

use crate::deliver::deliver_one;
use crate::rig::{ensure, fault, host_spec, marker, wait_events, Daemon, Memory, GPU};

/// The argument that makes this binary the daemon to be killed.
pub const HOLDER_ARG: &str = "--hold-as-daemon";

/// Longest time from the daemon's death to the last held fault completed.
pub const BOUND: Duration = Duration::from_secs(1);

/// Held faults one step of the module's sweep hands to nvidia-uvm at once (wic_shim.c's
/// `WIC_COMPLETE_BATCH`).
const SWEEP_BATCH: usize = 16;

const SLOTS: u32 = 4;
const MESSAGE_BYTES: u32 = 4096; // 16 warps x 4 KiB: 16 pages per run

/// A daemon process holding every fault of [`SLOTS`] slots' batches (16 pages each) placed in
/// `memory`: the process and the pages.
fn start_holder(fake: &FakeGpu, memory: &mut Memory) -> Result<(Child, Vec<u64>), String> {
    let config = wic_engine::EngineConfig::default();
    let bytes =
        host_spec(SLOTS, MESSAGE_BYTES).placement_bytes(config.warps_per_batch).ok_or("the spec has no placement")?;
    let region = memory.take(bytes)?;
    fcntl(fake.fd(), FcntlArg::F_SETFD(FdFlag::empty())).map_err(|e| format!("fcntl: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let mut holder = Command::new(exe)
        .args([HOLDER_ARG, &fake.fd().as_raw_fd().to_string(), &region.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the holding daemon: {e}"))?;
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let ready = lines.next().and_then(Result::ok).unwrap_or_default();
    let runs: Vec<u64> = ready
        .strip_prefix("ready ")
        .ok_or(format!("holder said {ready:?}"))?
        .split(' ')
        .filter_map(|v| v.parse().ok())
        .collect();
    ensure(runs.len() == SLOTS as usize, || format!("holder said {ready:?}"))?;

    // Every warp of every slot's batch faults: 16 pages x 4 slots held.
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
    let pages: Vec<u64> = runs.iter().flat_map(|run| (0..16).map(move |p| run + p * 4096)).collect();
    let entries: Vec<_> = pages.iter().map(|va| fault(*va, AccessType::Read)).collect();
    let (verdicts, _) = fake.inject(GPU, &entries).map_err(|e| format!("inject: {e}"))?;
    ensure(verdicts.iter().all(|v| *v == fakegpu::VERDICT_HOLD), || format!("not all held: {verdicts:?}"))?;
    let confirmed = lines.next().and_then(Result::ok).unwrap_or_default();
    ensure(confirmed == format!("held {}", pages.len()), || format!("holder said {confirmed:?}"))?;
    Ok((holder, pages))
}

pub fn run() -> Result<(), String> {
    let fake = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
    let mut memory = Memory::new(&fake, 16 << 20)?;
    let (mut holder, pages) = start_holder(&fake, &mut memory)?;
    holder.kill().map_err(|e| format!("kill: {e}"))?;
    let killed = Instant::now();
    let _ = holder.wait();
    let events = wait_events(&fake, BOUND * 5, |seen| {
        let maps = seen.iter().filter(|e| e.kind == fakegpu::EVENT_MAP).count();
        maps == pages.len() && seen.last().is_some_and(|e| e.kind == fakegpu::EVENT_REPLAY)
    })?;
    let took = killed.elapsed();
    ensure(took <= BOUND, || format!("held faults completed {took:?} after the kill, bound {BOUND:?}"))?;
    for va in &pages {
        ensure(events.iter().any(|e| e.kind == fakegpu::EVENT_MAP && e.va == *va), || {
            format!("page {va:#x} never mapped")
        })?;
        let word = marker(&memory, *va);
        ensure(word == WIC_MARKER_DAEMON_GONE, || format!("page {va:#x} holds {word:#x}, not the daemon-gone marker"))?;
    }
    // The markers, then the maps, went to nvidia-uvm in calls of up to SWEEP_BATCH pages each.
    let calls = events.iter().filter(|e| e.kind == fakegpu::EVENT_COMPLETE).count();
    let most = 2 * pages.len().div_ceil(SWEEP_BATCH);
    ensure((2..=most).contains(&calls), || {
        format!("{} held pages completed in {calls} uvm_wic_complete() calls, expected 2 to {most}", pages.len())
    })?;
    println!("daemon-death: {} held faults completed {took:?} after kill -9 (bound {BOUND:?}), in {calls} calls to nvidia-uvm", pages.len());

    // A new daemon takes the device over and works.
    let mut daemon = Daemon::open(Submission::Uring)?;
    let space = daemon.backend.device().attach(fake.fd()).map_err(|e| format!("attach: {e}"))?;
    let (layout, placed) = daemon.channel(host_spec(1, 512), space, &mut memory)?;
    deliver_one(&fake, &mut daemon, &memory, &layout, &placed, 0, GPU)?;
    drop(daemon);
    unrecorded_faults_are_replayed(&fake, &mut memory)?;
    held_faults_stay_held_until_their_marker(&fake, &mut memory)
}

/// While the dead daemon's session completes its held faults, a replay (another process's
/// batch on the GPU suffices) makes them fault again: they are still held, not serviced before
/// their marker is in place. The session's first marker write stalls (the fake GPU's armed
/// stall) while such a fault comes back.
fn held_faults_stay_held_until_their_marker(fake: &FakeGpu, memory: &mut Memory) -> Result<(), String> {
    let (mut holder, pages) = start_holder(fake, memory)?;
    fake.fail(Fail { writes: 1, flags: fakegpu::FAIL_STALL, ..Default::default() })
        .map_err(|e| format!("arm the stall: {e}"))?;
    holder.kill().map_err(|e| format!("kill: {e}"))?;
    // Not waited for yet: its exit ends with the release, which the stall holds up.
    let stalled = wait_events(fake, BOUND * 5, |seen| seen.iter().any(|e| e.kind == fakegpu::EVENT_STALLED));
    let again = stalled.as_ref().ok().and_then(|seen| {
        let stalled_va = seen.iter().find(|e| e.kind == fakegpu::EVENT_STALLED).map(|e| e.va)?;
        pages.iter().copied().find(|va| *va != stalled_va)
    });
    let verdicts = again.map(|va| fake.inject(GPU, &[fault(va, AccessType::Read)]));
    fake.fail(Fail::default()).map_err(|e| format!("release the stall: {e}"))?;
    let _ = holder.wait();
    stalled.map_err(|_| "the session's release never wrote a marker".to_string())?;
    let again = again.ok_or("no held page besides the stalled one")?;
    let (verdicts, _) = verdicts.expect("injected").map_err(|e| format!("inject: {e}"))?;
    ensure(verdicts == [fakegpu::VERDICT_HOLD], || {
        format!(
            "a held fault coming back while the dead daemon's session completed its faults was {verdicts:?}, not held"
        )
    })?;
    let events = wait_events(fake, BOUND * 5, |seen| {
        seen.iter().filter(|e| e.kind == fakegpu::EVENT_MAP).count() >= pages.len()
    })
    .map_err(|_| "the held faults were not all completed after the stall".to_string())?;
    ensure(!events.iter().any(|e| e.kind == fakegpu::EVENT_SERVICED), || "a held fault was serviced".into())?;
    let word = marker(memory, again);
    ensure(word == WIC_MARKER_DAEMON_GONE, || format!("page {again:#x} holds {word:#x}, not the daemon-gone marker"))?;
    println!("daemon-death: a held fault coming back during the release stayed held until its marker");
    Ok(())
}

/// A GPU whose held faults were none of them recorded (the ring was full) is replayed too
/// when the daemon's session ends: nothing else would make those warps fault again.
fn unrecorded_faults_are_replayed(fake: &FakeGpu, memory: &mut Memory) -> Result<(), String> {
    const OTHER_GPU: u32 = 9; // the second parent GPU's
    let mut daemon = Daemon::open(Submission::Ioctl)?;
    let space = daemon.backend.device().attach(fake.fd()).map_err(|e| format!("attach: {e}"))?;
    let ring_entries = u64::from(daemon.backend.device().limits().ring_entries);
    // 16-page runs: one slot more than the ring holds, so that GPU 1's faults fill it.
    let (layout, placed) = daemon.channel(host_spec((ring_entries / 16 + 1) as u32, 4096), space, memory)?;
    let runs: Vec<u64> = layout.slots.iter().filter_map(|s| placed.placement.process_va(s.runs[0])).collect();
    let pages: Vec<u64> =
        runs.iter().flat_map(|run| (0..u64::from(layout.pages_per_run)).map(move |p| run + p * 4096)).collect();
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
    for chunk in pages.chunks(fakegpu::MAX_INJECT as usize) {
        let entries: Vec<_> = chunk.iter().map(|va| fault(*va, AccessType::Read)).collect();
        let (verdicts, _) = fake.inject(GPU, &entries).map_err(|e| format!("inject: {e}"))?;
        ensure(verdicts.iter().all(|v| *v == fakegpu::VERDICT_HOLD), || "GPU 1's faults not all held".into())?;
    }
    let dropped = daemon.backend.device().ring().dropped();
    ensure(dropped == pages.len() as u64 - ring_entries, || format!("{dropped} faults dropped with a full ring"))?;
    // The other GPU's warps fault on the same pages: held, but the ring has no room.
    let entries: Vec<_> = pages[..8].iter().map(|va| fault(*va, AccessType::Read)).collect();
    let (verdicts, _) = fake.inject(OTHER_GPU, &entries).map_err(|e| format!("inject: {e}"))?;
    ensure(verdicts.iter().all(|v| *v == fakegpu::VERDICT_HOLD), || {
        format!("GPU {OTHER_GPU}'s faults were {verdicts:?}")
    })?;
    let now_dropped = daemon.backend.device().ring().dropped();
    ensure(now_dropped == dropped + 8, || {
        format!("GPU {OTHER_GPU}'s faults: {} dropped, expected 8", now_dropped - dropped)
    })?;

    drop(daemon);
    let deadline = Instant::now() + BOUND * 5;
    let mut replayed = Vec::new();
    while !replayed.contains(&OTHER_GPU) && Instant::now() < deadline {
        let (events, _) = fake.events(4096, 100).map_err(|e| format!("events: {e}"))?;
        replayed.extend(events.iter().filter(|e| e.kind == fakegpu::EVENT_REPLAY).map(|e| e.gpu_id));
    }
    ensure(replayed.contains(&OTHER_GPU), || {
        format!("GPU {OTHER_GPU}, whose held faults were never recorded, was not replayed at release; replays: {replayed:?}")
    })?;
    ensure(replayed.contains(&GPU), || format!("GPU {GPU} not replayed at release; replays: {replayed:?}"))?;
    println!("daemon-death: GPUs {replayed:?} replayed at release, GPU {OTHER_GPU} with no fault recorded");
    Ok(())
}

/// The daemon to be killed: attaches the inherited space, places the channel at the given
/// address, says where its runs are, and holds every fault it reads until it dies.
pub fn holder(args: &[String]) -> ExitCode {
    match hold(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("error {e}");
            ExitCode::FAILURE
        }
    }
}

fn hold(args: &[String]) -> Result<(), String> {
    let [fd, base] = args else { return Err(format!("usage: {HOLDER_ARG} FD BASE")) };
    let fd: i32 = fd.parse().map_err(|_| "bad fd")?;
    let base: u64 = base.parse().map_err(|_| "bad base")?;
    // SAFETY: the parent passed this descriptor open and does not close it while we live.
    let uvm = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut daemon = Daemon::open(Submission::Ioctl)?;
    let space = daemon.backend.device().attach(uvm).map_err(|e| e.to_string())?;
    let (layout, placed) = daemon.channel_at(host_spec(SLOTS, MESSAGE_BYTES), space, base)?;
    let runs: Vec<String> =
        layout.slots.iter().filter_map(|s| placed.placement.process_va(s.runs[0])).map(|va| va.to_string()).collect();
    println!("ready {}", runs.join(" "));
    let mut held = 0;
    let mut told = false;
    loop {
        held += daemon.take_faults();
        if held == (SLOTS * 16) as usize && !told {
            println!("held {held}");
            told = true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
