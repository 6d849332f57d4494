//! The daemon under load: one this program starts (emulated backend, private socket, limits
//! sized for the load) or one already running; its status through a monitor connection of its
//! own, and what it uses of the machine, from /proc.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use wic_proto::client::Client as ProtoClient;
use wic_proto::frame;
use wic_proto::message::{ErrorCode, Reply, Request, Response, Stats, Status};

/// How long a daemon may take to listen, and to exit after SIGTERM.
const START_STOP_WAIT: Duration = Duration::from_secs(10);

/// A `wicd serve` this program started; killed if dropped before [`Target::stop`].
struct Spawned {
    child: Child,
    dir: PathBuf,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the daemon process uses, from /proc/<pid>.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub rss_kib: u64,
    /// The most RSS the process ever had (the kernel's high-water mark).
    pub hwm_kib: u64,
    /// Open descriptors; `None` where /proc/<pid>/fd is not ours to read (another user's daemon).
    pub fds: Option<u64>,
}

/// The daemon the load runs against.
pub struct Target {
    pub socket: PathBuf,
    pub pid: u32,
    monitor: ProtoClient,
    spawned: Option<Spawned>,
}

impl Target {
    /// Starts `wicd` with the configuration `config` on a socket in a fresh directory.
    pub fn start(wicd: &Path, config: &str) -> Result<Self, String> {
        let dir = wic_tests::scratch("load");
        let socket = dir.join("wicd.sock");
        std::fs::write(dir.join("wicd.toml"), config).map_err(|e| format!("writing the configuration: {e}"))?;
        let log = std::fs::File::create(dir.join("wicd.log")).map_err(|e| format!("creating the log: {e}"))?;
        let child = Command::new(wicd)
            .args(["serve", "--backend", "emulated", "--config"])
            .arg(dir.join("wicd.toml"))
            .arg("--socket")
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", wicd.display()))?;
        let mut spawned = Spawned { child, dir };
        let deadline = Instant::now() + START_STOP_WAIT;
        while UnixStream::connect(&socket).is_err() {
            if let Ok(Some(status)) = spawned.child.try_wait() {
                return Err(format!(
                    "wicd exited during start-up ({status}); its log is {}",
                    spawned.dir.join("wicd.log").display()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("wicd did not listen within {START_STOP_WAIT:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut target = Self::existing(&socket)?;
        target.spawned = Some(spawned);
        Ok(target)
    }

    /// A daemon already listening on `socket`.
    pub fn existing(socket: &Path) -> Result<Self, String> {
        let monitor = ProtoClient::connect(socket, "wic-load monitor").map_err(|e| e.to_string())?;
        let mut target = Self { socket: socket.to_path_buf(), pid: 0, monitor, spawned: None };
        target.pid = target.status()?.pid;
        Ok(target)
    }

    /// Where the daemon this program started writes its log.
    pub fn log_path(&self) -> Option<PathBuf> {
        self.spawned.as_ref().map(|s| s.dir.join("wicd.log"))
    }

    pub fn status(&mut self) -> Result<Status, String> {
        match self.monitor.call(&Request::Status {}) {
            Ok(Reply::Status(status)) => Ok(status),
            Ok(other) => Err(format!("status answered with {other:?}")),
            Err(e) => Err(format!("status: {e}")),
        }
    }

    pub fn stats(&mut self) -> Result<Stats, String> {
        match self.monitor.call(&Request::Stats {}) {
            Ok(Reply::Stats(stats)) => Ok(*stats),
            Ok(other) => Err(format!("stats answered with {other:?}")),
            Err(e) => Err(format!("stats: {e}")),
        }
    }

    /// Polls the status until `done` holds or `timeout` passes; returns the last status and
    /// how long it took.
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        done: impl Fn(&Status) -> bool,
    ) -> Result<(Status, Duration, bool), String> {
        let start = Instant::now();
        loop {
            let status = self.status()?;
            if done(&status) {
                return Ok((status, start.elapsed(), true));
            }
            if start.elapsed() > timeout {
                return Ok((status, start.elapsed(), false));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn usage(&self) -> Result<Usage, String> {
        let path = format!("/proc/{}/status", self.pid);
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        let field = |name: &str| -> Result<u64, String> {
            text.lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
                .ok_or_else(|| format!("{path}: no {name}"))
        };
        let fds = std::fs::read_dir(format!("/proc/{}/fd", self.pid)).ok().map(|dir| dir.count() as u64);
        Ok(Usage { rss_kib: field("VmRSS:")?, hwm_kib: field("VmHWM:")?, fds })
    }

    /// Checks that one more connection is refused with `EXHAUSTED`: the caller has filled
    /// `limits.max_clients`. The refusal comes unasked, before any hello.
    pub fn expect_refusal(&self) -> Result<(), String> {
        let mut stream = UnixStream::connect(&self.socket).map_err(|e| format!("connecting past the limit: {e}"))?;
        stream.set_read_timeout(Some(START_STOP_WAIT)).map_err(|e| e.to_string())?;
        let mut header = [0u8; frame::HEADER_BYTES];
        stream.read_exact(&mut header).map_err(|e| format!("a connection past max_clients got no refusal: {e}"))?;
        let len = frame::body_len(header, frame::MAX_REPLY_BYTES).map_err(|e| e.to_string())?;
        let mut body = vec![0u8; len];
        stream.read_exact(&mut body).map_err(|e| e.to_string())?;
        match serde_json::from_slice::<Response>(&body) {
            Ok(Response::Error(e)) if e.code == ErrorCode::Exhausted => Ok(()),
            other => Err(format!("a connection past max_clients got {other:?} instead of EXHAUSTED")),
        }
    }

    /// Stops the daemon this program started (SIGTERM) and checks that it exits cleanly and
    /// removes its socket; a daemon that was already running is left alone.
    pub fn stop(self) -> Result<(), String> {
        let Some(mut spawned) = self.spawned else { return Ok(()) };
        drop(self.monitor);
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid as i32), nix::sys::signal::Signal::SIGTERM)
            .map_err(|e| format!("signalling wicd: {e}"))?;
        let deadline = Instant::now() + START_STOP_WAIT;
        loop {
            if let Some(status) = spawned.child.try_wait().map_err(|e| e.to_string())? {
                if !status.success() {
                    return Err(format!("wicd exited with {status} after SIGTERM"));
                }
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("wicd did not exit within {START_STOP_WAIT:?} of SIGTERM"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.socket.exists() {
            return Err("wicd left its socket behind".into());
        }
        Ok(())
    }
}
