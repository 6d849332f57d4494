//! The fast path: one thread that owns the engine and the backend and waits on io_uring for
//! doorbells (faults posted, data published), the shim's fault ring, control requests and the
//! engine's next deadline.
//!
//! The control side (the tokio server) talks to it through a crossbeam queue plus an eventfd
//! that wakes the ring; replies come back on tokio oneshot channels. Nothing here blocks on a
//! client: every read is of the daemon's own eventfds and shared regions.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, Sender, TryRecvError};
use io_uring::{opcode, types, IoUring};
use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::sync::oneshot;
use wic_engine::{
    ChannelId, ChannelLayout, ChannelSpec, Command, Engine, EngineConfig, EngineError, ErrorMarker, FaultEntry, Nanos,
    PoolError, RawFaultEntry,
};
use wic_kmod::ShimBackend;
use wic_proto::message::{ErrorCode, Stats, WireError};
use wic_proto::shm::{
    ChannelState, ConsumerLayout, ConsumerRegion, ProducerLayout, ProducerRegion, FAULT_RING_ENTRIES,
};

use super::emulated::{EmulatedChannel, EmulatedGpus};
use super::gpus::{marker_retries, ChannelMap, Executed, ExecutionLog};
use super::observe::Observer;
use super::shim::{ShimGpus, RELEASE_RETRY};

/// io_uring user data of the control doorbell's read.
const WAKE_TOKEN: u64 = 0;
/// io_uring user data of cancel requests (their completions carry no work).
const CANCEL_TOKEN: u64 = u64::MAX;
/// io_uring user data of the poll of the shim's fault ring.
const RING_TOKEN: u64 = u64::MAX - 1;
/// io_uring user data of the polls of observed spaces' event queues: this bit, ORed with the
/// space id (doorbell tokens count up from 1 and never reach it).
const OBSERVER_TOKEN: u64 = 1 << 62;
const RING_ENTRIES: u32 = 256;

/// The GPU backend the fast path drives.
pub enum Backend {
    /// `gpus` emulated GPUs.
    Emulated { gpus: u16 },
    /// The wic_shim module, through an open session.
    Shim(Box<ShimBackend>),
}

/// Where the control side asks a channel to go in an application's address space (shim backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacementRequest {
    pub space: u32,
    pub base_va: u64,
}

/// What the control side asks of the fast path.
pub enum Control {
    Create {
        spec: ChannelSpec,
        placement: Option<PlacementRequest>,
        reply: oneshot::Sender<Result<Created, WireError>>,
    },
    /// Attaches the address space of an application's UVM file (shim backend).
    AttachSpace {
        uvm: OwnedFd,
        reply: oneshot::Sender<Result<u32, WireError>>,
    },
    /// Detaches a space once its connection's channels are destroyed.
    DetachSpace {
        space: u32,
        reply: oneshot::Sender<()>,
    },
    /// Watches `start..end` of an observed space (emulated backend).
    Watch {
        space: u32,
        start: u64,
        end: u64,
        reply: oneshot::Sender<Result<(), WireError>>,
    },
    Destroy {
        channel: u32,
        reply: oneshot::Sender<Result<(), WireError>>,
    },
    Publish {
        channel: u32,
        slot: u32,
        reply: oneshot::Sender<Result<(), WireError>>,
    },
    Snapshot {
        reply: oneshot::Sender<Snapshot>,
    },
    /// Completes every held fault with the stopping marker and ends the thread.
    Shutdown {
        reply: oneshot::Sender<()>,
    },
}

/// A new channel: its layout with the addresses its consumers use, and the descriptors to
/// hand to clients (duplicates; the fast path keeps its own). Shim channels have no consumer
/// region: their consumers are GPU kernels.
pub struct Created {
    pub layout: ChannelLayout,
    pub consumer_region: Option<OwnedFd>,
    pub fault_doorbell: Option<OwnedFd>,
    pub producer_region: Option<OwnedFd>,
    pub publish_doorbell: Option<OwnedFd>,
}

/// Per-channel counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ChannelCounters {
    pub publishes: u64,
    pub deliveries: u64,
    pub timeouts: u64,
    /// The highest overflow count its consumer region showed (emulated backend): the warps'
    /// own count, which the client writes. Kept at its highest so it never goes backwards,
    /// and never added to a daemon-wide total, as nothing bounds it.
    pub client_overflows: u64,
}

