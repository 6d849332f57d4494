//! libwic reads `$WIC_TIMEOUT_MS` and `$WIC_SOCKET` when it connects, in Rust and in C.
//!
//! The environment belongs to the whole process: this file holds a single test, so that no
//! other test of this executable runs while it changes the variables.

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::ptr::null_mut;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use wic::abi::{WIC_EINVALID, WIC_ETIMED_OUT};
use wic::capi::wic_connect;
use wic::{Client, ErrorCode};
use wic_proto::client::TIMEOUT_ENV;
use wic_proto::{DEFAULT_SOCKET, SOCKET_ENV};

/// Runs `f` on a thread and returns what it returned and how long it took; fails the test
/// if that is more than 5 s, so that a connect without a deadline cannot hang the test.
fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> (T, Duration) {
    let (done, result) = mpsc::channel();
    let start = Instant::now();
    thread::spawn(move || done.send(f()));
    let value = result.recv_timeout(Duration::from_secs(5)).expect("connect returned within 5 s");
    (value, start.elapsed())
}

/// Connects in Rust to `path` (`None`: the default); returns the error, if any, and how long
/// it took.
fn rust_connect(path: Option<&Path>) -> (Option<wic::client::Error>, Duration) {
    let path = path.map(Path::to_path_buf);
    bounded(move || Client::connect(path.as_deref()).err())
}

/// Connects through the C ABI to `path`; returns the result and how long it took.
fn c_connect(path: &Path) -> (i32, Duration) {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    bounded(move || {
        let mut client = null_mut();
        // SAFETY: a NUL-terminated path and a writable handle pointer.
        let rc = unsafe { wic_connect(path.as_ptr(), &mut client) };
        assert!(client.is_null(), "no handle on failure");
        rc
    })
}

#[test]
fn connect_follows_the_environment() {
    let dir = std::env::temp_dir().join(format!("libwic-env-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("wicd.sock");
    // Connections wait in the backlog and are never answered.
    let _listener = UnixListener::bind(&path).unwrap();
    let limit = Duration::from_millis(300);
    std::env::set_var(TIMEOUT_ENV, "300");

    let (err, took) = rust_connect(Some(&path));
    let err = err.expect("no daemon answered");
    assert_eq!(err.code(), ErrorCode::TimedOut, "{err}");
    assert!(took >= limit && took < limit + Duration::from_secs(2), "Rust: gave up after {took:?}");
    let (rc, took) = c_connect(&path);
    assert_eq!(rc, WIC_ETIMED_OUT);
    assert!(took >= limit && took < limit + Duration::from_secs(2), "C: gave up after {took:?}");

    std::env::set_var(TIMEOUT_ENV, "soon");
    let err = rust_connect(Some(&path)).0.expect("a malformed timeout");
    assert_eq!(err.code(), ErrorCode::Invalid);
    assert!(err.to_string().starts_with("WIC_TIMEOUT_MS: `soon` is not a timeout"), "{err}");
    assert_eq!(c_connect(&path).0, WIC_EINVALID);

    // An empty variable is an unset one: the default socket, not a socket named "".
    std::env::set_var(TIMEOUT_ENV, "300");
    std::env::set_var(SOCKET_ENV, "");
    if let Some(err) = rust_connect(None).0 {
        assert!(err.to_string().contains(DEFAULT_SOCKET), "{err}");
    }
    std::env::remove_var(SOCKET_ENV);
    std::env::remove_var(TIMEOUT_ENV);
}
