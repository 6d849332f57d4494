//! The deployment files in `deploy/`: the systemd units pass `systemd-analyze verify` without a
//! single warning, the example configuration has exactly the documented keys and defaults, and the
//! sysusers, tmpfiles and udev files hold the expected entries.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const UNITS: [&str; 4] = ["wicd.service", "wicd.socket", "wic-sleep.service", "wic-compute-mode.service"];

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("deploy")
}

fn read_deploy(rel: &str) -> String {
    let path = deploy_dir().join(rel);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// `name` on `PATH`, if any.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
}

fn systemd_analyze() -> PathBuf {
    which("systemd-analyze").unwrap_or_else(|| {
        panic!(
            "systemd-analyze not found on PATH: install the `systemd` package \
             (e.g. `apt-get install systemd`) to verify the units in deploy/"
        )
    })
}

/// A scratch directory removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("wic-systemd-units-{}-{tag}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        ScratchDir(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// `systemd-analyze verify` refuses units whose executables do not exist. Point every `Exec*=`
/// line whose program is not installed here (`/usr/bin/wicd` on a build machine) at `true`;
/// programs that exist (`/bin/kill`) and every other line stay as they are.
fn with_existing_executables(unit: &str) -> String {
    let true_bin = which("true")
        .or_else(|| ["/usr/bin/true", "/bin/true"].map(PathBuf::from).into_iter().find(|p| p.is_file()))
        .expect("a `true` executable");
    let mut out = String::with_capacity(unit.len());
    for line in unit.lines() {
        let rewritten = line.split_once('=').and_then(|(key, value)| {
            if !key.trim().starts_with("Exec") {
                return None;
            }
            let value = value.trim_start();
            let prefix_len = value.len() - value.trim_start_matches(['-', '@', ':', '+', '!']).len();
            let (prefix, command) = value.split_at(prefix_len);
            let (program, args) = command.split_once(char::is_whitespace).unwrap_or((command, ""));
            if Path::new(program).is_file() {
                return None;
            }
            let args = if args.is_empty() { String::new() } else { format!(" {args}") };
            Some(format!("{key}={prefix}{}{args}", true_bin.display()))
        });
        out.push_str(rewritten.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

struct Verify {
    success: bool,
    /// Every line of stdout and stderr.
    output: String,
    /// Lines that concern the units under test.
    problems: Vec<String>,
}

/// Runs `systemd-analyze verify` on copies of `units` (name, contents) placed in `dir`.
fn verify(dir: &Path, units: &[(&str, String)]) -> Verify {
    let mut paths = Vec::new();
    for (name, contents) in units {
        let path = dir.join(name);
        fs::write(&path, contents).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        paths.push(path);
    }
    let out = Command::new(systemd_analyze())
        .arg("verify")
        .args(&paths)
        .env("SYSTEMD_LOG_COLOR", "0")
        .env("SYSTEMD_COLORS", "0")
        .env("SYSTEMD_PAGER", "")
        .output()
        .expect("running systemd-analyze verify");
    let output = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let dir_str = dir.display().to_string();
    let problems = output
        .lines()
        .filter(|l| l.contains(&dir_str) || units.iter().any(|(name, _)| l.contains(name)))
        .map(str::to_owned)
        .collect();
    Verify { success: out.status.success(), output, problems }
}

fn deploy_units() -> Vec<(&'static str, String)> {
    UNITS.iter().map(|&name| (name, with_existing_executables(&read_deploy(name)))).collect()
}

#[test]
fn units_pass_systemd_analyze_verify() {
    systemd_analyze();
    let scratch = ScratchDir::new("verify");
    let units = deploy_units();
    let service = &units[0].1;
    assert!(
        !service.contains("/usr/bin/wicd") || Path::new("/usr/bin/wicd").is_file(),
        "ExecStart was not rewritten:\n{service}"
    );
    assert!(service.contains("ExecReload=/bin/kill -HUP $MAINPID"), "ExecReload must stay as it is");

    let result = verify(&scratch.0, &units);
    assert!(
        result.success && result.problems.is_empty(),
        "systemd-analyze verify reported problems with deploy/{{{}}}:\n{}",
        UNITS.join(","),
        result.output
    );
}

/// The check above must not pass vacuously: a unit with an unknown key only draws a warning
/// (exit status 0) from `systemd-analyze verify`, and that warning has to be caught.
#[test]
fn verify_check_catches_warnings() {
    let scratch = ScratchDir::new("broken");
    let mut units = deploy_units();
    units[0].1 = units[0].1.replacen("[Service]\n", "[Service]\nNoSuchSetting=1\n", 1);
    units[1].1 = units[1].1.replacen("SocketMode=0660", "SocketMode=0668", 1);
    let result = verify(&scratch.0, &units);
    for (unit, needle) in [("wicd.service", "NoSuchSetting"), ("wicd.socket", "0668")] {
        assert!(
            result.problems.iter().any(|l| l.contains(unit) && l.contains(needle)),
            "expected a complaint about {needle} in {unit} from systemd-analyze verify, got:\n{}",
            result.output
        );
    }
}

/// `key=value` directives of one section of a unit file.
fn section<'a>(unit: &'a str, name: &str) -> Vec<(&'a str, &'a str)> {
    let header = format!("[{name}]");
    let mut inside = false;
    let mut out = Vec::new();
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == header;
        } else if inside && !line.is_empty() && !line.starts_with('#') && !line.starts_with(';') {
            let (k, v) = line.split_once('=').unwrap_or_else(|| panic!("not a directive: {line}"));
            out.push((k.trim(), v.trim()));
        }
    }
    out
}

