//! A held fault receives exactly the producer's bytes: the shim holds a warp's read of a PCM
//! page, the host publishes, and the page gets the data, its companion is unmapped, the run is
//! mapped and the GPU replayed, in that order. A producer GPU's write of its PAT page marks the
//! slot's tag available and is released writable. A host producer that wrote its batch into
//! the run itself hands over only the pages' head words (`WIC_CMD_COMPLETE_HEADS`): the module
//! writes those 16 bytes of a 2-page run and nothing else.

use std::time::Duration;

use wic_engine::fault::AccessType;
use wic_engine::{ChannelLayout, ChannelSpec, Command, DataSource, Fill, Producer};
use wic_kabi::{self as kabi, WicCommand};
use wic_kernel_io::fakegpu::{self, FakeGpu};
use wic_kernel_io::{PlacedChannel, Submission};

use crate::rig::{ensure, fault, host_spec, stall_held, wait_events, Daemon, Direct, Memory, GPU};

/// The producer GPU of the PAT case: the second GPU of the first parent (MIG).
const PRODUCER_GPU: u32 = 2;

pub fn run() -> Result<(), String> {
    let fake = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
    let mut memory = Memory::new(&fake, 16 << 20)?;
    let mut daemon = Daemon::open(Submission::Uring)?;
    let space = daemon.backend.device().attach(fake.fd()).map_err(|e| format!("attach: {e}"))?;
    let (layout, placed) = daemon.channel(host_spec(2, 512), space, &mut memory)?;
    deliver_one(&fake, &mut daemon, &memory, &layout, &placed, 0, GPU)?;

    // GPU ids are nvidia-uvm's, up to 256: the 9th parent GPU (65) and sub-index 7 of the 8th
    // parent (64, MIG) are held, recorded and completed like the first GPU's.
    for gpu in [65u32, 64] {
        let spec = ChannelSpec { consumer_gpu: gpu as u16, ..host_spec(1, 512) };
        let (layout, placed) = daemon.channel(spec, space, &mut memory)?;
        deliver_one(&fake, &mut daemon, &memory, &layout, &placed, 0, gpu).map_err(|e| format!("GPU {gpu}: {e}"))?;
        daemon.backend.unplace(&placed).map_err(|e| e.to_string())?;
    }

    // A page nobody registered is not held: nvidia-uvm services it as usual.
    let stranger = memory.take(4096)?;
    let (verdicts, _) = fake.inject(GPU, &[fault(stranger, AccessType::Read)]).map_err(|e| e.to_string())?;
    ensure(verdicts == [fakegpu::VERDICT_PASS], || format!("an unregistered page was {verdicts:?}"))?;

    completions_share_one_call(&fake, &mut daemon, space, &mut memory)?;
    prefetch_is_held_unrecorded(&fake, &mut daemon, space, &mut memory)?;
    pat_marks_the_tag_available(&fake, &mut daemon, space, &mut memory)?;
    daemon.backend.unplace(&placed).map_err(|e| e.to_string())?;
    daemon.backend.device().detach(space).map_err(|e| e.to_string())?;
    // The next step drives the module itself, in a session of its own.
    drop(daemon);
    heads_of_a_run_written_in_place()
}

