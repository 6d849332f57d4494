//! Shared helpers for the end-to-end tests: the workspace's binaries, built once per test
//! process, a real `wicd` on a private socket, and the invariants every emulated run must keep.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is inside the workspace").to_path_buf()
}

/// The target directory the test binary runs from (`target/<profile>`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test binary>
    exe.parent().and_then(Path::parent).expect("test binaries live in target/<profile>/deps").to_path_buf()
}

/// Builds wicd, wicctl and libwic with the profile of this test run (once), so the tests never
/// run stale binaries, and returns the target directory holding them.
pub fn built() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = target_dir();
        let profile = dir.file_name().and_then(|n| n.to_str()).unwrap_or("debug").to_string();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build.current_dir(workspace()).args(["build", "--quiet", "-p", "wicd", "-p", "wicctl", "-p", "wic"]);
        // The test profile's settings are what built this binary; `test` maps to `dev`-style
        // output in target/debug.
        if profile == "release" {
            build.arg("--release");
        }
        build.env("CARGO_TARGET_DIR", dir.parent().expect("target/<profile>"));
        let status = build.status().expect("run cargo build");
        assert!(status.success(), "building wicd, wicctl and libwic failed");
        dir
    })
}

/// A binary of the workspace.
pub fn binary(name: &str) -> PathBuf {
    let path = built().join(name);
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// The newest kernel release with headers installed (`/lib/modules/<release>/build`), compared
/// by its numbers.
pub fn kernel_with_headers() -> Option<String> {
    let mut kernels: Vec<String> = std::fs::read_dir("/lib/modules")
        .ok()?
        .filter_map(|d| d.ok())
        .filter(|d| d.path().join("build").is_dir())
        .filter_map(|d| d.file_name().into_string().ok())
        .collect();
    kernels.sort_by_key(|k| {
        k.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse::<u64>().ok()).collect::<Vec<_>>()
    });
    kernels.pop()
}

/// Writes the sources of small stand-ins for NVIDIA's modules into `dir`, with a `Kbuild` for
/// them: `nvidia` (exporting a symbol, of version `nvidia_version`) and an `nvidia-uvm` of
/// `uvm_version` using it, which also exports `uvm_wic_register` and is followed by a
/// `wic_shim` using that when `hooked`. They stand for NVIDIA's files where a test needs only
/// their names, versions and links, never their code.
pub fn write_stand_in_modules(dir: &Path, nvidia_version: &str, uvm_version: &str, hooked: bool) {
    std::fs::create_dir_all(dir).expect("stand-in module dir");
    let write = |name: &str, text: String| std::fs::write(dir.join(name), text).expect("stand-in module source");
    write(
        "nvidia.c",
        format!(
            "#include <linux/module.h>\nint nv_stand_in(void) {{ return 0; }}\nEXPORT_SYMBOL(nv_stand_in);\n\
             MODULE_LICENSE(\"GPL\");\nMODULE_VERSION(\"{nvidia_version}\");\n"
        ),
    );
    write(
        "nvidia-uvm.c",
        format!(
            "#include <linux/module.h>\nextern int nv_stand_in(void);\nint uvm_wic_register(void) {{ return nv_stand_in(); }}\n\
             {}MODULE_LICENSE(\"GPL\");\nMODULE_VERSION(\"{uvm_version}\");\n",
            if hooked { "EXPORT_SYMBOL(uvm_wic_register);\n" } else { "" }
        ),
    );
    if hooked {
        write(
            "wic_shim.c",
            "#include <linux/module.h>\nextern int uvm_wic_register(void);\n\
             static int __init shim_init(void) { return uvm_wic_register(); }\nmodule_init(shim_init);\n\
             MODULE_LICENSE(\"GPL\");\n"
                .into(),
        );
    }
    let objects = if hooked { "nvidia.o nvidia-uvm.o wic_shim.o" } else { "nvidia.o nvidia-uvm.o" };
    write("Kbuild", format!("obj-m := {objects}\n"));
}

