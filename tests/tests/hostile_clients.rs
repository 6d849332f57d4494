//! wicd under a hostile local user. Every member of the socket's group can talk to wicd; one
//! of them must not be able to deny service to the others, root's `wicctl` included. Each test
//! runs an attack (as another uid where the bound is per uid: `wic-hostile`, started with
//! setuid, which needs root) while a well-behaved client keeps working, and checks that what
//! the attacker got stayed within the configured bounds.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use wic_proto::client::{Client, ClientError};
use wic_proto::frame;
use wic_proto::message::{ChannelSpec, ErrorCode, Producer, Reply, Request, Response, Role};
use wic_proto::PROTOCOL_VERSION;
use wic_tests::Daemon;

/// The attacker, and a second unprivileged user who only wants to be served.
const ATTACKER: u32 = 65534;
const OTHER_USER: u32 = 65533;
const THIRD_USER: u32 = 65532;

/// `quota::FDS_RESERVED`, `FDS_PER_CONNECTION` and `FDS_PER_CHANNEL` in wicd
/// (`daemon/src/service/quota.rs`).
const FDS_RESERVED: u64 = 64 + 253 + 64;
const FDS_PER_CONNECTION: u64 = 4;
const FDS_PER_CHANNEL: u64 = 8;

/// Whether this process may start clients as other uids; if not, says why the test is skipped.
fn can_switch_uid() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("skipped: starting a client as another uid needs root");
    }
    root
}

/// Configuration for a daemon other uids can reach.
fn config(limits: &str) -> String {
    format!("[service]\nsocket_mode = \"0666\"\n\n[limits]\n{limits}")
}

/// `wic-hostile` running as `uid`, its stdin kept open so it holds what it got until released.
struct Hostile {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Hostile {
    fn start(uid: u32, args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_wic-hostile"))
            .args(args)
            .uid(uid)
            .gid(uid)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start wic-hostile");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Self { child, stdout }
    }

    /// Its next line; every wait in wic-hostile is bounded, so this is too.
    fn line(&mut self) -> String {
        let mut line = String::new();
        if self.stdout.read_line(&mut line).expect("read wic-hostile") == 0 {
            let mut err = String::new();
            let _ = self.child.stderr.take().expect("piped").read_to_string(&mut err);
            panic!("wic-hostile ended early: {err}");
        }
        line.trim_end().to_owned()
    }

    /// Lets it go on (release what it holds, or report what wicd closed) and waits for it.
    fn release(mut self) -> String {
        self.child.stdin.take().expect("piped").write_all(b"\n").expect("release wic-hostile");
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).expect("read wic-hostile");
        let status = self.child.wait().expect("wait wic-hostile");
        assert!(status.success(), "wic-hostile failed ({status})");
        rest.trim_end().to_owned()
    }
}

/// `wic-hostile behave` as `uid`: a well-behaved user's whole round (create, grant, attach,
/// destroy), whatever came of it.
fn try_behave(daemon: &Daemon, uid: u32) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_wic-hostile"))
        .args(["behave".as_ref(), daemon.socket.as_os_str()])
        .uid(uid)
        .gid(uid)
        .output()
        .expect("run wic-hostile behave")
}

/// A well-behaved user's whole round as `uid`, which must be served.
fn behave(daemon: &Daemon, uid: u32) {
    let output = try_behave(daemon, uid);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.trim() == "served",
        "uid {uid} was not served: {stdout}{}\n{}",
        String::from_utf8_lossy(&output.stderr),
        daemon.log()
    );
}

/// `wic-hostile` with `args` as each of `uids` in turn, each started once the one before said
/// what it got: the processes, holding what they got, and their first lines.
fn in_turn(uids: &[u32], args: &[&str]) -> (Vec<Hostile>, Vec<String>) {
    let mut started = Vec::new();
    let mut lines = Vec::new();
    for &uid in uids {
        let mut hostile = Hostile::start(uid, args);
        lines.push(hostile.line());
        started.push(hostile);
    }
    (started, lines)
}

/// `wicctl status` as this process's user (root: an operator).
fn wicctl_status(daemon: &Daemon) {
    let output = Command::new(wic_tests::binary("wicctl"))
        .arg("status")
        .env("WIC_SOCKET", &daemon.socket)
        .output()
        .expect("run wicctl");
    assert!(output.status.success(), "wicctl status failed: {}", String::from_utf8_lossy(&output.stderr));
}

fn spec() -> ChannelSpec {
    ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes: 64, slots: 1, timeout_ns: 0 }
}

