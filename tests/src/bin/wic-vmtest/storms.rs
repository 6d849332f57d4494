//! More faults than the module can record, in the real kernel: warps of many slots fault at
//! once, past the fault ring's capacity (the daemon not reading) and past the held-fault table
//! (the daemon reading), with a duplicate storm of every recorded fault (what a global replay
//! provokes). Faults the module could not record are held anyway and fault again after the
//! next replay, as on a GPU. Every slot then receives exactly its producer's bytes, once, and
//! nothing is left held: detaching completes no leftover fault.

use std::collections::HashMap;
use std::time::Duration;

use wic_engine::fault::AccessType;
use wic_engine::{ChannelLayout, ErrorMarker, RawFaultEntry};
use wic_kernel_io::fakegpu::{self, FakeGpu};
use wic_kernel_io::{PlacedChannel, Submission};

use crate::rig::{ensure, fault, host_spec, wait_events, Daemon, Memory, GPU};

const PAGE: u64 = 4096;

pub fn run() -> Result<(), String> {
    let fake = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
    let mut memory = Memory::new(&fake, 48 << 20)?;
    let mut daemon = Daemon::open(Submission::Uring)?;
    let space = daemon.backend.device().attach(fake.fd()).map_err(|e| format!("attach: {e}"))?;
    let limits = daemon.backend.device().limits();
    let (ring_entries, max_held) = (u64::from(limits.ring_entries), u64::from(limits.max_held));

    // The fault ring fills: 4 KiB messages make 16-page runs; 16 slots more than the ring holds.
    let slots = (ring_entries / 16 + 16) as u32;
    let (layout, placed) = daemon.channel(host_spec(slots, 4096), space, &mut memory)?;
    storm(&fake, &mut daemon, &memory, &layout, &placed, ring_entries as usize, None)?;

    // The held table fills while the daemon keeps the ring drained: 16 KiB messages, 64-page runs.
    let slots = (max_held / 64 + 4) as u32;
    let (big, big_placed) = daemon.channel(host_spec(slots, 16384), space, &mut memory)?;
    storm(&fake, &mut daemon, &memory, &big, &big_placed, max_held as usize, Some(512))?;

    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
    for placed in [&placed, &big_placed] {
        daemon.backend.unplace(placed).map_err(|e| e.to_string())?;
    }
    daemon.backend.device().detach(space).map_err(|e| e.to_string())?;
    let (leftovers, _) = fake.events(fakegpu::LOG_EVENTS as usize, 200).map_err(|e| format!("events: {e}"))?;
    ensure(leftovers.iter().all(|e| e.kind != fakegpu::EVENT_WRITE), || {
        let markers: Vec<_> = leftovers
            .iter()
            .filter(|e| e.kind == fakegpu::EVENT_WRITE)
            .map(|e| ErrorMarker::from_word(e.data0))
            .collect();
        format!("{} faults were still held at detach: {markers:?}", markers.len())
    })
}

