//! The fast path: one thread that owns the service core (the engine and the backend) and waits
//! on io_uring for doorbells (faults posted, data published), the descriptors the backend names
//! (the shim's fault ring, observed spaces), control requests and the core's next deadline.
//!
//! The control side asks through [`super::control`]. Nothing here blocks on a client: every read
//! is of the daemon's own eventfds and shared regions.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, TryRecvError};
use io_uring::{opcode, types, IoUring};
use nix::sys::eventfd::EventFd;
use wic_engine::{ChannelSpec, Engine, Nanos};
use wic_proto::message::{ErrorCode, WireError};

use super::backend::{eventfd, Added, Backend, Bell, PlacementRequest, Source};
use super::control::{Control, Created, DataplaneHandle};
use super::core::Core;

/// io_uring user data of the control doorbell's read.
const WAKE_TOKEN: u64 = 0;
/// io_uring user data of cancel requests (their completions carry no work).
const CANCEL_TOKEN: u64 = u64::MAX;
/// io_uring user data of the poll of the backend's fault ring.
const RECORD_RING_TOKEN: u64 = u64::MAX - 1;
/// io_uring user data of the polls of address spaces' descriptors: this bit, ORed with the
/// space id (doorbell tokens count up from 1 and never reach it).
const SPACE_TOKEN: u64 = 1 << 62;
const URING_ENTRIES: u32 = 256;

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

struct Dataplane<B> {
    core: Core<B>,
    uring: IoUring,
    control: Receiver<Control>,
    wake: Arc<EventFd>,
    wake_buf: Box<[u8; 8]>,
    registrations: HashMap<u64, Registration>,
    next_token: u64,
    start: Instant,
    completions: Vec<(u64, i32)>,
}

/// Starts the fast path: `engine` driving `backend`.
pub fn spawn<B: Backend + Send + 'static>(
    engine: Engine,
    backend: B,
) -> Result<(DataplaneHandle, std::thread::JoinHandle<()>), String> {
    let uring = IoUring::new(URING_ENTRIES).map_err(|e| format!("io_uring setup: {e}"))?;
    let wake = Arc::new(eventfd().map_err(|e| format!("eventfd: {e}"))?);
    let (tx, control) = crossbeam::channel::unbounded();
    let mut dataplane = Dataplane {
        core: Core::new(engine, backend),
        uring,
        control,
        wake: wake.clone(),
        wake_buf: Box::new([0; 8]),
        registrations: HashMap::new(),
        next_token: 1,
        start: Instant::now(),
        completions: Vec::new(),
    };
    dataplane.arm_wake().map_err(|e| format!("io_uring: {e}"))?;
    dataplane.arm_source(Source::RecordRing).map_err(|e| format!("io_uring: {e}"))?;
    let thread = std::thread::Builder::new()
        .name("wicd-fastpath".into())
        .spawn(move || dataplane.run())
        .map_err(|e| format!("cannot start the fast path: {e}"))?;
    Ok((DataplaneHandle { tx, wake }, thread))
}

/// The io_uring user data of `source`'s poll.
fn source_token(source: Source) -> u64 {
    match source {
        Source::RecordRing => RECORD_RING_TOKEN,
        Source::Space(space) => SPACE_TOKEN | u64::from(space),
    }
}

impl<B: Backend> Dataplane<B> {
    fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    fn push(&mut self, entry: io_uring::squeue::Entry) -> io::Result<()> {
        // SAFETY: every entry pushed reads into a buffer owned by `self` (the wake buffer or a
        // registration's box) that is dropped only after its completion has been reaped.
        while unsafe { self.uring.submission().push(&entry) }.is_err() {
            self.uring.submit()?;
        }
        Ok(())
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let read = opcode::Read::new(types::Fd(self.wake.as_fd().as_raw_fd()), self.wake_buf.as_mut_ptr(), 8)
            .build()
            .user_data(WAKE_TOKEN);
        self.push(read)
    }

