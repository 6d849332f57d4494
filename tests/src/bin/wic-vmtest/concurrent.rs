//! Batches submitted from several threads run at once (`WIC_MAX_CONCURRENT_BATCHES` of them):
//! a batch waiting on nvidia-uvm in one space no longer holds back another space's; a further
//! batch waits for one of them to end; the expiry still gets in between the steps of every
//! batch; batches running together never mix their data, while ranges come and go and the
//! expiry runs beside them; the io_uring chunks of one batch still run in order; and wicd's
//! shim backend activates two applications at once, one lane each.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use wic_engine::fault::AccessType;
use wic_engine::ChannelSpec;
use wic_kabi::{self as kabi, WicCommand, WIC_MARKER_CHANNEL_CLOSED, WIC_MAX_CONCURRENT_BATCHES};
use wic_kernel_io::device::raw;
use wic_kernel_io::fakegpu::{self, Fail, FakeGpu};
use wic_kernel_io::{Device, Submission, UringSubmitter};

use crate::rig::{
    drain_log, ensure, fault, host_spec, marker, set_max_hold_ms, submit_on, wait_events, Daemon, Memory, DEVICE, GPU,
};

const PAGE: u64 = 4096;
/// Long enough for a batch that is not held back to end on a loaded VM; far below the fake
/// GPU's own 10 s limit on a stall.
const RUNS_WITHIN: Duration = Duration::from_secs(3);
const BOUND_MS: u32 = 200;

/// A check on the scenario's session.
type Check = fn(&Device) -> Result<(), String>;

pub fn run() -> Result<(), String> {
    let device = Device::open(std::path::Path::new(DEVICE), Duration::from_secs(5))
        .map_err(|e| format!("open {DEVICE}: {e}"))?;
    set_max_hold_ms(0)?;
    let checks: [(&str, Check); 5] = [
        (
            "a batch stalled in one space holds back no other space",
            a_batch_stalled_in_one_space_holds_back_no_other_space,
        ),
        ("a batch past the limit waits for one to end", a_batch_past_the_limit_waits_for_one_to_end),
        ("the expiry gets in between the steps of every batch", the_expiry_gets_in_between_the_steps_of_every_batch),
        ("batches at once keep their data apart", batches_at_once_keep_their_data_apart),
        ("the chunks of one io_uring batch run in order", the_chunks_of_one_io_uring_batch_run_in_order),
    ];
    let outcome = checks.iter().try_for_each(|(name, check)| check(&device).map_err(|e| format!("{name}: {e}")));
    set_max_hold_ms(0)?;
    outcome?;
    // One session at a time: the daemon's is next.
    drop(device);
    wicd_activates_two_applications_at_once().map_err(|e| format!("wicd activates two applications at once: {e}"))
}

/// An application's space with `pages` pages of managed memory registered as one PCM range.
struct Space {
    fake: FakeGpu,
    memory: Memory,
    id: u32,
    range: u32,
}

impl Space {
    fn open(device: &Device, pages: u64) -> Result<Self, String> {
        let fake = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
        let memory = Memory::new(&fake, (pages * PAGE) as usize)?;
        let id = device.attach(fake.fd()).map_err(|e| format!("attach: {e}"))?;
        let range = device
            .register(id, kabi::WIC_RANGE_PCM, memory.base(), pages * PAGE, 0)
            .map_err(|e| format!("register: {e}"))?;
        fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
        drain_log(&fake)?;
        Ok(Self { fake, memory, id, range })
    }

    /// A fault of a warp of [`GPU`] reading page `page`, which the module holds.
    fn hold(&self, page: u64) -> Result<u64, String> {
        let va = self.memory.base() + page * PAGE;
        let (verdicts, _) =
            self.fake.inject(GPU, &[fault(va, AccessType::Read)]).map_err(|e| format!("inject: {e}"))?;
        ensure(verdicts == [fakegpu::VERDICT_HOLD], || format!("the fault at {va:#x} was not held: {verdicts:?}"))?;
        Ok(va)
    }