fn refusal(result: Result<Reply, ClientError>) -> (ErrorCode, String) {
    match result {
        Err(ClientError::Refused(e)) => (e.code, e.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn open_fds(daemon: &Daemon) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", daemon.child.id())).expect("wicd's descriptors").count()
}

/// Waits until wicd counts `n` connections, `client`'s own included.
fn wait_clients(client: &mut Client, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let clients = match client.call(&Request::Status {}).expect("status") {
            Reply::Status(status) => status.clients,
            other => panic!("{other:?}"),
        };
        if clients == n {
            return;
        }
        assert!(Instant::now() < deadline, "wicd counts {clients} clients, not {n}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_for_log(daemon: &Daemon, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !daemon.log().contains(needle) {
        assert!(Instant::now() < deadline, "the log never said {needle:?}:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn silent_connections_of_one_user_lock_out_neither_other_users_nor_root() {
    if !can_switch_uid() {
        return;
    }
    let limits = "max_clients = 16\nreserved_clients = 2\nmax_clients_per_uid = 8\nhello_timeout_ms = 10000\n";
    let daemon = Daemon::start("hostile-silent", &config(limits));
    let socket = daemon.socket.to_str().expect("utf-8 path");
    let mut attacker = Hostile::start(ATTACKER, &["silent", socket, "20", "--wait-ms", "20000"]);
    assert_eq!(attacker.line(), "accepted 8", "one uid holds at most max_clients_per_uid connections");
    assert_eq!(attacker.line(), "refused 12 EXHAUSTED");
    behave(&daemon, OTHER_USER);
    wicctl_status(&daemon);

    // A second user takes what is left to non-operators; the reserve still lets root in.
    let mut root = Client::connect(&daemon.socket, "operator").expect("root connects");
    wait_clients(&mut root, 9);
    let mut second = Hostile::start(THIRD_USER, &["silent", socket, "20", "--wait-ms", "20000"]);
    assert_eq!(second.line(), "accepted 5", "16 connections, 2 of them reserved, 9 taken");
    assert_eq!(second.line(), "refused 15 EXHAUSTED");
    let reserve: Vec<Client> =
        (0..2).map(|_| Client::connect(&daemon.socket, "operator").expect("root uses the reserve")).collect();
    drop(reserve);
    wait_clients(&mut root, 14);
    wicctl_status(&daemon);

    // Connections that never say hello are closed at the hello deadline.
    for (hostile, accepted) in [(attacker, "8"), (second, "5")] {
        let closed = hostile.release();
        let fields: Vec<&str> = closed.split_whitespace().collect();
        assert!(
            fields.len() == 3 && fields[..2] == ["closed", accepted],
            "the silent connections were not all closed: {closed}"
        );
    }
    let log = daemon.log();
    assert!(
        log.contains("uid=65534") && log.contains("holds its limit of 8 connections"),
        "refusals are logged with the uid:\n{log}"
    );
    // The refusals came faster than the log takes them: those left out are counted.
    assert!(log.contains("more refusals of this uid not logged uid=65534"), "{log}");
    assert!(log.contains("no hello within 10000 ms"), "{log}");
    behave(&daemon, OTHER_USER);
    daemon.stop();
}

#[test]
fn descriptors_trickled_with_a_request_are_closed_as_they_arrive() {
    // Root's descriptors in flight are not held to its own descriptor limit; another user's
    // sends would fail once they pass it, before wicd is tried.
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: passing more descriptors than this process's limit needs root");
        return;
    }
    let daemon = Daemon::start("hostile-fds", "");
    let mut stream = UnixStream::connect(&daemon.socket).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let hello = serde_json::to_vec(&Request::Hello { version: PROTOCOL_VERSION, client: "trickle".into() }).unwrap();
    stream.write_all(&frame::encode(&hello)).unwrap();
    read_response(&mut stream).expect("hello answered");
    let before = open_fds(&daemon);

    // A valid request padded to almost the frame limit, its first 100 bytes sent one at a time
    // with 253 descriptors each: 25,300 descriptors, which wicd would hold until the request is
    // complete if it kept them.
    let mut body = br#"{"op":"status"}"#.to_vec();
    body.resize(60_000, b' ');
    let bytes = frame::encode(&body);
    let null = std::fs::File::open("/dev/null").unwrap();
    let fds = [null.as_raw_fd(); 253];
    for byte in &bytes[..100] {
        let rights = [ControlMessage::ScmRights(&fds)];
        sendmsg::<()>(
            stream.as_raw_fd(),
            &[std::io::IoSlice::new(std::slice::from_ref(byte))],
            &rights,
            MsgFlags::empty(),
            None,
        )
        .expect("send a byte with descriptors");
    }
    wait_until_read(&stream);
    let mut other = Client::connect(&daemon.socket, "bystander").expect("another client connects");
    assert!(matches!(other.call(&Request::CreateChannel { spec: spec(), base_va: None }), Ok(Reply::Channel(_))));
    let during = open_fds(&daemon);
    // The bystander's connection and channel, and the one descriptor the request may carry.
    let bound = before + 1 + FDS_PER_CHANNEL as usize + 1;
    assert!(during <= bound, "wicd holds {during} descriptors, {before} before the trickle (bound {bound})");

    stream.write_all(&bytes[100..]).unwrap();
    let refused = read_response(&mut stream).expect("the request is answered");
    match refused {
        Response::Error(e) => {
            assert_eq!(e.code, ErrorCode::Invalid);
            assert!(e.message.contains("at most 1 descriptor"), "{}", e.message);
        }
        Response::Ok(reply) => panic!("a request with 25,300 descriptors was served: {reply:?}"),
    }
    wicctl_status(&daemon);
    daemon.stop();
}

/// Waits until wicd has read every byte sent on `stream` (and received their descriptors).
fn wait_until_read(stream: &UnixStream) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut queued: libc::c_int = 0;
        // SAFETY: SIOCOUTQ writes one int through the pointer, which is live.
        let ok = unsafe { libc::ioctl(stream.as_raw_fd(), libc::TIOCOUTQ, &mut queued) } == 0;
        assert!(ok, "SIOCOUTQ: {}", std::io::Error::last_os_error());
        if queued == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "wicd left {queued} bytes unread");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn read_response(stream: &mut UnixStream) -> Result<Response, String> {
    let mut header = [0u8; frame::HEADER_BYTES];
    stream.read_exact(&mut header).map_err(|e| format!("header: {e}"))?;
    let mut body = vec![0u8; frame::body_len(header, 1 << 20).map_err(|e| e.to_string())?];
    stream.read_exact(&mut body).map_err(|e| format!("body: {e}"))?;
    serde_json::from_slice(&body).map_err(|e| e.to_string())
}

/// Runs `wicd serve` on `socket` with default settings and `adjust` applied, which must refuse to
/// start: its output once it has exited, within 10 s.
fn refused_start(socket: &std::path::Path, adjust: impl FnOnce(&mut Command)) -> std::process::Output {
    let mut command = Command::new(wic_tests::binary("wicd"));
    command.args(["serve", "--backend", "emulated", "--config", "/dev/null", "--socket"]).arg(socket);
    adjust(&mut command);
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("run wicd");
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().expect("wait wicd").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("wait wicd");
            panic!("wicd started instead of refusing:\n{}", String::from_utf8_lossy(&output.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("wait wicd")
}

/// wicd as started with `limit` as its hard descriptor limit.
fn with_descriptor_limit(limit: u64) -> impl FnOnce(&mut Command) {
    move |command: &mut Command| {
        // SAFETY: setrlimit is async-signal-safe and touches only the child's own limits.
        unsafe {
            command.pre_exec(move || {
                let rlim = libc::rlimit { rlim_cur: limit, rlim_max: limit };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &rlim) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    }
}

#[test]
fn the_limits_must_fit_the_descriptor_limit_and_channels_stop_short_of_it() {
    // Too low for 256 connections: refused at start, with the reason.
    let dir = wic_tests::scratch("hostile-nofile");
    let output = refused_start(&dir.join("wicd.sock"), with_descriptor_limit(600));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("RLIMIT_NOFILE") && stderr.contains("max_clients = 256"),
        "{stderr}"
    );

    // Room for 4 channels besides 8 connections and the reserve.
    let max_clients = 8;
    let limit = FDS_RESERVED + FDS_PER_CONNECTION * max_clients + 4 * FDS_PER_CHANNEL;
    let daemon = Daemon::start_with(
        "hostile-budget",
        &config(&format!("max_clients = {max_clients}\nreserved_channels = 1\n")),
        with_descriptor_limit(limit),
    );
    let mut client = Client::connect(&daemon.socket, "test").expect("connect");
    let before = open_fds(&daemon);
    for _ in 0..4 {
        assert!(matches!(client.call(&Request::CreateChannel { spec: spec(), base_va: None }), Ok(Reply::Channel(_))));
    }
    let held = (open_fds(&daemon) - before) as u64;
    assert!(
        held <= 4 * FDS_PER_CHANNEL,
        "4 channels hold {held} descriptors, more than the budget's {FDS_PER_CHANNEL} each"
    );
    let (code, message) = refusal(client.call(&Request::CreateChannel { spec: spec(), base_va: None }));
    assert_eq!(code, ErrorCode::Exhausted);
    assert!(message.contains("descriptor limit"), "{message}");
    // Every connection still fits.
    let clients: Vec<Client> =
        (1..max_clients).map(|_| Client::connect(&daemon.socket, "test").expect("connect")).collect();
    assert_eq!(clients.len() as u64, max_clients - 1);
    drop(clients);
    wicctl_status(&daemon);
    daemon.stop();
}

#[test]
fn grant_tokens_are_bounded_per_channel_and_per_uid_freed_with_their_owner_and_reloaded() {
    if !can_switch_uid() {
        return;
    }
    let limits = "max_grants_per_channel = 10\nmax_grants_per_uid = 25\n";
    let mut daemon = Daemon::start("hostile-grants", &config(limits));
    let socket = daemon.socket.to_str().expect("utf-8 path").to_owned();
    let grants = || Hostile::start(ATTACKER, &["grants", &socket, "3", "20"]);
    let mut attacker = grants();
    let granted = attacker.line();
    assert!(granted.starts_with("granted 10 10 5 | EXHAUSTED uid 65534 has 25 unused tokens"), "{granted}");
    behave(&daemon, OTHER_USER);
    let log = daemon.log();
    assert!(!log.contains("grant issued"), "granting is logged at debug only:\n{log}");
    assert!(log.contains("grant refused") && log.contains("uid=65534"), "{log}");
    attacker.release();

    // The attacker's tokens went with its channels: it gets as many again.
    let mut again = grants();
    assert!(again.line().starts_with("granted 10 10 5 |"));
    again.release();

    // Reloaded like the other limits.
    std::fs::write(daemon.dir.join("wicd.toml"), config("max_grants_per_channel = 3\nmax_grants_per_uid = 25\n"))
        .unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for_log(&daemon, "configuration reloaded");
    let mut reloaded = grants();
    let granted = reloaded.line();
    assert!(granted.starts_with("granted 3 3 3 | EXHAUSTED channel"), "{granted}");
    reloaded.release();

    // Limits the descriptor limit cannot hold are refused on reload too.
    std::fs::write(daemon.dir.join("wicd.toml"), config("max_clients = 4294967295\nmax_clients_per_uid = 4\n"))
        .unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for_log(&daemon, "RLIMIT_NOFILE");
    assert!(daemon.alive());
    let mut kept = grants();
    assert!(kept.line().starts_with("granted 3 3 3 |"), "the running limits were kept");
    kept.release();
    daemon.stop();
}

/// SIGHUP re-reads the configuration on wicd's control thread: a FIFO with no writer, a symlink
/// to /dev/zero or a file of 2 MiB at its path is refused at once, the running configuration is
/// kept, and wicd goes on serving (a blocking read of the FIFO stopped every client; /dev/zero
/// grew wicd until the OOM killer ended it).
#[test]
fn a_reload_from_a_fifo_a_device_or_a_huge_file_is_refused_and_wicd_keeps_serving() {
    let mut daemon = Daemon::start("hostile-reload", &config(""));
    let path = daemon.dir.join("wicd.toml");
    let reload_refused = |daemon: &mut Daemon, times: usize, why: &str| {
        daemon.signal(nix::sys::signal::Signal::SIGHUP);
        let deadline = Instant::now() + Duration::from_secs(5);
        while daemon.log().matches("reload failed").count() < times {
            assert!(Instant::now() < deadline, "reload {times} was not refused:\n{}", daemon.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        let log = daemon.log();
        let last = log.lines().rfind(|l| l.contains("reload failed")).unwrap_or_default().to_owned();
        assert!(last.contains(why), "{last}");
        assert!(daemon.alive());
        wicctl_status(daemon);
    };

    std::fs::remove_file(&path).unwrap();
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).unwrap();
    reload_refused(&mut daemon, 1, "not a regular file");

    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
    reload_refused(&mut daemon, 2, "not a regular file");

    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, "#\n".repeat(1 << 20)).unwrap();
    reload_refused(&mut daemon, 3, "larger than");

    std::fs::write(&path, config("")).unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for_log(&daemon, "configuration reloaded");
    daemon.stop();
}

#[test]
fn channels_are_bounded_per_uid() {
    if !can_switch_uid() {
        return;
    }
    let daemon = Daemon::start("hostile-channels", &config("max_channels_per_client = 4\nmax_channels_per_uid = 10\n"));
    let socket = daemon.socket.to_str().expect("utf-8 path");
    let mut attacker = Hostile::start(ATTACKER, &["channels", socket, "3", "10"]);
    let created = attacker.line();
    assert!(created.starts_with("created 4 4 2 | EXHAUSTED uid 65534 owns its limit of 10 channels"), "{created}");
    behave(&daemon, OTHER_USER);
    // Root is not held to the per-uid bound.
    let mut root = Client::connect(&daemon.socket, "operator").unwrap();
    for _ in 0..4 {
        assert!(matches!(root.call(&Request::CreateChannel { spec: spec(), base_va: None }), Ok(Reply::Channel(_))));
    }
    attacker.release();
    daemon.stop();
}

#[test]
fn slots_and_pool_pages_every_user_shares_are_bounded_per_uid() {
    if !can_switch_uid() {
        return;
    }
    let daemon = Daemon::start("hostile-pool", &config("max_slots_per_uid = 1024\nmax_pages_per_uid = 4096\n"));
    let socket = daemon.socket.to_str().expect("utf-8 path");
    // Every slot of the engine in one channel.
    let mut slots = Hostile::start(ATTACKER, &["channels", socket, "1", "1", "--slots", "4096"]);
    let created = slots.line();
    assert!(
        created.starts_with("created 0 | EXHAUSTED uid 65534 holds 0 slots; 4096 more would pass its limit of 1024"),
        "{created}"
    );
    slots.release();
    // The whole pool in one channel: 2 slots of 2 runs of 4096 pages (16 warps of 1 MiB).
    let mut pages =
        Hostile::start(ATTACKER, &["channels", socket, "1", "1", "--slots", "2", "--message-bytes", "1048576"]);
    let created = pages.line();
    assert!(
        created.starts_with("created 0 | EXHAUSTED uid 65534 holds 0 pages; 16384 more would pass its limit of 4096"),
        "{created}"
    );
    // Within the bounds, channels add up until the next one would pass them.
    let mut many = Hostile::start(ATTACKER, &["channels", socket, "1", "10", "--slots", "300"]);
    let created = many.line();
    assert!(created.starts_with("created 3 | EXHAUSTED uid 65534 holds 900 slots; 300 more"), "{created}");
    behave(&daemon, OTHER_USER);
    pages.release();
    many.release();
    daemon.stop();
}

/// Four uids, each within its limits, once took every pool page and slot (each: 8 channels of
/// 128 slots of 16 messages of 512 bytes, 1024 slots and 4096 pages, its limits exactly), and
/// nobody could create a channel after them, root included. Now each may hold at most half of
/// what the other users leave: 8, 8, 7 and 3 channels; root creates one of the same size out
/// of the operators' reserve, and a fifth user is still served.
#[test]
fn uids_within_their_limits_together_leave_operators_their_reserve_and_the_next_user_room() {
    if !can_switch_uid() {
        return;
    }
    let daemon = Daemon::start("hostile-group", &config(""));
    let socket = daemon.socket.to_str().expect("utf-8 path");
    let (group, lines) = in_turn(
        &[ATTACKER, OTHER_USER, THIRD_USER, THIRD_USER - 1],
        &["channels", socket, "1", "8", "--slots", "128", "--message-bytes", "512"],
    );
    assert!(lines[0].starts_with("created 8 | -"), "{lines:?}");
    assert!(lines[1].starts_with("created 8 | -"), "{lines:?}");
    assert!(
        lines[2].starts_with("created 7 | EXHAUSTED uid 65532 holds 896 slots; 128 more would pass its share of 896"),
        "{lines:?}"
    );
    assert!(
        lines[3].starts_with("created 3 | EXHAUSTED uid 65531 holds 384 slots; 128 more would pass its share of 448"),
        "{lines:?}"
    );
    let mut root = Client::connect(&daemon.socket, "operator").unwrap();
    let big = ChannelSpec { slots: 128, message_bytes: 512, ..spec() };
    assert!(matches!(root.call(&Request::CreateChannel { spec: big, base_va: None }), Ok(Reply::Channel(_))));
    behave(&daemon, THIRD_USER - 2);
    for taker in group {
        taker.release();
    }
    daemon.stop();
}

/// Uids that together would fill the channels wicd's descriptor limit allows (20 here) leave the
/// operators their reserve (4) and each the next uid some room: 8, 4, 2, 1, then none; root
/// still creates its 4 and more up to the limit. The previous wicd gave the first uid all 20.
#[test]
fn uids_together_leave_operators_channels_within_the_descriptor_limit() {
    if !can_switch_uid() {
        return;
    }
    let max_clients = 16;
    let limit = FDS_RESERVED + FDS_PER_CONNECTION * max_clients + 20 * FDS_PER_CHANNEL;
    let daemon = Daemon::start_with(
        "hostile-capacity",
        &config(&format!("max_clients = {max_clients}\nreserved_channels = 4\n")),
        with_descriptor_limit(limit),
    );
    let socket = daemon.socket.to_str().expect("utf-8 path");
    let (group, lines) =
        in_turn(&[ATTACKER, OTHER_USER, THIRD_USER, THIRD_USER - 1, THIRD_USER - 2], &["channels", socket, "1", "20"]);
    let counts: Vec<&str> = lines.iter().map(|l| l.split(" |").next().unwrap_or_default()).collect();
    assert_eq!(counts, ["created 8", "created 4", "created 2", "created 1", "created 0"], "{lines:?}");
    assert!(lines[0].contains("holds 8 channels; 1 more would pass its share of 8"), "{lines:?}");
    assert!(lines[4].contains("holds 0 channels; 1 more would pass its share of 0"), "{lines:?}");
    let mut root = Client::connect(&daemon.socket, "operator").unwrap();
    for _ in 0..5 {
        assert!(matches!(root.call(&Request::CreateChannel { spec: spec(), base_va: None }), Ok(Reply::Channel(_))));
    }
    let (code, message) = refusal(root.call(&Request::CreateChannel { spec: spec(), base_va: None }));
    assert!(code == ErrorCode::Exhausted && message.contains("descriptor limit"), "{message}");
    for taker in group {
        taker.release();
    }
    daemon.stop();
}

/// Users who said hello and then sat idle, each within its limits, once filled every
/// connection users may take, for as long as they liked. Now a connection that holds nothing is
/// closed after `idle_close_ms` of silence once three quarters of the users' connections are
/// taken: a further user gets in, and a connection that holds a channel stays.
#[test]
fn idle_connections_holding_nothing_make_room_when_the_table_fills() {
    if !can_switch_uid() {
        return;
    }
    // 16 connections for users (20 less 4 reserved), 4 per uid.
    let daemon =
        Daemon::start("hostile-idle", &config("max_clients = 20\nmax_clients_per_uid = 4\nidle_close_ms = 300\n"));
    let socket = daemon.socket.to_str().expect("utf-8 path");
    let mut holder = Hostile::start(THIRD_USER - 3, &["channels", socket, "1", "1"]);
    assert!(holder.line().starts_with("created 1 | -"));
    let (idlers, lines) = in_turn(&[ATTACKER, OTHER_USER, THIRD_USER, THIRD_USER - 1], &["idle", socket, "4"]);
    for line in lines {
        assert!(line.starts_with("connected 4 | -") || line.starts_with("connected 3 | EXHAUSTED"), "{line}");
    }
    // A fifth user finds the table full at first, and gets in once the idle ones are closed.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if try_behave(&daemon, THIRD_USER - 2).status.success() {
            break;
        }
        assert!(Instant::now() < deadline, "a fifth user never got in:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_for_log(&daemon, "holding nothing");
    let mut root = Client::connect(&daemon.socket, "operator").unwrap();
    let listed = match root.call(&Request::Channels {}).expect("channels") {
        Reply::Channels { channels } => channels,
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(listed.len(), 1, "the holder's channel, and its connection, stay: {listed:?}");
    for idler in idlers {
        idler.release();
    }
    holder.release();
    daemon.stop();
}

#[test]
fn requests_that_never_finish_and_replies_never_read_are_cut_off() {
    let daemon = Daemon::start("hostile-slow", &config("request_timeout_ms = 500\n"));
    let hello = frame::encode(
        &serde_json::to_vec(&Request::Hello { version: PROTOCOL_VERSION, client: "slow".into() }).unwrap(),
    );

    // A request begun and never finished.
    let mut slow = UnixStream::connect(&daemon.socket).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    slow.write_all(&hello).unwrap();
    read_response(&mut slow).expect("hello answered");
    slow.write_all(&[200, 0, 0, 0, b'{']).unwrap();
    let started = Instant::now();
    let mut byte = [0u8; 1];
    assert_eq!(slow.read(&mut byte).expect("wicd closes, not the read timeout"), 0);
    assert!(started.elapsed() >= Duration::from_millis(400), "closed before the timeout: {:?}", started.elapsed());

    // Requests pipelined whose replies are never read: wicd stops writing, then hangs up.
    let mut greedy = UnixStream::connect(&daemon.socket).unwrap();
    greedy.write_all(&hello).unwrap();
    let stats = frame::encode(&serde_json::to_vec(&Request::Stats {}).unwrap());
    let requests = 5000;
    greedy.write_all(&stats.repeat(requests)).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    greedy.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut replies = Vec::new();
    // wicd hung up with requests unread, which the kernel reports as a reset after the data.
    let read = greedy.read_to_end(&mut replies);
    let hung_up = read.is_ok() || read.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset);
    assert!(hung_up, "wicd kept the connection of a client that does not read: {read:?}");
    let answered = count_frames(&replies);
    assert!(answered <= requests, "all {requests} requests and the hello were answered");
    wait_for_log(&daemon, "did not read its reply within 500 ms");
    wicctl_status(&daemon);
    daemon.stop();
}

fn count_frames(mut bytes: &[u8]) -> usize {
    let mut frames = 0;
    while bytes.len() >= frame::HEADER_BYTES {
        let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        if bytes.len() < frame::HEADER_BYTES + len {
            break;
        }
        bytes = &bytes[frame::HEADER_BYTES + len..];
        frames += 1;
    }
    frames
}

#[test]
fn a_full_daemon_refusal_is_read_every_time() {
    let daemon = Daemon::start("hostile-full", &config("max_clients = 2\nreserved_clients = 1\n"));
    let _held: Vec<Client> = (0..2).map(|_| Client::connect(&daemon.socket, "test").unwrap()).collect();
    for attempt in 0..30 {
        match Client::connect(&daemon.socket, "test") {
            Err(ClientError::Refused(e)) => {
                assert_eq!(e.code, ErrorCode::Exhausted);
                assert!(e.message.contains("too many clients"), "{}", e.message);
            }
            other => panic!("attempt {attempt}: {other:?}"),
        }
    }
    daemon.stop();
}

#[test]
fn an_owner_attaching_with_its_own_token_leaves_the_token_good() {
    let daemon = Daemon::start("hostile-own-token", "");
    let mut owner = Client::connect(&daemon.socket, "owner").unwrap();
    let channel = match owner.call(&Request::CreateChannel { spec: spec(), base_va: None }).unwrap() {
        Reply::Channel(info) => info.channel,
        other => panic!("{other:?}"),
    };
    let token = match owner.call(&Request::Grant { channel, role: Role::Consumer, uid: None }).unwrap() {
        Reply::Token { token } => token,
        other => panic!("{other:?}"),
    };
    assert_eq!(refusal(owner.call(&Request::Attach { token: token.clone() })).0, ErrorCode::Invalid);
    let mut consumer = Client::connect(&daemon.socket, "consumer").unwrap();
    assert!(matches!(consumer.call(&Request::Attach { token }), Ok(Reply::Channel(info)) if info.channel == channel));
    wait_for_log(&daemon, "attach refused (INVALID)");
    daemon.stop();
}

#[test]
fn a_file_at_the_socket_path_is_never_removed() {
    let dir = wic_tests::scratch("hostile-socket-path");
    let path = dir.join("precious");
    std::fs::write(&path, "not a socket").unwrap();
    let output = refused_start(&path, |_| {});
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("is not a socket"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");

    // A socket of another user is left alone as well.
    if can_switch_uid() {
        let socket = dir.join("theirs.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        drop(listener);
        nix::unistd::chown(&socket, Some(nix::unistd::Uid::from_raw(ATTACKER)), None).unwrap();
        let output = refused_start(&socket, |_| {});
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains("uid 65534"), "{stderr}");
        assert!(socket.exists());
    }
}

#[test]
fn a_client_flooding_its_own_fault_ring_keeps_neither_other_channels_nor_requests_waiting() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{mpsc, Arc};
    use wic_proto::client::Timeout;
    use wic_proto::message::FdKind;
    use wic_proto::shm::{ConsumerLayout, FAULT_RING_ENTRIES, RING_ENTRY_BYTES};

    /// Ends the flood however the test ends.
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    /// Confines the calling thread, or the process about to exec, to `cpu`.
    fn pin(cpu: usize) -> std::io::Result<()> {
        // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET stays inside it and
        // sched_setaffinity only reads it.
        let done = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        if done == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    // The attacker needs a CPU of its own, as any machine with a few cores gives it: where this
    // process may use two, the flood gets the second, at real-time priority where allowed
    // (root), and wicd and everyone else the first. Even so the scheduler leaves other tasks
    // 50 ms of each second of the flood's CPU, during which it pauses; hence each request and
    // delivery below must take less than half a second, not just less than one.
    // SAFETY: a zeroed cpu_set_t is the empty set, which sched_getaffinity fills.
    let cpus: Vec<usize> = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set), 0);
        (0..libc::CPU_SETSIZE as usize).filter(|&cpu| libc::CPU_ISSET(cpu, &set)).take(2).collect()
    };
    let cpus = match cpus[..] {
        [served, flood] => Some((served, flood)),
        _ => None,
    };
    let daemon = Daemon::start_with("hostile-fault-flood", "", |command| {
        if let Some((served, _)) = cpus {
            // SAFETY: sched_setaffinity is async-signal-safe and changes only the child.
            unsafe { command.pre_exec(move || pin(served)) };
        }
    });
    if let Some((served, _)) = cpus {
        pin(served).expect("pin the test's thread");
    }
    let limit = Duration::from_millis(500);
    // The watchdog's view, and another client's channels.
    let mut operator =
        Client::connect_with_timeout(&daemon.socket, "watchdog", Timeout::after(limit)).expect("connect");
    let bystander = wic::Client::connect_with_timeout(Some(&daemon.socket), Timeout::after(limit)).expect("connect");
    let mut attacker = Client::connect(&daemon.socket, "flood").expect("connect");
    let (info, fds) =
        match attacker.call_with_fds(&Request::CreateChannel { spec: spec(), base_va: None }).expect("create") {
            (Reply::Channel(info), fds) => (info, fds),
            (other, _) => panic!("{other:?}"),
        };
    assert_eq!(info.fds[..2], [FdKind::ConsumerRegion, FdKind::FaultDoorbell]);
    let layout = ConsumerLayout { slots: info.slots.len() as u32, pages_per_run: info.pages_per_run };
    let mut fds = fds.into_iter();
    let (region, doorbell) = (fds.next().expect("consumer region"), fds.next().expect("fault doorbell"));

    // The attacker writes its ring by hand (docs/protocol.md): as soon as wicd publishes its
    // read index, the sequence words of the next whole ring's worth, so wicd never finds the
    // ring empty. The entries stay zero and name no page of the channel. The doorbell is rung
    // only when wicd has stopped reading.
    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(Arc::clone(&stop));
    let flood = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            if let Some((_, flood)) = cpus {
                pin(flood).expect("pin the flood's thread");
                let fifo = libc::sched_param { sched_priority: 1 };
                // SAFETY: this thread's own policy, from a valid parameter; refused unless root.
                let _ = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &fifo) };
            }
            let bytes = layout.bytes();
            // SAFETY: a new shared mapping of the whole region, unmapped below.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    region.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(base, libc::MAP_FAILED, "map the consumer region");
            let word = |offset: usize| -> &AtomicU64 {
                assert!(offset & 7 == 0 && offset + 8 <= bytes);
                // SAFETY: an aligned word inside the mapping, which outlives every use.
                unsafe { &*base.cast::<u8>().add(offset).cast::<AtomicU64>() }
            };
            let read_index = word(40);
            let ring = (64 + 4 * layout.pages()).next_multiple_of(8);
            let entries = u64::from(FAULT_RING_ENTRIES);
            let give_up = Instant::now() + Duration::from_secs(10);
            // `next`: the first index whose sequence word is not written yet.
            let (mut next, mut idle, mut refills) = (0u64, 0u64, 0u64);
            while !stop.load(Ordering::Relaxed) && Instant::now() < give_up {
                let get = read_index.load(Ordering::Acquire);
                if next < get + entries {
                    for index in next.max(get)..get + entries {
                        word(ring + (index % entries) as usize * RING_ENTRY_BYTES).store(index + 1, Ordering::Release);
                    }
                    (next, idle, refills) = (get + entries, 0, refills + 1);
                    continue;
                }
                idle += 1;
                if idle & 4095 == 0 {
                    nix::unistd::write(&doorbell, &1u64.to_ne_bytes()).expect("ring the doorbell");
                }
                std::hint::spin_loop();
            }
            // SAFETY: no reference into the mapping is used past here.
            unsafe { libc::munmap(base, bytes) };
            refills
        })
    };

    let flooding = Instant::now();
    let mut rounds = 0u32;
    while flooding.elapsed() < Duration::from_secs(2) {
        for request in [Request::Status {}, Request::Stats {}] {
            if let Err(e) = operator.call(&request) {
                panic!("{request:?} during the flood: {e}");
            }
        }
        // A whole round on another channel: created, published, its consumer's fault
        // delivered, destroyed.
        let channel = Arc::new(bystander.create_channel(&spec()).expect("a channel created during the flood"));
        let batch = channel.info().batch_bytes as usize;
        let message: Vec<u8> = (0..batch).map(|i| (i as u32).wrapping_mul(31).wrapping_add(rounds) as u8).collect();
        channel.publish_copy(0, &message).expect("publish");
        let (tx, rx) = mpsc::channel();
        let consumer = {
            let channel = Arc::clone(&channel);
            std::thread::spawn(move || {
                let mut got = vec![0u8; batch];
                let _ = tx.send(channel.consume(0, &mut got).map(|_| got));
            })
        };
        let got = rx.recv_timeout(limit).expect("delivered during the flood").expect("consume");
        assert_eq!(got, message, "round {rounds}");
        consumer.join().expect("consumer thread");
        Arc::into_inner(channel).expect("the only handle left").close().expect("destroyed during the flood");
        rounds += 1;
    }
    let during = match operator.call(&Request::Stats {}).expect("stats") {
        Reply::Stats(stats) => *stats,
        other => panic!("{other:?}"),
    };
    stop.store(true, Ordering::Relaxed);
    let refills = flood.join().expect("flood thread");

    // wicd kept reading the flood, a whole ring at a time, each a ring found full.
    let rings = during.faults_captured / u64::from(FAULT_RING_ENTRIES);
    assert!(refills >= 16 && rings >= 16, "the flood ran: {refills} refills, {during:?}");
    assert!((16..=rings).contains(&during.fault_buffer_overflows), "{during:?}");
    assert!(
        during.faults_ignored >= 16 * u64::from(FAULT_RING_ENTRIES),
        "the flood's entries name no page of its channel: {during:?}"
    );
    assert_eq!(during.faults_completed, u64::from(rounds), "each round delivered once");
    drop(attacker);
    daemon.stop();
}

