//! wicd as a service: the socket server (control), the fast path (engine thread) and the two
//! GPU backends it drives (emulated, or the shim module).

pub mod dataplane;
pub mod emulated;
pub mod gpus;
pub mod server;
pub mod shim;
