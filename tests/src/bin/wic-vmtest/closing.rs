//! Unregistering a range and detaching a space complete the held faults with the
//! channel-closed marker while the pages are still wic pages: a fault that arrives meanwhile is
//! held and completed too, and when nvidia-uvm refuses to write or map a marker the call fails
//! with its errno and leaves the range and its held faults as they were (the warp stays
//! stalled rather than reading the page without its marker), so that the daemon can retry.
//! The fake GPU's armed failures and stalls (`WIC_FAKEGPU_IOC_FAIL`) stand in for nvidia-uvm
//! refusing (suspended, out of memory) and for a slow write.
//!
//! A fault held without a held-table entry (the table full), before UNREGISTER or while it
//! runs, gets the marker in its page too: the table cannot find it, its range remembers it.
//!
//! A held page that nvidia-uvm cannot map on the faulting GPU (resident only on a GPU without
//! peer access to it, `WIC_FAKEGPU_IOC_RESIDE`): a MAP fails with EXDEV and leaves the fault
//! held (no release, so no endless fault, release, fault again), and UNREGISTER still completes
//! it: marker written, released unmapped, serviced by nvidia-uvm once the range is gone.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use wic_engine::fault::AccessType;
use wic_kabi::{self as kabi, WicCommand, WIC_MARKER_CHANNEL_CLOSED};
use wic_kernel_io::device::raw::ioc_unregister;
use wic_kernel_io::fakegpu::{self, Event, Fail, FakeGpu};
use wic_kernel_io::{Device, DeviceError};

use crate::rig::{ensure, fault, marker, wait_events, Memory, DEVICE, GPU};

const PAGE: u64 = 4096;
/// Pages of each range the steps register.
const PAGES: u64 = 4;

pub fn run() -> Result<(), String> {
    let fake = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
    // The held table's worth of pages, and room for the other steps' ranges.
    let mut memory = Memory::new(&fake, (u64::from(kabi::WIC_MAX_HELD) * PAGE + (1 << 20)) as usize)?;
    let mut device =
        Device::open(Path::new(DEVICE), Duration::from_secs(5)).map_err(|e| format!("open {DEVICE}: {e}"))?;
    let space = device.attach(fake.fd()).map_err(|e| format!("attach: {e}"))?;
    let mut step = Step { fake: &fake, device: &mut device, space };

    // Each step works on ranges of its own: all run, and every failure is reported. The last
    // detaches the space.
    let results = [
        step.unregister_refused(
            "write",
            Fail { writes: 1, error: Errno::EAGAIN as u32, ..Default::default() },
            &mut memory,
        )
        .map_err(|e| format!("unregister with the marker's write refused: {e}")),
        step.unregister_refused(
            "map",
            Fail { maps: 1, error: Errno::ENOMEM as u32, ..Default::default() },
            &mut memory,
        )
        .map_err(|e| format!("unregister with the marker page's map refused: {e}")),
        step.page_gone(&mut memory).map_err(|e| format!("unregister of a page that is gone: {e}")),
        step.fault_while_unregistering(&mut memory).map_err(|e| format!("a fault while unregistering: {e}")),
        step.unmappable(&mut memory).map_err(|e| format!("a held page the GPU cannot map: {e}")),
        step.untabled_faults_get_the_marker(&mut memory)
            .map_err(|e| format!("faults held without a table entry on an unregistered range: {e}")),
        step.detach_refused(&mut memory).map_err(|e| format!("detach with a marker's write refused: {e}")),
    ];
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
    let failed: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    ensure(failed.is_empty(), || failed.join("; "))
}

struct Step<'a> {
    fake: &'a FakeGpu,
    device: &'a mut Device,
    space: u32,
}