/// One warp of `slot`'s next batch faults on `gpu` (the channel's consumer GPU), the host
/// publishes, the data arrives.
pub fn deliver_one(
    fake: &FakeGpu,
    daemon: &mut Daemon,
    memory: &Memory,
    layout: &ChannelLayout,
    placed: &PlacedChannel,
    slot: usize,
    gpu: u32,
) -> Result<(), String> {
    let run = placed.placement.process_va(layout.slots[slot].runs[0]).ok_or("run not placed")?;
    let companion = placed.placement.process_va(layout.slots[slot].runs[1]).ok_or("companion not placed")?;
    let run_bytes = u64::from(layout.pages_per_run) * 4096;
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;

    // The last warp of the batch reads the run's last page: held, recorded, not serviced.
    let (verdicts, _) =
        fake.inject(gpu, &[fault(run + run_bytes - 4096, AccessType::Read)]).map_err(|e| format!("inject: {e}"))?;
    ensure(verdicts == [fakegpu::VERDICT_HOLD], || format!("the PCM fault was {verdicts:?}, not held"))?;
    let held_before = daemon.engine.held();
    ensure(daemon.take_faults() == 1, || "no record in the fault ring".into())?;
    ensure(daemon.engine.held() == held_before + 1, || "the engine does not hold the request".into())?;
    ensure(fake.page_state(gpu, run).map_err(|e| format!("page state: {e}"))? & fakegpu::PAGE_MAPPED == 0, || {
        "held page is mapped".into()
    })?;

    // The host publishes: the engine asks for the data, the companion unmap, the map, a replay.
    let now = daemon.now();
    daemon.engine.publish(now, layout.id, slot as u32, &mut daemon.commands).map_err(|e| e.to_string())?;
    let Some(&Command::Complete { fill: Fill::Data { source: DataSource::Host { offset }, len }, .. }) =
        daemon.commands.iter().find(|c| matches!(c, Command::Complete { .. }))
    else {
        return Err(format!("publish gave no host write: {:?}", daemon.commands));
    };
    let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + 3 + slot as u64) as u8).collect();
    daemon.host_data[offset as usize..(offset + len) as usize].copy_from_slice(&bytes);
    daemon.execute()?;

    let events =
        wait_events(fake, Duration::from_secs(5), |seen| seen.iter().any(|e| e.kind == fakegpu::EVENT_REPLAY))?;
    let kinds: Vec<u32> = events.iter().map(|e| e.kind).collect();
    let expected = [
        fakegpu::EVENT_COMPLETE,
        fakegpu::EVENT_WRITE,
        fakegpu::EVENT_UNMAP,
        fakegpu::EVENT_MAP,
        fakegpu::EVENT_REPLAY,
    ];
    ensure(kinds == expected, || format!("fake GPU saw {events:?}, expected kinds {expected:?}"))?;
    ensure(events[0].length == 1, || format!("one completion in {:?}", events[0]))?;
    let events = &events[1..];
    let first_word = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    ensure(events[0].va == run && events[0].length == len && events[0].data0 == first_word, || {
        format!("write {:?}", events[0])
    })?;
    ensure(events[1].va == companion && events[1].length == run_bytes && events[1].gpu_id == gpu, || {
        format!("unmap {:?}", events[1])
    })?;
    ensure(events[2].va == run && events[2].length == run_bytes && events[2].gpu_id == gpu, || {
        format!("map {:?}", events[2])
    })?;
    ensure(events[3].gpu_id == gpu, || format!("replay {:?}", events[3]))?;
    ensure(memory.read(run, len as usize) == bytes, || "the page does not hold exactly the producer's bytes".into())?;
    let state = |va| fake.page_state(gpu, va).map_err(|e| format!("page state: {e}"));
    ensure(state(run)? & fakegpu::PAGE_MAPPED != 0, || "the run is not mapped".into())?;
    ensure(state(companion)? & fakegpu::PAGE_MAPPED == 0, || "the companion is still mapped".into())?;
    ensure(daemon.engine.held() == held_before, || "the engine still holds the request".into())
}