/// The fast path's view for stats and status.
pub struct Snapshot {
    pub stats: Stats,
    pub channels: HashMap<u32, ChannelCounters>,
    pub held: u32,
}

/// The control side's handle.
#[derive(Clone)]
pub struct DataplaneHandle {
    tx: Sender<Control>,
    wake: Arc<EventFd>,
}

impl DataplaneHandle {
    /// Sends a request built around a reply channel and waits for the answer.
    pub async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Control) -> Result<T, WireError> {
        let (reply, answer) = oneshot::channel();
        let gone = || WireError::new(ErrorCode::Stopping, "the fast path has stopped");
        self.tx.send(make(reply)).map_err(|_| gone())?;
        // A failed write means the counter is saturated: the thread is awake anyway.
        let _ = self.wake.write(1);
        answer.await.map_err(|_| gone())
    }
}

fn engine_error(e: EngineError) -> WireError {
    let code = match e {
        EngineError::Invalid(_) | EngineError::SlotOutOfRange { .. } | EngineError::NotHostProducer(_) => {
            ErrorCode::Invalid
        }
        EngineError::Pool(PoolError::ZeroLength) => ErrorCode::Invalid,
        EngineError::Pool(_) | EngineError::Tags(_) | EngineError::SlotsExhausted { .. } => ErrorCode::Exhausted,
        EngineError::UnknownChannel(_) => ErrorCode::NotFound,
        EngineError::AlreadyPublished { .. } => ErrorCode::Busy,
    };
    WireError::new(code, e.to_string())
}

/// Which doorbell a registration reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bell {
    Faults,
    Published,
}

/// A pending read of an eventfd; the buffer must stay put until its completion arrives.
struct Registration {
    fd: OwnedFd,
    buf: Box<[u8; 8]>,
    channel: u32,
    bell: Bell,
    /// Its channel was closed: the next completion of its read, whatever the result, ends
    /// it. The channel id alone cannot tell, as a new channel may have taken it since.
    closing: bool,
}

/// The daemon's side of an emulated channel's fault ring.
#[derive(Default)]
struct FaultRing {
    /// The daemon's own read index.
    get: u64,
    /// The channel is in `Dataplane::unread`: its last pass read a whole ring's worth, so
    /// more entries may be waiting.
    unread: bool,
}

/// Counters the engine does not keep.
#[derive(Default)]
struct Counters {
    replays: u64,
    commands_failed: u64,
    /// Ring entries whose page is in no run of the ring's channel: dropped before the engine.
    misdirected: u64,
    /// Passes over an emulated channel's fault ring (one per turn, see `take_faults`) that
    /// read a whole ring's worth of entries: the rings wicd found full.
    rings_found_full: u64,
    channels: ChannelMap<ChannelCounters>,
    /// Data completions of the last execution whose fill failed.
    unfilled: Vec<Command>,
}

impl ExecutionLog for Counters {
    fn delivered(&mut self, channel: u32) {
        self.channels.entry(channel).or_default().deliveries += 1;
    }

    fn failed(&mut self, channel: u32, marker: ErrorMarker) {
        if marker == ErrorMarker::Timeout {
            self.channels.entry(channel).or_default().timeouts += 1;
        }
    }

    fn unfilled(&mut self, complete: Command) {
        self.unfilled.push(complete);
    }
}

/// The backend's channels and the means to run commands on them.
enum Gpus {
    Emulated { gpus: EmulatedGpus, count: u16 },
    Shim(Box<ShimGpus>),
}

impl Gpus {
    fn has(&self, channel: u32) -> bool {
        match self {
            Self::Emulated { gpus, .. } => gpus.channel(channel).is_some(),
            Self::Shim(shim) => shim.channel(channel).is_some(),
        }
    }

    fn producer(&self, channel: u32) -> Option<&ProducerRegion> {
        match self {
            Self::Emulated { gpus, .. } => gpus.channel(channel)?.producer.as_ref(),
            Self::Shim(shim) => shim.channel(channel)?.producer.as_ref(),
        }
    }

    fn channel_ids(&self) -> Vec<u32> {
        match self {
            Self::Emulated { gpus, .. } => gpus.channels().map(|(id, _)| *id).collect(),
            Self::Shim(shim) => shim.channel_ids().collect(),
        }
    }

