//! The WIC engine: the Interrupter (PCM page pool), the Monitor (fault classification, DAB and
//! PFQ) and the Activator (commands), driven purely by inputs. The fault-entry decoder and the
//! types clients share with wicd are `wic-types`', re-exported here.
//!
//! The engine is sans-IO: it never reads a clock, spawns a thread or makes a syscall. Time is an
//! argument ([`Nanos`]) and every effect is a [`Command`] returned to the caller, so the same code
//! runs unchanged under the daemon, the emulated GPU and the deterministic tests.

// Input reaches this crate from clients, devices and files: failures are errors, never panics.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod activator;
pub mod engine;
pub mod histogram;
pub mod intake;
pub mod interrupter;
pub mod monitor;
mod prefetch;

pub use activator::{Command, DataSource, ErrorMarker, Fill};
pub use engine::{pool_page, ChannelId, ChannelLayout, Engine, EngineConfig, EngineError, EngineStats, SlotLayout};
pub use histogram::Histogram;
pub use intake::{FaultSink, Intake};
pub use interrupter::{PagePool, PageRun, PoolError, TagAllocator, TagError, TagId};
pub use wic_types::{
    fault, pages_for_batch, ChannelSpec, FaultEntry, GpuId, Nanos, Producer, RawFaultEntry, VaWidth, PAGE_SIZE,
};
