//! wicd as a service: the socket server (control), the fast path (engine thread), the two
//! GPU backends it drives (emulated, or the shim module) and the observer of real GPU faults.

pub mod dataplane;
pub mod emulated;
pub mod gpus;
pub mod observe;
pub mod quota;
pub mod server;
pub mod sharing;
pub mod shim;
