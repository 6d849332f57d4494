//! What the control side (the tokio server) asks of the fast path, and its handle to ask it
//! with: requests go through a crossbeam queue plus an eventfd that wakes the fast path's
//! io_uring wait; replies come back on tokio oneshot channels.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use crossbeam::channel::Sender;
use nix::sys::eventfd::EventFd;
use tokio::sync::oneshot;
use wic_engine::{ChannelLayout, ChannelSpec};
use wic_proto::message::{ErrorCode, WireError};

use super::backend::ClientFds;
pub use super::backend::PlacementRequest;
use super::core::Snapshot;

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
/// hand to clients.
pub struct Created {
    pub layout: ChannelLayout,
    pub fds: ClientFds,
}

/// The control side's handle.
#[derive(Clone)]
pub struct DataplaneHandle {
    pub(super) tx: Sender<Control>,
    pub(super) wake: Arc<EventFd>,
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
