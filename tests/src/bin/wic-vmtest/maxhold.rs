//! The module bounds a hold by itself: with `max_hold_ms` set (through
//! `/sys/module/wic_shim/parameters/max_hold_ms`), a fault that the daemon never completes (this
//! scenario's daemon opens the device, registers a range and never runs a command) is completed
//! by the module with the timeout marker, mapped and its GPU replayed, within the bound plus
//! the expiry work's period and some slack. With the bound at 0 nothing expires; set again, or
//! lowered from a long bound, the bound applies at once to faults already held. The parameter is
//! restored whatever happens.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use wic_engine::fault::AccessType;
use wic_engine::{FaultEntry, VaWidth};
use wic_kabi::{self as kabi, WicCommand, WIC_MARKER_TIMEOUT};
use wic_kernel_io::fakegpu::{self, Event, Fail, FakeGpu};
use wic_kernel_io::Device;

use crate::rig::{ensure, fault, marker, set_max_hold_ms as set, submit_on, wait_events, Direct, Memory, GPU};

const PARAM: &str = wic_kernel_io::device::MAX_HOLD_MS_PARAM;
const PAGE: u64 = 4096;
/// The bound the scenario sets.
const BOUND: Duration = Duration::from_millis(200);
/// What the completion may take beyond the bound: the work's period (a quarter of the bound)
/// and scheduling under an emulated CPU.
const SLACK: Duration = Duration::from_millis(800);
/// With the bound at 0 the work looks again every second: a bound set then applies within it.
const IDLE_PERIOD: Duration = Duration::from_secs(1);

pub fn run() -> Result<(), String> {
    let old =
        std::fs::read_to_string(PARAM).map_err(|e| format!("read {PARAM}: {e} (the module has no hold bound)"))?;
    let result = steps();
    let restored = set(old.trim().parse().unwrap_or(0));
    result?;
    restored
}

fn steps() -> Result<(), String> {
    let Direct { fake, memory, mut device, space } = Direct::open(4)?;
    let base = memory.base();

    // A fault held with the bound set: completed by the module, not before the bound.
    set(BOUND.as_millis() as u32)?;
    let va = base + PAGE;
    // Taken before the fault is held: the module measures from the hold itself.
    let held = Instant::now();
    inject(&fake, va)?;
    ensure(read_ring(&mut device) == 1, || "the held fault was not recorded".into())?;
    let events = wait_events(&fake, BOUND + SLACK * 4, |seen| completed(seen, va).is_some())?;
    let took = held.elapsed();
    ensure(took >= BOUND, || format!("the fault was completed after {took:?}, before the bound {BOUND:?}"))?;
    ensure(took <= BOUND + SLACK, || format!("the fault was completed after {took:?}, bound {BOUND:?} + {SLACK:?}"))?;
    check_page(&fake, &memory, &events, va)?;
    println!("max-hold: a fault wicd never completed was completed by the module {took:?} after it was held (max_hold_ms {})", BOUND.as_millis());
    a_late_completion_of_an_expired_page_is_refused_once(&mut device, &memory, space, va)?;

    // Bound 0: nothing expires. Set again, the fault already held expires.
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
    set(0)?;
    let va = base + 2 * PAGE;
    inject(&fake, va)?;
    read_ring(&mut device);
    std::thread::sleep(BOUND * 3);
    let (events, _) = fake.events(4096, 0).map_err(|e| format!("events: {e}"))?;
    ensure(!events.iter().any(|e| e.va == va && matches!(e.kind, fakegpu::EVENT_WRITE | fakegpu::EVENT_MAP)), || {
        format!("with max_hold_ms 0 the held fault was touched: {events:?}")
    })?;
    ensure(fake.page_state(GPU, va).map_err(|e| format!("page state: {e}"))? & fakegpu::PAGE_MAPPED == 0, || {
        "with max_hold_ms 0 the held page was mapped".into()
    })?;
    set(BOUND.as_millis() as u32)?;
    let again = Instant::now();
    let events = wait_events(&fake, IDLE_PERIOD + BOUND + SLACK * 4, |seen| completed(seen, va).is_some())?;
    let took = again.elapsed();
    ensure(took <= SLACK, || format!("a bound set while a fault was held applied only after {took:?}"))?;
    check_page(&fake, &memory, &events, va)?;

    // A long bound lowered at run time applies at once, not after the long bound's period
    // (a quarter of it: 15 s here).
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
    set(60_000)?;
    let va = base + 3 * PAGE;
    inject(&fake, va)?;
    read_ring(&mut device);
    std::thread::sleep(BOUND + BOUND / 2);
    set(BOUND.as_millis() as u32)?;
    let lowered = Instant::now();
    let events = wait_events(&fake, SLACK * 4, |seen| completed(seen, va).is_some())?;
    let took = lowered.elapsed();
    ensure(took <= SLACK, || format!("a bound lowered from 60 s applied only after {took:?}"))?;
    check_page(&fake, &memory, &events, va)?;
    one_refused_fault_holds_back_no_other(&fake, &memory, &mut device, space)?;
    a_fault_past_the_ring_or_the_table_is_bounded(&fake, &mut device, space)?;
    gone_pages_are_not_held_again(&mut device)?;
    a_long_batch_lets_the_expiry_in(&mut device)?;
    an_unmappable_page_is_passed_once(&fake, &memory, &mut device, space)?;
    an_untouched_pat_page_expires(&fake, &memory, &mut device, space)?;
    a_whole_run_expires_as_wicd_would_end_it(&fake, &memory, &mut device, space)
}