/// Wake-ups of one batch run by one call into nvidia-uvm: one acquisition of its locks and one
/// wait for the TLB invalidates, not three of each per wake-up. Their 1 MiB of data fills the
/// module's bounce buffer exactly.
fn completions_share_one_call(
    fake: &FakeGpu,
    daemon: &mut Daemon,
    space: u32,
    memory: &mut Memory,
) -> Result<(), String> {
    // 16 slots of 64 KiB batches: 1 MiB of data, the bounce buffer's size, so one call.
    let (layout, placed) = daemon.channel(host_spec(16, 4096), space, memory)?;
    let runs: Vec<u64> = layout
        .slots
        .iter()
        .map(|s| placed.placement.process_va(s.runs[0]).ok_or("a run not placed"))
        .collect::<Result<_, _>>()?;
    // Published first, the batches are there when the warps' faults come: the engine
    // completes every one from that batch of faults, with one replay after them.
    let now = daemon.now();
    for slot in 0..runs.len() as u32 {
        daemon.engine.publish(now, layout.id, slot, &mut daemon.commands).map_err(|e| e.to_string())?;
    }
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
    let reads: Vec<_> = runs.iter().map(|va| fault(*va, AccessType::Read)).collect();
    let (verdicts, _) = fake.inject(GPU, &reads).map_err(|e| format!("inject: {e}"))?;
    ensure(verdicts.iter().all(|v| *v == fakegpu::VERDICT_HOLD), || format!("not all held: {verdicts:?}"))?;
    ensure(daemon.take_faults() == runs.len(), || "not every fault recorded".into())?;
    daemon.execute()?;
    let events =
        wait_events(fake, Duration::from_secs(5), |seen| seen.iter().any(|e| e.kind == fakegpu::EVENT_REPLAY))?;
    let calls: Vec<u64> = events.iter().filter(|e| e.kind == fakegpu::EVENT_COMPLETE).map(|e| e.length).collect();
    ensure(calls == [runs.len() as u64], || format!("{} wake-ups took the calls {calls:?}", runs.len()))?;
    let maps = events.iter().filter(|e| e.kind == fakegpu::EVENT_MAP).count();
    ensure(maps == runs.len(), || format!("{maps} runs mapped of {}", runs.len()))?;
    daemon.backend.unplace(&placed).map_err(|e| e.to_string())
}

/// A prefetch of a wic page is held (serviced, it would map the page before its data) but not
/// recorded: no warp waits on it and the GPU never replays it. The warp's real read of the
/// page, later, is recorded and delivered.
fn prefetch_is_held_unrecorded(
    fake: &FakeGpu,
    daemon: &mut Daemon,
    space: u32,
    memory: &mut Memory,
) -> Result<(), String> {
    let (layout, placed) = daemon.channel(host_spec(1, 512), space, memory)?;
    let run = placed.placement.process_va(layout.slots[0].runs[0]).ok_or("run not placed")?;
    let last = run + u64::from(layout.pages_per_run) * 4096 - 4096;
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
    let dropped = daemon.backend.device().ring().dropped();
    let prefetches =
        [fault(last, AccessType::Prefetch), fault(last, AccessType::PhysPrefetch), fault(run, AccessType::Prefetch)];
    let (verdicts, _) = fake.inject(GPU, &prefetches).map_err(|e| format!("inject: {e}"))?;
    ensure(verdicts.iter().all(|v| *v == fakegpu::VERDICT_HOLD), || {
        format!("prefetches of wic pages were {verdicts:?}, not held")
    })?;
    let records = daemon.take_faults();
    ensure(records == 0, || format!("{records} prefetch faults were recorded"))?;
    ensure(daemon.backend.device().ring().dropped() == dropped, || "prefetch faults were counted as dropped".into())?;
    ensure(fake.page_state(GPU, last).map_err(|e| format!("page state: {e}"))? == 0, || {
        "a prefetched page is mapped".into()
    })?;
    // The real read of the prefetched page: recorded (no held entry hides it) and delivered.
    deliver_one(fake, daemon, memory, &layout, &placed, 0, GPU)
        .map_err(|e| format!("the read after the prefetch: {e}"))?;
    daemon.backend.unplace(&placed).map_err(|e| e.to_string())
}