    fn execute(&mut self, commands: &[Command], log: &mut impl ExecutionLog) -> Executed {
        match self {
            Self::Emulated { gpus, .. } => gpus.execute(commands, log),
            Self::Shim(shim) => shim.execute(commands, log),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Emulated { .. } => "emulated",
            Self::Shim(_) => "shim",
        }
    }
}

struct Dataplane {
    engine: Engine,
    backend: Gpus,
    observer: Observer,
    ring: IoUring,
    control: Receiver<Control>,
    wake: Arc<EventFd>,
    wake_buf: Box<[u8; 8]>,
    registrations: HashMap<u64, Registration>,
    next_token: u64,
    /// The daemon's side of every emulated channel's fault ring.
    fault_rings: HashMap<u32, FaultRing>,
    /// Emulated channels whose last pass over their ring read a whole ring's worth, in the
    /// order their next turn comes (round robin).
    unread: VecDeque<u32>,
    counters: Counters,
    start: Instant,
    commands: Vec<Command>,
    faults: Vec<RawFaultEntry>,
    completions: Vec<(u64, i32)>,
}

/// Starts the fast path on `backend`; `uvm_tools` is nvidia-uvm's tools node, through which
/// the emulated backend observes real GPU faults where there is a GPU.
pub fn spawn(
    config: EngineConfig,
    backend: Backend,
    uvm_tools: &std::path::Path,
) -> Result<(DataplaneHandle, std::thread::JoinHandle<()>), String> {
    // The engine validates the configuration before the backend sizes anything by it.
    let engine = Engine::new(config).map_err(|e| format!("engine configuration: {e}"))?;
    let backend = match backend {
        Backend::Emulated { gpus } => Gpus::Emulated { gpus: EmulatedGpus::new(engine.config()), count: gpus },
        Backend::Shim(shim) => Gpus::Shim(Box::new(ShimGpus::new(*shim))),
    };
    let ring = IoUring::new(RING_ENTRIES).map_err(|e| format!("io_uring setup: {e}"))?;
    // Blocking on purpose: io_uring reads of a non-blocking eventfd fail with EAGAIN instead of
    // waiting.
    let wake = Arc::new(EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC).map_err(|e| format!("eventfd: {e}"))?);
    let (tx, control) = crossbeam::channel::unbounded();
    let mut dataplane = Dataplane {
        engine,
        backend,
        observer: Observer::new(uvm_tools),
        ring,
        control,
        wake: wake.clone(),
        wake_buf: Box::new([0; 8]),
        registrations: HashMap::new(),
        next_token: 1,
        fault_rings: HashMap::new(),
        unread: VecDeque::new(),
        counters: Counters::default(),
        start: Instant::now(),
        commands: Vec::new(),
        faults: Vec::new(),
        completions: Vec::new(),
    };
    dataplane.arm_wake().map_err(|e| format!("io_uring: {e}"))?;
    dataplane.arm_ring().map_err(|e| format!("io_uring: {e}"))?;
    let thread = std::thread::Builder::new()
        .name("wicd-fastpath".into())
        .spawn(move || dataplane.run())
        .map_err(|e| format!("cannot start the fast path: {e}"))?;
    Ok((DataplaneHandle { tx, wake }, thread))
}

fn eventfd() -> io::Result<OwnedFd> {
    let fd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)?;
    Ok(OwnedFd::from(fd))
}

impl Dataplane {
    fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    fn push(&mut self, entry: io_uring::squeue::Entry) -> io::Result<()> {
        // SAFETY: every entry pushed reads into a buffer owned by `self` (the wake buffer or a
        // registration's box) that is dropped only after its completion has been reaped.
        while unsafe { self.ring.submission().push(&entry) }.is_err() {
            self.ring.submit()?;
        }
        Ok(())
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let read = opcode::Read::new(types::Fd(self.wake.as_fd().as_raw_fd()), self.wake_buf.as_mut_ptr(), 8)
            .build()
            .user_data(WAKE_TOKEN);
        self.push(read)
    }

    /// Polls the shim's fault ring. One-shot, re-armed after each completion: records that
    /// arrived in between make the new poll complete at once.
    fn arm_ring(&mut self) -> io::Result<()> {
        let Gpus::Shim(shim) = &mut self.backend else { return Ok(()) };
        let poll = opcode::PollAdd::new(types::Fd(shim.ring_fd()), libc::POLLIN as u32).build().user_data(RING_TOKEN);
        self.push(poll)
    }