/// A page expired alone (its range registered without runs): wicd is not told, so its next
/// completion of the page is for the generation whose warp read the timeout marker: refused
/// (ESTALE), the marker left in place; the one after is the next generation's, and goes in
/// (the slot's other page first, which unmaps this one).
fn a_late_completion_of_an_expired_page_is_refused_once(
    device: &mut Device,
    memory: &Memory,
    space: u32,
    va: u64,
) -> Result<(), String> {
    let data = [0x5au8; 64];
    let complete = |va: u64, companion: u64| WicCommand {
        opcode: kabi::WIC_CMD_COMPLETE,
        space_id: space,
        gpu_id: GPU,
        pages: 1,
        va,
        arg: data.as_ptr() as u64,
        length: data.len() as u64,
        companion,
        ..WicCommand::default()
    };
    let mut late = [complete(va, va + PAGE)];
    device.submit(&mut late).map_err(|e| format!("complete: {e}"))?;
    ensure(late[0].result == -libc::ESTALE, || {
        format!("a completion of the page the expiry completed got {}, not ESTALE", late[0].result)
    })?;
    let word = marker(memory, va);
    ensure(word == WIC_MARKER_TIMEOUT, || format!("the late completion wrote {word:#x} over the timeout marker"))?;
    let mut next = [complete(va + PAGE, va), complete(va, va + PAGE)];
    device.submit(&mut next).map_err(|e| format!("complete: {e}"))?;
    ensure(next.iter().all(|c| c.result == 0), || {
        format!("the next generations' completions got {:?}", next.map(|c| c.result))
    })?;
    ensure(memory.read(va, data.len()) == data, || "the next generation's data did not arrive".into())
}