fn pat_marks_the_tag_available(
    fake: &FakeGpu,
    daemon: &mut Daemon,
    space: u32,
    memory: &mut Memory,
) -> Result<(), String> {
    // The producer's batch is managed memory: the module copies it from there.
    let batch = u64::from(daemon.engine.config().warps_per_batch) * 512;
    let source = memory.take(batch.next_multiple_of(4096))?;
    let spec =
        ChannelSpec { producer: Producer::Gpu { gpu: PRODUCER_GPU as u16, base_va: source }, ..host_spec(1, 512) };
    let (layout, placed) = daemon.channel(spec, space, memory)?;
    let pat =
        placed.placement.process_va(layout.slots[0].pat.ok_or("no PAT pages")?[0]).ok_or("PAT page not placed")?;
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
    let (before, tags_before) = (daemon.engine.stats().pat_publishes, daemon.engine.available_tags());
    let (verdicts, _) = fake.inject(PRODUCER_GPU, &[fault(pat, AccessType::Write)]).map_err(|e| e.to_string())?;
    ensure(verdicts == [fakegpu::VERDICT_HOLD], || format!("the PAT fault was {verdicts:?}, not held"))?;
    ensure(daemon.take_faults() == 1, || "no record for the PAT fault".into())?;
    ensure(daemon.engine.stats().pat_publishes == before + 1, || "the PAT fault published nothing".into())?;
    ensure(daemon.engine.available_tags() == tags_before + 1, || "the slot's tag is not available".into())?;
    daemon.execute()?;
    let events =
        wait_events(fake, Duration::from_secs(5), |seen| seen.iter().any(|e| e.kind == fakegpu::EVENT_REPLAY))?;
    ensure(
        events.iter().any(|e| e.kind == fakegpu::EVENT_MAP_WRITABLE && e.va == pat && e.gpu_id == PRODUCER_GPU),
        || format!("the PAT page was not released writable: {events:?}"),
    )?;
    ensure(fake.page_state(PRODUCER_GPU, pat).map_err(|e| e.to_string())? & fakegpu::PAGE_WRITABLE != 0, || {
        "PAT page not writable".into()
    })?;
    daemon.backend.unplace(&placed).map_err(|e| e.to_string())
}