/// What `deploy/modprobe/wic-modprobe` would run to load `module` for kernel `kver` (it runs
/// nothing: `WIC_MODPROBE_DRY_RUN`), and whether it would, with the module tree under
/// `modules_root` (the system's when `None`), in the environment nvidia-modprobe gives modprobe
/// (CUDA's way of loading nvidia-uvm): `PATH=/sbin` alone. The module is given the option `opt=1`.
pub fn wic_modprobe_dry_run(modules_root: Option<&Path>, kver: &str, module: &str) -> (bool, String) {
    let mut command = Command::new("/bin/sh");
    command
        .arg(workspace().join("deploy/modprobe/wic-modprobe"))
        .arg(module)
        .arg("opt=1")
        .env_clear()
        .env("PATH", "/sbin")
        .env("WIC_KERNEL", kver)
        .env("WIC_MODPROBE_DRY_RUN", "1");
    if let Some(root) = modules_root {
        command.env("WIC_MODULES_ROOT", root);
    }
    let out = command.output().expect("run wic-modprobe");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// A scratch directory unique to this test process and `name`, emptied first.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wic-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A running `wicd serve` on a private socket; killed (SIGKILL) when dropped unless stopped.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub dir: PathBuf,
}

impl Daemon {
    /// Starts wicd with `config` (TOML text) and waits until its socket accepts connections.
    pub fn start(name: &str, config: &str) -> Self {
        Self::start_with(name, config, |_| {})
    }

    /// As [`Daemon::start`], with `adjust` applied to the command first (limits, environment).
    pub fn start_with(name: &str, config: &str, adjust: impl FnOnce(&mut Command)) -> Self {
        let dir = scratch(name);
        std::fs::write(dir.join("wicd.toml"), config).expect("write config");
        let socket = dir.join("wicd.sock");
        let mut command = Self::command(&dir, &socket);
        adjust(&mut command);
        let child = command.spawn().expect("spawn wicd");
        let mut daemon = Self { child, socket, dir };
        daemon.wait_listening();
        daemon
    }

    /// Starts a new wicd on the same socket and configuration once this one has died (as a
    /// service manager restarts it); its log goes on in the same file.
    pub fn respawn(&mut self) {
        assert!(!self.alive(), "respawn while wicd is still running");
        self.child = Self::command(&self.dir, &self.socket).spawn().expect("spawn wicd");
        self.wait_listening();
    }

    fn command(dir: &Path, socket: &Path) -> Command {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("wicd.log")).expect("log file");
        let mut command = Command::new(binary("wicd"));
        command
            .arg("serve")
            .arg("--config")
            .arg(dir.join("wicd.toml"))
            .arg("--socket")
            .arg(socket)
            .arg("--backend")
            .arg("emulated")
            .env("RUST_BACKTRACE", "1")
            .stdout(Stdio::null())
            .stderr(log);
        command
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            if let Some(status) = self.child.try_wait().expect("wait wicd") {
                panic!("wicd exited during start-up ({status}):\n{}", self.log());
            }
            assert!(Instant::now() < deadline, "wicd did not listen within 10 s:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("wicd.log")).unwrap_or_default()
    }

    /// Sends `signal` to the daemon.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal).expect("signal wicd");
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn stop(mut self) -> String {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait wicd") {
                assert!(status.success(), "wicd exited with {status}:\n{}", self.log());
                break;
            }
            assert!(Instant::now() < deadline, "wicd did not stop within 10 s:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!self.socket.exists(), "wicd left its socket behind");
        self.log()
    }

    /// Whether the daemon process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().expect("wait wicd").is_none()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Booting a Debian kernel under qemu with wic's kernel modules loaded, through
/// `tests/vm/run.sh` (see tests/vm/README.md).
pub mod vm {
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};

    /// The harness script.
    pub fn script() -> PathBuf {
        super::workspace().join("tests/vm/run.sh")
    }

    /// The outcome of one boot.
    #[derive(Debug)]
    pub struct VmRun {
        /// The harness's verdict: the command exited 0, the modules loaded and the kernel
        /// logged no warning, oops or panic.
        pub ok: bool,
        /// The guest's serial console (`<out>/console.log`).
        pub console: String,
        /// The harness's own messages: what it built and booted, its verdict and the reasons.
        pub log: String,
        /// Where the files the command sent back (`WIC-VM-FILE-BEGIN NAME`) were written.
        pub files: PathBuf,
    }

    impl VmRun {
        /// A file the command sent back, if it did.
        pub fn file(&self, name: &str) -> Option<String> {
            std::fs::read_to_string(self.files.join(name)).ok()
        }

        /// The last `lines` lines of the console.
        pub fn console_tail(&self, lines: usize) -> String {
            let all: Vec<&str> = self.console.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }

        /// The harness's messages and the end of the console, for assertion messages.
        pub fn report(&self) -> String {
            format!("{}\n--- console (tail) ---\n{}", self.log.trim_end(), self.console_tail(80))
        }
    }

    /// Why the VM tests cannot run here, or `None`. Only a user who is not root and lacks a
    /// prerequisite is excused: as root the harness installs what is missing.
    pub fn unavailable() -> Option<String> {
        if nix::unistd::geteuid().is_root() {
            return None;
        }
        let check = Command::new("bash").arg(script()).arg("--check").output().expect("run tests/vm/run.sh --check");
        if check.status.success() {
            None
        } else {
            let why = String::from_utf8_lossy(&check.stdout).trim().replace('\n', "; ");
            Some(format!("not root and {why}"))
        }
    }

    /// Builds the kernel modules, boots the kernel with them loaded, `bins` in `/bin` and
    /// `files` (host path, guest path) in place, and runs `command` inside; `out_dir` receives
    /// the console, the files sent back and the initramfs.
    pub fn run(out_dir: &Path, bins: &[&Path], files: &[(PathBuf, String)], command: &[&str], timeout_s: u64) -> VmRun {
        let mut harness = Command::new("bash");
        harness.arg(script()).arg("--out").arg(out_dir).arg("--timeout").arg(timeout_s.to_string());
        for bin in bins {
            harness.arg("--bin").arg(bin);
        }
        for (src, dest) in files {
            let mut spec = src.clone().into_os_string();
            spec.push(":");
            spec.push(dest);
            harness.arg("--file").arg(spec);
        }
        harness.arg("--").args(command);
        // The console goes to <out>/console.log as well; stdout would only repeat it.
        let output = harness.stdout(Stdio::null()).output().expect("run tests/vm/run.sh");
        VmRun {
            ok: output.status.success(),
            console: std::fs::read_to_string(out_dir.join("console.log")).unwrap_or_default(),
            log: String::from_utf8_lossy(&output.stderr).into_owned(),
            files: out_dir.to_path_buf(),
        }
    }
}

/// The invariants of one workload run both ways on the emulator (`poll`, then `fault` through
/// the real engine): every message delivered with intact bytes, every request woken exactly
/// once, nothing left held, every page back in the pool. (A run may request nothing at all;
/// callers that expect traffic check `messages_checked` themselves.) `warps_per_batch` is the warps one
/// wake-up serves.
pub fn check_runs(poll: &wic_emu::RunReport, fault: &wic_emu::RunReport, warps_per_batch: u64) -> Result<(), String> {
    let name = fault.workload;
    let fail = |what: String| Err(format!("{name}: {what}"));
    let Some(engine) = fault.engine.as_ref() else { return fail("fault mode ran without the engine".into()) };
    for r in [poll, fault] {
        if r.corrupt_messages != 0 || r.error_markers != 0 {
            return fail(format!(
                "{:?}: {} corrupted messages, {} failed requests",
                r.mode, r.corrupt_messages, r.error_markers
            ));
        }
    }
    if poll.messages_checked != fault.messages_checked {
        return fail(format!("the modes delivered {} and {} messages", poll.messages_checked, fault.messages_checked));
    }
    if engine.requests != engine.delivered {
        return fail(format!("{} requests, {} delivered: a request was lost", engine.requests, engine.delivered));
    }
    if engine.delivered * warps_per_batch != fault.messages_checked {
        return fail(format!(
            "{} wake-ups for {} messages: a wake-up was lost or duplicated",
            engine.delivered, fault.messages_checked
        ));
    }
    if engine.dab_updates != engine.delivered {
        return fail(format!("{} publishes consumed {} times", engine.dab_updates, engine.delivered));
    }
    if (engine.timed_out, engine.malformed, engine.foreign, engine.wrong_gpu) != (0, 0, 0, 0) {
        return fail(format!("timed out / malformed / foreign / wrong GPU: {engine:?}"));
    }
    if !fault.pfq_empty || !fault.pool_restored {
        return fail(format!("PFQ empty: {}, pool restored: {}", fault.pfq_empty, fault.pool_restored));
    }
    if poll.engine.is_some() || poll.daemon_share != 0.0 {
        return fail("naive polling ran a daemon".into());
    }
    Ok(())
}