/// In a PCM range registered with its runs (as wicd registers a channel), the expiry ends a
/// hold as wicd's own timeout would: the marker at the start of every page of the fault's run,
/// the slot's other run (mapped with the previous generation's bytes) unmapped, the run
/// mapped; and it tells wicd, with a record of its own, so that the slot moves on.
fn a_whole_run_expires_as_wicd_would_end_it(
    fake: &FakeGpu,
    memory: &Memory,
    device: &mut Device,
    space: u32,
) -> Result<(), String> {
    const RUN_PAGES: u32 = 2;
    set(0)?;
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
    let run = memory.base() + 40 * PAGE;
    let companion = run + u64::from(RUN_PAGES) * PAGE;
    let range = device
        .register(space, kabi::WIC_RANGE_PCM, run, 2 * u64::from(RUN_PAGES) * PAGE, RUN_PAGES)
        .map_err(|e| format!("register: {e}"))?;
    // The previous generation: the companion completed (with another marker than the
    // expiry's), so mapped.
    let mut previous = [WicCommand {
        opcode: kabi::WIC_CMD_COMPLETE,
        space_id: space,
        gpu_id: GPU,
        pages: RUN_PAGES,
        va: companion,
        arg: kabi::WIC_MARKER_CHANNEL_CLOSED,
        companion: run,
        ..WicCommand::default()
    }];
    device.submit(&mut previous).map_err(|e| format!("complete: {e}"))?;
    ensure(previous[0].result == 0, || format!("completing the companion: {}", previous[0].result))?;
    let va = run + PAGE;
    inject(fake, va)?;
    read_ring(device);
    set(BOUND.as_millis() as u32)?;
    let events = wait_events(fake, BOUND + SLACK * 4, |seen| {
        completed(seen, run).is_some() && seen.iter().any(|e| e.kind == fakegpu::EVENT_UNMAP)
    })?;
    set(0)?;
    for page in [run, va] {
        let word = marker(memory, page);
        ensure(word == WIC_MARKER_TIMEOUT, || {
            format!("page {page:#x} of the run holds {word:#x}, not the timeout marker: {events:?}")
        })?;
    }
    let unmapped = events
        .iter()
        .any(|e| e.kind == fakegpu::EVENT_UNMAP && e.va == companion && e.length == u64::from(RUN_PAGES) * PAGE);
    ensure(unmapped, || format!("the slot's other run was not unmapped: {events:?}"))?;
    let state = fake.page_state(GPU, companion).map_err(|e| format!("page state: {e}"))?;
    ensure(state & fakegpu::PAGE_MAPPED == 0, || "the slot's other run is still mapped".into())?;
    // wicd's completion of that generation, sent before it read the expiry's record, comes
    // late: refused, not written into the run its warps read the timeout marker from.
    let data = [0x5au8; 64];
    let late = |arg: u64, length: u64| WicCommand {
        opcode: kabi::WIC_CMD_COMPLETE,
        space_id: space,
        gpu_id: GPU,
        pages: RUN_PAGES,
        va: run,
        arg,
        length,
        companion,
        ..WicCommand::default()
    };
    let mut stale = [late(data.as_ptr() as u64, data.len() as u64)];
    device.submit(&mut stale).map_err(|e| format!("complete: {e}"))?;
    ensure(stale[0].result == -libc::ESTALE, || {
        format!("a completion of the expired generation got {}, not ESTALE", stale[0].result)
    })?;
    let word = marker(memory, run);
    ensure(word == WIC_MARKER_TIMEOUT, || format!("the late completion wrote {word:#x} into the expired run"))?;
    let mut records = Vec::new();
    device.ring().read(&mut records, 16);
    let told = records.iter().any(|r| {
        r.expired && r.range_id == range && r.gpu_id == GPU && FaultEntry::decode_va(&r.entry, VaWidth::Bits57) == va
    });
    ensure(told, || format!("no expiry record for wicd: {records:?}"))?;
    // Once wicd read the record, the slot goes on: its next generation in the other run (which
    // unmaps this one), the one after in this run again.
    let mut next = [
        WicCommand { va: companion, companion: run, ..late(kabi::WIC_MARKER_CHANNEL_CLOSED, 0) },
        late(kabi::WIC_MARKER_CHANNEL_CLOSED, 0),
    ];
    device.submit(&mut next).map_err(|e| format!("complete: {e}"))?;
    ensure(next.iter().all(|c| c.result == 0), || {
        format!("the generations after the expiry record was read got {:?}", next.map(|c| c.result))
    })?;
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))
}

/// An expired fault whose page nvidia-uvm cannot map on its GPU (resident only on a GPU
/// without peer access) gets its marker and is released unmapped; held again when it comes
/// back, it would expire again every period and its warp never reach the marker. Its next
/// fault is passed instead, for nvidia-uvm to service, once: later faults there are held.
fn an_unmappable_page_is_passed_once(
    fake: &FakeGpu,
    memory: &Memory,
    device: &mut Device,
    space: u32,
) -> Result<(), String> {
    let va = memory.base() + 32 * PAGE;
    quiet_page(fake, device, space, kabi::WIC_RANGE_PCM, va)?;
    fake.reside(GPU, va, true).map_err(|e| format!("reside: {e}"))?;
    inject(fake, va)?;
    read_ring(device);
    set(BOUND.as_millis() as u32)?;
    wait_events(fake, BOUND + SLACK * 4, |seen| {
        let marker =
            seen.iter().position(|e| e.kind == fakegpu::EVENT_WRITE && e.va == va && e.data0 == WIC_MARKER_TIMEOUT);
        marker.is_some_and(|at| seen[at..].iter().any(|e| e.kind == fakegpu::EVENT_REPLAY && e.gpu_id == GPU))
    })?;
    set(0)?;
    let (again, _) = fake.inject(GPU, &[fault(va, AccessType::Read)]).map_err(|e| format!("inject: {e}"))?;
    ensure(again == [fakegpu::VERDICT_PASS], || {
        format!("the unmappable page's fault after its expiry was {again:?}, not passed")
    })?;
    let (later, _) = fake.inject(GPU, &[fault(va, AccessType::Read)]).map_err(|e| format!("inject: {e}"))?;
    ensure(later == [fakegpu::VERDICT_HOLD], || {
        format!("a later fault on the page was {later:?}: passed more than once")
    })?;
    fake.reside(GPU, va, false).map_err(|e| format!("reside: {e}"))?;
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))
}

