//! A channel handle: the daemon's description of the channel, the shared-memory regions and
//! doorbells handed over with it, and the fast paths that use them.
//!
//! - **Host producers** fill a slot's buffer in the producer region and publish it by bumping the
//!   slot's `published` counter, then ring the publish doorbell; the slot can be written again
//!   once the daemon has delivered the generation (`delivered` catches up, futex-woken). A
//!   producer that can reach the consumers' pages writes the batch there instead
//!   ([`Channel::acquire_run`], [`Channel::publish_run`]) and the daemon copies nothing but
//!   the head words (docs/architecture.md, "Host producers in place").
//! - **Consumers** (on the emulated backend) play the warps of one batch: read the slot's run for
//!   the next generation, and while its pages are unmapped, post a replayable fault to the
//!   channel's fault ring, ring the fault doorbell and sleep until the daemon replays.
//!
//! Every method takes `&self`, so a handle may be shared by threads, with one rule: one thread
//! at a time per slot and direction (one producer thread and one consumer thread per slot).

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wic_proto::client::ClientError;
use wic_proto::message::{ChannelInfo, ErrorCode, FdKind, Producer, Reply, Request, Role};
use wic_proto::shm::{
    futex_wait, ChannelState, ConsumerLayout, ConsumerRegion, ProducerLayout, ProducerRegion, ShmError, PAGE_MAPPED,
};
use wic_types::fault::AccessType;
use wic_types::{ErrorMarker, FaultEntry, PAGE_SIZE};

use crate::abi::{role_to_c, WicChannelInfo, WicSlotInfo};
use crate::connection::Connection;

/// Longest single sleep while waiting: how often a waiter checks that the daemon is alive.
const LIVENESS_PERIOD: Duration = Duration::from_millis(100);
/// How long a warp whose fault found the ring full waits for a replay before faulting again.
const RING_FULL_BACKOFF: Duration = Duration::from_millis(1);
/// Instance block of the emulated consumer GPU `n` is at `INSTANCE_STRIDE * (n + 1)`, as the
/// emulated GPUs number them.
const INSTANCE_STRIDE: u64 = 0x10_0000;