    /// Polls an observed space's event queue (one-shot, re-armed after each completion).
    fn arm_observer(&mut self, space: u32) -> io::Result<()> {
        let Some(fd) = self.observer.fd(space) else { return Ok(()) };
        let poll = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .build()
            .user_data(OBSERVER_TOKEN | u64::from(space));
        self.push(poll)
    }

    fn arm(&mut self, token: u64) -> io::Result<()> {
        let Some(reg) = self.registrations.get_mut(&token) else { return Ok(()) };
        let read = opcode::Read::new(types::Fd(reg.fd.as_raw_fd()), reg.buf.as_mut_ptr(), 8).build().user_data(token);
        self.push(read)
    }

    fn register(&mut self, fd: OwnedFd, channel: u32, bell: Bell) -> io::Result<()> {
        let token = self.next_token;
        self.next_token += 1;
        self.registrations.insert(token, Registration { fd, buf: Box::new([0; 8]), channel, bell, closing: false });
        let armed = self.arm(token);
        if armed.is_err() {
            // No read in flight: nothing would ever complete to drop it.
            self.registrations.remove(&token);
        }
        armed
    }

    fn run(mut self) {
        tracing::debug!("fast path running");
        loop {
            if self.drain_control() {
                break;
            }
            if let Err(e) = self.wait() {
                tracing::error!("fast path: io_uring wait failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
            // Turns owed from earlier iterations first: a channel whose doorbell rings now
            // gets its turn below and, if its ring is still not empty, its next one after.
            self.take_unread();
            self.reap();
            let now = self.now();
            self.engine.expire(now, &mut self.commands);
            self.execute();
            if let Gpus::Shim(shim) = &mut self.backend {
                shim.retry_stuck();
            }
        }
        tracing::debug!("fast path stopped");
    }

    /// Waits for a completion, the engine's next deadline or the next time to ask the module
    /// again to let go of what it refused; does not wait while a fault ring is owed a turn.
    fn wait(&mut self) -> io::Result<()> {
        let retry = match &self.backend {
            Gpus::Shim(shim) if shim.has_stuck() => Some(self.now().saturating_add(RELEASE_RETRY.as_nanos() as Nanos)),
            _ => None,
        };
        let deadline = match (self.engine.next_deadline(), retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let result = match deadline {
            _ if !self.unread.is_empty() => self.ring.submit(),
            Some(deadline) => {
                let left = deadline.saturating_sub(self.now());
                let ts = types::Timespec::from(Duration::from_nanos(left.max(1)));
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
            None => self.ring.submit_and_wait(1),
        };
        match result {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn reap(&mut self) {
        // Reaped into a reused buffer first: handling a completion pushes new submissions.
        let mut completions = std::mem::take(&mut self.completions);
        completions.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        for (token, result) in completions.drain(..) {
            match token {
                CANCEL_TOKEN => {}
                WAKE_TOKEN => {
                    if let Err(e) = self.arm_wake() {
                        tracing::error!("fast path: cannot re-arm the control doorbell: {e}");
                    }
                }
                token if token & OBSERVER_TOKEN != 0 && token != RING_TOKEN => {
                    let space = token as u32;
                    if result < 0 && result != -libc::ECANCELED {
                        tracing::warn!(
                            space,
                            "polling the observed space failed: {}",
                            io::Error::from_raw_os_error(-result)
                        );
                    }
                    if result != -libc::ECANCELED {
                        self.observer.drain(space);
                        if let Err(e) = self.arm_observer(space) {
                            tracing::error!(space, "cannot re-arm the observed space's poll: {e}");
                        }
                    }
                }
                RING_TOKEN => {
                    if result < 0 {
                        tracing::error!(
                            "fast path: polling the fault ring failed: {}",
                            io::Error::from_raw_os_error(-result)
                        );
                    }
                    self.take_ring();
                    if let Err(e) = self.arm_ring() {
                        tracing::error!("fast path: cannot re-arm the fault ring poll: {e}");
                    }
                }
                token => self.on_bell(token, result),
            }
        }
        self.completions = completions;
    }

    fn on_bell(&mut self, token: u64, result: i32) {
        let Some(reg) = self.registrations.get(&token) else { return };
        let (channel, bell) = (reg.channel, reg.bell);
        // An interrupted read of a live channel's doorbell is read again, or the channel
        // would never be rung again.
        let interrupted = result == -libc::EINTR;
        if reg.closing || (result < 0 && !interrupted) || !self.backend.has(channel) {
            // Cancelled because the channel closed (or a read error): the buffer is free now.
            if result < 0 && result != -libc::ECANCELED {
                tracing::warn!("channel {channel}: doorbell read failed: {}", io::Error::from_raw_os_error(-result));
            }
            self.registrations.remove(&token);
            return;
        }
        if !interrupted {
            match bell {
                // A channel already owed a turn gets no extra one by ringing.
                Bell::Faults if self.fault_rings.get(&channel).is_some_and(|fault_ring| fault_ring.unread) => {}
                Bell::Faults => self.take_faults(channel),
                Bell::Published => self.take_published(channel),
            }
        }
        if let Err(e) = self.arm(token) {
            tracing::error!("channel {channel}: cannot re-arm its doorbell: {e}");
        }
    }

    /// Feeds the shim's fault records to the engine.
    fn take_ring(&mut self) {
        let Gpus::Shim(shim) = &mut self.backend else { return };
        let now = self.start.elapsed().as_nanos() as Nanos;
        shim.take_faults(&mut self.engine, now, &mut self.commands);
        self.execute();
    }

    /// Gives each channel left with unread ring entries its next turn, in the order they were
    /// left; a channel whose ring is still not empty goes to the back for the next iteration.
    fn take_unread(&mut self) {
        for _ in 0..self.unread.len() {
            let Some(channel) = self.unread.pop_front() else { break };
            let Some(fault_ring) = self.fault_rings.get_mut(&channel) else { continue };
            fault_ring.unread = false;
            self.take_faults(channel);
        }
    }

    /// Feeds the faults an emulated channel's consumers posted to the engine: one turn, one
    /// pass over its ring, at most [`FAULT_RING_ENTRIES`] entries.
    ///
    /// The client writes its ring and can keep refilling it as fast as wicd reads it. Reading
    /// until it is empty would then never end, and every other channel, control request and
    /// the watchdog's snapshot would wait. So a pass that read a whole ring's worth, which may
    /// have left entries behind, queues the channel for another turn on the next iteration of
    /// the loop, after control requests and other doorbells; meanwhile the loop does not sleep.
    fn take_faults(&mut self, channel: u32) {
        let Gpus::Emulated { gpus: backend, .. } = &self.backend else { return };
        let Some(regions) = backend.channel(channel) else { return };
        let gpu = regions.consumer_gpu;
        let fault_ring = self.fault_rings.entry(channel).or_default();
        let va_width = self.engine.config().va_width;
        self.faults.clear();
        regions.consumer.take_faults(&mut fault_ring.get, &mut self.faults);
        // The read index the warps check is published only after a pass: one that reads a
        // whole ring's worth of entries found the ring full, and warps faulting meanwhile were
        // turned away. Counted from entries read, not from a word the client writes, a client
        // can add at most one per ring's worth of entries it posts.
        if self.faults.len() == FAULT_RING_ENTRIES as usize {
            self.counters.rings_found_full = self.counters.rings_found_full.saturating_add(1);
            if !fault_ring.unread {
                fault_ring.unread = true;
                self.unread.push_back(channel);
            }
        }
        // A client writes only its own channel's ring: entries naming another channel's pages
        // are dropped, so no process can complete or steal another's requests.
        let before = self.faults.len();
        self.faults.retain(|raw| {
            let va = FaultEntry::decode(raw, va_width).page();
            backend.place(va).is_some_and(|place| place.channel == channel)
        });
        self.counters.misdirected += (before - self.faults.len()) as u64;
        if !self.faults.is_empty() {
            let now = self.start.elapsed().as_nanos() as Nanos;
            self.engine.handle_faults(now, gpu, &self.faults, &mut self.commands);
        }
        self.execute();
    }

    fn take_published(&mut self, channel: u32) {
        let Some(producer) = self.backend.producer(channel) else { return };
        let now = self.now();
        let mut published = 0;
        let (engine, commands) = (&mut self.engine, &mut self.commands);
        producer.take_published(|slot| match engine.publish(now, ChannelId(channel), slot, commands) {
            Ok(()) => published += 1,
            Err(e) => tracing::debug!("channel {channel}: publish of slot {slot} ignored: {e}"),
        });
        self.counters.channels.entry(channel).or_default().publishes += published;
        self.execute();
    }

    fn execute(&mut self) {
        self.run_commands();
        if self.counters.unfilled.is_empty() {
            return;
        }
        // Once: a marker completion that fails too is not retried (`marker_retries` takes
        // data completions only); the module completes it when the channel closes.
        let mut unfilled = std::mem::take(&mut self.counters.unfilled);
        tracing::warn!(
            "{} completions could not write their data: completing them with the timeout marker",
            unfilled.len()
        );
        marker_retries(&unfilled, &mut self.commands);
        self.run_commands();
        unfilled.clear();
        self.counters.unfilled = unfilled;
    }

    /// Runs the pending commands on the backend and counts what they did.
    fn run_commands(&mut self) {
        if self.commands.is_empty() {
            return;
        }
        let done = self.backend.execute(&self.commands, &mut self.counters);
        self.counters.replays += done.replays;
        self.counters.commands_failed += done.failed;
        self.commands.clear();
    }

    /// Handles queued control requests; true when the thread must stop.
    fn drain_control(&mut self) -> bool {
        loop {
            match self.control.try_recv() {
                Ok(Control::Create { spec, placement, reply }) => {
                    let _ = reply.send(self.create(spec, placement));
                }
                Ok(Control::AttachSpace { uvm, reply }) => {
                    let attached = match &mut self.backend {
                        Gpus::Shim(shim) => shim.attach(uvm),
                        Gpus::Emulated { .. } => self.observe(uvm),
                    };
                    let _ = reply.send(attached);
                }
                Ok(Control::DetachSpace { space, reply }) => {
                    match &mut self.backend {
                        Gpus::Shim(shim) => shim.detach(space),
                        Gpus::Emulated { .. } => {
                            if self.observer.detach(space) {
                                let cancel = opcode::AsyncCancel::new(OBSERVER_TOKEN | u64::from(space))
                                    .build()
                                    .user_data(CANCEL_TOKEN);
                                if let Err(e) = self.push(cancel) {
                                    tracing::error!(space, "cannot cancel the observed space's poll: {e}");
                                }
                            }
                        }
                    }
                    let _ = reply.send(());
                }
                Ok(Control::Watch { space, start, end, reply }) => {
                    let watched = match &self.backend {
                        Gpus::Emulated { .. } => self.observer.watch(space, start, end),
                        Gpus::Shim(_) => Err(WireError::new(
                            ErrorCode::Unsupported,
                            "the shim backend holds the faults of its channels itself: nothing to watch",
                        )),
                    };
                    let _ = reply.send(watched);
                }
                Ok(Control::Destroy { channel, reply }) => {
                    let _ = reply.send(self.destroy(channel));
                }
                Ok(Control::Publish { channel, slot, reply }) => {
                    let _ = reply.send(self.publish(channel, slot));
                }
                Ok(Control::Snapshot { reply }) => {
                    let _ = reply.send(self.snapshot());
                }
                Ok(Control::Shutdown { reply }) => {
                    self.shutdown();
                    let _ = reply.send(());
                    return true;
                }
                Err(TryRecvError::Empty) => return false,
                Err(TryRecvError::Disconnected) => {
                    self.shutdown();
                    return true;
                }
            }
        }
    }

    /// Observes an application's address space (emulated backend on a GPU machine).
    fn observe(&mut self, uvm: OwnedFd) -> Result<u32, WireError> {
        let space = self.observer.attach(uvm)?;
        if let Err(e) = self.arm_observer(space) {
            self.observer.detach(space);
            return Err(WireError::new(ErrorCode::Io, format!("cannot poll the observed space: {e}")));
        }
        Ok(space)
    }

    fn create(&mut self, spec: ChannelSpec, placement: Option<PlacementRequest>) -> Result<Created, WireError> {
        let backend = self.backend.name();
        match (&self.backend, placement) {
            (Gpus::Emulated { count, .. }, _) if spec.consumer_gpu >= *count => {
                return Err(WireError::new(
                    ErrorCode::Invalid,
                    format!("consumer GPU {} does not exist: the emulated backend has {count} GPUs", spec.consumer_gpu),
                ))
            }
            (Gpus::Emulated { .. }, Some(_)) => {
                return Err(WireError::new(
                    ErrorCode::Unsupported,
                    "the emulated backend places channels itself: drop base_va",
                ))
            }
            (Gpus::Shim(_), None) => return Err(WireError::new(
                ErrorCode::Invalid,
                "the shim backend places channels in the application's managed memory: attach_space, then give base_va",
            )),
            _ => {}
        }
        if matches!((&self.backend, spec.producer), (Gpus::Emulated { .. }, wic_engine::Producer::Gpu { .. })) {
            // The emulator models GPU producers itself (wicd demo); the emulated backend has no
            // GPU memory to copy a producer's bytes from.
            return Err(WireError::new(
                ErrorCode::Unsupported,
                format!("the {backend} backend serves host producers only"),
            ));
        }
        let layout = self.engine.open_channel(spec).map_err(engine_error)?;
        match self.attach_regions(&spec, &layout, placement) {
            Ok(created) => Ok(created),
            Err(e) => {
                let mut discard = Vec::new();
                self.engine.close_channel(layout.id, &mut discard).expect("opened just now");
                self.forget(layout.id.0, ChannelState::Closed);
                Err(e)
            }
        }
    }

    fn attach_regions(
        &mut self,
        spec: &ChannelSpec,
        layout: &ChannelLayout,
        placement: Option<PlacementRequest>,
    ) -> Result<Created, WireError> {
        let id = layout.id.0;
        let io =
            |e: io::Error| WireError::new(ErrorCode::Io, format!("cannot set up the channel's shared memory: {e}"));
        let (producer, producer_fd) = match spec.producer {
            wic_engine::Producer::Host => {
                let layout = ProducerLayout { slots: spec.slots, batch_bytes: layout.batch_bytes };
                let (region, fd) = ProducerRegion::create(layout).map_err(io)?;
                (Some(region), Some(fd))
            }
            wic_engine::Producer::Gpu { .. } => (None, None),
        };
        let publish_bell = producer.as_ref().map(|_| eventfd()).transpose().map_err(io)?;
        let mut created = Created {
            layout: layout.clone(),
            consumer_region: None,
            fault_doorbell: None,
            producer_region: producer_fd,
            publish_doorbell: publish_bell.as_ref().map(OwnedFd::try_clone).transpose().map_err(io)?,
        };
        match (&mut self.backend, placement) {
            (Gpus::Shim(shim), Some(at)) => {
                created.layout = shim.add(layout, spec.producer, at.space, at.base_va, producer)?;
            }
            (Gpus::Emulated { gpus, .. }, None) => {
                let consumer_layout = ConsumerLayout { slots: spec.slots, pages_per_run: layout.pages_per_run };
                let (consumer, consumer_fd) = ConsumerRegion::create(consumer_layout).map_err(io)?;
                let fault_bell = eventfd().map_err(io)?;
                created.consumer_region = Some(consumer_fd);
                created.fault_doorbell = Some(fault_bell.try_clone().map_err(io)?);
                let channel = EmulatedChannel { consumer_gpu: spec.consumer_gpu, consumer, producer };
                gpus.add(id, channel, layout.slots.iter().map(|s| s.runs));
                self.fault_rings.insert(id, FaultRing::default());
                self.register(fault_bell, id, Bell::Faults).map_err(io)?;
            }
            _ => unreachable!("create checked the placement against the backend"),
        }
        self.counters.channels.insert(id, ChannelCounters::default());
        if let Some(bell) = publish_bell {
            self.register(bell, id, Bell::Published).map_err(io)?;
        }
        Ok(created)
    }

    fn destroy(&mut self, channel: u32) -> Result<(), WireError> {
        self.engine.close_channel(ChannelId(channel), &mut self.commands).map_err(engine_error)?;
        // Held faults were completed with the closed marker: run that before the pages go.
        self.execute();
        self.forget(channel, ChannelState::Closed);
        Ok(())
    }

    /// Drops a closed channel's backend state and cancels its doorbell reads.
    fn forget(&mut self, channel: u32, state: ChannelState) {
        let producer = match &mut self.backend {
            Gpus::Emulated { gpus, .. } => gpus.remove(channel).map(|regions| {
                regions.consumer.set_state(state);
                regions.producer
            }),
            Gpus::Shim(shim) => shim.remove(channel).map(|placed| placed.producer),
        };
        if let Some(producer) = producer.flatten() {
            producer.set_state(state);
        }
        if self.fault_rings.remove(&channel).is_some_and(|fault_ring| fault_ring.unread) {
            self.unread.retain(|&c| c != channel);
        }
        self.counters.channels.remove(&channel);
        let tokens: Vec<u64> = self
            .registrations
            .iter_mut()
            .filter(|(_, r)| r.channel == channel && !r.closing)
            .map(|(t, r)| {
                r.closing = true;
                *t
            })
            .collect();
        for token in tokens {
            let cancel = opcode::AsyncCancel::new(token).build().user_data(CANCEL_TOKEN);
            if let Err(e) = self.push(cancel) {
                tracing::error!("channel {channel}: cannot cancel its doorbell read: {e}");
            }
        }
    }

    fn publish(&mut self, channel: u32, slot: u32) -> Result<(), WireError> {
        let spec = self.engine.channel_spec(ChannelId(channel)).map_err(engine_error)?;
        if slot >= spec.slots {
            return Err(WireError::new(
                ErrorCode::NotFound,
                format!("channel {channel} has {} slots, no slot {slot}", spec.slots),
            ));
        }
        let producer = self
            .backend
            .producer(channel)
            .ok_or_else(|| WireError::new(ErrorCode::Invalid, format!("channel {channel} has no host producer")))?;
        // The same step as libwic's fast path, then the same scan a doorbell triggers.
        if !producer.publish(slot) {
            return Err(WireError::new(
                ErrorCode::Busy,
                format!("channel {channel} slot {slot}: previous data not yet delivered"),
            ));
        }
        self.take_published(channel);
        Ok(())
    }

    fn shutdown(&mut self) {
        let channels = self.backend.channel_ids();
        // Faults posted but not read yet are held as well: read first, they get the stopping
        // marker like the rest, not the closed marker their channel's removal would give. One
        // pass each reads all a ring holds; a warp posting after it sees the stopping state.
        self.take_ring();
        for &channel in &channels {
            self.take_faults(channel);
        }
        self.engine.shutdown(&mut self.commands);
        self.execute();
        for channel in channels {
            self.forget(channel, ChannelState::Stopping);
        }
        let _ = self.ring.submit();
    }

    fn snapshot(&mut self) -> Snapshot {
        // `unrouted`: entries read but dropped before the engine, those naming another
        // channel's pages on the emulated GPU, records of no placed channel on the shim.
        // Overflows: the module's count on the shim; on the emulated GPU, only what wicd saw
        // itself, as the region's word is the client's to write.
        let (overflows, unrouted, backend_ignored) = match &mut self.backend {
            Gpus::Emulated { gpus, .. } => {
                for (id, channel) in gpus.channels() {
                    let counters = self.counters.channels.entry(*id).or_default();
                    counters.client_overflows = counters.client_overflows.max(channel.consumer.overflows());
                }
                (self.counters.rings_found_full, self.counters.misdirected, 0)
            }
            Gpus::Shim(shim) => (shim.overflows(), shim.stray_records(), shim.ring_anomalies()),
        };
        let s = self.engine.stats();
        let pool = self.engine.pool();
        let mut stats = Stats {
            faults_captured: s.entries + unrouted,
            faults_held: s.held,
            faults_completed: s.delivered,
            faults_timed_out: s.timed_out,
            faults_cancelled: s.closed_while_held,
            faults_ignored: s.malformed + s.foreign + s.wrong_gpu + s.duplicates + s.stale + unrouted + backend_ignored,
            pfq_depth: self.engine.held(),
            dab_updates: s.dab_updates,
            pat_faults: s.pat_publishes + s.pat_duplicates,
            host_publishes: s.host_publishes,
            pool_pages: pool.capacity(),
            pool_pages_used: pool.capacity() - pool.free_pages(),
            pool_longest_free_run: pool.longest_free_run(),
            wake_latency_ns: super::wire_histogram(&s.wake_latency_ns),
            batch_sizes: super::wire_histogram(&s.batch_sizes),
            fault_buffer_overflows: overflows,
            replays: self.counters.replays,
            commands_failed: self.counters.commands_failed,
            channels: self.engine.channel_count() as u32,
            clients: 0,
            ..Stats::default()
        };
        self.observer.report(&mut stats);
        Snapshot {
            stats,
            channels: self.counters.channels.iter().map(|(id, counters)| (*id, *counters)).collect(),
            held: self.engine.held(),
        }
    }
}
