//! wicd's I/O with kernel devices: `/dev/wic`, the character device of `wic_shim.ko`, and
//! nvidia-uvm's tools interface.
//!
//! - [`device`]: a session: version negotiation, VA spaces, ranges, commands by ioctl;
//! - [`ring`]: the reader of the mapped record ring, which trusts nothing the ring says;
//! - [`uring`]: command batches through io_uring `IORING_OP_URING_CMD`;
//! - [`commands`]: the engine's commands turned into [`wic_kabi::WicCommand`]s;
//! - [`backend`]: all of it behind the engine: ring records in, command batches out;
//! - `fakegpu` (feature `test-support`, for the VM tests): the test module that stands in for
//!   nvidia-uvm;
//! - [`uvmtools`]: an application's GPU faults seen through the stock driver's UVM tools
//!   interface (`/dev/nvidia-uvm-tools`), with no patched driver.
//!
//! The ABI itself is `ffi/include/wic_abi.h`, seen from Rust as [`wic_kabi`].

// Input reaches this crate from clients, devices and files: failures are errors, never panics.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod backend;
pub mod commands;
pub mod device;
#[cfg(feature = "test-support")]
pub mod fakegpu;
pub mod ring;
pub mod uring;
pub mod uvmtools;

pub use backend::{BatchPath, KernelOutcome, PlacedChannel, ShimSession, Submission, UnplaceError};
pub use commands::{CommandError, HostBytes, Placement, Translator};
pub use device::{Device, DeviceError};
pub use ring::{MemoryRing, Record, RecordRing, RingError};
pub use uring::UringSubmitter;
pub use uvmtools::{Event, EventTracker, FaultStats, UvmToolsError};