fn assert_directives(unit_name: &str, section_name: &str, expected: &[(&str, &str)]) {
    let unit = read_deploy(unit_name);
    let directives = section(&unit, section_name);
    for &(k, v) in expected {
        assert!(directives.contains(&(k, v)), "{unit_name} [{section_name}] lacks {k}={v}; has {directives:?}");
    }
}

#[test]
fn units_carry_the_daemon_contract() {
    assert_directives(
        "wicd.service",
        "Unit",
        &[("Requires", "wicd.socket"), ("After", "wicd.socket"), ("After", "systemd-modules-load.service")],
    );
    assert_directives(
        "wicd.service",
        "Service",
        &[
            ("Type", "notify"),
            ("NotifyAccess", "main"),
            ("WatchdogSec", "10s"),
            ("Restart", "on-failure"),
            ("ExecStart", "/usr/bin/wicd serve --config /etc/wic/wicd.toml"),
            ("ExecReload", "/bin/kill -HUP $MAINPID"),
            ("User", "wicd"),
            ("Group", "wic"),
            ("DevicePolicy", "closed"),
            ("DeviceAllow", "/dev/wic rw"),
            ("DeviceAllow", "/dev/nvidia-uvm-tools rw"),
            // What NVML opens for the GPU-sharing check (deploy/wicd.service says where measured).
            ("DeviceAllow", "char-nvidia rw"),
            ("DeviceAllow", "char-nvidia-uvm rw"),
            ("DeviceAllow", "char-nvidia-caps r"),
            ("CapabilityBoundingSet", "CAP_IPC_LOCK"),
            ("AmbientCapabilities", "CAP_IPC_LOCK"),
            ("LimitMEMLOCK", "infinity"),
            ("ReadWritePaths", "/run/wic"),
            ("TimeoutStopSec", "15s"),
            ("KillSignal", "SIGTERM"),
        ],
    );
    assert_directives("wicd.service", "Install", &[("WantedBy", "multi-user.target"), ("Also", "wicd.socket")]);

    let service = read_deploy("wicd.service");
    let directives = section(&service, "Service");
    assert!(
        !directives.iter().any(|(k, _)| *k == "RuntimeDirectory"),
        "wicd.socket owns /run/wic; wicd.service must not set RuntimeDirectory="
    );
    for (k, v) in &directives {
        if *k == "SystemCallFilter" && !v.starts_with('~') {
            for syscall in ["io_uring_setup", "io_uring_enter", "io_uring_register"] {
                assert!(v.split_whitespace().any(|s| s == syscall), "SystemCallFilter={v} blocks {syscall}");
            }
        }
        if *k == "RestrictAddressFamilies" {
            assert!(v.split_whitespace().any(|s| s == "AF_UNIX"), "RestrictAddressFamilies={v} blocks AF_UNIX");
        }
    }

    assert_directives(
        "wicd.socket",
        "Socket",
        &[
            ("ListenStream", "/run/wic/wicd.sock"),
            ("SocketMode", "0660"),
            ("SocketUser", "root"),
            ("SocketGroup", "wic"),
            ("DirectoryMode", "0750"),
        ],
    );
    assert_directives("wicd.socket", "Install", &[("WantedBy", "sockets.target")]);
}

/// The sleep unit sets wic_shim's `suspending` before NVIDIA's suspend units run, which preempt
/// every channel through /proc/driver/nvidia/suspend before the kernel's suspend (whose PM
/// notifier the module has), and clears it when the sleep ends.
#[test]
fn sleep_unit_runs_before_nvidias_suspend() {
    let unit = read_deploy("wic-sleep.service");
    let before: Vec<&str> = section(&unit, "Unit")
        .into_iter()
        .filter(|(k, _)| *k == "Before")
        .flat_map(|(_, v)| v.split_whitespace())
        .collect();
    for want in ["sleep.target", "nvidia-suspend.service", "nvidia-hibernate.service"] {
        assert!(before.contains(&want), "wic-sleep.service must run before {want}: Before={before:?}");
    }
    assert_directives("wic-sleep.service", "Unit", &[("StopWhenUnneeded", "yes")]);
    let param = "/sys/module/wic_shim/parameters/suspending";
    assert_directives(
        "wic-sleep.service",
        "Service",
        &[
            ("Type", "oneshot"),
            ("RemainAfterExit", "yes"),
            ("ExecStart", &format!("/bin/sh -c 'echo 1 > {param}'")),
            ("ExecStop", &format!("/bin/sh -c 'echo 0 > {param}'")),
        ],
    );
    assert_directives("wic-sleep.service", "Install", &[("WantedBy", "sleep.target")]);
}