/// Every warp of every slot of `layout` faults on the slot's run; `recordable` of them fit
/// (the ring, or the held table when the daemon reads every `read_every` injections).
fn storm(
    fake: &FakeGpu,
    daemon: &mut Daemon,
    memory: &Memory,
    layout: &ChannelLayout,
    placed: &PlacedChannel,
    recordable: usize,
    read_every: Option<usize>,
) -> Result<(), String> {
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
    let pages = u64::from(layout.pages_per_run);
    let runs: Vec<u64> = layout
        .slots
        .iter()
        .map(|s| placed.placement.process_va(s.runs[0]).ok_or_else(|| "run not placed".to_string()))
        .collect::<Result<_, _>>()?;
    let faults: Vec<RawFaultEntry> =
        runs.iter().flat_map(|&run| (0..pages).map(move |p| fault(run + p * PAGE, AccessType::Read))).collect();
    let excess = faults.len() - recordable;
    ensure(excess > 0, || "the storm must overflow".into())?;

    let dropped_before = daemon.backend.device().ring().dropped();
    let mut records = 0;
    for chunk in faults.chunks(read_every.unwrap_or(fakegpu::MAX_INJECT as usize)) {
        inject_held(fake, chunk)?;
        if read_every.is_some() {
            records += daemon.take_faults();
        }
    }
    let dropped = daemon.backend.device().ring().dropped() - dropped_before;
    ensure(dropped == excess as u64, || format!("{dropped} faults dropped, expected {excess}"))?;

    // A replay makes every stalled warp fault again: the recorded ones are already held, so
    // the module neither records nor drops them a second time.
    for _ in 0..3 {
        for chunk in faults[..recordable].chunks(fakegpu::MAX_INJECT as usize) {
            inject_held(fake, chunk)?;
        }
    }
    let redropped = daemon.backend.device().ring().dropped() - dropped_before - dropped;
    ensure(redropped == 0, || format!("{redropped} duplicates of held faults were counted as dropped"))?;
    records += daemon.take_faults();
    ensure(records == recordable, || format!("{records} records read, expected {recordable}"))?;
    let recorded_slots = recordable as u64 / pages;
    ensure(u64::from(daemon.engine.held()) == recorded_slots, || {
        format!("engine holds {} requests, expected {recorded_slots}", daemon.engine.held())
    })?;

    // The producer publishes every slot; the recorded ones are delivered, the others become
    // available and are delivered when their warps fault again after the replay.
    let mut expected = HashMap::new();
    for (slot, &run) in runs.iter().enumerate() {
        let now = daemon.now();
        daemon.engine.publish(now, layout.id, slot as u32, &mut daemon.commands).map_err(|e| e.to_string())?;
        let bytes: Vec<u8> = (0..layout.batch_bytes).map(|i| (i * 13 + slot as u64 * 7 + 1) as u8).collect();
        let offset = (slot as u64 * layout.batch_bytes) as usize;
        daemon.host_data[offset..offset + bytes.len()].copy_from_slice(&bytes);
        expected.insert(run, bytes);
    }
    daemon.execute()?;
    let refaults = &faults[recordable..];
    for chunk in refaults.chunks(fakegpu::MAX_INJECT as usize) {
        inject_held(fake, chunk)?;
    }
    daemon.take_faults();
    daemon.execute()?;
    ensure(daemon.engine.held() == 0, || format!("{} requests still held", daemon.engine.held()))?;

    let events = wait_events(fake, Duration::from_secs(20), |seen| {
        seen.iter().filter(|e| e.kind == fakegpu::EVENT_WRITE).count() >= runs.len()
    })?;
    let mut writes: HashMap<u64, usize> = HashMap::new();
    for event in events.iter().filter(|e| e.kind == fakegpu::EVENT_WRITE) {
        *writes.entry(event.va).or_default() += 1;
    }
    ensure(writes.len() == runs.len() && writes.values().all(|&n| n == 1), || {
        format!("{} runs written, expected each of {} once", writes.len(), runs.len())
    })?;
    for (run, bytes) in &expected {
        ensure(memory.read(*run, bytes.len()) == *bytes, || {
            format!("run {run:#x} does not hold its producer's bytes")
        })?;
        for page in 0..pages {
            let state = fake.page_state(GPU, run + page * PAGE).map_err(|e| format!("page state: {e}"))?;
            ensure(state & fakegpu::PAGE_MAPPED != 0, || format!("page {page} of run {run:#x} is not mapped"))?;
        }
    }
    Ok(())
}

/// Injects `faults` on [`GPU`]; each must be held, recorded or not.
fn inject_held(fake: &FakeGpu, faults: &[RawFaultEntry]) -> Result<(), String> {
    let (verdicts, _) = fake.inject(GPU, faults).map_err(|e| format!("inject: {e}"))?;
    ensure(verdicts.iter().all(|&v| v == fakegpu::VERDICT_HOLD), || {
        format!(
            "{} of {} faults not held",
            verdicts.iter().filter(|&&v| v != fakegpu::VERDICT_HOLD).count(),
            faults.len()
        )
    })
}