    /// Waits until the expiry wrote its marker into `va`.
    fn wait_expired(&self, va: u64, within: Duration) -> Result<(), String> {
        wait_events(&self.fake, within, |seen| seen.iter().any(|e| e.kind == fakegpu::EVENT_WRITE && e.va == va))
            .map(|_| ())
    }

    /// A completion of the run at page `page` with `marker`, its companion the page after.
    fn complete(&self, page: u64, marker: u64) -> WicCommand {
        let va = self.memory.base() + page * PAGE;
        WicCommand {
            opcode: kabi::WIC_CMD_COMPLETE,
            space_id: self.id,
            gpu_id: GPU,
            pages: 1,
            va,
            arg: marker,
            companion: va + PAGE,
            ..WicCommand::default()
        }
    }

    /// Its next fill stalls in the fake GPU until [`Space::release`].
    fn stall(&self) -> Result<(), String> {
        self.fake.fail(Fail { writes: 1, flags: fakegpu::FAIL_STALL, ..Default::default() }).map_err(|e| e.to_string())
    }

    fn release(&self) -> Result<(), String> {
        self.fake.fail(Fail::default()).map_err(|e| e.to_string())
    }

    fn wait_stalled(&self) -> Result<(), String> {
        wait_stalls(&self.fake, 1)
    }

    fn detach(self, device: &Device) -> Result<(), String> {
        device.detach(self.id).map_err(|e| format!("detach: {e}"))
    }
}

/// Waits for `count` stalls (the log is one for all spaces: one wait sees them all).
fn wait_stalls(fake: &FakeGpu, count: usize) -> Result<(), String> {
    wait_events(fake, RUNS_WITHIN, |seen| seen.iter().filter(|e| e.kind == fakegpu::EVENT_STALLED).count() >= count)
        .map(|_| ())
        .map_err(|_| format!("{count} fills never stalled"))
}

/// Submits `commands` on a thread of `scope`; the batch's count (or error) and its results
/// come back on the receiver when it ends.
fn submit_in<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    fd: RawFd,
    mut commands: Vec<WicCommand>,
) -> mpsc::Receiver<(nix::Result<i32>, Vec<i32>)> {
    let (tx, rx) = mpsc::channel();
    scope.spawn(move || {
        let done = submit_on(fd, &mut commands);
        let _ = tx.send((done, commands.iter().map(|c| c.result).collect()));
    });
    rx
}

/// Fails unless the batch of `n` commands ended within [`RUNS_WITHIN`], every command done.
fn ended(rx: &mpsc::Receiver<(nix::Result<i32>, Vec<i32>)>, n: i32, what: &str) -> Result<(), String> {
    let (done, results) = rx.recv_timeout(RUNS_WITHIN).map_err(|_| format!("{what} did not end"))?;
    ensure(done == Ok(n) && results.iter().all(|&r| r == 0), || format!("{what}: {done:?}, results {results:?}"))
}

/// A batch whose fill waits on nvidia-uvm in one space (here the fake GPU's stall) no longer
/// keeps a batch of another space waiting: both run at once. With one lock for every batch,
/// the second waited for the first to end.
fn a_batch_stalled_in_one_space_holds_back_no_other_space(device: &Device) -> Result<(), String> {
    let (stalled, free) = (Space::open(device, 2)?, Space::open(device, 2)?);
    stalled.stall()?;
    let fd = device.fd().as_raw_fd();
    std::thread::scope(|scope| {
        let first = submit_in(scope, fd, vec![stalled.complete(0, WIC_MARKER_CHANNEL_CLOSED)]);
        let outcome = stalled.wait_stalled().and_then(|()| {
            let second = submit_in(scope, fd, vec![free.complete(0, WIC_MARKER_CHANNEL_CLOSED)]);
            ended(&second, 1, "the batch of the other space, while the first stalled")
        });
        let released = stalled.release();
        outcome.and(released).and(ended(&first, 1, "the stalled batch, released"))
    })?;
    for space in [&stalled, &free] {
        let word = marker(&space.memory, space.memory.base());
        ensure(word == WIC_MARKER_CHANNEL_CLOSED, || format!("a run holds {word:#x}, not its marker"))?;
    }
    stalled.detach(device)?;
    free.detach(device)
}

