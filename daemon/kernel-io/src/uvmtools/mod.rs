//! An application's GPU faults, observed through the UVM tools interface of NVIDIA's stock
//! driver (`/dev/nvidia-uvm-tools`): no patched nvidia-uvm, no `wic_shim.ko`.
//!
//! The application hands wicd its open `/dev/nvidia-uvm` descriptor; [`EventTracker::attach`]
//! opens a new file on `/dev/nvidia-uvm-tools` (the driver keeps one tracker per file), gives
//! the driver an event queue and its control block in wicd's own memory, and subscribes to the
//! GPU fault, fault replay and fatal fault events of that descriptor's VA space.
//! [`EventTracker::poll_events`] drains the queue; [`FaultStats`] (sans-IO) counts the faults on
//! watched pages and pairs each with the replay that ended it, for a latency.
//!
//! What the driver requires, as read in `kernel-open/nvidia-uvm/uvm_tools.c` of
//! NVIDIA/open-gpu-kernel-modules (the same in every 580.x tag, 580.65.06 to 580.142, and
//! unchanged through 595.45.04):
//!
//! - `uvmFd` is a descriptor number in the *caller's* table (`fget`), and its file must be an
//!   initialized VA-space file of nvidia-uvm (`UVM_INITIALIZE` done). A `/proc/PID/fd/N` reopen
//!   is a new, uninitialized file, and the secondary nvidia-uvm file a process makes with
//!   `UVM_MM_INITIALIZE` (CUDA holds one beside its VA-space file) is not a VA-space file: both
//!   get `NV_ERR_ILLEGAL_ACTION`. The very file must come over a socket (`SCM_RIGHTS`) or by
//!   `pidfd_getfd`.
//! - the queue and the control block are user memory passed by address, pinned by the driver
//!   (`pin_user_pages`, write access) and not `mmap`ed from the tools file; each address must be
//!   page aligned and nonzero (`NV_ERR_INVALID_ADDRESS` otherwise) and must not be a mapping of
//!   nvidia-uvm. `queueBufferSize` counts *entries*: a power of two, at least 2.
//! - the tracker keeps a reference on the nvidia-uvm file until the tools file is closed: drop
//!   the tracker when the application leaves, or its VA space outlives it.
//! - `UVM_TOOLS_INIT_EVENT_TRACKER_V2` (since 565) makes a queue of [`abi::EventEntryV2`]
//!   (72 bytes); the V1 call makes 64-byte V1 entries with 8-bit GPU indices. Only V2 is used
//!   here: drivers before 565 answer `EINVAL`.
//! - the protocol of the control block ([`abi::ToolsEventControlData`]): the driver writes an
//!   entry at `put_behind`, then stores the next index to `put_ahead` and `put_behind`; it drops
//!   an event (and counts it in `dropped[type]`) when only one free slot is left before
//!   `get_behind`, so a queue of n entries holds n - 1. The reader announces with `get_ahead`
//!   how far it has taken entries (the driver's wakeup test: `(put_behind - get_ahead) mod n >=
//!   threshold`, threshold n / 2 until set) and frees slots with `get_behind`. All indices are
//!   kept reduced modulo n.
//! - `poll` on the tools file reports `POLLIN` while that test holds; [`EventTracker::attach`]
//!   sets the threshold to 1.
//! - replay events are queued when the replay's push completes on the GPU, through a driver
//!   work queue: they can arrive after faults of the next batch. [`flush_events`] (an ioctl on
//!   the nvidia-uvm file) pushes completed ones out.
//! - CPU timestamps are `CLOCK_MONOTONIC_RAW` nanoseconds (`ktime_get_raw_ts64`); GPU
//!   timestamps are the GPU's nanosecond timer.
//!
//! The module is split the way its parts are used: [`abi`] (the driver's structs and numbers),
//! [`raw`] (the ioctls, one per line), `error` (status codes and the error type), `event`
//! (decoded events), `queue` (the event queue reader), `tracker` (the tools file that owns a
//! queue) and `stats` (sans-IO fault statistics).

pub mod abi;
mod error;
mod event;
mod queue;
pub mod raw;
mod stats;
mod tracker;

pub use error::{nv_status_name, UvmToolsError};
pub use event::{ClientType, Event, EventAccessType, EventFaultType, FatalFault, GpuFault, GpuReplay};
pub use queue::EventQueue;
pub use stats::FaultStats;
pub use tracker::{flush_events, EventTracker};

#[cfg(test)]
mod tests;