/// A GPU producer's first write to a PAT page its kernel never touched: the page is resident
/// nowhere, which no map can map. The expiry's writable map populates it (zeroed, as
/// nvidia-uvm's first touch would) and maps it, instead of failing with ENODATA at every period.
fn an_untouched_pat_page_expires(
    fake: &FakeGpu,
    memory: &Memory,
    device: &mut Device,
    space: u32,
) -> Result<(), String> {
    let va = memory.base() + 36 * PAGE;
    let range = quiet_page(fake, device, space, kabi::WIC_RANGE_PAT, va)?;
    fake.untouched(va).map_err(|e| format!("untouched: {e}"))?;
    let (verdicts, _) = fake.inject(GPU, &[fault(va, AccessType::Write)]).map_err(|e| format!("inject: {e}"))?;
    ensure(verdicts == [fakegpu::VERDICT_HOLD], || format!("the PAT fault was {verdicts:?}"))?;
    read_ring(device);
    set(BOUND.as_millis() as u32)?;
    let events = wait_events(fake, BOUND + SLACK * 4, |seen| {
        let map = seen.iter().position(|e| e.kind == fakegpu::EVENT_MAP_WRITABLE && e.va == va);
        map.is_some_and(|at| seen[at..].iter().any(|e| e.kind == fakegpu::EVENT_REPLAY && e.gpu_id == GPU))
    })
    .map_err(|_| "the held fault on an untouched PAT page never expired".to_string());
    set(0)?;
    events?;
    let state = fake.page_state(GPU, va).map_err(|e| format!("page state: {e}"))?;
    ensure(state & fakegpu::PAGE_MAPPED != 0 && state & fakegpu::PAGE_WRITABLE != 0, || {
        format!("the untouched PAT page is {state:#x} after its expiry, not mapped writable")
    })?;
    device.unregister(range).map_err(|e| format!("unregister: {e}"))?;
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))
}

/// A held fault whose marker nvidia-uvm keeps refusing (its page is mapped on another GPU: a
/// write would not reach that GPU's view) stays held, retried at each run, and the faults held
/// beside it still expire within the bound.
fn one_refused_fault_holds_back_no_other(
    fake: &FakeGpu,
    memory: &Memory,
    device: &mut Device,
    space: u32,
) -> Result<(), String> {
    const OTHER_GPU: u32 = 2;
    set(0)?;
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
    let base = memory.base() + 8 * PAGE;
    device.register(space, kabi::WIC_RANGE_PCM, base, 16 * PAGE, 0).map_err(|e| format!("register: {e}"))?;
    let refused = base;
    // Mapped on GPU: completed (with another marker than the expiry's), its companion the
    // range's last page.
    let mut mapped = [WicCommand {
        opcode: kabi::WIC_CMD_COMPLETE,
        space_id: space,
        gpu_id: GPU,
        pages: 1,
        va: refused,
        arg: kabi::WIC_MARKER_CHANNEL_CLOSED,
        companion: base + 15 * PAGE,
        ..WicCommand::default()
    }];
    device.submit(&mut mapped).map_err(|e| format!("complete: {e}"))?;
    ensure(mapped[0].result == 0, || format!("complete: {}", mapped[0].result))?;
    let (verdicts, _) =
        fake.inject(OTHER_GPU, &[fault(refused, AccessType::Read)]).map_err(|e| format!("inject: {e}"))?;
    ensure(verdicts == [fakegpu::VERDICT_HOLD], || format!("the other GPU's fault was {verdicts:?}"))?;
    let others: Vec<u64> = (1..16).map(|page| base + page * PAGE).collect();
    for va in &others {
        inject(fake, *va)?;
    }
    read_ring(device);
    set(BOUND.as_millis() as u32)?;
    let started = Instant::now();
    let events = wait_events(fake, BOUND + SLACK * 4, |seen| others.iter().all(|va| completed(seen, *va).is_some()))?;
    let took = started.elapsed();
    ensure(took <= BOUND + SLACK, || format!("the faults beside the refused one expired only after {took:?}"))?;
    for va in &others {
        check_page(fake, memory, &events, *va)?;
    }
    let state = fake.page_state(OTHER_GPU, refused).map_err(|e| format!("page state: {e}"))?;
    ensure(state & fakegpu::PAGE_MAPPED == 0, || "the refused fault's page was mapped on its GPU".into())?;
    set(0)?;
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))
}