/// `wicctl ARGS` as `uid` (this process's, root, when `None`): its exit status and output.
fn wicctl_as(daemon: &Daemon, uid: Option<u32>, args: &[&str]) -> (Option<i32>, String) {
    let mut command = Command::new(wic_tests::binary("wicctl"));
    command.args(args).env("WIC_SOCKET", &daemon.socket);
    if let Some(uid) = uid {
        command.uid(uid).gid(uid);
    }
    let output = command.output().expect("run wicctl");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.code(), text)
}

#[test]
fn only_operators_drain_and_a_drain_refuses_every_new_channel_until_undone() {
    if !can_switch_uid() {
        return;
    }
    let daemon = Daemon::start("drain", &config(""));
    let (code, text) = wicctl_as(&daemon, Some(ATTACKER), &["drain", "--no-wait"]);
    assert_eq!(code, Some(1), "a user drained wicd: {text}");
    assert!(text.contains("only root and wicd's own user"), "{text}");

    // A job's channel, then the drain: it waits for the channel, which keeps working, and
    // every new channel is refused, root's too.
    let create = Request::CreateChannel { spec: spec(), base_va: None };
    let mut job = Client::connect(&daemon.socket, "job").expect("connect");
    let Reply::Channel(info) = job.call(&create).expect("create") else { panic!("not a channel") };
    let (code, text) = wicctl_as(&daemon, None, &["drain", "--wait", "0.5"]);
    assert_eq!(code, Some(4), "{text}");
    assert!(text.contains("waiting for 1 channels to end") && text.contains("1 channels are left after"), "{text}");
    let (_, status) = wicctl_as(&daemon, None, &["status"]);
    assert!(status.lines().any(|l| l.starts_with("draining") && l.contains("yes")), "{status}");
    let mut root = Client::connect(&daemon.socket, "operator").expect("connect");
    let (code, message) = refusal(root.call(&create));
    assert_eq!(code, ErrorCode::Stopping, "{message}");
    assert!(message.contains("draining"), "{message}");
    job.call(&Request::Publish { channel: info.channel, slot: 0 }).expect("a publish while draining");

    // The job ends: the drain is done.
    job.call(&Request::DestroyChannel { channel: info.channel }).expect("destroy");
    let (code, text) = wicctl_as(&daemon, None, &["drain"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("drained: no channels left"), "{text}");

    // Undone: channels again.
    let (code, text) = wicctl_as(&daemon, None, &["drain", "--undo"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(matches!(root.call(&create), Ok(Reply::Channel(_))), "a channel after the drain was undone");
    let log = daemon.log();
    assert!(log.contains("draining: new channels are refused") && log.contains("drain undone"), "{log}");
}