impl Step<'_> {
    /// A fresh PCM range of [`PAGES`] pages, with the fake GPU's log emptied and the ring drained.
    fn range(&mut self, memory: &mut Memory) -> Result<(u64, u32), String> {
        self.fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
        let base = memory.take(PAGES * PAGE)?;
        let id = self
            .device
            .register(self.space, kabi::WIC_RANGE_PCM, base, PAGES * PAGE, 0)
            .map_err(|e| format!("register: {e}"))?;
        Ok((base, id))
    }

    /// Injects a read of `va` and expects `verdict`.
    fn inject(&self, va: u64, verdict: u8) -> Result<(), String> {
        let (verdicts, _) =
            self.fake.inject(GPU, &[fault(va, AccessType::Read)]).map_err(|e| format!("inject: {e}"))?;
        ensure(verdicts == [verdict], || {
            let want = if verdict == fakegpu::VERDICT_HOLD { "held" } else { "passed" };
            format!("the fault at {va:#x} was not {want} (verdict {verdicts:?})")
        })
    }

    /// Records read from the ring (and dropped).
    fn drain(&mut self) -> usize {
        let mut out = Vec::new();
        self.device.ring().read(&mut out, 4096)
    }

    /// Replays the GPU, as the daemon or another completion would.
    fn replay(&self) -> Result<(), String> {
        let mut cmds = [WicCommand { opcode: kabi::WIC_CMD_REPLAY, gpu_id: GPU, ..Default::default() }];
        self.device.submit(&mut cmds).map_err(|e| format!("replay: {e}"))?;
        ensure(cmds[0].result == 0, || format!("replay: result {}", cmds[0].result))
    }

    /// The page is held, as a stalled warp sees it: not mapped on the GPU (and, with `unwritten`,
    /// without the marker), and a replay's fault on it is held again rather than serviced.
    fn still_held(&self, memory: &Memory, va: u64, unwritten: bool) -> Result<(), String> {
        ensure(!self.mapped(va)?, || format!("page {va:#x} is mapped on the GPU"))?;
        ensure(!unwritten || marker(memory, va) != WIC_MARKER_CHANNEL_CLOSED, || {
            format!("page {va:#x} holds the marker already")
        })?;
        self.replay()?;
        self.inject(va, fakegpu::VERDICT_HOLD)?;
        let events = self.events()?;
        ensure(!events.iter().any(|e| e.kind == fakegpu::EVENT_SERVICED || (is_map(e) && e.va == va)), || {
            format!("page {va:#x} was serviced or mapped: {events:?}")
        })
    }

    /// The page was completed with the marker: written, then mapped on the GPU, and the GPU
    /// replayed after the map.
    fn completed(&self, memory: &Memory, events: &[Event], va: u64) -> Result<(), String> {
        let write = events
            .iter()
            .position(|e| e.kind == fakegpu::EVENT_WRITE && e.va == va && e.data0 == WIC_MARKER_CHANNEL_CLOSED);
        let map = events.iter().rposition(|e| is_map(e) && e.gpu_id == GPU && e.va <= va && va < e.va + e.length);
        let replay = events.iter().rposition(|e| e.kind == fakegpu::EVENT_REPLAY && e.gpu_id == GPU);
        ensure(matches!((write, map, replay), (Some(w), Some(m), Some(r)) if w < m && m < r), || {
            format!("page {va:#x} not written with the marker, mapped and replayed in that order: {events:?}")
        })?;
        ensure(marker(memory, va) == WIC_MARKER_CHANNEL_CLOSED, || format!("page {va:#x} does not hold the marker"))?;
        ensure(self.mapped(va)?, || format!("page {va:#x} is not mapped"))
    }

    fn mapped(&self, va: u64) -> Result<bool, String> {
        let state = self.fake.page_state(GPU, va).map_err(|e| format!("page state: {e}"))?;
        Ok(state & fakegpu::PAGE_MAPPED != 0)
    }

    fn events(&self) -> Result<Vec<Event>, String> {
        let (events, overflow) = self.fake.events(4096, 0).map_err(|e| format!("events: {e}"))?;
        ensure(overflow == 0, || format!("{overflow} fake-GPU events lost"))?;
        Ok(events)
    }

    /// (a) nvidia-uvm refuses the marker's write or map: UNREGISTER fails with its errno, the
    /// fault stays held through a replay, and the next UNREGISTER completes it.
    fn unregister_refused(&mut self, what: &str, fail: Fail, memory: &mut Memory) -> Result<(), String> {
        let (base, id) = self.range(memory)?;
        let va = base + PAGE;
        self.inject(va, fakegpu::VERDICT_HOLD)?;
        self.drain();
        let errno = Errno::from_raw(fail.error as i32);
        self.fake.fail(fail).map_err(|e| format!("arm the {what} failure: {e}"))?;
        expect_errno("UNREGISTER", self.device.unregister(id), errno)?;
        self.still_held(memory, va, fail.writes > 0)?;
        self.inject(base + 2 * PAGE, fakegpu::VERDICT_HOLD)?;
        ensure(self.drain() == 1, || "a new fault on the range left registered was not recorded".into())?;

        self.device.unregister(id).map_err(|e| format!("UNREGISTER once nvidia-uvm accepts again: {e}"))?;
        let events = self.events()?;
        self.completed(memory, &events, va)?;
        self.completed(memory, &events, base + 2 * PAGE)?;
        self.inject(base + 3 * PAGE, fakegpu::VERDICT_PASS)?;
        expect_errno("UNREGISTER it again", self.device.unregister(id), Errno::ENOENT)
    }

    /// A page nvidia-uvm says is gone (EFAULT: no longer managed memory) is dropped from the
    /// held faults rather than blocking UNREGISTER for ever.
    fn page_gone(&mut self, memory: &mut Memory) -> Result<(), String> {
        let (base, id) = self.range(memory)?;
        self.inject(base, fakegpu::VERDICT_HOLD)?;
        self.fake
            .fail(Fail { writes: 1, error: Errno::EFAULT as u32, ..Default::default() })
            .map_err(|e| format!("arm: {e}"))?;
        self.device.unregister(id).map_err(|e| format!("UNREGISTER: {e}"))?;
        let events = self.events()?;
        ensure(events.iter().any(|e| e.kind == fakegpu::EVENT_REPLAY && e.gpu_id == GPU), || {
            format!("no replay: {events:?}")
        })?;
        self.inject(base, fakegpu::VERDICT_PASS)
    }

    /// (b) A fault on the range after UNREGISTER started (its first marker write stalled) is
    /// held, not recorded, and completed with the marker by that UNREGISTER.
    fn fault_while_unregistering(&mut self, memory: &mut Memory) -> Result<(), String> {
        let (base, id) = self.range(memory)?;
        self.inject(base, fakegpu::VERDICT_HOLD)?;
        self.drain();
        let stalled = self.unregister_with_fault_during(id, base + PAGE)?;
        ensure(stalled.iter().any(|e| e.kind == fakegpu::EVENT_STALLED && e.va == base), || {
            format!("not the marker's write stalled: {stalled:?}")
        })?;
        ensure(self.drain() == 0, || "the fault during UNREGISTER was recorded".into())?;
        let events = [stalled, self.events()?].concat();
        ensure(!events.iter().any(|e| e.kind == fakegpu::EVENT_SERVICED), || {
            format!("a fault was serviced: {events:?}")
        })?;
        self.completed(memory, &events, base)?;
        self.completed(memory, &events, base + PAGE)
    }

    /// UNREGISTER of range `id` with its first marker write stalled and, while it stalls, a
    /// fault on `va`, which must be held; the UNREGISTER must then succeed. Returns the fake
    /// GPU's events up to the stall.
    fn unregister_with_fault_during(&mut self, id: u32, va: u64) -> Result<Vec<Event>, String> {
        self.fake
            .fail(Fail { writes: 1, flags: fakegpu::FAIL_STALL, ..Default::default() })
            .map_err(|e| format!("arm the stall: {e}"))?;
        let fd = self.device.fd().as_raw_fd();
        let fake = self.fake;
        let (stalled, verdicts, unregistered) = std::thread::scope(|scope| {
            // SAFETY: checked ABI; the module reads one u32; the session outlives the scope.
            let unregister = scope.spawn(move || unsafe { ioc_unregister(fd, &id) });
            let stalled =
                wait_events(fake, Duration::from_secs(5), |seen| seen.iter().any(|e| e.kind == fakegpu::EVENT_STALLED));
            let verdicts = fake.inject(GPU, &[fault(va, AccessType::Read)]);
            let released = fake.fail(Fail::default());
            let unregistered = unregister.join().map_err(|_| "the UNREGISTER thread panicked".to_string());
            (
                stalled.and_then(|s| released.map(|_| s).map_err(|e| format!("release the stall: {e}"))),
                verdicts,
                unregistered,
            )
        });
        let stalled = stalled?;
        let (verdicts, _) = verdicts.map_err(|e| format!("inject: {e}"))?;
        ensure(verdicts == [fakegpu::VERDICT_HOLD], || {
            format!("the fault during UNREGISTER was not held (verdict {verdicts:?})")
        })?;
        unregistered?.map_err(|errno| format!("UNREGISTER: {errno}"))?;
        Ok(stalled)
    }

    /// (c) A held page resident out of the GPU's reach: a completion's map fails with EXDEV
    /// and releases nothing; once reachable again the completion releases it; UNREGISTER of a
    /// range with such a held page writes its marker and releases it unmapped instead of
    /// failing for ever.
    fn unmappable(&mut self, memory: &mut Memory) -> Result<(), String> {
        let (base, id) = self.range(memory)?;
        self.inject(base, fakegpu::VERDICT_HOLD)?;
        ensure(self.drain() == 1, || "the held fault was not recorded".into())?;
        self.fake.reside(GPU, base, true).map_err(|e| format!("reside: {e}"))?;
        let complete = WicCommand {
            opcode: kabi::WIC_CMD_COMPLETE,
            space_id: self.space,
            gpu_id: GPU,
            pages: 1,
            va: base,
            arg: kabi::WIC_MARKER_TIMEOUT,
            companion: base + 2 * PAGE,
            ..Default::default()
        };
        let mut cmds = [complete];
        let done = self.device.submit(&mut cmds).map_err(|e| format!("COMPLETE: {e}"))?;
        ensure(done == 0 && cmds[0].result == -(Errno::EXDEV as i32), || {
            format!(
                "COMPLETE of a page the GPU cannot reach: expected EXDEV, got count {done}, result {}",
                cmds[0].result
            )
        })?;
        // Still held: a replay's fault on it is held again and not recorded again.
        self.still_held(memory, base, false)?;
        ensure(self.drain() == 0, || "the fault after the failed map was recorded again".into())?;

        self.fake.reside(GPU, base, false).map_err(|e| format!("reside: {e}"))?;
        let mut cmds = [complete];
        self.device.submit(&mut cmds).map_err(|e| format!("COMPLETE: {e}"))?;
        ensure(cmds[0].result == 0, || format!("COMPLETE once reachable: result {}", cmds[0].result))?;
        ensure(self.mapped(base)?, || "the page is not mapped".into())?;

        // UNREGISTER with a held page out of reach: marker written, released unmapped.
        let va = base + PAGE;
        self.inject(va, fakegpu::VERDICT_HOLD)?;
        self.fake.reside(GPU, va, true).map_err(|e| format!("reside: {e}"))?;
        self.events()?;
        self.device.unregister(id).map_err(|e| format!("UNREGISTER with a held page the GPU cannot reach: {e}"))?;
        let events = self.events()?;
        let write = events
            .iter()
            .position(|e| e.kind == fakegpu::EVENT_WRITE && e.va == va && e.data0 == WIC_MARKER_CHANNEL_CLOSED);
        let replay = events.iter().rposition(|e| e.kind == fakegpu::EVENT_REPLAY && e.gpu_id == GPU);
        ensure(matches!((write, replay), (Some(w), Some(r)) if w < r), || {
            format!("no marker write then replay: {events:?}")
        })?;
        ensure(marker(memory, va) == WIC_MARKER_CHANNEL_CLOSED, || format!("page {va:#x} does not hold the marker"))?;
        ensure(!self.mapped(va)?, || format!("page {va:#x} is mapped"))?;
        // Its fault comes back and is nvidia-uvm's to service.
        self.inject(va, fakegpu::VERDICT_PASS)
    }

    /// DETACH with a marker's write refused fails, keeps the space, its ranges and their held
    /// faults; the next DETACH completes them all.
    fn detach_refused(&mut self, memory: &mut Memory) -> Result<(), String> {
        let (first, _) = self.range(memory)?;
        let second = memory.take(PAGES * PAGE)?;
        self.device
            .register(self.space, kabi::WIC_RANGE_PCM, second, PAGES * PAGE, 0)
            .map_err(|e| format!("register: {e}"))?;
        self.inject(first, fakegpu::VERDICT_HOLD)?;
        self.inject(second + PAGE, fakegpu::VERDICT_HOLD)?;
        self.fake
            .fail(Fail { writes: 1, error: Errno::EAGAIN as u32, ..Default::default() })
            .map_err(|e| format!("arm: {e}"))?;
        expect_errno("DETACH", self.device.detach(self.space), Errno::EAGAIN)?;
        // The step that met the refusal wrote the other page's marker (one call to nvidia-uvm
        // for both); neither page is mapped, the refused one is unwritten.
        self.still_held(memory, first, false)?;
        self.still_held(memory, second + PAGE, false)?;
        let unwritten =
            [first, second + PAGE].iter().filter(|va| marker(memory, **va) != WIC_MARKER_CHANNEL_CLOSED).count();
        ensure(unwritten == 1, || {
            format!("{unwritten} of the two held pages lack the marker after one refused write")
        })?;
        self.device.detach(self.space).map_err(|e| format!("DETACH once nvidia-uvm accepts again: {e}"))?;
        let events = self.events()?;
        self.completed(memory, &events, first)?;
        self.completed(memory, &events, second + PAGE)?;
        self.inject(second + 2 * PAGE, fakegpu::VERDICT_PASS)?;
        expect_errno("DETACH it again", self.device.detach(self.space), Errno::ENOENT)
    }
}

