//! How long a sleeping wicd takes to wake for a host producer's publish, measured through the
//! daemon itself: a `wicd serve` of this build on the emulated GPU ([`crate::wicd`]), one slot
//! whose consumer's fault wicd holds, and a producer publishing it with libwic's
//! `Channel::publish`: the slot's counter and dirty bit in the shared producer region, then one
//! write to the channel's publish doorbell, an eventfd the fast path reads through io_uring.
//! Before each publish the fault is held and every thread has slept for [`GAP`], so the fast
//! path is asleep in io_uring and its CPU idle: the model's sleeping wicd. The producer runs on
//! one CPU and every thread it wakes (wicd's, the baseline's) on another: a wake-up finds its
//! CPU idle, as on a host with idle cores, and never preempts the waker instead. The consumer
//! thread, which wicd wakes once a publish reached it, runs on a third CPU where there is one,
//! else beside wicd's: never on the producer's, where its wake-up could preempt the spinning
//! producer before it saw the end.
//!
//! The producer times the publish call, then spins until the slot's dirty bit is cleared: the
//! fast path's handler takes it and, in the same step, hands the slot to `Engine::publish`. The
//! span from the call's start to then is the model's `daemon.publish_ns` and
//! `daemon.wakeup_ns` together. The wake-up proper, from the doorbell write to the handler, is
//! the span less libwic's work before its write: the publish call's median less that of the
//! baseline's bare write(2), which wakes the same kind of waiter.
//!
//! The baseline, interleaved with the publishes, is the machine's own wake-up, which no daemon
//! could beat: a thread writes an eventfd and spins until a thread blocked on it runs, blocked
//! in an io_uring read as the fast path is, or in read(2). The end is when the spinning waker
//! sees the wakee's mark, for wicd and the baseline alike, and so no sooner than the write
//! returned.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};
use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use wic::{Channel, ChannelSpec, Client, Producer, Role};
use wic_proto::message::{FdKind, Reply, Request};
use wic_proto::shm::{ProducerLayout, ProducerRegion};

use crate::measure::{percentile, sorted};
use crate::wicd::{self, Wicd};
use crate::Settings;

/// How long every thread sleeps before each wake-up.
const GAP: Duration = Duration::from_micros(500);
/// The one slot published.
const SLOT: u32 = 0;
/// The longest any wait may take before the bench gives up: far longer than any wake-up.
const PATIENCE: Duration = Duration::from_secs(10);
/// How long wicd holds the consumer's fault for its data: longer than any run.
const HOLD: Duration = Duration::from_secs(3600);
/// Submission queue entries of the baseline's io_uring, as many as the fast path's.
const URING_ENTRIES: u32 = 256;

#[derive(Debug, Serialize, Deserialize)]
pub struct Row {
    /// Publishes timed, and pings of each baseline, after the warm-up.
    pub rounds: usize,
    pub gap_us: f64,
    /// libwic's publish call: the producer region's counter and dirty bit, then the doorbell
    /// write; what the producer thread spends.
    pub publish_p50_ns: f64,
    pub publish_p99_ns: f64,
    /// From the publish call's start until wicd's fast path handed the slot to the engine.
    pub span_p50_ns: f64,
    pub span_p99_ns: f64,
    /// The span less libwic's work before its doorbell write (publish call p50 less the bare
    /// write's p50): from the doorbell write until the fast path's handler.
    pub wakeup_p50_ns: f64,
    pub wakeup_p99_ns: f64,
    /// Baseline: from an eventfd write until the thread blocked on it in an io_uring read
    /// runs; the write(2) call alone; the same with the thread blocked in read(2).
    pub uring_wake_p50_ns: f64,
    pub uring_wake_p99_ns: f64,
    pub write_p50_ns: f64,
    pub read_wake_p50_ns: f64,
    pub read_wake_p99_ns: f64,
    /// wicd's wake-up over the io_uring baseline's, at p50 and at p99.
    pub wakeup_over_uring_p50: f64,
    pub wakeup_over_uring_p99: f64,
}

/// Per round after the warm-up, in nanoseconds.
#[derive(Default)]
struct Samples {
    publish: Vec<f64>,
    span: Vec<f64>,
    uring_wake: Vec<f64>,
    write: Vec<f64>,
    read_wake: Vec<f64>,
}

