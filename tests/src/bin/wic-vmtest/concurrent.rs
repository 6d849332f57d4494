//! Batches submitted from several threads run at once (`WIC_MAX_CONCURRENT_BATCHES` of them):
//! a batch waiting on nvidia-uvm in one space no longer holds back another space's; a further
//! batch waits for one of them to end; the expiry still gets in between the steps of every
//! batch; and batches running together never mix their data, while ranges come and go and the
//! expiry runs beside them.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use wic_engine::fault::AccessType;
use wic_kabi::{self as kabi, WicCommand, WIC_MARKER_CHANNEL_CLOSED, WIC_MAX_CONCURRENT_BATCHES};
use wic_kernel_io::device::raw;
use wic_kernel_io::fakegpu::{self, Fail, FakeGpu};
use wic_kernel_io::{Device, UringSubmitter};

use crate::rig::{ensure, fault, marker, submit_on, wait_events, Memory, DEVICE, GPU};

const PAGE: u64 = 4096;
/// Long enough for a batch that is not held back to end on a loaded VM; far below the fake
/// GPU's own 10 s limit on a stall.
const RUNS_WITHIN: Duration = Duration::from_secs(3);
const BOUND_MS: u32 = 200;

pub fn run() -> Result<(), String> {
    let device = Device::open(std::path::Path::new(DEVICE), Duration::from_secs(5))
        .map_err(|e| format!("open {DEVICE}: {e}"))?;
    set_bound(0)?;
    let checks: [(&str, fn(&Device) -> Result<(), String>); 5] = [
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
    set_bound(0)?;
    outcome
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
        wait_events(&self.fake, RUNS_WITHIN, |seen| seen.iter().any(|e| e.kind == fakegpu::EVENT_STALLED))
            .map(|_| ())
            .map_err(|_| "a batch's fill never stalled".into())
    }

    fn detach(self, device: &Device) -> Result<(), String> {
        device.detach(self.id).map_err(|e| format!("detach: {e}"))
    }
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
        let outcome =
            a1.wait_stalled().and_then(|()| b1.wait_stalled()).and_then(|()| set_bound(BOUND_MS)).and_then(|()| {
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
    set_bound(0)?;
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
    set_bound(BOUND_MS)?;
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
    set_bound(0)?;
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
        let order = first.wait_stalled().and_then(|()| {
            match wait_events(&second.fake, Duration::from_millis(500), |seen| {
                seen.iter().any(|e| e.kind == fakegpu::EVENT_WRITE)
            }) {
                Ok(seen) => Err(format!("the second chunk ran while the first stalled: {seen:?}")),
                Err(_) => Ok(()),
            }
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

/// Sets the module's `max_hold_ms`.
fn set_bound(ms: u32) -> Result<(), String> {
    std::fs::write("/sys/module/wic_shim/parameters/max_hold_ms", ms.to_string())
        .map_err(|e| format!("max_hold_ms: {e}"))
}