/// Every held fault is bounded, recorded or not. Past a full ring a fault is entered in the held
/// table unrecorded, and expires like any other. Past a full table it is held without an entry:
/// half the bound after it, the expiry completes the table's faults (none could be freed) and
/// replays the GPU, and the fault, coming back, takes an entry with its first hold's age, so
/// that it is completed within the bound and a period, not a second bound later.
fn a_fault_past_the_ring_or_the_table_is_bounded(
    fake: &FakeGpu,
    device: &mut Device,
    space: u32,
) -> Result<(), String> {
    /// Long enough to tell one bound from two under the VM's scheduling.
    const LONG_BOUND: Duration = Duration::from_millis(1000);
    set(0)?;
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
    let limits = device.limits();
    let (ring, table) = (u64::from(limits.ring_entries), u64::from(limits.max_held));
    let memory = Memory::new(fake, ((table + 1) * PAGE) as usize)?;
    let base = memory.base();
    let range = device
        .register(space, kabi::WIC_RANGE_PCM, base, (table + 1) * PAGE, 0)
        .map_err(|e| format!("register: {e}"))?;
    let pages = |from: u64, to: u64| (from..to).map(|i| fault(base + i * PAGE, AccessType::Read)).collect::<Vec<_>>();
    let hold_all = |faults: &[wic_engine::RawFaultEntry]| -> Result<(), String> {
        let (verdicts, _) = fake.inject(GPU, faults).map_err(|e| format!("inject: {e}"))?;
        ensure(verdicts.iter().all(|&v| v == fakegpu::VERDICT_HOLD), || "a fault on a wic page was not held".into())
    };

    // The ring fills (wicd reads nothing); one fault more is held, entered, not recorded.
    hold_all(&pages(0, ring))?;
    let dropped = device.ring().dropped();
    let past_ring = base + ring * PAGE;
    let held = Instant::now();
    inject(fake, past_ring)?;
    ensure(device.ring().dropped() == dropped + 1, || "the fault past the full ring was not counted".into())?;
    set(BOUND.as_millis() as u32)?;
    wait_events(fake, BOUND + SLACK * 4, |seen| completed(seen, past_ring).is_some())
        .map_err(|_| "the fault held past a full ring never expired".to_string())?;
    let took = held.elapsed();
    ensure(took <= BOUND + SLACK, || format!("the fault past the full ring expired only after {took:?}"))?;
    set(0)?;
    read_ring(device);
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;

    // The table fills (wicd reads the ring); one fault more is held without an entry.
    for chunk in pages(0, table).chunks(ring as usize) {
        hold_all(chunk)?;
        read_ring(device);
    }
    let past_table = base + table * PAGE;
    let held = Instant::now();
    inject(fake, past_table)?;
    set(LONG_BOUND.as_millis() as u32)?;
    // The relief's replay; then the fault comes back, as its warp would.
    wait_events(fake, LONG_BOUND + SLACK * 4, |seen| {
        seen.iter().any(|e| e.kind == fakegpu::EVENT_REPLAY && e.gpu_id == GPU)
    })
    .map_err(|_| "no replay for the fault held past a full table".to_string())?;
    let relieved = held.elapsed();
    inject(fake, past_table)?;
    wait_events(fake, LONG_BOUND * 2 + SLACK * 4, |seen| completed(seen, past_table).is_some())
        .map_err(|_| "the fault held past a full table never expired".to_string())?;
    let took = held.elapsed();
    set(0)?;
    ensure(took <= LONG_BOUND + LONG_BOUND / 4 + SLACK / 2, || {
        format!("the fault past the full table expired {took:?} after its first hold (its GPU replayed after {relieved:?}): more than the bound {LONG_BOUND:?} and a period")
    })?;
    println!("max-hold: faults past a full ring and a full table completed within the bound ({took:?} past the table, bound {LONG_BOUND:?})");
    read_ring(device);
    device.unregister(range).map_err(|e| format!("unregister: {e}"))?;
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))
}

