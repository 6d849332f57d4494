//! A real wicd on a private socket, driven at the protocol level: framing errors, version and
//! hello checks, ownership and grants, reclaiming after an abrupt disconnect, reload, and a
//! consumer region's fault ring written by hand.

use std::time::{Duration, Instant};

use wic_engine::fault::AccessType;
use wic_engine::{ErrorMarker, FaultEntry, PAGE_SIZE};
use wic_proto::client::{Client, ClientError};
use wic_proto::frame;
use wic_proto::message::{
    ChannelInfo, ChannelSpec, ErrorCode, FdKind, Producer, Reply, Request, Response, Role, Stats,
};
use wic_proto::shm::{ConsumerLayout, ConsumerRegion, RingFull, FAULT_RING_ENTRIES, PAGE_MAPPED};
use wic_tests::Daemon;

fn spec(slots: u32, message_bytes: u32) -> ChannelSpec {
    ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes, slots, timeout_ns: 0 }
}

fn connect(daemon: &Daemon) -> Client {
    Client::connect(&daemon.socket, "test").expect("connect to wicd")
}

fn refused(result: Result<Reply, ClientError>) -> ErrorCode {
    match result {
        Err(ClientError::Refused(e)) => e.code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn create(client: &mut Client, slots: u32) -> (u32, Vec<FdKind>) {
    let (info, _) = create_with_fds(client, spec(slots, 64));
    (info.channel, info.fds)
}

fn create_with_fds(client: &mut Client, spec: ChannelSpec) -> (ChannelInfo, Vec<std::os::fd::OwnedFd>) {
    match client.call_with_fds(&Request::CreateChannel { spec, base_va: None }).expect("create") {
        (Reply::Channel(info), fds) => {
            assert_eq!(fds.len(), info.fds.len(), "one descriptor per listed kind");
            (info, fds)
        }
        (other, _) => panic!("unexpected {other:?}"),
    }
}

fn wait_stats(client: &mut Client, what: &str, done: impl Fn(&Stats) -> bool) -> Stats {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = stats(client);
        if done(&now) {
            return now;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {now:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stats(client: &mut Client) -> Stats {
    match client.call(&Request::Stats {}).expect("stats") {
        Reply::Stats(stats) => *stats,
        other => panic!("unexpected {other:?}"),
    }
}

fn raw_reply(client: &mut Client, bytes: &[u8]) -> Response {
    client.send_raw(bytes).expect("send");
    let (body, _) = client.receive().expect("a reply");
    serde_json::from_slice(&body).expect("replies are JSON responses")
}

fn error_code(response: Response) -> ErrorCode {
    match response {
        Response::Error(e) => e.code,
        Response::Ok(reply) => panic!("expected an error, got {reply:?}"),
    }
}

#[test]
fn broken_requests_get_errors_and_the_daemon_keeps_serving() {
    let mut daemon = Daemon::start("broken", "");
    let mut client = connect(&daemon);
    let garbage = frame::encode(b"\x00\xffnot json");
    assert_eq!(error_code(raw_reply(&mut client, &garbage)), ErrorCode::Invalid);
    let unknown = frame::encode(br#"{"op":"format_disk"}"#);
    assert_eq!(error_code(raw_reply(&mut client, &unknown)), ErrorCode::Invalid);
    let extra = frame::encode(br#"{"op":"destroy_channel","channel":0,"force":true}"#);
    assert_eq!(error_code(raw_reply(&mut client, &extra)), ErrorCode::Invalid);
    assert_eq!(error_code(raw_reply(&mut client, &0u32.to_le_bytes())), ErrorCode::Protocol);
    // Still in sync after all that.
    assert!(matches!(client.call(&Request::Status {}), Ok(Reply::Status(_))));

    // A greeted client that says hello again in another version is closed as well.
    let mut again = connect(&daemon);
    let wrong = frame::encode(br#"{"op":"hello","version":99,"client":"again"}"#);
    assert_eq!(error_code(raw_reply(&mut again, &wrong)), ErrorCode::Protocol);
    assert!(again.call(&Request::Status {}).is_err(), "closed after a version mismatch");

    // An oversized frame is answered, then the connection is closed.
    let mut big = connect(&daemon);
    let response = raw_reply(&mut big, &(1u32 << 30).to_le_bytes());
    assert_eq!(error_code(response), ErrorCode::Protocol);
    assert!(big.call(&Request::Status {}).is_err(), "the connection is closed after an oversized frame");

    // A truncated frame followed by a hang-up costs nothing.
    let mut truncated = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    std::io::Write::write_all(&mut truncated, &[100, 0, 0, 0, b'{', b'"']).unwrap();
    drop(truncated);

    // Requests before hello are refused; a wrong version ends the session.
    let mut raw = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    let status = frame::encode(br#"{"op":"status"}"#);
    std::io::Write::write_all(&mut raw, &status).unwrap();
    let mut header = [0u8; 4];
    std::io::Read::read_exact(&mut raw, &mut header).unwrap();
    let mut body = vec![0u8; u32::from_le_bytes(header) as usize];
    std::io::Read::read_exact(&mut raw, &mut body).unwrap();
    assert!(String::from_utf8_lossy(&body).contains("the first request must be hello"));
    let hello = frame::encode(br#"{"op":"hello","version":99,"client":"future"}"#);
    std::io::Write::write_all(&mut raw, &hello).unwrap();
    std::io::Read::read_exact(&mut raw, &mut header).unwrap();
    let mut body = vec![0u8; u32::from_le_bytes(header) as usize];
    std::io::Read::read_exact(&mut raw, &mut body).unwrap();
    assert!(String::from_utf8_lossy(&body).contains("version 99 is not supported"));
    assert_eq!(std::io::Read::read(&mut raw, &mut header).unwrap(), 0, "closed after a version mismatch");

    assert!(daemon.alive());
    let mut fresh = connect(&daemon);
    assert!(matches!(fresh.call(&Request::Status {}), Ok(Reply::Status(_))));
    daemon.stop();
}

#[test]
fn clients_act_only_on_their_own_channels_and_granted_roles() {
    let daemon = Daemon::start("peers", "");
    let mut owner = connect(&daemon);
    let mut other = connect(&daemon);
    let (channel, fds) = create(&mut owner, 2);
    assert_eq!(
        fds,
        vec![FdKind::ConsumerRegion, FdKind::FaultDoorbell, FdKind::ProducerRegion, FdKind::PublishDoorbell]
    );

    assert_eq!(refused(other.call(&Request::DestroyChannel { channel })), ErrorCode::Permission);
    assert_eq!(
        refused(other.call(&Request::Grant { channel, role: Role::Producer, uid: None })),
        ErrorCode::Permission
    );
    assert_eq!(refused(other.call(&Request::Publish { channel, slot: 0 })), ErrorCode::Permission);
    assert_eq!(refused(other.call(&Request::Attach { token: "00".repeat(16) })), ErrorCode::NotFound);
    assert_eq!(refused(other.call(&Request::DestroyChannel { channel: 999 })), ErrorCode::NotFound);
    assert_eq!(refused(owner.call(&Request::Grant { channel, role: Role::Owner, uid: None })), ErrorCode::Invalid);

    // A token bound to another uid is refused, and stays valid for that uid.
    let Reply::Token { token: bound } =
        owner.call(&Request::Grant { channel, role: Role::Producer, uid: Some(4_000_000) }).unwrap()
    else {
        panic!("grant returns a token")
    };
    assert_eq!(refused(other.call(&Request::Attach { token: bound.clone() })), ErrorCode::Permission);

    let Reply::Token { token } = owner.call(&Request::Grant { channel, role: Role::Producer, uid: None }).unwrap()
    else {
        panic!("grant returns a token")
    };
    let (reply, passed) = other.call_with_fds(&Request::Attach { token: token.clone() }).unwrap();
    let Reply::Channel(info) = reply else { panic!("attach returns the channel") };
    assert_eq!(info.role, Role::Producer);
    assert_eq!(info.fds, vec![FdKind::ProducerRegion, FdKind::PublishDoorbell], "a producer gets no consumer region");
    assert_eq!(passed.len(), 2);
    assert_eq!(refused(other.call(&Request::Attach { token })), ErrorCode::NotFound, "tokens are single-use");

    // The producer may publish but not destroy or grant.
    assert!(matches!(other.call(&Request::Publish { channel, slot: 1 }), Ok(Reply::Done)));
    assert_eq!(refused(other.call(&Request::Publish { channel, slot: 1 })), ErrorCode::Busy, "not delivered yet");
    assert_eq!(refused(other.call(&Request::Publish { channel, slot: 2 })), ErrorCode::NotFound);
    assert_eq!(refused(other.call(&Request::DestroyChannel { channel })), ErrorCode::Permission);
    assert_eq!(stats(&mut owner).host_publishes, 1);

    // Destroying the channel drops its outstanding tokens.
    assert!(matches!(owner.call(&Request::DestroyChannel { channel }), Ok(Reply::Done)));
    assert_eq!(refused(owner.call(&Request::Attach { token: bound })), ErrorCode::NotFound);
    assert_eq!(refused(other.call(&Request::Publish { channel, slot: 0 })), ErrorCode::NotFound);
    daemon.stop();
}

#[test]
fn an_abrupt_disconnect_reclaims_channels_and_pages() {
    let daemon = Daemon::start("reclaim", "");
    let mut watcher = connect(&daemon);
    let before = stats(&mut watcher);
    assert_eq!((before.channels, before.pool_pages_used), (0, 0));
    let mut doomed = connect(&daemon);
    for slots in [1, 4, 16] {
        create(&mut doomed, slots);
    }
    let during = stats(&mut watcher);
    assert_eq!(during.channels, 3);
    assert_eq!(during.pool_pages_used, 2 * (1 + 4 + 16), "64-byte messages: one page per run, two runs per slot");
    assert_eq!(during.clients, 2);
    drop(doomed);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = stats(&mut watcher);
        if now.channels == 0 && now.pool_pages_used == 0 && now.clients == 1 {
            assert_eq!(now.pool_longest_free_run, now.pool_pages, "the pool is whole again");
            break;
        }
        assert!(Instant::now() < deadline, "not reclaimed: {now:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    daemon.stop();
}

#[test]
fn limits_apply_and_reload_on_sighup() {
    let config = "[limits]\nmax_channels_per_client = 2\nmax_message_bytes = 4096\n";
    let daemon = Daemon::start("limits", config);
    let mut client = connect(&daemon);
    create(&mut client, 1);
    create(&mut client, 1);
    let third = client.call(&Request::CreateChannel { spec: spec(1, 64), base_va: None });
    assert_eq!(refused(third), ErrorCode::Exhausted);
    let big = client.call(&Request::CreateChannel { spec: spec(1, 8192), base_va: None });
    assert_eq!(refused(big), ErrorCode::Invalid);

    std::fs::write(daemon.dir.join("wicd.toml"), "[limits]\nmax_channels_per_client = 3\nmax_message_bytes = 16384\n")
        .unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !daemon.log().contains("configuration reloaded") {
        assert!(Instant::now() < deadline, "no reload:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(matches!(
        client.call(&Request::CreateChannel { spec: spec(1, 8192), base_va: None }),
        Ok(Reply::Channel(_))
    ));

    // A broken file is reported and the running configuration kept.
    std::fs::write(daemon.dir.join("wicd.toml"), "[limits]\nmax_clients = \"many\"\n").unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !daemon.log().contains("reload failed") {
        assert!(Instant::now() < deadline, "no reload error:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        refused(client.call(&Request::CreateChannel { spec: spec(1, 64), base_va: None })),
        ErrorCode::Exhausted
    );
    daemon.stop();
}

#[test]
fn channels_on_missing_gpus_or_with_gpu_producers_are_refused_clearly() {
    let daemon = Daemon::start("refusals", "[emulated]\ngpus = 2\n");
    let mut client = connect(&daemon);
    let mut bad = spec(1, 64);
    bad.consumer_gpu = 2;
    let Err(ClientError::Refused(e)) = client.call(&Request::CreateChannel { spec: bad, base_va: None }) else {
        panic!("refused")
    };
    assert_eq!(e.code, ErrorCode::Invalid);
    assert!(e.message.contains("2 GPUs"), "{e}");
    let mut gpu = spec(1, 64);
    gpu.producer = Producer::Gpu { gpu: 1, base_va: 0x1000 };
    assert_eq!(refused(client.call(&Request::CreateChannel { spec: gpu, base_va: None })), ErrorCode::Unsupported);
    assert_eq!(refused(client.call(&Request::CreateChannel { spec: spec(0, 64), base_va: None })), ErrorCode::Invalid);
    let huge = spec(5000, 64);
    assert_eq!(refused(client.call(&Request::CreateChannel { spec: huge, base_va: None })), ErrorCode::Exhausted);
    assert_eq!(stats(&mut client).pool_pages_used, 0, "failed creations keep nothing");
    daemon.stop();
}

#[test]
fn descriptors_come_only_with_attach_space_and_the_emulated_backend_has_no_spaces() {
    let mut daemon = Daemon::start("spaces", "[service]\nuvm_tools = \"/nonexistent/nvidia-uvm-tools\"\n");
    let mut client = connect(&daemon);
    let file = std::fs::File::open("/dev/null").expect("/dev/null");
    let fd = std::os::fd::AsFd::as_fd(&file);
    fn refused_passing(client: &mut Client, request: &Request, fds: &[std::os::fd::BorrowedFd<'_>]) -> ErrorCode {
        match client.call_passing(request, fds) {
            Err(ClientError::Refused(e)) => e.code,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    assert_eq!(refused_passing(&mut client, &Request::Stats {}, &[fd]), ErrorCode::Invalid, "a descriptor with stats");
    assert_eq!(
        refused_passing(&mut client, &Request::AttachSpace {}, &[]),
        ErrorCode::Invalid,
        "attach_space without one"
    );
    assert_eq!(refused_passing(&mut client, &Request::AttachSpace {}, &[fd, fd]), ErrorCode::Invalid, "two");
    let many = [fd; 200];
    assert_eq!(refused_passing(&mut client, &Request::AttachSpace {}, &many), ErrorCode::Invalid, "200");
    // No /dev/wic and no nvidia-uvm-tools: nothing to place channels in, no faults to observe.
    assert_eq!(refused_passing(&mut client, &Request::AttachSpace {}, &[fd]), ErrorCode::Unsupported);
    let placed = Request::CreateChannel { spec: spec(1, 64), base_va: Some(1 << 30) };
    assert_eq!(refused(client.call(&placed)), ErrorCode::Invalid, "base_va without an attached space");
    let watch = Request::Watch { base_va: 1 << 30, length: 4096 };
    assert_eq!(refused(client.call(&watch)), ErrorCode::Invalid, "watch without an attached space");
    // Nothing leaked into the next request, no descriptor stayed open, and the daemon serves.
    assert_eq!(create(&mut client, 1).1.len(), 4);
    assert!(daemon.alive());
    let open_fds = std::fs::read_dir(format!("/proc/{}/fd", daemon.child.id())).expect("the daemon's fds").count();
    assert!(open_fds < 64, "wicd holds {open_fds} descriptors after refusing 200");
}

#[test]
fn a_fault_ring_reaches_every_page_of_its_own_channels_runs_and_nothing_of_another_channel() {
    let daemon = Daemon::start("misdirected", "");
    let (mut owner, mut other) = (connect(&daemon), connect(&daemon));
    // 4 KiB messages: a batch of warps spans several pages per run.
    let (mine, fds) = create_with_fds(&mut owner, spec(1, 4096));
    assert!(mine.pages_per_run > 1, "{} pages per run", mine.pages_per_run);
    assert_eq!(mine.fds[..2], [FdKind::ConsumerRegion, FdKind::FaultDoorbell]);
    let (theirs, _) = create_with_fds(&mut other, spec(1, 64));
    let layout = ConsumerLayout { slots: 1, pages_per_run: mine.pages_per_run };
    let region = ConsumerRegion::open(&fds[0], layout).expect("the consumer region maps");
    // What a consumer warp does, written by hand: an entry in the ring, then the doorbell.
    let fault = |va: u64| {
        region
            .post_fault(&FaultEntry::replayable_gpc(va, AccessType::Read, 0, 0, 0, 0).encode())
            .expect("room in the ring");
        nix::unistd::write(&fds[1], &1u64.to_ne_bytes()).expect("ring the doorbell");
    };

    fault(theirs.slots[0].runs[0]);
    let after_theirs = wait_stats(&mut owner, "the misdirected entry", |s| s.faults_captured == 1);
    assert_eq!(
        (after_theirs.faults_ignored, after_theirs.faults_held),
        (1, 0),
        "another channel's page is not ours to request"
    );
    let last_page = mine.slots[0].runs[0] + u64::from(mine.pages_per_run - 1) * PAGE_SIZE;
    fault(last_page);
    let held = wait_stats(&mut owner, "the request on the run's last page", |s| s.faults_captured == 2);
    assert_eq!(
        (held.faults_ignored, held.faults_held, held.pfq_depth),
        (1, 1, 1),
        "any page of its own run is a request"
    );

    // Their slot has no request held, so its publish completes nothing; ours completes ours.
    assert!(matches!(other.call(&Request::Publish { channel: theirs.channel, slot: 0 }), Ok(Reply::Done)));
    assert!(matches!(owner.call(&Request::Publish { channel: mine.channel, slot: 0 }), Ok(Reply::Done)));
    let done = wait_stats(&mut owner, "the delivery", |s| s.faults_completed == 1);
    assert_eq!((done.faults_completed, done.pfq_depth), (1, 0));
    assert_eq!(region.page_state(layout.run_page(0, 0)).load(std::sync::atomic::Ordering::Acquire), PAGE_MAPPED);
    daemon.stop();
}

#[test]
fn a_fault_posted_but_not_yet_read_at_shutdown_gets_the_stopping_marker() {
    let daemon = Daemon::start("unread-at-stop", "");
    let mut owner = connect(&daemon);
    let (mine, fds) = create_with_fds(&mut owner, spec(1, 64));
    let layout = ConsumerLayout { slots: 1, pages_per_run: mine.pages_per_run };
    let region = ConsumerRegion::open(&fds[0], layout).expect("the consumer region maps");
    // Posted without ringing the doorbell: wicd has no reason to read it before it stops.
    let entry = FaultEntry::replayable_gpc(mine.slots[0].runs[0], AccessType::Read, 0, 0, 0, 0).encode();
    region.post_fault(&entry).expect("room in the ring");
    assert_eq!(stats(&mut owner).faults_captured, 0, "not read yet");
    // Stopped with its owner still connected: a departing owner would close the channel.
    daemon.stop();
    let page = layout.run_page(0, 0);
    assert_eq!(
        region.page_state(page).load(std::sync::atomic::Ordering::Acquire),
        PAGE_MAPPED,
        "the held warp was woken"
    );
    let mut word = [0u8; 8];
    region.read_pages(page, &mut word);
    assert_eq!(u64::from_ne_bytes(word), ErrorMarker::DaemonStopping.word(), "with the stopping marker");
}

#[test]
fn a_client_cannot_forge_the_daemon_wide_overflow_count() {
    let daemon = Daemon::start("forged-overflows", "");
    let mut owner = connect(&daemon);
    let (mine, fds) = create_with_fds(&mut owner, spec(1, 64));
    let layout = ConsumerLayout { slots: 1, pages_per_run: mine.pages_per_run };
    let region = ConsumerRegion::open(&fds[0], layout).expect("the consumer region maps");
    // A full ring: every entry posted before the doorbell rings, so the next warp is turned away.
    let entry = FaultEntry::replayable_gpc(mine.slots[0].runs[0], AccessType::Read, 0, 0, 0, 0).encode();
    for _ in 0..FAULT_RING_ENTRIES {
        region.post_fault(&entry).expect("room in the ring");
    }
    assert_eq!(region.post_fault(&entry), Err(RingFull));
    nix::unistd::write(&fds[1], &1u64.to_ne_bytes()).expect("ring the doorbell");
    let full = wait_stats(&mut owner, "the ring's entries", |s| s.faults_captured == u64::from(FAULT_RING_ENTRIES));
    assert_eq!(full.fault_buffer_overflows, 1, "wicd found the ring full once: {full:?}");
    assert_eq!(client_overflows(&mut owner, mine.channel), Some(1), "the turned-away warp's own count");

    // The ring's overflow word (u64 at 48, docs/protocol.md) is the client's to write.
    let forge = |value: u64| {
        nix::sys::uio::pwrite(&fds[0], &value.to_ne_bytes(), 48).expect("write the consumer region");
    };
    forge(u64::MAX);
    assert_eq!(stats(&mut owner).fault_buffer_overflows, 1, "a forged word is not a daemon-wide count");
    assert_eq!(client_overflows(&mut owner, mine.channel), Some(u64::MAX), "the channel's own claim, as written");
    forge(5);
    assert_eq!(client_overflows(&mut owner, mine.channel), Some(u64::MAX), "a claim never goes backwards");
    assert_eq!(stats(&mut owner).fault_buffer_overflows, 1);

    assert!(matches!(owner.call(&Request::DestroyChannel { channel: mine.channel }), Ok(Reply::Done)));
    assert_eq!(stats(&mut owner).fault_buffer_overflows, 1, "nothing of the channel's word outlives it");
    assert_eq!(client_overflows(&mut owner, mine.channel), None);
    let (next, _) = create_with_fds(&mut owner, spec(1, 64));
    assert_eq!(client_overflows(&mut owner, next.channel), Some(0), "a new channel starts with no claim");
    daemon.stop();
}

/// `channel`'s overflow count as its consumers report it, if the channel is listed.
fn client_overflows(client: &mut Client, channel: u32) -> Option<u64> {
    match client.call(&Request::Channels {}).expect("channels") {
        Reply::Channels { channels } => channels.iter().find(|c| c.channel == channel).map(|c| c.client_overflows),
        other => panic!("unexpected {other:?}"),
    }
}
