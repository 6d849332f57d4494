//! wicd as a service: the socket server (control) and its registry of connections, channels and
//! grants, the fast path (engine thread), the two GPU backends it drives (emulated, or the shim
//! module) and the observer of real GPU faults.

pub mod admission;
pub mod backend;
pub mod control;
pub mod core;
pub mod dataplane;
pub mod emulated;
pub mod hold;
pub mod observe;
pub mod quota;
pub mod registry;
pub mod runs;
pub mod server;
pub mod sharing;
pub mod shim;
pub mod socket;

/// The wire form of an engine histogram, for the stats the fast path and the observer report.
pub fn wire_histogram(h: &wic_engine::Histogram) -> wic_proto::message::Histogram {
    wic_proto::message::Histogram {
        count: h.count(),
        sum: h.sum(),
        max: h.max(),
        buckets: h.buckets().map(|(le, n)| [le, n]).collect(),
    }
}
