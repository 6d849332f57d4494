//! The fault buffer against held faults, on the fake GPU's model of the replayable-fault
//! hardware: a buffer full of held faults drops the fault of another application's warp (not a
//! wic page), and a dropped fault raises no interrupt and comes back only with a replay. The
//! bottom half's runs are then made of held faults only, and must still end with a replay (the
//! patched driver's rule, `uvm_wic_run_replays()` in uvm_wic.h, which the fake runs), or that
//! warp stays stalled for ever. Meanwhile each held fault comes back at every replay and stays
//! held, recorded once, and a run of them alone does not replay (each replay would beget the
//! next); completing them resumes their warps.

use wic_engine::fault::AccessType;
use wic_engine::Command;
use wic_kernel_io::fakegpu::{self, FakeGpu};
use wic_kernel_io::Submission;

use crate::rig::{ensure, fault, host_spec, Daemon, Memory, GPU};

/// Replays one bottom half may issue here without being a storm: the one for the overflow,
/// the one that ends the batch with the other application's fault, and one more in case the
/// rotation drops that fault once more.
const CALM_REPLAYS: u32 = 3;

pub fn run() -> Result<(), String> {
    let fake = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
    let stranger = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
    let mut memory = Memory::new(&fake, 4 << 20)?;
    let mut daemon = Daemon::open(Submission::Ioctl)?;
    let space = daemon.backend.device().attach(fake.fd()).map_err(|e| format!("attach: {e}"))?;
    // One-page runs, one slot per entry of the fault buffer.
    let (layout, placed) = daemon.channel(host_spec(fakegpu::HW_BUFFER, 256), space, &mut memory)?;
    let runs: Vec<u64> = layout
        .slots
        .iter()
        .map(|slot| placed.placement.process_va(slot.runs[0]).ok_or("a run not placed"))
        .collect::<Result<_, _>>()?;
    fake.reset().map_err(|e| e.to_string())?;

    // One warp per slot fills the buffer with faults on wic pages.
    let reads: Vec<_> = runs.iter().map(|va| fault(*va, AccessType::Read)).collect();
    let filled = fake.warps(GPU, &reads).map_err(|e| format!("warps: {e}"))?;
    ensure(filled.dropped == 0 && filled.stalled == fakegpu::HW_BUFFER, || format!("filling the buffer: {filled:?}"))?;
    // Another application's warp faults on its own page: the buffer is full, the fault dropped.
    let page = memory.take(4096)?;
    let late = stranger.warps(GPU, &[fault(page, AccessType::Read)]).map_err(|e| format!("warps: {e}"))?;
    ensure(late.dropped == 1, || format!("the fault past the full buffer was not dropped: {late:?}"))?;

    let run = fake.bottom_half(GPU).map_err(|e| format!("bottom half: {e}"))?;
    let state = stranger.page_state(GPU, page).map_err(|e| e.to_string())?;
    ensure(state & fakegpu::PAGE_STALLED == 0, || {
        format!("the other application's warp is still stalled ({run:?}): its fault was dropped and the held-only runs never replayed")
    })?;
    ensure(state & fakegpu::PAGE_MAPPED != 0, || "the other application's page was not serviced".into())?;
    ensure(run.replays <= CALM_REPLAYS, || format!("{} replays for one overflow: a storm", run.replays))?;
    // The held faults came back at each replay and are still held, each recorded once.
    for va in &runs {
        let state = fake.page_state(GPU, *va).map_err(|e| e.to_string())?;
        ensure(state & fakegpu::PAGE_STALLED != 0 && state & fakegpu::PAGE_MAPPED == 0, || {
            format!("wic page {va:#x}: {state:#x}")
        })?;
    }
    let records = daemon.take_faults();
    ensure(records == runs.len(), || format!("{records} records for {} held faults", runs.len()))?;
    println!("overflow: a fault dropped behind {} held ones came back after {} replays", runs.len(), run.replays);

    // A replay with nothing to resume (another GPU's completion, a cancel path) makes every
    // held fault come back at once, into a buffer with room: the run that fetches them, held
    // faults only and no overflow, must not replay again, or each replay begets the next.
    daemon.commands.push(Command::Replay { gpu: GPU as u16 });
    daemon.execute()?;
    let calm = fake.bottom_half(GPU).map_err(|e| format!("bottom half: {e}"))?;
    ensure(calm.replays == 0 && calm.stalled == fakegpu::HW_BUFFER, || format!("the held faults' return: {calm:?}"))?;

    // Completed, the held warps resume at the replay that ends the batch of completions.
    let now = daemon.now();
    for slot in 0..layout.slots.len() as u32 {
        daemon.engine.publish(now, layout.id, slot, &mut daemon.commands).map_err(|e| e.to_string())?;
    }
    daemon.execute()?;
    for va in &runs {
        let state = fake.page_state(GPU, *va).map_err(|e| e.to_string())?;
        ensure(state & fakegpu::PAGE_STALLED == 0, || format!("the warp on {va:#x} did not resume: {state:#x}"))?;
    }
    let quiet = fake.bottom_half(GPU).map_err(|e| format!("bottom half: {e}"))?;
    ensure(quiet.stalled == 0 && quiet.replays == 0, || format!("after the completions: {quiet:?}"))?;
    daemon.backend.unplace(&placed).map_err(|e| e.to_string())?;
    daemon.backend.device().detach(space).map_err(|e| e.to_string())
}