    /// Polls `source`, if the backend has a descriptor for it. One-shot, re-armed after each
    /// completion: what arrived in between makes the new poll complete at once.
    fn arm_source(&mut self, source: Source) -> io::Result<()> {
        let Some(fd) = self.core.backend().source_fd(source) else { return Ok(()) };
        let poll = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).build().user_data(source_token(source));
        self.push(poll)
    }

    fn cancel(&mut self, token: u64) -> io::Result<()> {
        self.push(opcode::AsyncCancel::new(token).build().user_data(CANCEL_TOKEN))
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
            // gets its turn below and, if its fault ring is still not empty, its next one after.
            let now = self.now();
            self.core.take_owed(now);
            self.reap();
            let now = self.now();
            self.core.tick(now);
            while let Some(channel) = self.core.take_failed() {
                self.close_bells(channel);
            }
        }
        tracing::debug!("fast path stopped");
    }

    /// Waits for a completion or the core's next deadline; does not wait while channels are
    /// owed a turn at their fault rings.
    fn wait(&mut self) -> io::Result<()> {
        let result = match self.core.next_deadline(self.now()) {
            _ if self.core.owes_turns() => self.uring.submit(),
            Some(deadline) => {
                let left = deadline.saturating_sub(self.now());
                let ts = types::Timespec::from(Duration::from_nanos(left.max(1)));
                let args = types::SubmitArgs::new().timespec(&ts);
                self.uring.submitter().submit_with_args(1, &args)
            }
            None => self.uring.submit_and_wait(1),
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
        completions.extend(self.uring.completion().map(|c| (c.user_data(), c.result())));
        for (token, result) in completions.drain(..) {
            match token {
                CANCEL_TOKEN => {}
                WAKE_TOKEN => {
                    if let Err(e) = self.arm_wake() {
                        tracing::error!("fast path: cannot re-arm the control doorbell: {e}");
                    }
                }
                RECORD_RING_TOKEN => self.on_source(Source::RecordRing, result),
                token if token & SPACE_TOKEN != 0 => self.on_source(Source::Space(token as u32), result),
                token => self.on_bell(token, result),
            }
        }
        self.completions = completions;
    }

    fn on_source(&mut self, source: Source, result: i32) {
        if result == -libc::ECANCELED {
            return;
        }
        if result < 0 {
            let error = io::Error::from_raw_os_error(-result);
            match source {
                Source::RecordRing => tracing::error!("fast path: polling the fault ring failed: {error}"),
                Source::Space(space) => tracing::warn!(space, "polling the address space failed: {error}"),
            }
        }
        let now = self.now();
        self.core.ready(now, source);
        if let Err(e) = self.arm_source(source) {
            tracing::error!("fast path: cannot re-arm the poll of {source:?}: {e}");
        }
    }

    fn on_bell(&mut self, token: u64, result: i32) {
        let Some(reg) = self.registrations.get(&token) else { return };
        let (channel, bell) = (reg.channel, reg.bell);
        // An interrupted read of a live channel's doorbell is read again, or the channel
        // would never be rung again.
        let interrupted = result == -libc::EINTR;
        if reg.closing || (result < 0 && !interrupted) || !self.core.has(channel) {
            // Cancelled because the channel closed (or a read error): the buffer is free now.
            if result < 0 && result != -libc::ECANCELED {
                tracing::warn!("channel {channel}: doorbell read failed: {}", io::Error::from_raw_os_error(-result));
            }
            self.registrations.remove(&token);
            return;
        }
        if !interrupted {
            let now = self.now();
            self.core.rung(now, channel, bell);
        }
        if let Err(e) = self.arm(token) {
            tracing::error!("channel {channel}: cannot re-arm its doorbell: {e}");
        }
    }

    /// Handles queued control requests; true when the thread must stop.
    fn drain_control(&mut self) -> bool {
        loop {
            let now = self.now();
            match self.control.try_recv() {
                Ok(Control::Create { spec, placement, reply }) => {
                    let _ = reply.send(self.create(spec, placement));
                }
                Ok(Control::AttachSpace { uvm, reply }) => {
                    let _ = reply.send(self.attach_space(uvm));
                }
                Ok(Control::DetachSpace { space, reply }) => {
                    self.core.backend().detach_space(space);
                    // A space the backend polled no descriptor of has no poll: the cancel
                    // finds nothing.
                    if let Err(e) = self.cancel(source_token(Source::Space(space))) {
                        tracing::error!(space, "cannot cancel the space's poll: {e}");
                    }
                    let _ = reply.send(());
                }
                Ok(Control::Watch { space, start, end, reply }) => {
                    let _ = reply.send(self.core.backend().watch(space, start, end));
                }
                Ok(Control::Destroy { channel, reply }) => {
                    let destroyed = self.core.destroy(channel);
                    if destroyed.is_ok() {
                        self.close_bells(channel);
                    }
                    let _ = reply.send(destroyed);
                }
                Ok(Control::Publish { channel, slot, reply }) => {
                    let _ = reply.send(self.core.publish(now, channel, slot));
                }
                Ok(Control::Snapshot { reply }) => {
                    let _ = reply.send(self.core.snapshot());
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

    /// Attaches an application's address space, and polls what the backend reads of it.
    fn attach_space(&mut self, uvm: OwnedFd) -> Result<u32, WireError> {
        let space = self.core.backend().attach_space(uvm)?;
        if let Err(e) = self.arm_source(Source::Space(space)) {
            self.core.backend().detach_space(space);
            return Err(WireError::new(ErrorCode::Io, format!("cannot poll the address space: {e}")));
        }
        Ok(space)
    }

    fn create(&mut self, spec: ChannelSpec, placement: Option<PlacementRequest>) -> Result<Created, WireError> {
        let Added { layout, fds, bells } = self.core.create(spec, placement)?;
        let id = layout.id.0;
        for (fd, bell) in bells {
            if let Err(e) = self.register(fd, id, bell) {
                self.core.abandon(id);
                self.close_bells(id);
                return Err(WireError::new(ErrorCode::Io, format!("cannot wait on the channel's doorbell: {e}")));
            }
        }
        Ok(Created { layout, fds })
    }

    /// Cancels the doorbell reads of a channel that is gone.
    fn close_bells(&mut self, channel: u32) {
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
            if let Err(e) = self.cancel(token) {
                tracing::error!("channel {channel}: cannot cancel its doorbell read: {e}");
            }
        }
    }

    fn shutdown(&mut self) {
        let now = self.now();
        for channel in self.core.shutdown(now) {
            self.close_bells(channel);
        }
        let _ = self.uring.submit();
    }
}