/// Why a channel operation failed.
#[derive(Debug)]
pub enum Error {
    /// A request to the daemon failed or was refused.
    Request(ClientError),
    /// The daemon's reply is inconsistent or of the wrong kind.
    Protocol(String),
    /// A shared region handed over by the daemon cannot be mapped or does not match the reply.
    Region(ShmError),
    /// This handle's role does not allow the operation, or the daemon handed it no region for it.
    Permission(&'static str),
    /// The channel's producer is a GPU: there is no host publish path.
    GpuProducer,
    /// The channel's consumers are GPU kernels (shim backend): there is no host consume path.
    GpuConsumer,
    /// Only producer and consumer tokens can be granted.
    GrantOwner,
    /// No such slot.
    NoSlot { slot: u32, slots: u32 },
    /// More bytes than a slot holds.
    TooLong { len: usize, max: u64 },
    /// The slot's previous generation has not been delivered yet.
    Busy,
    /// The wait ran out, or the daemon completed the request with the timeout marker.
    TimedOut,
    /// The channel was destroyed.
    Closed,
    /// The daemon is stopping.
    Stopping,
    /// The daemon hung up while a caller waited for it.
    DaemonGone,
    /// This handle cannot reach the consumers' pages to write a run in place.
    NotInPlace(&'static str),
    /// The last in-place publish of the slot missed its generation: the generation ended
    /// (timed out, or the module's bound) before its run was mapped, so the consumers read an
    /// error marker instead. The batch must be written again, into the run acquired next.
    Missed,
    /// Ringing a doorbell failed.
    Doorbell(io::Error),
}

impl Error {
    /// The error code this maps to in `wic.h`.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Request(e) => e.code(),
            Self::Protocol(_) => ErrorCode::Protocol,
            Self::Region(ShmError::BadHeader(_)) => ErrorCode::Protocol,
            Self::Region(ShmError::Io(_)) | Self::Doorbell(_) => ErrorCode::Io,
            Self::Permission(_) => ErrorCode::Permission,
            Self::GpuProducer | Self::GpuConsumer => ErrorCode::Unsupported,
            Self::GrantOwner | Self::TooLong { .. } => ErrorCode::Invalid,
            Self::NoSlot { .. } => ErrorCode::NotFound,
            Self::Busy => ErrorCode::Busy,
            Self::TimedOut => ErrorCode::TimedOut,
            Self::Closed => ErrorCode::Closed,
            Self::Stopping => ErrorCode::Stopping,
            Self::DaemonGone => ErrorCode::Connect,
            Self::NotInPlace(_) => ErrorCode::Unsupported,
            Self::Missed => ErrorCode::Stale,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Request(e) => e.fmt(f),
            Self::Protocol(what) => write!(f, "unexpected answer from wicd: {what}"),
            Self::Region(e) => e.fmt(f),
            Self::Permission(what) => write!(f, "permission denied: {what}"),
            Self::GpuProducer => f.write_str("the channel's producer is a GPU; hosts cannot publish to it"),
            Self::GpuConsumer => f.write_str("the channel's consumers are GPU kernels; hosts cannot consume from it"),
            Self::GrantOwner => f.write_str("only producer and consumer roles can be granted"),
            Self::NoSlot { slot, slots } => write!(f, "no slot {slot}: the channel has {slots}"),
            Self::TooLong { len, max } => write!(f, "{len} bytes do not fit a slot of {max} bytes"),
            Self::Busy => f.write_str(ErrorCode::Busy.describe()),
            Self::TimedOut => f.write_str(ErrorCode::TimedOut.describe()),
            Self::Closed => f.write_str(ErrorCode::Closed.describe()),
            Self::Stopping => f.write_str(ErrorCode::Stopping.describe()),
            Self::DaemonGone => f.write_str("wicd hung up"),
            Self::NotInPlace(why) => write!(f, "cannot write in place: {why}"),
            Self::Missed => f.write_str("the last in-place publish missed its generation; write the batch again"),
            Self::Doorbell(e) => write!(f, "ringing the doorbell: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Request(e) => Some(e),
            Self::Region(e) => Some(e),
            Self::Doorbell(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ClientError> for Error {
    fn from(e: ClientError) -> Self {
        Self::Request(e)
    }
}

impl From<ShmError> for Error {
    fn from(e: ShmError) -> Self {
        Self::Region(e)
    }
}

/// The consumer's side: the emulated GPU's view of the channel.
struct ConsumerSide {
    region: ConsumerRegion,
    doorbell: OwnedFd,
    /// Next generation each slot's consumer reads.
    generations: Vec<AtomicU32>,
}

/// A host producer's side.
struct ProducerSide {
    region: ProducerRegion,
    doorbell: OwnedFd,
    /// Per slot, the region's count of missed in-place publishes last seen by this handle.
    missed_seen: Vec<AtomicU32>,
    /// Per slot, this handle published in place and has not yet said whether it missed.
    in_place_pending: Vec<AtomicBool>,
}

/// A slot's run, lent to its host producer to write the next batch in place
/// ([`Channel::acquire_run`]); it borrows the channel, whose region holds the head words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run<'a> {
    /// The run: [`ChannelInfo::batch_bytes`] bytes in the consumers' pages, except the first
    /// 8 bytes of each page, which belong to `heads`.
    pub data: *mut u8,
    /// One word per page: the batch's bytes `[4096 p, 4096 p + 8)` go to `heads[p]`, never to
    /// `data + 4096 p`, where a generation that ends meanwhile puts its error marker.
    pub heads: *mut u64,
    /// Pages of the run.
    pub pages: u32,
    /// Which of the slot's two runs.
    pub side: u8,
    /// The slot.
    pub slot: u32,
    channel: PhantomData<&'a Channel>,
}

impl Run<'_> {
    /// The run `data`, `heads`, `pages`, `side` and `slot` describe, as a C caller hands it
    /// back (`struct wic_run`).
    ///
    /// # Safety
    /// The fields come from [`Channel::acquire_run`] of a channel this process still has open.
    pub unsafe fn from_raw(data: *mut u8, heads: *mut u64, pages: u32, side: u8, slot: u32) -> Self {
        Self { data, heads, pages, side, slot, channel: PhantomData }
    }

    /// Copies `bytes` to `offset` of the batch, the head words' share into the heads.
    ///
    /// # Safety
    /// `self` came from [`Channel::acquire_run`] of a channel still open, and is not yet
    /// published; `offset + bytes.len()` is within the batch.
    pub unsafe fn write(&self, offset: usize, bytes: &[u8]) {
        let page = PAGE_SIZE as usize;
        let mut done = 0;
        while done < bytes.len() {
            let at = offset + done;
            let (index, within) = (at / page, at % page);
            let take = if within < 8 { 8 - within } else { page - within }.min(bytes.len() - done);
            let chunk = &bytes[done..done + take];
            // SAFETY: in the caller's bounds, per this function's contract: the head word of
            // page `index` is one of `pages`, and the rest of the page is in the run.
            unsafe {
                if within < 8 {
                    let head = self.heads.add(index).cast::<u8>().add(within);
                    std::ptr::copy_nonoverlapping(chunk.as_ptr(), head, take);
                } else {
                    std::ptr::copy_nonoverlapping(chunk.as_ptr(), self.data.add(at), take);
                }
            }
            done += take;
        }
    }
}

/// A channel this process created or attached to.
pub struct Channel {
    info: ChannelInfo,
    conn: Arc<Connection>,
    consumer: Option<ConsumerSide>,
    producer: Option<ProducerSide>,
    /// The channel was placed in this process's managed memory: its runs' addresses are this
    /// process's (shim backend).
    placed_here: bool,
}

impl fmt::Debug for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Channel")
            .field("info", &self.info)
            .field("consumer", &self.consumer.is_some())
            .field("producer", &self.producer.is_some())
            .finish_non_exhaustive()
    }
}

/// Takes the descriptor of `kind` out of `fds`, checking it is there at most once.
fn take_fd(kinds: &[FdKind], fds: &mut [Option<OwnedFd>], kind: FdKind) -> Result<Option<OwnedFd>, Error> {
    let mut found = kinds.iter().enumerate().filter(|(_, k)| **k == kind).map(|(i, _)| i);
    match (found.next(), found.next()) {
        (None, _) => Ok(None),
        (Some(i), None) => Ok(fds[i].take()),
        (Some(_), Some(_)) => Err(Error::Protocol(format!("{kind:?} passed twice"))),
    }
}

/// A region descriptor and its doorbell come together or not at all.
fn pair(region: Option<OwnedFd>, doorbell: Option<OwnedFd>, what: &str) -> Result<Option<(OwnedFd, OwnedFd)>, Error> {
    match (region, doorbell) {
        (Some(r), Some(d)) => Ok(Some((r, d))),
        (None, None) => Ok(None),
        _ => Err(Error::Protocol(format!("the {what} region and its doorbell must be passed together"))),
    }
}

/// Nanoseconds on `CLOCK_MONOTONIC`, the clock fault timestamps use on the emulated GPU.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a pointer to a live local; with
    // CLOCK_MONOTONIC it cannot fail on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// Adds 1 to an eventfd doorbell. A saturated counter (EAGAIN) is fine: the daemon has not read
/// it yet, so it will look anyway.
fn ring(doorbell: &OwnedFd) -> Result<(), Error> {
    loop {
        match nix::unistd::write(doorbell, &1u64.to_ne_bytes()) {
            Ok(_) | Err(nix::errno::Errno::EAGAIN) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(Error::Doorbell(e.into())),
        }
    }
}

fn check_open(state: ChannelState) -> Result<(), Error> {
    match state {
        ChannelState::Open => Ok(()),
        ChannelState::Closed => Err(Error::Closed),
        ChannelState::Stopping => Err(Error::Stopping),
    }
}

impl Channel {
    /// Opens a channel from the daemon's reply and the descriptors that came with it.
    pub(crate) fn open(
        conn: Arc<Connection>,
        info: ChannelInfo,
        fds: Vec<OwnedFd>,
        placed_here: bool,
    ) -> Result<Self, Error> {
        if fds.len() != info.fds.len() {
            return Err(Error::Protocol(format!("{} descriptors announced, {} received", info.fds.len(), fds.len())));
        }
        if info.slots.len() != info.spec.slots as usize {
            return Err(Error::Protocol(format!(
                "{} slots described for a channel of {}",
                info.slots.len(),
                info.spec.slots
            )));
        }
        if info.batch_bytes > u64::from(info.pages_per_run) * PAGE_SIZE {
            return Err(Error::Protocol(format!(
                "a batch of {} bytes does not fit a run of {} pages",
                info.batch_bytes, info.pages_per_run
            )));
        }
        let mut fds: Vec<Option<OwnedFd>> = fds.into_iter().map(Some).collect();
        let consumer = pair(
            take_fd(&info.fds, &mut fds, FdKind::ConsumerRegion)?,
            take_fd(&info.fds, &mut fds, FdKind::FaultDoorbell)?,
            "consumer",
        )?;
        let producer = pair(
            take_fd(&info.fds, &mut fds, FdKind::ProducerRegion)?,
            take_fd(&info.fds, &mut fds, FdKind::PublishDoorbell)?,
            "producer",
        )?;
        let consumer = match consumer {
            Some((fd, doorbell)) => {
                let layout = ConsumerLayout { slots: info.spec.slots, pages_per_run: info.pages_per_run };
                let region = ConsumerRegion::open(&fd, layout)?;
                let generations = (0..info.spec.slots).map(|_| AtomicU32::new(0)).collect();
                Some(ConsumerSide { region, doorbell, generations })
            }
            None => None,
        };
        let producer = match producer {
            Some((fd, doorbell)) => {
                let layout = ProducerLayout { slots: info.spec.slots, batch_bytes: info.batch_bytes };
                let region = ProducerRegion::open(&fd, layout)?;
                // Misses before this handle existed are not its own.
                let seen =
                    |slot| if region.supports_in_place() { region.missed(slot).load(Ordering::Acquire) } else { 0 };
                let missed_seen = (0..info.spec.slots).map(|slot| AtomicU32::new(seen(slot))).collect();
                let in_place_pending = (0..info.spec.slots).map(|_| AtomicBool::new(false)).collect();
                Some(ProducerSide { region, doorbell, missed_seen, in_place_pending })
            }
            None => None,
        };
        Ok(Self { info, conn, consumer, producer, placed_here })
    }

