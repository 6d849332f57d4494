//! io_uring's inline issue against a busy session. io_uring first issues a command from the
//! submitting task with `IO_URING_F_NONBLOCK` and expects `EAGAIN` from one that would wait,
//! which it then runs on a worker of its own; a command that waits there instead blocks the
//! submitter (and, with `IORING_SETUP_SQPOLL`, every other request of the ring). The session's
//! mutex is such a wait: a batch holds it for whole steps, the expiry for a sweep. Here an
//! ioctl batch holds it, its fill stalled by the fake GPU, while an io_uring submission is
//! made: `io_uring_enter` must return at once, and the command complete once the batch ends.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};
use wic_kabi::{self as kabi, WicCommand};
use wic_kernel_io::fakegpu::{self, Fail};

use crate::rig::{ensure, submit_on, wait_events, Direct, GPU};

const PAGE: u64 = 4096;
/// How long the stalled batch holds the session: what a blocking submission would wait.
const STALL: Duration = Duration::from_secs(2);
/// What `io_uring_enter` may take when it does not wait for the session.
const PROMPT: Duration = Duration::from_millis(500);

pub fn run() -> Result<(), String> {
    let Direct { fake, memory, device, space } = Direct::open(4)?;
    let base = memory.base();
    let fd = device.fd().as_raw_fd();
    let mut batch = [WicCommand {
        opcode: kabi::WIC_CMD_COMPLETE,
        space_id: space,
        gpu_id: GPU,
        pages: 1,
        va: base,
        arg: kabi::WIC_MARKER_CHANNEL_CLOSED,
        companion: base + PAGE,
        ..WicCommand::default()
    }];
    let mut replay = [WicCommand { opcode: kabi::WIC_CMD_REPLAY, gpu_id: GPU, ..WicCommand::default() }];
    fake.fail(Fail { writes: 1, flags: fakegpu::FAIL_STALL, ..Default::default() })
        .map_err(|e| format!("arm the stall: {e}"))?;
    let mut ring = IoUring::new(4).map_err(|e| format!("io_uring setup: {e}"))?;
    let (entered, completion, stalled) = std::thread::scope(|scope| {
        let commands = &mut batch;
        let holder = scope.spawn(move || submit_on(fd, commands));
        let stalled = wait_events(&fake, PROMPT * 4, |seen| seen.iter().any(|e| e.kind == fakegpu::EVENT_STALLED))
            .map(drop)
            .map_err(|_| "the batch's write never stalled".to_string());
        // Whatever happens below, the stall ends after STALL: a blocking submission returns.
        let release = scope.spawn(|| {
            std::thread::sleep(STALL);
            fake.fail(Fail::default())
        });
        let mut payload = [0u8; 16];
        payload[..8].copy_from_slice(&(replay.as_mut_ptr() as u64).to_ne_bytes());
        payload[8..12].copy_from_slice(&1u32.to_ne_bytes());
        let entry = opcode::UringCmd16::new(types::Fd(fd), kabi::WIC_IOC_SUBMIT).cmd(payload).build().user_data(7);
        let start = Instant::now();
        // SAFETY: the payload is carried by value; `replay` outlives the completion reaped below.
        let pushed = unsafe { ring.submission().push(&entry) };
        let submitted = pushed
            .map_err(|_| "submission queue full".to_string())
            .and_then(|()| ring.submit().map_err(|e| format!("io_uring_enter: {e}")));
        let entered = start.elapsed();
        let completion = submitted.and_then(|_| {
            ring.submit_and_wait(1).map_err(|e| format!("io_uring_enter (wait): {e}"))?;
            ring.completion().next().map(|cqe| cqe.result()).ok_or_else(|| "no completion".to_string())
        });
        let released = release.join().map_err(|_| "the releasing thread panicked".to_string());
        let held = holder.join().map_err(|_| "the holding thread panicked".to_string());
        let stalled = stalled
            .and(released.and_then(|r| r.map_err(|e| format!("release the stall: {e}"))))
            .and(held.and_then(|r| r.map(drop).map_err(|e| format!("the stalled batch: {e}"))));
        (entered, completion, stalled)
    });
    stalled?;
    ensure(entered < PROMPT, || {
        format!("io_uring_enter waited {entered:?} for the busy session (the batch held it {STALL:?})")
    })?;
    let done = completion?;
    ensure(done == 1 && replay[0].result == 0, || {
        format!("the io_uring batch did {done} of 1 command: result {}", replay[0].result)
    })?;
    println!(
        "busy: io_uring_enter returned in {entered:?} while an ioctl batch held the session; the command ran after it"
    );
    Ok(())
}
