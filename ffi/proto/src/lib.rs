//! The contracts between `wicd` and its clients, in one place:
//!
//! - [`frame`]: how messages travel on the Unix socket (length-prefixed JSON);
//! - [`message`]: the requests, replies and error codes of protocol version [`PROTOCOL_VERSION`];
//! - [`shm`]: the shared-memory regions behind the publish and fault fast paths;
//! - [`client`]: a blocking client used by `wicctl`, libwic and the tests.
//!
//! `docs/protocol.md` is the reference for all of it; tests keep the two in step.

// Input reaches this crate from clients, devices and files: failures are errors, never panics.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod client;
pub mod frame;
pub mod message;
pub mod shm;

/// Version of the protocol spoken on the socket; a `hello` with another version is refused.
pub const PROTOCOL_VERSION: u32 = 1;

/// Where `wicd` listens unless configured otherwise.
pub const DEFAULT_SOCKET: &str = "/run/wic/wicd.sock";

/// Environment variable that overrides [`DEFAULT_SOCKET`] for clients.
pub const SOCKET_ENV: &str = "WIC_SOCKET";

/// The socket a client should use: `explicit`, else `$WIC_SOCKET`, else [`DEFAULT_SOCKET`].
/// An empty `$WIC_SOCKET` counts as unset.
pub fn socket_path(explicit: Option<&str>) -> std::path::PathBuf {
    match explicit {
        Some(path) => path.into(),
        None => env_socket_path(std::env::var_os(SOCKET_ENV)),
    }
}

/// The socket `$WIC_SOCKET` names, given its value.
fn env_socket_path(value: Option<std::ffi::OsString>) -> std::path::PathBuf {
    value.filter(|path| !path.is_empty()).map_or_else(|| DEFAULT_SOCKET.into(), Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn an_empty_socket_variable_is_unset() {
        assert_eq!(env_socket_path(None), Path::new(DEFAULT_SOCKET));
        assert_eq!(env_socket_path(Some("".into())), Path::new(DEFAULT_SOCKET));
        assert_eq!(env_socket_path(Some("/tmp/w.sock".into())), Path::new("/tmp/w.sock"));
        assert_eq!(socket_path(Some("/tmp/x.sock")), Path::new("/tmp/x.sock"));
    }
}