    /// The daemon's description of the channel.
    pub fn info(&self) -> &ChannelInfo {
        &self.info
    }

    /// The channel's id in the daemon.
    pub fn id(&self) -> u32 {
        self.info.channel
    }

    /// The part of the channel this handle holds.
    pub fn role(&self) -> Role {
        self.info.role
    }

    /// The `struct wic_channel_info` view of the channel.
    pub fn abi_info(&self) -> WicChannelInfo {
        WicChannelInfo {
            channel_id: self.info.channel,
            role: role_to_c(self.info.role),
            slots: self.info.spec.slots,
            message_bytes: self.info.spec.message_bytes,
            pages_per_run: self.info.pages_per_run,
            warps_per_batch: self.info.warps_per_batch,
            batch_bytes: self.info.batch_bytes,
        }
    }

    fn check_slot(&self, slot: u32) -> Result<(), Error> {
        if (slot as usize) < self.info.slots.len() {
            Ok(())
        } else {
            Err(Error::NoSlot { slot, slots: self.info.spec.slots })
        }
    }

    /// The `struct wic_slot_info` of `slot`.
    pub fn abi_slot(&self, slot: u32) -> Result<WicSlotInfo, Error> {
        self.check_slot(slot)?;
        let s = &self.info.slots[slot as usize];
        Ok(WicSlotInfo { run_va: s.runs, pat_va: s.pat.unwrap_or([0; 2]), tag: s.tag, reserved: 0 })
    }