/// `WIC_MAX_CONCURRENT_BATCHES` batches stalled at once: one more waits for a group, and runs
/// once one of them ends.
fn a_batch_past_the_limit_waits_for_one_to_end(device: &Device) -> Result<(), String> {
    let limit = WIC_MAX_CONCURRENT_BATCHES as usize;
    let spaces = (0..=limit).map(|_| Space::open(device, 2)).collect::<Result<Vec<_>, _>>()?;
    let fd = device.fd().as_raw_fd();
    std::thread::scope(|scope| {
        let mut running = Vec::new();
        let mut outcome = Ok(());
        for space in &spaces[..limit] {
            outcome = outcome.and_then(|()| space.stall());
            running.push(submit_in(scope, fd, vec![space.complete(0, WIC_MARKER_CHANNEL_CLOSED)]));
            outcome = outcome.and_then(|()| space.wait_stalled());
        }
        let last = &spaces[limit];
        let waiting = submit_in(scope, fd, vec![last.complete(0, WIC_MARKER_CHANNEL_CLOSED)]);
        outcome = outcome.and_then(|()| match waiting.recv_timeout(Duration::from_millis(500)) {
            Err(_) => Ok(()),
            Ok(got) => Err(format!("a batch past the limit ran while {limit} stalled: {got:?}")),
        });
        // One of them ends: the one waiting takes its group.
        outcome = outcome.and_then(|()| spaces[0].release()).and_then(|()| ended(&running[0], 1, "the first batch"));
        outcome = outcome.and_then(|()| ended(&waiting, 1, "the batch past the limit, once one ended"));
        for (space, batch) in spaces[1..limit].iter().zip(&running[1..]) {
            let released = space.release();
            outcome = outcome.and(released).and_then(|()| ended(batch, 1, "a stalled batch, released"));
        }
        for space in &spaces {
            let _ = space.release();
        }
        outcome
    })?;
    for space in spaces {
        space.detach(device)?;
    }
    Ok(())
}

/// Two batches run at once, each of two steps (completions of two spaces); both first steps
/// stall past the bound. The expiry waits for both to be between two steps, gets in there, and
/// completes a fault held in a third space while both second steps stall.
fn the_expiry_gets_in_between_the_steps_of_every_batch(device: &Device) -> Result<(), String> {
    let spaces = (0..5).map(|_| Space::open(device, 2)).collect::<Result<Vec<_>, _>>()?;
    let [a1, a2, b1, b2, other] = &spaces[..] else { unreachable!() };
    let held = other.hold(0)?;
    let fd = device.fd().as_raw_fd();
    a1.stall()?;
    b1.stall()?;
    std::thread::scope(|scope| {
        let batch = |first: &Space, second: &Space| {
            vec![first.complete(0, WIC_MARKER_CHANNEL_CLOSED), second.complete(0, WIC_MARKER_CHANNEL_CLOSED)]
        };
        let a = submit_in(scope, fd, batch(a1, a2));
        let b = submit_in(scope, fd, batch(b1, b2));
        let outcome = wait_stalls(&a1.fake, 2).and_then(|()| set_max_hold_ms(BOUND_MS)).and_then(|()| {
            std::thread::sleep(Duration::from_millis(u64::from(BOUND_MS) * 3 / 2));
            a2.stall()?;
            b2.stall()?;
            a1.release()?;
            b1.release()?;
            other
                .wait_expired(held, RUNS_WITHIN)
                .map_err(|_| "the held fault did not expire while both batches stalled in their second step".into())
        });
        for space in [a1, a2, b1, b2] {
            let _ = space.release();
        }
        outcome.and(ended(&a, 2, "the first batch")).and(ended(&b, 2, "the second batch"))
    })?;
    set_max_hold_ms(0)?;
    let word = marker(&other.memory, held);
    ensure(word == kabi::WIC_MARKER_TIMEOUT, || format!("the expired page holds {word:#x}"))?;
    for space in spaces {
        space.detach(device)?;
    }
    Ok(())
}

