//! The two systemd protocols wicd speaks: readiness/watchdog notifications (`sd_notify`) and
//! socket activation (`LISTEN_FDS`). Both are tiny, so they are implemented here rather than
//! pulled in.

use std::os::fd::{FromRawFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram, UnixListener};
use std::time::Duration;

/// First descriptor systemd passes (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: RawFd = 3;

/// Sends `state` (e.g. `READY=1`) to the service manager; a no-op when not run by systemd.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let path = path.to_string_lossy().into_owned();
    let addr = match path.strip_prefix('@') {
        Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name.as_bytes()),
        None => SocketAddr::from_pathname(&path),
    };
    let sent = addr.and_then(|addr| UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &addr));
    if let Err(e) = sent {
        tracing::warn!("sd_notify {state:?} to {path}: {e}");
    }
}

/// How often to send `WATCHDOG=1`: half the interval systemd asked for, if it asked us.
pub fn watchdog_interval() -> Option<Duration> {
    if let Some(pid) = std::env::var("WATCHDOG_PID").ok().and_then(|p| p.parse::<u32>().ok()) {
        if pid != std::process::id() {
            return None;
        }
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

/// The listening socket passed by socket activation, if this process was activated.
pub fn activated_listener() -> Result<Option<UnixListener>, String> {
    let Ok(pid) = std::env::var("LISTEN_PID") else { return Ok(None) };
    if pid.parse::<u32>().ok() != Some(std::process::id()) {
        return Ok(None);
    }
    let count: i32 = std::env::var("LISTEN_FDS").ok().and_then(|n| n.parse().ok()).unwrap_or(0);
    if count != 1 {
        return Err(format!("socket activation passed {count} sockets; wicd takes exactly one"));
    }
    // SAFETY: systemd passed descriptor 3 to this process (LISTEN_PID matched) and nothing
    // else in the process owns it.
    let listener = unsafe { UnixListener::from_raw_fd(LISTEN_FDS_START) };
    nix::fcntl::fcntl(&listener, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))
        .map_err(|e| format!("socket activation: {e}"))?;
    Ok(Some(listener))
}
