//! wicctl as a program, against stand-ins for a stuck wicd: how `$WIC_TIMEOUT_MS` and
//! `$WIC_SOCKET` reach it, what it prints and how it exits.

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// What a finished wicctl left behind.
struct Outcome {
    status: Option<i32>,
    stderr: String,
    took: Duration,
}

/// Runs wicctl with `args` and `env` (everything else of the caller's environment but the
/// wic variables); kills it and fails the test if it runs for more than 5 s.
fn wicctl(args: &[&str], env: &[(&str, &str)]) -> Outcome {
    let mut command = Command::new(env!("CARGO_BIN_EXE_wicctl"));
    command
        .args(args)
        .env_remove("WIC_SOCKET")
        .env_remove("WIC_TIMEOUT_MS")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let start = Instant::now();
    let mut child = command.spawn().unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(5) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("wicctl {args:?} still ran after 5 s");
        }
        thread::sleep(Duration::from_millis(10));
    };
    let took = start.elapsed();
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    Outcome { status: status.code(), stderr, took }
}

/// A socket whose connections are accepted and never answered, as a stopped (SIGSTOP) wicd's
/// would be.
fn silent_daemon(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wicctl-env-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("wicd.sock");
    let listener = UnixListener::bind(&path).unwrap();
    // Holds every connection open, answering nothing, until the test process ends.
    thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    path
}

fn socket_arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn status_gives_up_on_a_silent_daemon_after_wic_timeout_ms() {
    let path = silent_daemon("status");
    let outcome = wicctl(&["--socket", socket_arg(&path), "status"], &[("WIC_TIMEOUT_MS", "300")]);
    assert_eq!(outcome.status, Some(1), "{}", outcome.stderr);
    assert!(outcome.stderr.starts_with("wicctl: timed out: wicd at "), "{}", outcome.stderr);
    assert!(outcome.stderr.contains("did not answer within 300 ms"), "{}", outcome.stderr);
    assert!(
        outcome.took >= Duration::from_millis(300) && outcome.took < Duration::from_secs(3),
        "took {:?}",
        outcome.took
    );
}

#[test]
fn metrics_gives_up_within_its_timeout_option() {
    let path = silent_daemon("metrics");
    // The option wins over the environment.
    let outcome =
        wicctl(&["metrics", "--socket", socket_arg(&path), "--timeout-ms", "300"], &[("WIC_TIMEOUT_MS", "60000")]);
    assert_eq!(outcome.status, Some(1), "{}", outcome.stderr);
    assert!(outcome.stderr.contains("did not answer within 300 ms"), "{}", outcome.stderr);
    assert!(outcome.took < Duration::from_secs(3), "took {:?}", outcome.took);
}

#[test]
fn a_malformed_timeout_is_a_usage_error() {
    let path = silent_daemon("malformed");
    let outcome = wicctl(&["--socket", socket_arg(&path), "status"], &[("WIC_TIMEOUT_MS", "10s")]);
    assert_eq!(outcome.status, Some(2), "{}", outcome.stderr);
    assert!(outcome.stderr.contains("WIC_TIMEOUT_MS: `10s` is not a timeout"), "{}", outcome.stderr);
}

#[test]
fn an_empty_wic_socket_means_the_default_socket() {
    let outcome = wicctl(&["status"], &[("WIC_SOCKET", ""), ("WIC_TIMEOUT_MS", "300")]);
    // No usage error: wicctl tried the default socket (or reached a wicd there).
    assert_ne!(outcome.status, Some(2), "{}", outcome.stderr);
    if outcome.status != Some(0) {
        assert!(outcome.stderr.contains(wic_proto::DEFAULT_SOCKET), "{}", outcome.stderr);
    }
}
