//! wicd under the two systemd protocols it speaks, without systemd as PID 1: socket activation
//! through `systemd-socket-activate`, and readiness/watchdog/stopping notifications received on
//! a NOTIFY_SOCKET the test binds itself.

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use wic_proto::client::Client;
use wic_proto::message::{Reply, Request};
use wic_tests::{binary, scratch};

fn receive_until(notify: &UnixDatagram, wanted: &str, seen: &mut Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 4096];
    while !seen.iter().any(|m| m.lines().any(|l| l == wanted)) {
        assert!(Instant::now() < deadline, "no {wanted} notification; got {seen:?}");
        if let Ok(n) = notify.recv(&mut buf) {
            seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
}

#[test]
fn socket_activation_readiness_watchdog_and_stopping() {
    let activate = which("systemd-socket-activate");
    let dir = scratch("systemd");
    let socket = dir.join("activated.sock");
    let notify_path = dir.join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    std::fs::write(dir.join("wicd.toml"), "").unwrap();
    let mut child = Command::new(activate)
        .arg("--listen")
        .arg(&socket)
        // The activated process gets only the variables named here.
        .args(["--setenv=NOTIFY_SOCKET", "--setenv=WATCHDOG_USEC"])
        .arg(binary("wicd"))
        .args(["serve", "--backend", "emulated", "--config"])
        .arg(dir.join("wicd.toml"))
        .env("NOTIFY_SOCKET", &notify_path)
        .env("WATCHDOG_USEC", "200000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start systemd-socket-activate");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "systemd-socket-activate did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The first connection starts wicd on the passed socket.
    let mut client = Client::connect(&socket, "test").expect("activation serves the first client");
    let Ok(Reply::Status(status)) = client.call(&Request::Status {}) else { panic!("status") };
    assert_eq!(status.pid, child.id(), "wicd runs in the activated process");
    let mut seen = Vec::new();
    receive_until(&notify, "READY=1", &mut seen);
    receive_until(&notify, "WATCHDOG=1", &mut seen);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    receive_until(&notify, "STOPPING=1", &mut seen);
    let exit = child.wait().unwrap();
    assert!(exit.success(), "wicd exited with {exit}");
    assert!(socket.exists(), "an activated socket belongs to systemd: wicd must not remove it");
}

fn which(tool: &str) -> std::path::PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|p| p.join(tool)).find(|p| p.exists()))
        .unwrap_or_else(|| panic!("{tool} is missing: install the `systemd` package"))
}
