//! libwic: the library applications use to talk to `wicd`, with a C ABI (`ffi/include/wic.h`)
//! and the same functionality as a Rust API.
//!
//! - [`Client`] is a session with the daemon; it is thread-safe and shared by the channels
//!   opened through it, which keep the connection open after the client is dropped. Every
//!   request has a deadline ([`Timeout`]: `$WIC_TIMEOUT_MS`, 10 s by default).
//! - [`Channel`] is a channel this process created ([`Client::create_channel`], as its owner) or
//!   attached to with a token ([`Client::attach`]). Host producers publish through the shared
//!   producer region and a doorbell; consumers on the emulated backend read their slots as the
//!   consumer warps would, faulting through the channel's fault ring.
//! - [`abi`] mirrors every struct and constant of `wic.h`; the `extern "C"` functions live in
//!   `capi` and are thin wrappers that never let a panic cross into C.
//!
//! Errors carry a [`wic_proto::message::ErrorCode`]; in C it is returned as `-(code)`.

// Input reaches this crate from clients, devices and files: failures are errors, never panics.
// (Unsafe code is held to the workspace's lints: Cargo.toml.)
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod abi;
pub mod capi;
pub mod channel;
pub mod client;
mod connection;

pub use channel::{Channel, Run};
pub use client::Client;
pub use wic_proto::client::Timeout;
pub use wic_proto::message::{ChannelInfo, ChannelSpec, ErrorCode, Producer, Role, SlotInfo, Stats};

#[cfg(test)]
mod tests {
    #[test]
    fn handles_may_be_shared_by_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<super::Client>();
        shareable::<super::Channel>();
    }
}