/// When nvidia-uvm says, completing an expired fault, that the range's memory is no longer
/// managed (EFAULT: freed) or that the space's process is gone (ESRCH), the fault is released
/// unmapped and its GPU replayed; coming back, it is passed, not held again at every period
/// (a freed VA reused by the next program would stall its kernel; a dying process's teardown
/// expects its faults serviced).
fn gone_pages_are_not_held_again(device: &mut Device) -> Result<(), String> {
    let fake = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
    let memory = Memory::new(&fake, 4 * PAGE as usize)?;
    let space = device.attach(fake.fd()).map_err(|e| format!("attach: {e}"))?;
    let (freed, dead) = (memory.base(), memory.base() + 2 * PAGE);
    for va in [freed, dead] {
        device.register(space, kabi::WIC_RANGE_PCM, va, PAGE, 0).map_err(|e| format!("register: {e}"))?;
    }
    for (va, errno, what) in [(freed, libc::EFAULT, "a freed range"), (dead, libc::ESRCH, "a dead process")] {
        set(0)?;
        fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
        inject(&fake, va)?;
        read_ring(device);
        fake.fail(Fail { writes: 1, error: errno as u32, ..Default::default() }).map_err(|e| format!("fail: {e}"))?;
        set(BOUND.as_millis() as u32)?;
        wait_events(&fake, BOUND + SLACK * 4, |seen| {
            seen.iter().any(|e| e.kind == fakegpu::EVENT_REPLAY && e.gpu_id == GPU)
        })
        .map_err(|_| format!("the expiry of a fault on {what} did not replay its GPU"))?;
        set(0)?;
        let (again, _) = fake.inject(GPU, &[fault(va, AccessType::Read)]).map_err(|e| format!("inject: {e}"))?;
        ensure(again == [fakegpu::VERDICT_PASS], || {
            format!("the fault on {what} came back and was {again:?}, held again")
        })?;
    }
    device.detach(space).map_err(|e| format!("detach: {e}"))
}