impl Step<'_> {
    /// Faults on a range held without a held-table entry (the table is full): the table does
    /// not know their pages, yet once the range is gone they come back at a replay and are
    /// passed, and nvidia-uvm services them. So UNREGISTER writes the closed marker into their
    /// pages first, one held before UNREGISTER began and one held while it ran, leaves them
    /// unmapped (which GPU faulted is not known), then replays the GPUs on which the space held
    /// faults: the warps fault again and read the marker. A page completed after its fault was
    /// held keeps what the completion wrote.
    fn untabled_faults_get_the_marker(&mut self, memory: &mut Memory) -> Result<(), String> {
        let held = u64::from(kabi::WIC_MAX_HELD);
        let (base, small) = self.range(memory)?;
        self.inject(base, fakegpu::VERDICT_HOLD)?;
        let big = memory.take((held - 1) * PAGE)?;
        let big_id = self
            .device
            .register(self.space, kabi::WIC_RANGE_PCM, big, (held - 1) * PAGE, 0)
            .map_err(|e| format!("register: {e}"))?;
        let pages: Vec<u64> = (0..held - 1).map(|p| big + p * PAGE).collect();
        // In chunks the ring holds, read as they come: the held table fills, not the ring.
        for chunk in pages.chunks(256) {
            let entries: Vec<_> = chunk.iter().map(|va| fault(*va, AccessType::Read)).collect();
            let (verdicts, _) = self.fake.inject(GPU, &entries).map_err(|e| format!("inject: {e}"))?;
            ensure(verdicts.iter().all(|v| *v == fakegpu::VERDICT_HOLD), || {
                "a fault filling the held table was not held".into()
            })?;
            self.drain();
        }
        let before = base + PAGE;
        let during = base + 2 * PAGE;
        let served = base + 3 * PAGE;
        let dropped = self.device.ring().dropped();
        self.inject(before, fakegpu::VERDICT_HOLD)?;
        self.inject(served, fakegpu::VERDICT_HOLD)?;
        ensure(self.device.ring().dropped() == dropped + 2, || "a fault past the full held table was recorded".into())?;
        // wicd completes that page (here with the timeout marker): it is no longer awaiting one.
        let mut cmds = [WicCommand {
            opcode: kabi::WIC_CMD_COMPLETE,
            space_id: self.space,
            gpu_id: GPU,
            pages: 1,
            va: served,
            arg: kabi::WIC_MARKER_TIMEOUT,
            // A completion names the slot's other run; unmapping it leaves its fault as it was.
            companion: before,
            ..Default::default()
        }];
        self.device.submit(&mut cmds).map_err(|e| format!("COMPLETE: {e}"))?;
        ensure(cmds[0].result == 0, || format!("COMPLETE of the page: result {}", cmds[0].result))?;
        self.fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;

        // UNREGISTER stalls on the first marker it writes (the tabled fault's page): a fault
        // then finds the table still full.
        let stalled = self.unregister_with_fault_during(small, during)?;
        ensure(self.device.ring().dropped() == dropped + 3, || {
            "the fault during UNREGISTER took an entry: the table was not full".into()
        })?;
        let events = [stalled, self.events()?].concat();
        self.completed(memory, &events, base)?;
        let replay = events.iter().rposition(|e| e.kind == fakegpu::EVENT_REPLAY && e.gpu_id == GPU);
        for va in [before, during] {
            let write = events
                .iter()
                .position(|e| e.kind == fakegpu::EVENT_WRITE && e.va == va && e.data0 == WIC_MARKER_CHANNEL_CLOSED);
            ensure(matches!((write, replay), (Some(w), Some(r)) if w < r), || {
                format!(
                    "page {va:#x}, held without an entry, not written with the marker before the replay: {events:?}"
                )
            })?;
            ensure(marker(memory, va) == WIC_MARKER_CHANNEL_CLOSED, || {
                format!("page {va:#x} does not hold the marker")
            })?;
            ensure(!self.mapped(va)?, || format!("page {va:#x} is mapped"))?;
            // Its fault comes back and is nvidia-uvm's to service: the warp reads the marker.
            self.inject(va, fakegpu::VERDICT_PASS)?;
        }
        // The page completed since its fault was held gets no closed marker over what it holds.
        ensure(!events.iter().any(|e| e.kind == fakegpu::EVENT_WRITE && e.va == served), || {
            format!("the page completed after its fault was held was written again: {events:?}")
        })?;
        ensure(marker(memory, served) == kabi::WIC_MARKER_TIMEOUT, || {
            format!("page {served:#x} no longer holds what its completion wrote")
        })?;
        self.device.unregister(big_id).map_err(|e| format!("UNREGISTER of the full range: {e}"))
    }
}

fn is_map(e: &Event) -> bool {
    e.kind == fakegpu::EVENT_MAP || e.kind == fakegpu::EVENT_MAP_WRITABLE
}

fn expect_errno(what: &str, got: Result<(), DeviceError>, want: Errno) -> Result<(), String> {
    match got {
        Err(DeviceError::Call { errno, .. }) if errno == want => Ok(()),
        other => Err(format!("{what}: expected {want:?}, got {other:?}")),
    }
}