/// Threads that each complete their own runs with their own data, batch after batch, all at
/// once, with more threads than batches may run together; meanwhile a range is registered and
/// unregistered again and again (calls that run alone) and the expiry completes faults held in
/// another space. Every run ends with the data its thread wrote last: no batch's data went
/// into another's run.
fn batches_at_once_keep_their_data_apart(device: &Device) -> Result<(), String> {
    const THREADS: usize = WIC_MAX_CONCURRENT_BATCHES as usize + 2;
    const ROUNDS: usize = 200;
    const RUNS: u64 = 8;
    let spaces = (0..THREADS).map(|_| Space::open(device, 2 * RUNS)).collect::<Result<Vec<_>, _>>()?;
    const EXPIRIES: u64 = 3;
    // Faults for the expiry, one page each; the churned range comes and goes.
    let expiring = Space::open(device, EXPIRIES)?;
    let churned = Space::open(device, 1)?;
    device.unregister(churned.range).map_err(|e| format!("unregister: {e}"))?;
    let fd = device.fd().as_raw_fd();
    set_max_hold_ms(BOUND_MS)?;
    let stop = AtomicBool::new(false);
    let outcome = std::thread::scope(|scope| {
        let churn = scope.spawn(|| -> Result<u64, String> {
            let mut turns = 0;
            let mut range = kabi::WicRange {
                space_id: churned.id,
                kind: kabi::WIC_RANGE_PCM,
                start: churned.memory.base(),
                length: PAGE,
                ..Default::default()
            };
            while !stop.load(Ordering::Relaxed) {
                // An output: 0 going in.
                range.range_id = 0;
                // SAFETY: checked ABI; `range` is valid for reads and writes; the session stays
                // open for the call (the scope ends before `device` goes).
                unsafe { raw::ioc_register(fd, &mut range) }.map_err(|e| format!("register: {e}"))?;
                // SAFETY: as above; the module reads one u32.
                unsafe { raw::ioc_unregister(fd, &range.range_id) }.map_err(|e| format!("unregister: {e}"))?;
                turns += 1;
            }
            Ok(turns)
        });
        let workers: Vec<_> = spaces
            .iter()
            .enumerate()
            .map(|(thread, space)| {
                scope.spawn(move || -> Result<(), String> {
                    let mut data = vec![[0u8; 64]; RUNS as usize];
                    for round in 0..ROUNDS {
                        let mut commands = Vec::new();
                        for run in 0..RUNS {
                            let bytes = &mut data[run as usize];
                            bytes.fill((thread * 31 + round * 7 + run as usize) as u8);
                            bytes[..8].copy_from_slice(&(((thread as u64) << 32) | round as u64).to_le_bytes());
                            let side = (round % 2) as u64;
                            let mut command = space.complete(2 * run + side, 0);
                            command.companion = space.memory.base() + (2 * run + 1 - side) * PAGE;
                            command.arg = bytes.as_ptr() as u64;
                            command.length = bytes.len() as u64;
                            commands.push(command);
                        }
                        let done = submit_on(fd, &mut commands).map_err(|e| format!("submit: {e}"))?;
                        ensure(done == RUNS as i32, || {
                            format!("thread {thread} round {round}: {done} of {RUNS} done")
                        })?;
                        for (run, bytes) in data.iter().enumerate() {
                            let va = space.memory.base() + (2 * run as u64 + (round % 2) as u64) * PAGE;
                            let got = space.memory.read(va, bytes.len());
                            ensure(got == bytes, || {
                                format!("thread {thread} round {round} run {run}: another batch's data {got:?}")
                            })?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        let mut outcome = (0..EXPIRIES).try_for_each(|page| {
            let va = expiring.hold(page)?;
            expiring
                .wait_expired(va, Duration::from_millis(u64::from(BOUND_MS) * 10))
                .map_err(|_| format!("the fault at {va:#x} did not expire beside the batches"))
        });
        for worker in workers {
            outcome = outcome.and(worker.join().unwrap_or_else(|_| Err("a worker panicked".into())));
        }
        stop.store(true, Ordering::Relaxed);
        let turns = churn.join().unwrap_or_else(|_| Err("the churn thread panicked".into()));
        outcome.and(turns.and_then(|turns| ensure(turns > 0, || "no range came and went".into())))
    });
    set_max_hold_ms(0)?;
    outcome?;
    for space in spaces {
        space.detach(device)?;
    }
    expiring.detach(device)?;
    churned.detach(device)
}

/// A batch wicd submits through io_uring in chunks (the module's limit on one submission) runs
/// chunk after chunk: the second chunk, of another space, does not run while the first one's
/// fill stalls. Unlinked, the chunks go to io_uring's workers (each is longer than the module
/// runs inline) and the module runs them at once.
fn the_chunks_of_one_io_uring_batch_run_in_order(device: &Device) -> Result<(), String> {
    const CHUNK: u64 = 17;
    let (first, second) = (Space::open(device, 2 * CHUNK)?, Space::open(device, 2 * CHUNK)?);
    let mut commands: Vec<WicCommand> = [&first, &second]
        .iter()
        .flat_map(|space| (0..CHUNK).map(|run| space.complete(2 * run, WIC_MARKER_CHANNEL_CLOSED)))
        .collect();
    let mut submitter = UringSubmitter::new(CHUNK as u32).map_err(|e| format!("io_uring: {e}"))?;
    first.stall()?;
    let fd = device.fd();
    let outcome = std::thread::scope(|scope| {
        let commands = &mut commands;
        let submitted = scope.spawn(move || submitter.submit(fd, commands));
        // The second space's writes, among all the log holds (it is one for all spaces).
        let second_pages = second.memory.base()..second.memory.base() + 2 * CHUNK * PAGE;
        let second_wrote = |seen: &[fakegpu::Event]| {
            seen.iter().any(|e| e.kind == fakegpu::EVENT_WRITE && second_pages.contains(&e.va))
        };
        let order = wait_events(&first.fake, RUNS_WITHIN, |seen| seen.iter().any(|e| e.kind == fakegpu::EVENT_STALLED))
            .map_err(|_| "the first chunk's fill never stalled".to_string())
            .and_then(|seen| {
                ensure(!second_wrote(&seen), || format!("the second chunk ran before the first stalled: {seen:?}"))
            })
            .and_then(|()| match wait_events(&second.fake, Duration::from_millis(500), second_wrote) {
                Ok(seen) => Err(format!("the second chunk ran while the first stalled: {seen:?}")),
                Err(_) => Ok(()),
            });
        let released = first.release();
        let done = submitted.join().map_err(|_| "the submitting thread panicked".to_string())?;
        order.and(released)?;
        done.map_err(|e| format!("submit: {e}"))
    })?;
    ensure(outcome == 2 * CHUNK as usize && commands.iter().all(|c| c.result == 0), || {
        format!("{outcome} of {} done", 2 * CHUNK)
    })?;
    first.detach(device)?;
    second.detach(device)
}

/// wicd's shim backend runs a batch that names two applications (address spaces, here each on a
/// GPU of its own) as two lanes at once: the second one's run is filled and mapped while the
/// first one's fill stalls, and both runs end with their data, mapped, their GPUs replayed. Run
/// in a session of its own (the daemon's).
fn wicd_activates_two_applications_at_once() -> Result<(), String> {
    let mut daemon = Daemon::open(Submission::Uring)?;
    let mut sides = Vec::new();
    for gpu in [GPU, GPU + 1] {
        let fake = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
        let mut memory = Memory::new(&fake, 1 << 20)?;
        let space = daemon.backend.device().attach(fake.fd()).map_err(|e| format!("attach: {e}"))?;
        let spec = ChannelSpec { consumer_gpu: gpu as u16, ..host_spec(1, 512) };
        let (layout, placed) = daemon.channel(spec, space, &mut memory)?;
        let run = placed.placement.process_va(layout.slots[0].runs[0]).ok_or("run not placed")?;
        fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
        let (verdicts, _) = fake.inject(gpu, &[fault(run, AccessType::Read)]).map_err(|e| format!("inject: {e}"))?;
        ensure(verdicts == [fakegpu::VERDICT_HOLD], || format!("GPU {gpu}'s fault was {verdicts:?}"))?;
        sides.push((fake, memory, space, layout, run, gpu));
    }
    ensure(daemon.take_faults() == 2, || "two records expected".into())?;
    drain_log(&sides[0].0)?;
    let data: Vec<u8> = (0..512u32).map(|i| (i * 13 + 5) as u8).collect();
    daemon.host_data[..data.len()].copy_from_slice(&data);
    for (_, _, _, layout, _, _) in &sides {
        let now = daemon.now();
        daemon.engine.publish(now, layout.id, 0, &mut daemon.commands).map_err(|e| e.to_string())?;
    }
    let (first, second) = (&sides[0], &sides[1]);
    first.0.fail(Fail { writes: 1, flags: fakegpu::FAIL_STALL, ..Default::default() }).map_err(|e| e.to_string())?;
    let (executed, overlapped) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            // One wait for both (the log is one for all spaces): the stall is released only after.
            let overlapped = wait_events(&first.0, RUNS_WITHIN, |seen| {
                seen.iter().any(|e| e.kind == fakegpu::EVENT_STALLED)
                    && seen.iter().any(|e| e.kind == fakegpu::EVENT_MAP && e.gpu_id == second.5 && e.va == second.4)
            })
            .map_err(|_| "the second GPU's run was not mapped while the first GPU's fill stalled".to_string());
            let released = first.0.fail(Fail::default()).map_err(|e| e.to_string());
            released.and(overlapped)
        });
        let executed = daemon.execute();
        (executed, watcher.join().unwrap_or_else(|_| Err("the watcher panicked".into())))
    });
    let earlier = overlapped?;
    executed?;
    for (fake, memory, _, _, run, gpu) in &sides {
        let state = fake.page_state(*gpu, *run).map_err(|e| format!("page state: {e}"))?;
        ensure(state & fakegpu::PAGE_MAPPED != 0, || format!("GPU {gpu}'s run is not mapped"))?;
        ensure(memory.read(*run, data.len()) == data, || format!("GPU {gpu}'s run lacks its data"))?;
    }
    let replayed =
        |seen: &[fakegpu::Event], gpu: u32| seen.iter().any(|e| e.kind == fakegpu::EVENT_REPLAY && e.gpu_id == gpu);
    let replayed_both =
        |seen: &[fakegpu::Event]| [first.5, second.5].iter().all(|&gpu| replayed(&earlier, gpu) || replayed(seen, gpu));
    wait_events(&first.0, RUNS_WITHIN, replayed_both).map_err(|_| "both GPUs were not replayed".to_string())?;
    for (_, _, space, ..) in &sides {
        daemon.backend.device().detach(*space).map_err(|e| format!("detach: {e}"))?;
    }
    Ok(())
}