    /// Issues a token that lets another process attach as `role` (producer or consumer); `uid`
    /// restricts it to one user.
    pub fn grant(&self, role: Role, uid: Option<u32>) -> Result<String, Error> {
        if role == Role::Owner {
            return Err(Error::GrantOwner);
        }
        if self.info.role != Role::Owner {
            return Err(Error::Permission("only the owner's handle may grant"));
        }
        match self.conn.call(&Request::Grant { channel: self.info.channel, role, uid })? {
            Reply::Token { token } => Ok(token),
            other => Err(Error::Protocol(format!("expected a token, got {other:?}"))),
        }
    }

    /// Releases the handle; the owner's handle also destroys the channel in the daemon. A
    /// channel the daemon already dropped (closed, or not found) is not an error.
    pub fn close(self) -> Result<(), Error> {
        let Self { info, conn, consumer, producer, .. } = self;
        drop((consumer, producer));
        if info.role != Role::Owner {
            return Ok(());
        }
        match conn.call(&Request::DestroyChannel { channel: info.channel }) {
            Ok(Reply::Done) => Ok(()),
            Ok(other) => Err(Error::Protocol(format!("expected done, got {other:?}"))),
            Err(e) if matches!(e.code(), ErrorCode::NotFound | ErrorCode::Closed) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    // ---- Host producer ----

    fn producer(&self) -> Result<&ProducerSide, Error> {
        if !self.info.role.may_publish() {
            return Err(Error::Permission("this handle may not publish"));
        }
        if matches!(self.info.spec.producer, Producer::Gpu { .. }) {
            return Err(Error::GpuProducer);
        }
        self.producer.as_ref().ok_or(Error::Permission("the daemon gave this handle no producer region"))
    }

    /// The producer side and its region, for a valid `slot` of an open channel.
    fn producer_slot(&self, slot: u32) -> Result<&ProducerRegion, Error> {
        let side = self.producer()?;
        self.check_slot(slot)?;
        check_open(side.region.state())?;
        Ok(&side.region)
    }

    /// `slot`'s buffer in the producer region: [`ChannelInfo::batch_bytes`] bytes to fill
    /// before [`publish`](Self::publish). Writing it while the previous generation is not yet
    /// delivered races with the daemon's copy.
    pub fn slot_buffer(&self, slot: u32) -> Result<*mut u8, Error> {
        let side = self.producer()?;
        self.check_slot(slot)?;
        Ok(side.region.slot_ptr(slot))
    }

    /// Publishes `slot`, whose buffer holds the next generation.
    pub fn publish(&self, slot: u32) -> Result<(), Error> {
        let region = self.producer_slot(slot)?;
        if !region.publish(slot) {
            return Err(Error::Busy);
        }
        self.ring_publish()
    }

    fn ring_publish(&self) -> Result<(), Error> {
        let side = self.producer.as_ref().expect("checked by producer()");
        ring(&side.doorbell)
    }

    /// Copies `data` into `slot`'s buffer and publishes it; refused with [`Error::Busy`],
    /// without writing, while the previous generation is not delivered.
    pub fn publish_copy(&self, slot: u32, data: &[u8]) -> Result<(), Error> {
        let region = self.producer_slot(slot)?;
        if data.len() as u64 > self.info.batch_bytes {
            return Err(Error::TooLong { len: data.len(), max: self.info.batch_bytes });
        }
        if region.published(slot).load(Ordering::Acquire) != region.delivered(slot).load(Ordering::Acquire) {
            return Err(Error::Busy);
        }
        region.write_slot(slot, data);
        if !region.publish(slot) {
            return Err(Error::Busy);
        }
        self.ring_publish()
    }

    /// Waits until `slot` can be published again: its last generation has been delivered.
    /// `timeout` of zero polls once. [`Error::Missed`], once, when the last in-place publish
    /// missed its generation.
    pub fn wait_writable(&self, slot: u32, timeout: Duration) -> Result<(), Error> {
        let side = self.producer()?;
        self.check_slot(slot)?;
        let region = &side.region;
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let delivered = region.delivered(slot).load(Ordering::Acquire);
            if region.published(slot).load(Ordering::Acquire) == delivered {
                return Self::report_missed(side, slot);
            }
            check_open(region.state())?;
            let wait = match deadline {
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(Error::TimedOut);
                    }
                    left.min(LIVENESS_PERIOD)
                }
                None => LIVENESS_PERIOD,
            };
            futex_wait(region.delivered(slot), delivered, wait);
            if region.delivered(slot).load(Ordering::Acquire) == delivered && self.conn.daemon_gone() {
                return Err(Error::DaemonGone);
            }
        }
    }

