//! The C examples, compiled here against wic.h and the static libwic, driven against a real
//! wicd on the emulated GPU; the daemon's counters (through wicctl) must account for exactly
//! what they did.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use wic_proto::client::Client;
use wic_proto::message::{ChannelSpec, Producer, Reply, Request, Role};
use wic_tests::{binary, built, workspace, Daemon};

/// Compiles `examples/c/<name>.c` into `dir`, statically linked.
fn compile(name: &str, dir: &Path) -> PathBuf {
    let root = workspace();
    let pc = std::fs::read_to_string(root.join("ffi/wic.pc.in")).expect("wic.pc.in");
    let private = pc.lines().find_map(|l| l.strip_prefix("Libs.private:")).expect("Libs.private in wic.pc.in");
    let out = dir.join(name);
    let status = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-I"])
        .arg(root.join("ffi/include"))
        .arg(root.join(format!("examples/c/{name}.c")))
        .arg(built().join("libwic.a"))
        .args(private.split_whitespace())
        .arg("-o")
        .arg(&out)
        .status()
        .expect("cc is required to build the C examples");
    assert!(status.success(), "compiling {name}.c failed");
    out
}

fn wicctl(daemon: &Daemon, args: &[&str]) -> String {
    let out = Command::new(binary("wicctl")).arg("--socket").arg(&daemon.socket).args(args).output().expect("wicctl");
    assert!(out.status.success(), "wicctl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

fn stats(daemon: &Daemon) -> serde_json::Value {
    serde_json::from_str(&wicctl(daemon, &["stats", "--json"])).expect("stats --json is JSON")
}

/// Starts the consumer and returns it with the token it printed.
fn start_consumer(
    consumer: &Path,
    daemon: &Daemon,
    args: &[&str],
) -> (std::process::Child, String, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(consumer)
        .args(args)
        .env("WIC_SOCKET", &daemon.socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start consumer");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).expect("consumer output");
    let token =
        line.trim().strip_prefix("token ").unwrap_or_else(|| panic!("expected a token, got {line:?}")).to_string();
    (child, token, stdout)
}

fn finish(child: std::process::Child, mut stdout: BufReader<std::process::ChildStdout>) -> (Output, String) {
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let output = child.wait_with_output().expect("wait");
    (output, rest)
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn producer_and_consumer_deliver_every_byte_and_the_counters_agree() {
    let daemon = Daemon::start("c-example", "");
    let consumer = compile("consumer", &daemon.dir);
    let producer = compile("producer", &daemon.dir);
    let (slots, generations) = (4u64, 60u64);
    let (child, token, stdout) =
        start_consumer(&consumer, &daemon, &["256", &slots.to_string(), &generations.to_string()]);
    let produced = Command::new(&producer)
        .args([token.as_str(), &generations.to_string()])
        .env("WIC_SOCKET", &daemon.socket)
        .output()
        .expect("run producer");
    let (consumed, rest) = finish(child, stdout);
    let batches = slots * generations;
    assert!(produced.status.success(), "producer: {}", String::from_utf8_lossy(&produced.stderr));
    assert!(consumed.status.success(), "consumer: {}", String::from_utf8_lossy(&consumed.stderr));
    assert_eq!(String::from_utf8_lossy(&produced.stdout).trim(), format!("published {batches} batches"));
    assert_eq!(rest.trim(), format!("consumed {batches} batches, 0 mismatches"));

    let s = stats(&daemon);
    let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("stats lack {k}"));
    assert_eq!(n("faults_completed"), batches, "one delivery per batch");
    assert_eq!(n("host_publishes"), batches);
    assert_eq!(n("dab_updates"), batches);
    assert_eq!((n("faults_timed_out"), n("faults_cancelled"), n("pfq_depth")), (0, 0, 0));
    assert_eq!(
        n("faults_captured"),
        n("faults_completed") + n("faults_ignored"),
        "every entry is a request or ignored"
    );
    assert!(n("faults_held") <= batches);
    assert_eq!(s["wake_latency_ns"]["count"].as_u64(), Some(batches));
    assert!(n("replays") >= 1 && n("replays") <= n("faults_captured"));
    assert_eq!(s["batch_sizes"]["sum"].as_u64(), Some(n("faults_captured")));
    // The consumer closed its channel: nothing is left behind.
    assert_eq!((n("channels"), n("pool_pages_used")), (0, 0));
    assert_eq!(wicctl(&daemon, &["channels"]).trim(), "no channels");

    let metrics = wicctl(&daemon, &["metrics"]);
    assert!(metrics.lines().any(|l| l == format!("wic_faults_completed_total {batches}")), "{metrics}");
    assert!(metrics.lines().any(|l| l == format!("wic_wake_latency_seconds_count {batches}")), "{metrics}");
    daemon.stop();
}

#[test]
fn a_channel_in_use_shows_in_wicctl_with_its_owner_and_counters() {
    let daemon = Daemon::start("c-channels", "");
    let consumer = compile("consumer", &daemon.dir);
    let (child, _token, stdout) = start_consumer(&consumer, &daemon, &["64", "2", "1"]);
    let table = wicctl(&daemon, &["channels", "--json"]);
    let channels: serde_json::Value = serde_json::from_str(&table).unwrap();
    let channel = &channels.as_array().expect("a list")[0];
    assert_eq!(channel["owner_pid"].as_u64(), Some(u64::from(child.id())));
    assert_eq!(channel["spec"]["slots"].as_u64(), Some(2));
    wait_for("the consumer to be held", || stats(&daemon)["pfq_depth"].as_u64() == Some(1));
    // Killing the consumer mid-wait reclaims its channel and the held request.
    let mut child = child;
    child.kill().unwrap();
    let _ = finish(child, stdout);
    wait_for("the channel to be reclaimed", || {
        let s = stats(&daemon);
        s["channels"].as_u64() == Some(0)
            && s["pool_pages_used"].as_u64() == Some(0)
            && s["pfq_depth"].as_u64() == Some(0)
    });
    assert_eq!(stats(&daemon)["faults_cancelled"].as_u64(), Some(1));
    daemon.stop();
}

#[test]
fn a_late_producer_times_the_consumer_out_and_a_stopping_daemon_wakes_it() {
    let daemon = Daemon::start("c-timeout", "[limits]\ndefault_timeout_ms = 150\n");
    let consumer = compile("consumer", &daemon.dir);
    let (child, _token, stdout) = start_consumer(&consumer, &daemon, &["64", "1", "1"]);
    let (output, _) = finish(child, stdout);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no data within the channel's timeout"), "{stderr}");
    assert_eq!(stats(&daemon)["faults_timed_out"].as_u64(), Some(1));

    // Now a consumer held when the daemon stops is told so instead of hanging.
    let patient = Daemon::start("c-stopping", "[limits]\ndefault_timeout_ms = 60000\n");
    let (child, _token, stdout) = start_consumer(&consumer, &patient, &["64", "1", "1"]);
    wait_for("the consumer to be held", || stats(&patient)["pfq_depth"].as_u64() == Some(1));
    patient.stop();
    let (output, _) = finish(child, stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("daemon stopping"), "{stderr}");
    daemon.stop();
}

#[test]
fn another_uid_is_refused_a_token_bound_to_someone_else() {
    let daemon = Daemon::start("c-uid", "[service]\nsocket_mode = \"0666\"\n");
    let producer = compile("producer", &daemon.dir);
    let mut owner = Client::connect(&daemon.socket, "test").unwrap();
    let spec = ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes: 64, slots: 1, timeout_ns: 0 };
    let Ok(Reply::Channel(info)) = owner.call(&Request::CreateChannel { spec, base_va: None }) else {
        panic!("create")
    };
    let grant = |owner: &mut Client, uid| match owner.call(&Request::Grant {
        channel: info.channel,
        role: Role::Producer,
        uid,
    }) {
        Ok(Reply::Token { token }) => token,
        other => panic!("grant: {other:?}"),
    };
    const NOBODY: u32 = 65534;
    let run_as_nobody = |token: &str| {
        Command::new(&producer)
            .args([token, "0"])
            .env("WIC_SOCKET", &daemon.socket)
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
            .expect("run producer as nobody")
    };
    let refused = run_as_nobody(&grant(&mut owner, Some(0)));
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("permission denied"), "{refused:?}");
    let allowed = run_as_nobody(&grant(&mut owner, Some(NOBODY)));
    assert!(allowed.status.success(), "{}", String::from_utf8_lossy(&allowed.stderr));
    daemon.stop();
}

#[test]
fn other_users_see_only_their_own_channels_and_the_socket_mode_keeps_strangers_out() {
    const NOBODY: u32 = 65534;
    let wicctl_as_nobody = |daemon: &Daemon, args: &[&str]| {
        Command::new(binary("wicctl"))
            .arg("--socket")
            .arg(&daemon.socket)
            .args(args)
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
            .expect("run wicctl as nobody")
    };
    let open = Daemon::start("c-visibility", "[service]\nsocket_mode = \"0666\"\n");
    let mut owner = Client::connect(&open.socket, "test").unwrap();
    let spec = ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes: 64, slots: 1, timeout_ns: 0 };
    let Ok(Reply::Channel(_)) = owner.call(&Request::CreateChannel { spec, base_va: None }) else { panic!("create") };
    let listed =
        |json: &str| serde_json::from_str::<serde_json::Value>(json).expect("JSON").as_array().expect("a list").len();
    assert_eq!(listed(&wicctl(&open, &["channels", "--json"])), 1, "root, an operator, sees every channel");
    let stranger = wicctl_as_nobody(&open, &["channels", "--json"]);
    assert!(stranger.status.success(), "{}", String::from_utf8_lossy(&stranger.stderr));
    assert_eq!(listed(&String::from_utf8_lossy(&stranger.stdout)), 0, "another uid sees none of root's channels");
    let mode = |daemon: &Daemon| std::fs::metadata(&daemon.socket).expect("socket").permissions().mode() & 0o777;
    assert_eq!(mode(&open), 0o666);
    open.stop();

    // The default mode, 0660 for the wic group, shuts everyone else out.
    let strict = Daemon::start("c-socket-mode", "");
    assert_eq!(mode(&strict), 0o660);
    let refused = wicctl_as_nobody(&strict, &["status"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("ermission denied"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    strict.stop();
}

/// The README's lines that build and run the C examples, with the paths of this test run:
/// `target/release/` is where this run's binaries are, `target/` where the examples go.
fn readme_example_lines(out: &Path) -> Vec<String> {
    let readme = std::fs::read_to_string(workspace().join("README.md")).expect("README.md");
    let lines: Vec<String> = readme
        .lines()
        .filter(|l| l.starts_with("cc ") || l.contains("target/consumer 256"))
        .map(|l| {
            let examples = l.replace("target/release/", "\0").replace("target/", &format!("{}/", out.display()));
            examples.replace('\0', &format!("{}/", built().display()))
        })
        .collect();
    assert_eq!(lines.len(), 3, "the README builds two examples and runs them: {lines:?}");
    lines
}

#[test]
fn the_readme_example_pipeline_succeeds_and_reports_failure() {
    let daemon = Daemon::start("c-readme", "");
    let script = readme_example_lines(&daemon.dir).join("\n");
    let run = |socket: &Path| {
        Command::new("bash")
            .arg("-c")
            .arg(&script)
            .current_dir(workspace())
            .env("WIC_SOCKET", socket)
            .output()
            .expect("bash")
    };
    let served = run(&daemon.socket);
    let stdout = String::from_utf8_lossy(&served.stdout);
    assert!(
        served.status.success() && stdout.contains("consumed 400 batches, 0 mismatches"),
        "{stdout}{}",
        String::from_utf8_lossy(&served.stderr)
    );
    // Both programs fail without a daemon: so must the pipeline.
    let failed = run(&daemon.dir.join("absent.sock"));
    assert!(
        !failed.status.success(),
        "the pipeline exited 0 with both programs failing: {}",
        String::from_utf8_lossy(&failed.stderr)
    );
    daemon.stop();
}