/// A batch of wicd's holds the session while it runs (each step may fill a megabyte): the
/// expiry, when it waits, gets in between two of its steps, so a fault held elsewhere is still
/// completed within the bound. Here the batch is two completions of two spaces, so two steps;
/// the first one's write stalls past the bound, and so does the second's.
fn a_long_batch_lets_the_expiry_in(device: &mut Device) -> Result<(), String> {
    set(0)?;
    let open = || FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE));
    let (first, second, other) = (open()?, open()?, open()?);
    let (first_memory, second_memory, other_memory) = (
        Memory::new(&first, 2 * PAGE as usize)?,
        Memory::new(&second, 2 * PAGE as usize)?,
        Memory::new(&other, PAGE as usize)?,
    );
    let mut spaces = Vec::new();
    for (fake, memory, pages) in [(&first, &first_memory, 2), (&second, &second_memory, 2), (&other, &other_memory, 1)]
    {
        let space = device.attach(fake.fd()).map_err(|e| format!("attach: {e}"))?;
        device.register(space, kabi::WIC_RANGE_PCM, memory.base(), pages * PAGE, 0).map_err(|e| e.to_string())?;
        spaces.push(space);
    }
    first.reset().map_err(|e| e.to_string())?;
    let held = other_memory.base();
    inject(&other, held)?;
    read_ring(device);
    let complete = |space_id: u32, va: u64| WicCommand {
        opcode: kabi::WIC_CMD_COMPLETE,
        space_id,
        gpu_id: GPU,
        pages: 1,
        va,
        arg: kabi::WIC_MARKER_CHANNEL_CLOSED,
        companion: va + PAGE,
        ..WicCommand::default()
    };
    let mut batch = [complete(spaces[0], first_memory.base()), complete(spaces[1], second_memory.base())];
    let stall = Fail { writes: 1, flags: fakegpu::FAIL_STALL, ..Default::default() };
    first.fail(stall).map_err(|e| format!("arm the stall: {e}"))?;
    set(BOUND.as_millis() as u32)?;
    let fd = device.fd().as_raw_fd();
    let (expired, submitted) = std::thread::scope(|scope| {
        let commands = &mut batch;
        let submit = scope.spawn(move || submit_on(fd, commands));
        let expired = wait_events(&first, SLACK * 4, |seen| seen.iter().any(|e| e.kind == fakegpu::EVENT_STALLED))
            .map_err(|_| "the batch's first write never stalled".to_string())
            .and_then(|_| {
                // The bound passes while the batch's first step stalls; the second step stalls too.
                std::thread::sleep(BOUND + BOUND / 2);
                second.fail(stall).map_err(|e| format!("arm the second stall: {e}"))?;
                first.fail(Fail::default()).map_err(|e| format!("release the first stall: {e}"))?;
                wait_events(&other, SLACK * 2, |seen| completed(seen, held).is_some())
                    .map_err(|_| "the held fault did not expire while the batch went on".to_string())
            });
        let released = first.fail(Fail::default()).and(second.fail(Fail::default()));
        let submitted = submit.join().map_err(|_| "the submitting thread panicked".to_string());
        (expired.and_then(|e| released.map(|_| e).map_err(|e| e.to_string())), submitted)
    });
    set(0)?;
    expired.map_err(|e| format!("{e} (the batch: {submitted:?}, {:?})", batch.map(|c| c.result)))?;
    let done = submitted?.map_err(|e| format!("submit: {e}"))?;
    ensure(done == 2 && batch.iter().all(|c| c.result == 0), || {
        format!("the batch did {done} of 2: {:?}", batch.map(|c| c.result))
    })?;
    for space in spaces {
        device.detach(space).map_err(|e| format!("detach: {e}"))?;
    }
    Ok(())
}

/// With no bound and the fake GPU's state reset, page `va` registered alone as a range of
/// `kind`; its id.
fn quiet_page(fake: &FakeGpu, device: &Device, space: u32, kind: u32, va: u64) -> Result<u32, String> {
    set(0)?;
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
    device.register(space, kind, va, PAGE, 0).map_err(|e| format!("register: {e}"))
}

fn inject(fake: &FakeGpu, va: u64) -> Result<(), String> {
    let (verdicts, _) = fake.inject(GPU, &[fault(va, AccessType::Read)]).map_err(|e| format!("inject: {e}"))?;
    ensure(verdicts == [fakegpu::VERDICT_HOLD], || format!("the fault at {va:#x} was not held (verdict {verdicts:?})"))
}

fn read_ring(device: &mut Device) -> usize {
    let mut out = Vec::new();
    device.ring().read(&mut out, 4096)
}

/// The positions of the timeout marker's write into `va`, then a map of it on [`GPU`], then a
/// replay of that GPU, if all three were logged in that order.
fn completed(events: &[Event], va: u64) -> Option<(usize, usize, usize)> {
    let write =
        events.iter().position(|e| e.kind == fakegpu::EVENT_WRITE && e.va == va && e.data0 == WIC_MARKER_TIMEOUT)?;
    let map = write
        + events[write..]
            .iter()
            .position(|e| e.kind == fakegpu::EVENT_MAP && e.gpu_id == GPU && e.va <= va && va < e.va + e.length)?;
    let replay = map + events[map..].iter().position(|e| e.kind == fakegpu::EVENT_REPLAY && e.gpu_id == GPU)?;
    Some((write, map, replay))
}

fn check_page(fake: &FakeGpu, memory: &Memory, events: &[Event], va: u64) -> Result<(), String> {
    ensure(completed(events, va).is_some(), || {
        format!("page {va:#x} not written with the timeout marker, mapped and replayed: {events:?}")
    })?;
    let word = marker(memory, va);
    ensure(word == WIC_MARKER_TIMEOUT, || format!("page {va:#x} holds {word:#x}, not the timeout marker"))?;
    let state = fake.page_state(GPU, va).map_err(|e| format!("page state: {e}"))?;
    ensure(state & fakegpu::PAGE_MAPPED != 0, || format!("page {va:#x} is not mapped on the GPU"))
}