pub fn run(settings: &Settings) -> Row {
    let (warm_up, rounds) = if settings.quick { (10, 100) } else { (100, 3_000) };
    let binary = wicd::binary();
    let allowed = sched_getaffinity(Pid::from_raw(0)).expect("this thread's CPUs");
    let cpus = spread_cpus(&allowed);
    // wicd and the waiters inherit the CPU of the thread that starts them.
    if let Some((_, wakee, _)) = cpus {
        pin(wakee);
    }
    let wicd = Wicd::start(&binary);
    let client = Client::connect(Some(&wicd.socket)).expect("connect to wicd");
    let spec = ChannelSpec {
        consumer_gpu: 0,
        producer: Producer::Host,
        message_bytes: 64,
        slots: 1,
        timeout_ns: HOLD.as_nanos() as u64,
    };
    let channel = Arc::new(client.create_channel(&spec).expect("a channel"));
    let view = producer_view(&wicd, &channel);
    let (uring, read) = (Waiter::spawn(Blocking::IoUring), Waiter::spawn(Blocking::Read));
    if let Some((waker, _, _)) = cpus {
        pin(waker);
    }
    let total = warm_up + rounds;
    let consumer = thread::spawn({
        let channel = Arc::clone(&channel);
        move || {
            if let Some((_, _, consumer)) = cpus {
                pin(consumer);
            }
            let mut data = [0u8; 64];
            for _ in 0..total {
                channel.consume(SLOT, &mut data).expect("consume");
            }
        }
    });
    let mut kept = Samples::default();
    for round in 0..total {
        thread::sleep(GAP);
        let (uring_wake, write) = uring.ping();
        thread::sleep(GAP);
        let (read_wake, _) = read.ping();
        wait_held(&client);
        thread::sleep(GAP);
        let start = Instant::now();
        channel.publish(SLOT).expect("publish");
        let returned = Instant::now();
        let taken = spin_until(|| !view.publish_pending(SLOT));
        channel.wait_writable(SLOT, PATIENCE).expect("the publish delivered");
        if round >= warm_up {
            kept.publish.push(ns(start, returned));
            kept.span.push(ns(start, taken));
            kept.uring_wake.push(uring_wake);
            kept.write.push(write);
            kept.read_wake.push(read_wake);
        }
    }
    consumer.join().expect("the consumer");
    sched_setaffinity(Pid::from_raw(0), &allowed).expect("this thread's CPUs back");
    let stats = client.stats().expect("wicd's stats");
    assert_eq!(stats.host_publishes, total as u64, "every publish reached the engine");
    assert_eq!(stats.faults_completed, total as u64, "every publish found its fault held");
    let [publish, span, uring_wake, write, read_wake] =
        [kept.publish, kept.span, kept.uring_wake, kept.write, kept.read_wake].map(|s| sorted(&s));
    let p50 = |s: &[f64]| percentile(s, 0.5);
    let p99 = |s: &[f64]| percentile(s, 0.99);
    let before_write = (p50(&publish) - p50(&write)).max(0.0);
    let (wakeup_p50, wakeup_p99) = (p50(&span) - before_write, p99(&span) - before_write);
    let row = Row {
        rounds,
        gap_us: GAP.as_secs_f64() * 1e6,
        publish_p50_ns: p50(&publish),
        publish_p99_ns: p99(&publish),
        span_p50_ns: p50(&span),
        span_p99_ns: p99(&span),
        wakeup_p50_ns: wakeup_p50,
        wakeup_p99_ns: wakeup_p99,
        uring_wake_p50_ns: p50(&uring_wake),
        uring_wake_p99_ns: p99(&uring_wake),
        write_p50_ns: p50(&write),
        read_wake_p50_ns: p50(&read_wake),
        read_wake_p99_ns: p99(&read_wake),
        wakeup_over_uring_p50: wakeup_p50 / p50(&uring_wake),
        wakeup_over_uring_p99: wakeup_p99 / p99(&uring_wake),
    };
    eprintln!(
        "doorbell: {rounds} rounds, {:.0} us asleep: wicd wakeup p50 {:.2} us p99 {:.2} us; publish call p50 {:.2} us p99 {:.2} us; publish to engine p50 {:.2} us p99 {:.2} us; eventfd wake in io_uring p50 {:.2} us p99 {:.2} us (write(2) p50 {:.2} us), in read(2) p50 {:.2} us p99 {:.2} us",
        row.gap_us,
        row.wakeup_p50_ns / 1e3,
        row.wakeup_p99_ns / 1e3,
        row.publish_p50_ns / 1e3,
        row.publish_p99_ns / 1e3,
        row.span_p50_ns / 1e3,
        row.span_p99_ns / 1e3,
        row.uring_wake_p50_ns / 1e3,
        row.uring_wake_p99_ns / 1e3,
        row.write_p50_ns / 1e3,
        row.read_wake_p50_ns / 1e3,
        row.read_wake_p99_ns / 1e3
    );
    row
}

/// How a baseline's waiter blocks on its eventfd.
#[derive(Clone, Copy)]
enum Blocking {
    IoUring,
    Read,
}

