//! A fault the hardware drops where nvidia-uvm's OVERFLOW latch cannot see it, on the fake
//! GPU's model of the fault buffer's registers: it drops faults into a full buffer and sets
//! OVERFLOW, which nvidia-uvm sees only where it reads the bit (the PUT read of a fetch, the GET
//! write just before the bit's clear). A fault dropped between that last read and the clear
//! leaves no trace, and with every fault in the buffer held, the bottom half's runs are made of
//! held faults only. Their final replay, NVIDIA's net for "faults that do not show up in the
//! buffer", must then be deferred, not left out: the lost warp faults again within
//! `UVM_WIC_DEFERRED_REPLAY_MS` (uvm_wic.h), and its fault is held and recorded.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use wic_engine::fault::{AccessType, VaWidth};
use wic_engine::FaultEntry;
use wic_kernel_io::fakegpu;

use crate::rig::{ensure, fault, wait_events, Direct, GPU};

/// `UVM_WIC_DEFERRED_REPLAY_MS`: how long a held-only run may put its replay off.
const DEFERRED: Duration = Duration::from_millis(100);
/// Slack for the VM's timers and scheduling on top of it.
const SLACK: Duration = Duration::from_millis(400);
/// Pages: a buffer's worth of held faults, and the warps that race the first fetch.
const FILL: u64 = fakegpu::HW_BUFFER as u64;
const LATE: u64 = fakegpu::HW_BATCH as u64 + 1;

pub fn run() -> Result<(), String> {
    let mut direct = Direct::open(FILL + LATE)?;
    let base = direct.memory.base();
    let page = |i: u64| base + i * 4096;

    // Held faults fill the buffer.
    let fill: Vec<_> = (0..FILL).map(|i| fault(page(i), AccessType::Read)).collect();
    let filled = direct.fake.warps(GPU, &fill).map_err(|e| format!("warps: {e}"))?;
    ensure(filled.dropped == 0, || format!("filling the buffer: {filled:?}"))?;
    // The first fetch frees one batch's room; one warp more than that stalls in its race.
    let late: Vec<_> = (FILL..FILL + LATE).map(|i| fault(page(i), AccessType::Read)).collect();
    let run = direct.fake.bottom_half_racing(GPU, &late).map_err(|e| format!("bottom half: {e}"))?;
    ensure(run.dropped == 1, || format!("the race dropped {} faults, not one: {run:?}", run.dropped))?;
    // Held faults only, no overflow seen: nothing replays now (each replay would beget the next).
    ensure(run.replays == 0, || format!("a run of held faults replayed at once: {run:?}"))?;
    let lost = page(FILL + LATE - 1);
    let mut recorded = records(&mut direct)?;
    ensure(recorded.len() as u64 == FILL + LATE - 1 && !recorded.contains(&lost), || {
        format!(
            "{} records before the deferred replay, the lost page's among them: {}",
            recorded.len(),
            recorded.contains(&lost)
        )
    })?;

    // The deferred replay makes every stalled warp fault again, the lost one too.
    let start = Instant::now();
    wait_events(&direct.fake, DEFERRED + SLACK, |seen| seen.iter().any(|e| e.kind == fakegpu::EVENT_REPLAY))
        .map_err(|_| format!("no replay within {:?} of a run that may have lost a fault", DEFERRED + SLACK))?;
    let waited = start.elapsed();
    // Now more warps than the buffer holds fault: the overflow is seen, and the runs replay
    // until every fault was fetched.
    for _ in 0..8 {
        direct.fake.bottom_half(GPU).map_err(|e| format!("bottom half: {e}"))?;
        recorded.extend(records(&mut direct)?);
        if recorded.contains(&lost) {
            break;
        }
    }
    ensure(recorded.contains(&lost), || "the lost warp's fault was never recorded after the deferred replay".into())?;
    let state = direct.fake.page_state(GPU, lost).map_err(|e| e.to_string())?;
    ensure(state & fakegpu::PAGE_STALLED != 0 && state & fakegpu::PAGE_MAPPED == 0, || {
        format!("the lost warp's page {lost:#x}: {state:#x}, not held")
    })?;
    println!("race: a fault lost in the latch's race came back with the deferred replay after {waited:?}");
    // The deferred replay of the last held-only run, if one is armed, comes before the next scenario.
    std::thread::sleep(DEFERRED + SLACK);
    Ok(())
}

/// The pages of the records waiting in the ring.
fn records(direct: &mut Direct) -> Result<BTreeSet<u64>, String> {
    let mut out = Vec::new();
    direct.device.ring().read(&mut out, usize::MAX);
    ensure(out.iter().all(|r| r.gpu_id == GPU), || format!("a record of another GPU: {out:?}"))?;
    Ok(out.iter().map(|r| FaultEntry::decode_va(&r.entry, VaWidth::Bits57)).collect())
}