    /// [`Error::Missed`] if this handle's last in-place publish of `slot`, now delivered or
    /// dropped, missed its generation; said once.
    fn report_missed(side: &ProducerSide, slot: u32) -> Result<(), Error> {
        if !side.region.supports_in_place() {
            return Ok(());
        }
        let missed = side.region.missed(slot).load(Ordering::Acquire);
        let seen = side.missed_seen[slot as usize].swap(missed, Ordering::Relaxed);
        if side.in_place_pending[slot as usize].swap(false, Ordering::Relaxed) && seen != missed {
            return Err(Error::Missed);
        }
        Ok(())
    }

    /// Waits until `slot` can be published again ([`Channel::wait_writable`]) and lends its
    /// producer the run the next batch goes to, to write in place: the consumers' own pages,
    /// which no GPU can read until [`Channel::publish_run`] has them mapped, so the daemon
    /// copies only the head words.
    ///
    /// Only the handle that can reach those pages writes in place: the owner's handle of a
    /// channel placed in this process's managed memory (shim backend; the pages should live
    /// on the CPU: `cudaMemAdviseSetPreferredLocation` to `cudaCpuDeviceId`, or a GPU fault
    /// on other data in their 2 MiB block can migrate them), or a handle holding the consumer
    /// region (emulated backend). [`Error::Missed`] when the previous in-place publish missed
    /// its generation: acquire again and write the batch again.
    pub fn acquire_run(&self, slot: u32, timeout: Duration) -> Result<Run<'_>, Error> {
        let side = self.producer()?;
        self.check_slot(slot)?;
        if !side.region.supports_in_place() {
            return Err(Error::NotInPlace("the daemon is older than in-place publishing"));
        }
        let owner_here = self.placed_here && self.info.role == Role::Owner;
        if !owner_here && self.consumer.is_none() {
            return Err(Error::NotInPlace("the consumers' pages are in another process: publish from the slot buffer"));
        }
        self.wait_writable(slot, timeout)?;
        let run_side = (side.region.writable_side(slot).load(Ordering::Acquire) & 1) as u8;
        let data = match &self.consumer {
            _ if owner_here => self.info.slots[slot as usize].runs[run_side as usize] as *mut u8,
            Some(consumer) => consumer.region.page_ptr(consumer.region.layout().run_page(slot, run_side as usize)),
            None => unreachable!("checked above"),
        };
        let heads = side.region.heads_ptr(slot);
        // SAFETY: the run and head words of a channel this handle has open.
        Ok(unsafe { Run::from_raw(data, heads, self.info.pages_per_run, run_side, slot) })
    }

    /// Publishes the batch written into `run`, from [`Channel::acquire_run`] of its slot.
    pub fn publish_run(&self, run: &Run<'_>) -> Result<(), Error> {
        let region = self.producer_slot(run.slot)?;
        if !region.supports_in_place() {
            return Err(Error::NotInPlace("the daemon is older than in-place publishing"));
        }
        if !region.publish_in_place(run.slot, run.side) {
            return Err(Error::Busy);
        }
        let side = self.producer.as_ref().expect("checked by producer_slot()");
        side.in_place_pending[run.slot as usize].store(true, Ordering::Relaxed);
        self.ring_publish()
    }

    // ---- Consumer (emulated backend) ----

    fn consumer(&self) -> Result<&ConsumerSide, Error> {
        if !self.info.role.may_consume() {
            return Err(Error::Permission("this handle may not consume"));
        }
        // The shim backend passes no consumer region: its consumers are the GPU's warps.
        self.consumer.as_ref().ok_or(Error::GpuConsumer)
    }

    /// Consumes `slot`'s next generation as the consumer warps of one batch on the emulated GPU
    /// would: copies up to [`ChannelInfo::batch_bytes`] bytes into `dst` and returns how many.
    ///
    /// Blocks until the daemon maps the run. Only one thread may consume a given slot at a
    /// time. A request the daemon completes with an error marker (timeout, channel closed,
    /// daemon stopping) uses up the generation, as it does for device consumers.
    pub fn consume(&self, slot: u32, dst: &mut [u8]) -> Result<usize, Error> {
        let side = self.consumer()?;
        self.check_slot(slot)?;
        let region = &side.region;
        let generation = &side.generations[slot as usize];
        let side_index = (generation.load(Ordering::Relaxed) % 2) as usize;
        let page = region.layout().run_page(slot, side_index);
        let run_va = self.info.slots[slot as usize].runs[side_index];
        let instance = INSTANCE_STRIDE * (u64::from(self.info.spec.consumer_gpu) + 1);
        let mapped = || region.page_state(page).load(Ordering::Acquire) == PAGE_MAPPED;
        loop {
            if mapped() {
                break;
            }
            let seq = region.replay_seq().load(Ordering::Acquire);
            // The state after the replay counter: the daemon closes a channel by setting its
            // state, then replaying, so a close either shows here or wakes the sleep below.
            // The other way round, a close between the two reads would be slept through.
            check_open(region.state())?;
            // Checked again after reading the replay counter: a replay between the first check
            // and here would otherwise be slept through.
            if mapped() {
                break;
            }
            let entry = FaultEntry::replayable_gpc(run_va, AccessType::Read, monotonic_ns(), instance, 0, 0).encode();
            if region.post_fault(&entry).is_err() {
                // The fault buffer is full: the hardware drops the fault and the warp faults
                // again after the next replay.
                futex_wait(region.replay_seq(), seq, RING_FULL_BACKOFF);
                continue;
            }
            ring(&side.doorbell)?;
            while region.replay_seq().load(Ordering::Acquire) == seq {
                futex_wait(region.replay_seq(), seq, LIVENESS_PERIOD);
                // A daemon that stops replays its held faults and then hangs up: the replay
                // must win over the hang-up, so the hang-up only counts while none came.
                if region.replay_seq().load(Ordering::Acquire) == seq && self.conn.daemon_gone() {
                    return Err(Error::DaemonGone);
                }
            }
        }
        let mut word = [0u8; 8];
        region.read_pages(page, &mut word);
        if let Some(marker) = ErrorMarker::from_word(u64::from_ne_bytes(word)) {
            generation.fetch_add(1, Ordering::Relaxed);
            return Err(match marker {
                ErrorMarker::Timeout => Error::TimedOut,
                ErrorMarker::ChannelClosed => Error::Closed,
                ErrorMarker::DaemonStopping => Error::Stopping,
                ErrorMarker::DaemonGone => Error::DaemonGone,
            });
        }
        let len = dst.len().min(usize::try_from(self.info.batch_bytes).unwrap_or(usize::MAX));
        region.read_pages(page, &mut dst[..len]);
        generation.fetch_add(1, Ordering::Relaxed);
        Ok(len)
    }
}