/// A thread blocked on its own eventfd, counting the times it ran; stopped when dropped.
struct Waiter {
    bell: Arc<EventFd>,
    woken: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Waiter {
    fn spawn(blocking: Blocking) -> Self {
        let bell = Arc::new(EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC).expect("eventfd"));
        let (woken, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let thread = thread::spawn({
            let (bell, woken, stop) = (Arc::clone(&bell), Arc::clone(&woken), Arc::clone(&stop));
            move || match blocking {
                Blocking::IoUring => uring_waiter(&bell, &woken, &stop),
                Blocking::Read => read_waiter(&bell, &woken, &stop),
            }
        });
        Self { bell, woken, stop, thread: Some(thread) }
    }

    /// Writes the bell and spins until the waiter has run: the nanoseconds until then and of
    /// the write(2) call.
    fn ping(&self) -> (f64, f64) {
        let before = self.woken.load(Ordering::Acquire);
        let start = Instant::now();
        self.bell.write(1).expect("eventfd write");
        let written = Instant::now();
        let woken = spin_until(|| self.woken.load(Ordering::Acquire) != before);
        (ns(start, woken), ns(start, written))
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if self.bell.write(1).is_ok() {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

/// The producer's CPU, that of the threads it wakes and the consumer's: the first three of
/// `allowed`, the consumer on the second when there are only two; none with fewer.
fn spread_cpus(allowed: &CpuSet) -> Option<(usize, usize, usize)> {
    let mut cpus = (0..CpuSet::count()).filter(|&cpu| allowed.is_set(cpu).unwrap_or(false));
    let (waker, wakee) = (cpus.next()?, cpus.next()?);
    Some((waker, wakee, cpus.next().unwrap_or(wakee)))
}

/// Runs this thread on `cpu` only.
fn pin(cpu: usize) {
    let mut only = CpuSet::new();
    only.set(cpu).expect("a CPU of the set");
    sched_setaffinity(Pid::from_raw(0), &only).expect("pin this thread");
}

fn ns(from: Instant, to: Instant) -> f64 {
    (to - from).as_nanos() as f64
}

/// Spins until `done`; returns when it saw it.
fn spin_until(done: impl Fn() -> bool) -> Instant {
    let deadline = Instant::now() + PATIENCE;
    for spins in 0u64.. {
        if done() {
            break;
        }
        // The clock read now and then only, so that it does not coarsen the observation.
        assert!(spins % 4096 != 0 || Instant::now() < deadline, "the wake-up never came");
        std::hint::spin_loop();
    }
    Instant::now()
}

/// Waits until wicd holds the consumer's fault.
fn wait_held(client: &Client) {
    let deadline = Instant::now() + PATIENCE;
    while client.stats().expect("wicd's stats").pfq_depth != 1 {
        assert!(Instant::now() < deadline, "wicd never held the consumer's fault");
        thread::sleep(Duration::from_micros(50));
    }
}

/// A second mapping of `channel`'s producer region, through a producer token: the bench reads
/// the slot's dirty bit in it to see the fast path's scan.
fn producer_view(wicd: &Wicd, channel: &Channel) -> ProducerRegion {
    let token = channel.grant(Role::Producer, None).expect("a producer token");
    let mut session = wic_proto::client::Client::connect(&wicd.socket, "wic-bench").expect("connect to wicd");
    let (reply, fds) = session.call_with_fds(&Request::Attach { token }).expect("attach");
    let Reply::Channel(info) = reply else { panic!("expected a channel, got {reply:?}") };
    let region = info.fds.iter().position(|kind| *kind == FdKind::ProducerRegion).expect("a producer region");
    let layout = ProducerLayout { slots: info.spec.slots, batch_bytes: info.batch_bytes };
    ProducerRegion::open(&fds[region], layout).expect("the producer region")
}

/// Blocks in an io_uring read of `bell`, as the fast path does, until `stop`.
fn uring_waiter(bell: &EventFd, woken: &AtomicU64, stop: &AtomicBool) {
    let mut uring = IoUring::new(URING_ENTRIES).expect("io_uring");
    let mut buf = [0u8; 8];
    while !stop.load(Ordering::Acquire) {
        let read = opcode::Read::new(types::Fd(bell.as_fd().as_raw_fd()), buf.as_mut_ptr(), 8).build();
        // SAFETY: `buf` outlives the read: its completion is reaped below before the next read
        // is queued or the function returns.
        unsafe { uring.submission().push(&read) }.expect("an empty submission queue");
        loop {
            match uring.submit_and_wait(1) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => panic!("io_uring wait: {e}"),
            }
        }
        let completion = uring.completion().next().expect("the read's completion");
        assert!(completion.result() == 8, "eventfd read: {}", completion.result());
        woken.fetch_add(1, Ordering::Release);
    }
}

/// Blocks in read(2) of `bell` until `stop`.
fn read_waiter(bell: &EventFd, woken: &AtomicU64, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        match bell.read() {
            Ok(_) => {
                woken.fetch_add(1, Ordering::Release);
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => panic!("eventfd read: {e}"),
        }
    }
}
