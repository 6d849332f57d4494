//! A `wicd serve` of this build on the emulated GPU and a private socket, for the benchmarks
//! that measure through the daemon itself. Killed, and its directory removed, when dropped.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long wicd may take to listen.
const START_WAIT: Duration = Duration::from_secs(10);

pub struct Wicd {
    child: Child,
    dir: PathBuf,
    pub socket: PathBuf,
}

impl Wicd {
    /// Starts `wicd` (a [`binary`]) and waits until its socket accepts connections.
    pub fn start(wicd: &Path) -> Self {
        let dir = std::env::temp_dir().join(format!("wic-bench-wicd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("wicd's scratch directory");
        // An empty configuration: built-in defaults, whatever /etc/wic/wicd.toml says.
        std::fs::write(dir.join("wicd.toml"), "").expect("wicd's configuration");
        let log = std::fs::File::create(dir.join("wicd.log")).expect("wicd's log");
        let socket = dir.join("wicd.sock");
        let child = Command::new(wicd)
            .arg("serve")
            .arg("--config")
            .arg(dir.join("wicd.toml"))
            .arg("--socket")
            .arg(&socket)
            .arg("--backend")
            .arg("emulated")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn wicd");
        let mut wicd = Self { child, dir, socket };
        let deadline = Instant::now() + START_WAIT;
        while UnixStream::connect(&wicd.socket).is_err() {
            if let Some(status) = wicd.child.try_wait().expect("wait for wicd") {
                panic!("wicd exited during start-up ({status}):\n{}", wicd.log());
            }
            assert!(Instant::now() < deadline, "wicd did not listen within {START_WAIT:?}:\n{}", wicd.log());
            std::thread::sleep(Duration::from_millis(10));
        }
        wicd
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("wicd.log")).unwrap_or_default()
    }
}

impl Drop for Wicd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The wicd beside this executable, built first when cargo runs this one (`cargo run`, the
/// tests), so that a benchmark never measures a stale daemon.
pub fn binary() -> PathBuf {
    let exe = std::env::current_exe().expect("this executable's path");
    // target/<profile>/wic-bench
    let profile_dir = exe.parent().expect("an executable lives in a directory").to_path_buf();
    if let Ok(cargo) = std::env::var("CARGO") {
        let mut build = Command::new(cargo);
        build.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("..")).args(["build", "--quiet", "-p", "wicd"]);
        if profile_dir.file_name().is_some_and(|name| name == "release") {
            build.arg("--release");
        }
        if let Some(target) = profile_dir.parent() {
            build.env("CARGO_TARGET_DIR", target);
        }
        assert!(build.status().expect("run cargo build").success(), "building wicd failed");
    }
    let wicd = profile_dir.join("wicd");
    assert!(wicd.exists(), "{} is missing: build it (cargo build --release -p wicd)", wicd.display());
    wicd
}