/// A host producer wrote its batch straight into a held 2-page run, all but the 8-byte head of
/// each page (where only completions write, markers included), and hands the two head words
/// over: `WIC_CMD_COMPLETE_HEADS` writes those 16 bytes, unmaps the companion, maps the run and
/// releases the warp; every other byte is the producer's. The fake GPU's fill counter grows by
/// 16; a `WIC_CMD_COMPLETE` of the same run grows it by the whole batch.
fn heads_of_a_run_written_in_place() -> Result<(), String> {
    const PAGE: u64 = kabi::WIC_PAGE_SIZE;
    let Direct { fake, memory, mut device, space } = Direct::open(4)?;
    let (run, companion) = (memory.base(), memory.base() + 2 * PAGE);
    // The batch's last warp reads the run's last page: held, recorded.
    stall_held(&fake, &mut device, run + PAGE)?;

    // The producer writes through the process's own mapping, the heads left alone.
    let batch: Vec<u8> = (0..2 * PAGE).map(|i| (i * 13 + 1) as u8).collect();
    for page in 0..2 {
        let body = (page * PAGE + 8) as usize..((page + 1) * PAGE) as usize;
        // SAFETY: `memory` maps the run's two pages, readable and writable; no Rust reference
        // covers them, and the module writes only their heads, in the submission below.
        unsafe {
            std::ptr::copy_nonoverlapping(batch[body.clone()].as_ptr(), (run as *mut u8).add(body.start), body.len());
        }
    }
    let heads = [0x1122_3344_5566_7788u64, 0x99aa_bbcc_ddee_ff00];
    let before = fake.filled().map_err(|e| format!("fill counter: {e}"))?;
    fake.events(4096, 0).map_err(|e| format!("events: {e}"))?;
    let mut cmds = [
        wic_kernel_io::commands::complete_heads(space, GPU, run, 2, companion, heads.as_ptr() as u64),
        WicCommand { opcode: kabi::WIC_CMD_REPLAY, gpu_id: GPU, ..WicCommand::default() },
    ];
    let done = device.submit(&mut cmds).map_err(|e| format!("submit: {e}"))?;
    ensure(done == 2 && cmds.iter().all(|c| c.result == 0), || {
        format!("the heads completion and the replay: {done} succeeded, results {:?}", cmds.map(|c| c.result))
    })?;

    let events =
        wait_events(&fake, Duration::from_secs(5), |seen| seen.iter().any(|e| e.kind == fakegpu::EVENT_RESUMED))?;
    let steps: Vec<(u32, u64, u64)> = events.iter().map(|e| (e.kind, e.va, e.length)).collect();
    let expected = [
        (fakegpu::EVENT_COMPLETE, 0, 1),
        (fakegpu::EVENT_WRITE, run, 8),
        (fakegpu::EVENT_WRITE, run + PAGE, 8),
        (fakegpu::EVENT_UNMAP, companion, 2 * PAGE),
        (fakegpu::EVENT_MAP, run, 2 * PAGE),
        (fakegpu::EVENT_REPLAY, 0, 0),
        (fakegpu::EVENT_RESUMED, run + PAGE, PAGE),
    ];
    ensure(steps == expected, || format!("fake GPU saw {events:?}, expected (kind, va, length) {expected:?}"))?;
    ensure(events[1].data0 == heads[0] && events[2].data0 == heads[1], || {
        format!("the heads written: {:#x} and {:#x}", events[1].data0, events[2].data0)
    })?;
    let state = fake.page_state(GPU, run + PAGE).map_err(|e| format!("page state: {e}"))?;
    ensure(state & fakegpu::PAGE_MAPPED != 0 && state & fakegpu::PAGE_STALLED == 0, || {
        format!("the warp's page after the completion: {state:#x}, not mapped with the warp resumed")
    })?;
    let mut want = batch.clone();
    want[..8].copy_from_slice(&heads[0].to_le_bytes());
    want[PAGE as usize..PAGE as usize + 8].copy_from_slice(&heads[1].to_le_bytes());
    let got = memory.read(run, want.len());
    let wrong = got.iter().zip(&want).position(|(g, w)| g != w);
    ensure(wrong.is_none(), || {
        let at = wrong.unwrap_or(0);
        format!("byte {at} of the run is {:#x}, not {:#x}: heads first, the producer's bytes after", got[at], want[at])
    })?;
    let after = fake.filled().map_err(|e| format!("fill counter: {e}"))?;
    ensure(after - before == 16, || format!("the heads completion filled {} bytes, not 2 x 8", after - before))?;

    // The slot's next generation goes to the companion (a marker, which unmaps this run); the
    // one after is this run's again, its whole batch copied by the module.
    let marker = WicCommand {
        opcode: kabi::WIC_CMD_COMPLETE,
        space_id: space,
        gpu_id: GPU,
        pages: 2,
        va: companion,
        arg: kabi::WIC_MARKER_TIMEOUT,
        companion: run,
        ..WicCommand::default()
    };
    let mut next = [marker];
    device.submit(&mut next).map_err(|e| format!("submit: {e}"))?;
    ensure(next[0].result == 0, || format!("the companion's completion got {}", next[0].result))?;
    let before = fake.filled().map_err(|e| format!("fill counter: {e}"))?;
    let whole = WicCommand { va: run, companion, arg: batch.as_ptr() as u64, length: batch.len() as u64, ..marker };
    let mut again = [whole];
    device.submit(&mut again).map_err(|e| format!("submit: {e}"))?;
    ensure(again[0].result == 0, || format!("the run's COMPLETE with data got {}", again[0].result))?;
    let after = fake.filled().map_err(|e| format!("fill counter: {e}"))?;
    ensure(after - before == batch.len() as u64, || {
        format!("a COMPLETE of the 2-page run filled {} bytes, not its {}", after - before, batch.len())
    })?;
    ensure(memory.read(run, batch.len()) == batch, || "the COMPLETE's batch did not arrive whole".into())
}
