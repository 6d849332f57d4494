//! What the service core asks of a GPU backend, whichever it is: the emulated GPU
//! ([`super::emulated`]) or the wic_shim module ([`super::shim`]).
//!
//! A backend owns every channel's device-side state and does the I/O that state needs (shared
//! regions, the module's ioctls); the core ([`super::core`]) owns the engine and decides; the
//! fast path ([`super::dataplane`]) waits on what the backend says to wait on.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::os::fd::{OwnedFd, RawFd};

use nix::sys::eventfd::{EfdFlags, EventFd};
use wic_engine::{ChannelLayout, ChannelSpec, Command, ErrorMarker, FaultSink, Fill, Nanos, Producer};
use wic_proto::message::{ErrorCode, Stats, WireError};
use wic_proto::shm::{ChannelState, ProducerLayout, ProducerRegion};

pub use super::hold::HoldBound;

/// Ends a host producer's publish whose completion, with `fill` (its data or an in-place batch's
/// heads), was `carried_out` or not. The engine consumed the generation either way, so the
/// producer may publish again; an in-place batch whose run was not mapped with its heads missed
/// its generation (its consumers read a marker), and the producer is told so.
pub fn end_publish(producer: &ProducerRegion, slot: u32, fill: Fill, carried_out: bool) {
    if !carried_out && fill == Fill::Heads {
        producer.mark_missed(slot);
    } else {
        producer.mark_delivered(slot);
    }
}

/// Channel id -> a backend's state for it. Channel ids are the engine's small integers, never
/// chosen by clients, so a multiplicative hash serves: a lookup per delivered command costs a
/// few instructions instead of SipHash's tens of nanoseconds.
pub type ChannelMap<V> = HashMap<u32, V, BuildHasherDefault<ChannelIdHasher>>;

/// Fibonacci hashing of a channel id (the std maps take the hash's high bits).
#[derive(Default)]
pub struct ChannelIdHasher(u64);

impl Hasher for ChannelIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte) ^ self.0.rotate_left(8));
        }
    }

    fn write_u32(&mut self, id: u32) {
        self.write_u64(u64::from(id));
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Where the control side asks a channel to go in an application's address space (shim backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacementRequest {
    pub space: u32,
    pub base_va: u64,
}

/// What one pass over a channel's fault ring read ([`Backend::take_channel_faults`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingPass {
    /// Less than a ring's worth, or nothing: the ring was empty when the pass ended.
    Emptied,
    /// A whole ring's worth: more entries may be waiting, for another turn.
    Full,
}

/// Which doorbell a descriptor the fast path reads is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bell {
    /// A channel's consumers posted faults (emulated backend).
    Faults,
    /// A channel's host producer published.
    Published,
}

/// A descriptor, other than a channel's doorbells, whose readiness means faults or events to
/// read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The module's record ring (shim backend).
    RecordRing,
    /// An observed address space's event queue (emulated backend on a GPU machine).
    Space(u32),
}

/// One side of a channel as a client shares it with wicd: the side's region and its doorbell
/// (duplicates; the fast path keeps its own of the doorbell).
pub struct SharedSide {
    pub region: OwnedFd,
    pub doorbell: OwnedFd,
}

/// The descriptors a channel's clients get, by side: the consumers' region and fault doorbell
/// (none on the shim, whose consumers are GPU kernels), the host producer's region and publish
/// doorbell (none for a GPU producer). Which of them a client gets depends on its role.
#[derive(Default)]
pub struct ClientFds {
    pub consumer: Option<SharedSide>,
    pub producer: Option<SharedSide>,
}

/// A channel the backend has set up: the layout its consumers use, the descriptors to hand to
/// clients and the doorbells the fast path reads (the daemon's own).
pub struct Added {
    pub layout: ChannelLayout,
    pub fds: ClientFds,
    pub bells: Vec<(OwnedFd, Bell)>,
}

/// What executing a batch of commands did, for the global counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Executed {
    pub replays: u64,
    /// Commands that could not be carried out: the module refused them, or they named pages
    /// or data the backend does not have.
    pub failed: u64,
}

/// Per-channel events of one execution.
pub trait ExecutionLog {
    /// Producer data was copied into `channel`'s run.
    fn delivered(&mut self, channel: u32);
    /// `channel`'s run was completed with `marker`.
    fn failed(&mut self, channel: u32, marker: ErrorMarker);
    /// `complete`'s data could not be written, so its run was not mapped. The engine has
    /// moved the slot on: only completing it again wakes its warps.
    fn unfilled(&mut self, complete: Command);
}

/// What a backend counts itself, for the stats.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Faults the GPU side could not record (fault ring full).
    pub overflows: u64,
    /// Entries read but dropped before the engine: they named no channel's pages, or another
    /// channel's than the ring they came from.
    pub unrouted: u64,
    /// Anomalies of the backend's own fault transport (torn or out-of-range ring state).
    pub anomalies: u64,
}

