//! wicd as a service: the socket server (control), the fast path (engine thread) and the
//! emulated GPU backend.

pub mod dataplane;
pub mod emulated;
pub mod server;