#[test]
fn example_config_has_exactly_the_documented_keys_and_defaults() {
    use toml::Value::{Integer as I, String as S};
    let s = |v: &str| S(v.to_owned());
    let expected: BTreeMap<&str, Vec<(&str, toml::Value)>> = BTreeMap::from([
        (
            "service",
            vec![
                ("socket", s("/run/wic/wicd.sock")),
                ("socket_mode", s("0660")),
                ("socket_group", s("wic")),
                ("backend", s("auto")),
                ("device", s("/dev/wic")),
                ("uvm_tools", s("/dev/nvidia-uvm-tools")),
                ("log_level", s("info")),
            ],
        ),
        ("engine", vec![("pool_pages", I(16384)), ("warps_per_batch", I(16)), ("max_slots", I(4096))]),
        ("emulated", vec![("gpus", I(4))]),
        (
            "shim",
            vec![
                ("submission", s("io_uring")),
                ("parallel_activation", toml::Value::Boolean(true)),
                ("open_wait_ms", I(2000)),
                ("gpu_sharing", s("refuse")),
                ("gpus", toml::Value::Array(Vec::new())),
            ],
        ),
        (
            "limits",
            vec![
                ("max_frame_bytes", I(65536)),
                ("max_clients", I(256)),
                ("reserved_clients", I(4)),
                ("max_clients_per_uid", I(64)),
                ("max_channels_per_client", I(64)),
                ("max_channels_per_uid", I(256)),
                ("max_slots_per_uid", I(1024)),
                ("max_pages_per_uid", I(4096)),
                ("reserved_channels", I(16)),
                ("reserved_slots", I(256)),
                ("reserved_pages", I(1024)),
                ("max_spaces_per_uid", I(32)),
                ("max_grants_per_channel", I(64)),
                ("max_grants_per_uid", I(1024)),
                ("max_message_bytes", I(1048576)),
                ("default_timeout_ms", I(1000)),
                ("hello_timeout_ms", I(5000)),
                ("request_timeout_ms", I(10000)),
                ("idle_close_ms", I(60000)),
            ],
        ),
    ]);

    let config: toml::Table = read_deploy("wicd.toml").parse().expect("deploy/wicd.toml is valid TOML");
    let sections: BTreeSet<&str> = config.keys().map(String::as_str).collect();
    assert_eq!(sections, expected.keys().copied().collect(), "sections of deploy/wicd.toml");
    for (name, keys) in &expected {
        let table = config[*name].as_table().unwrap_or_else(|| panic!("[{name}] is not a table"));
        let found: BTreeSet<&str> = table.keys().map(String::as_str).collect();
        assert_eq!(found, keys.iter().map(|(k, _)| *k).collect(), "keys of [{name}]");
        for (key, value) in keys {
            assert_eq!(&table[*key], value, "[{name}] {key}");
        }
    }
}

/// Whitespace-separated fields of the non-comment lines, honouring double quotes.
fn fields(text: &str) -> Vec<Vec<String>> {
    let mut lines = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut out = Vec::new();
        let mut cur = String::new();
        let mut quoted = false;
        for c in line.chars() {
            match c {
                '"' => {
                    quoted = !quoted;
                    cur.push(c);
                }
                c if c.is_whitespace() && !quoted => {
                    if !cur.is_empty() {
                        out.push(std::mem::take(&mut cur));
                    }
                }
                c => cur.push(c),
            }
        }
        assert!(!quoted, "unbalanced quote in: {line}");
        if !cur.is_empty() {
            out.push(cur);
        }
        // A trailing "-" means "unset", the same as leaving the field out.
        while out.len() > 2 && out.last().map(String::as_str) == Some("-") {
            out.pop();
        }
        lines.push(out);
    }
    lines
}

fn owned(rows: &[&[&str]]) -> Vec<Vec<String>> {
    rows.iter().map(|r| r.iter().map(|s| s.to_string()).collect()).collect()
}

#[test]
fn sysusers_creates_group_wic_and_user_wicd() {
    assert_eq!(
        fields(&read_deploy("sysusers.d/wic.conf")),
        owned(&[&["g", "wic"], &["u", "wicd", "-:wic", "\"wic daemon\""]]),
        "deploy/sysusers.d/wic.conf"
    );
}

#[test]
fn tmpfiles_creates_run_wic() {
    assert_eq!(
        fields(&read_deploy("tmpfiles.d/wic.conf")),
        owned(&[&["d", "/run/wic", "0750", "root", "wic"]]),
        "deploy/tmpfiles.d/wic.conf"
    );
}

#[test]
fn udev_rule_gives_dev_wic_to_wicd_alone() {
    let text = read_deploy("udev/70-wic.rules");
    let rules: Vec<BTreeSet<&str>> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split(',').map(str::trim).collect())
        .collect();
    let expected: BTreeSet<&str> =
        ["KERNEL==\"wic\"", "SUBSYSTEM==\"misc\"", "OWNER=\"wicd\"", "GROUP=\"root\"", "MODE=\"0600\""]
            .into_iter()
            .collect();
    assert_eq!(rules, vec![expected], "deploy/udev/70-wic.rules");
}