/// What the rest of wicd needs to know of a backend, as the backend describes itself:
/// `serve.rs` and the control plane decide by these, never by its name.
#[derive(Debug, Clone, Copy)]
pub struct BackendTraits {
    /// Its name: in logs, and the `backend` clients read in `hello` and `status`.
    pub name: &'static str,
    /// Whether it holds real GPU faults, which stall warps on the GPUs: the rules on GPUs
    /// shared with other contexts and on which GPUs channels may use (`[shim]`) apply.
    pub holds_gpu_faults: bool,
    /// Whether channels' pages come from the engine's pool, which every user draws from;
    /// otherwise they are the application's own memory, counted against its uid's bound alone.
    pub pages_from_pool: bool,
    /// The bound its GPU side puts on a held fault, if any: channel timeouts must end well
    /// below it.
    pub hold_bound: Option<HoldBound>,
}

/// A GPU backend, as the service core drives it.
pub trait Backend {
    /// What it is, for the control plane and `serve.rs`.
    fn traits(&self) -> BackendTraits;

    /// Refuses what this backend cannot serve, before the engine opens the channel.
    fn check(&self, spec: &ChannelSpec, placement: Option<PlacementRequest>) -> Result<(), WireError>;

    /// Sets up a channel the engine opened as `layout`.
    fn add(
        &mut self,
        spec: &ChannelSpec,
        layout: &ChannelLayout,
        placement: Option<PlacementRequest>,
    ) -> Result<Added, WireError>;

    /// Drops a channel after its final commands ran; its shared regions show `state`.
    fn remove(&mut self, channel: u32, state: ChannelState);

    /// Whether the backend has `channel`.
    fn has(&self, channel: u32) -> bool;

    /// Every channel.
    fn channel_ids(&self) -> Vec<u32>;

    /// `channel`'s host producer region.
    fn producer(&self, channel: u32) -> Option<&ProducerRegion>;

    /// Runs `commands` in order.
    fn execute(&mut self, commands: &[Command], log: &mut impl ExecutionLog) -> Executed;

    /// Reads the faults `channel`'s consumers posted to the channel's own fault ring, if the
    /// backend gives its channels one (their doorbells include a [`Bell::Faults`]), into
    /// `sink`: one pass, at most a ring's worth of entries. Whether more may wait is the
    /// core's to act on ([`RingPass::Full`]).
    fn take_channel_faults(&mut self, channel: u32, sink: &mut impl FaultSink) -> RingPass;

    /// The descriptor to poll for `source`.
    fn source_fd(&mut self, source: Source) -> Option<RawFd>;

    /// `source` is readable: reads it, faults into `sink`.
    fn take_source(&mut self, source: Source, sink: &mut impl FaultSink);

    /// Attaches an application's address space given its UVM file; returns its id.
    fn attach_space(&mut self, uvm: OwnedFd) -> Result<u32, WireError>;

    /// Detaches a space whose channels are gone.
    fn detach_space(&mut self, space: u32);

    /// Watches `start..end` of an observed space.
    fn watch(&mut self, space: u32, start: u64, end: u64) -> Result<(), WireError>;

    /// How long after `now`, the core's time in nanoseconds, the backend next wants
    /// [`Backend::retry`]; None while it has nothing to do again.
    fn retry_in(&self, _now: Nanos) -> Option<Nanos> {
        None
    }

    /// Does again what the device side refused and the backend must not give up on (letting
    /// go of ranges or spaces), if [`Backend::retry_in`] said it is due by `now`.
    fn retry(&mut self, _now: Nanos) {}

    /// What the backend counts; each channel's own count of overflows goes to `overflows`.
    fn counts(&mut self, overflows: &mut dyn FnMut(u32, u64)) -> Counts;

    /// Adds what the backend observed of real GPU faults to `stats`.
    fn report(&mut self, _stats: &mut Stats) {}
}

/// A blocking eventfd: the fast path's wake-up and every channel's doorbells. Blocking on
/// purpose: io_uring reads of a non-blocking eventfd fail with EAGAIN instead of waiting.
pub fn eventfd() -> nix::Result<EventFd> {
    EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)
}

/// The error a failed set-up of shared memory or a doorbell answers.
pub fn setup_error(e: io::Error) -> WireError {
    WireError::new(ErrorCode::Io, format!("cannot set up the channel's shared memory: {e}"))
}

impl Added {
    /// A channel of `spec` laid out as `layout`, with its host producer's side set up (none for
    /// a GPU producer): the region and the publish doorbell for clients, the doorbell for the
    /// fast path, and the region for the backend, which returns with it. The backend adds its
    /// consumer side.
    pub fn with_producer(
        spec: &ChannelSpec,
        layout: &ChannelLayout,
    ) -> Result<(Self, Option<ProducerRegion>), WireError> {
        let mut added = Self { layout: layout.clone(), fds: ClientFds::default(), bells: Vec::new() };
        if let Producer::Gpu { .. } = spec.producer {
            return Ok((added, None));
        }
        let (region, region_fd) =
            ProducerRegion::create(ProducerLayout { slots: spec.slots, batch_bytes: layout.batch_bytes })
                .map_err(setup_error)?;
        let bell = OwnedFd::from(eventfd().map_err(|e| setup_error(e.into()))?);
        added.fds.producer = Some(SharedSide { region: region_fd, doorbell: bell.try_clone().map_err(setup_error)? });
        added.bells.push((bell, Bell::Published));
        Ok((added, Some(region)))
    }
}
