//! The engine's input port for faults: backends read fault records in their own way (the
//! module's ring, an emulated channel's ring) and hand them to a [`FaultSink`]; the daemon's
//! service core passes the engine's [`Intake`], so the engine is fed in one place whatever the
//! backend.

use crate::activator::Command;
use crate::engine::Engine;
use wic_types::{GpuId, Nanos, RawFaultEntry};

/// Where a backend hands the faults it read.
pub trait FaultSink {
    /// A batch of raw fault entries, all from `gpu`, in the order the GPU reported them.
    fn faults(&mut self, gpu: GpuId, entries: &[RawFaultEntry]);

    /// The backend ended the hold of the page at `va` itself (see [`Engine::expired_elsewhere`]),
    /// after the faults handed before it.
    fn expired(&mut self, gpu: GpuId, va: u64);

    /// The page at `va` faulted on a GPU the backend cannot hold faults of (registered after
    /// the space was attached): the access was serviced without its data (see
    /// [`Engine::unservable`]).
    fn unservable(&mut self, va: u64);
}

/// The engine as a [`FaultSink`] at one instant: what it decides goes to `out`.
pub struct Intake<'a> {
    engine: &'a mut Engine,
    now: Nanos,
    out: &'a mut Vec<Command>,
}

impl Engine {
    /// The engine as a fault sink at `now`, its commands appended to `out`.
    pub fn intake<'a>(&'a mut self, now: Nanos, out: &'a mut Vec<Command>) -> Intake<'a> {
        Intake { engine: self, now, out }
    }
}

impl FaultSink for Intake<'_> {
    #[inline]
    fn faults(&mut self, gpu: GpuId, entries: &[RawFaultEntry]) {
        self.engine.handle_faults(self.now, gpu, entries, self.out);
    }

    fn expired(&mut self, gpu: GpuId, va: u64) {
        self.engine.expired_elsewhere(gpu, va, self.out);
    }

    fn unservable(&mut self, va: u64) {
        self.engine.unservable(va);
    }
}
