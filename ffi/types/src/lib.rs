//! The types wicd, its clients and its tools share, in a crate of their own: the GPU's
//! fault-buffer entries, the error markers a warp may find instead of data, what a channel is and
//! how much memory it takes, and nvidia-uvm's ids of the GPUs. The engine, the wire protocol, libwic and wicctl all use these, and
//! none of them needs the engine for it.

// Input reaches this crate from clients, devices and files: failures are errors, never panics.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod c_layout;
pub mod channel;
pub mod fault;
pub mod marker;
pub mod uvm_gpu;

pub use channel::{pages_for_batch, ChannelSpec, Producer};
pub use fault::{FaultEntry, RawFaultEntry, VaWidth};
pub use marker::ErrorMarker;

/// Nanoseconds on the caller's clock.
pub type Nanos = u64;

/// Index of a GPU as the backend numbers them.
pub type GpuId = u16;

/// Size of a UVM page as wicd manages it.
pub const PAGE_SIZE: u64 = 4096;
