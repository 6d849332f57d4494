//! Faults injected into a real wicd on the emulated GPU, driven through libwic as applications
//! use it: the pool runs out, the daemon is killed with warps held and restarted while the
//! application still holds its channels. In each case no delivery is lost or doubled, nothing
//! stays held, the pages go back to the pool, and the caller gets a clear error where one is due.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use wic::channel::Error;
use wic::{Channel, Client};
use wic_proto::message::{ChannelSpec, ErrorCode, Producer, Reply, Request, Stats};
use wic_tests::Daemon;

/// How long a waiter may take to notice a dead daemon (libwic checks every 100 ms).
const DEATH_NOTICE: Duration = Duration::from_secs(1);

fn spec(slots: u32, message_bytes: u32) -> ChannelSpec {
    ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes, slots, timeout_ns: 0 }
}

fn connect(daemon: &Daemon) -> Client {
    Client::connect(Some(&daemon.socket)).expect("connect to wicd")
}

fn pattern(slot: u32, round: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(31).wrapping_add(slot * 7 + round * 13) as u8).collect()
}

/// Publishes then consumes one generation of every slot, checking every byte.
fn round_trip(channel: &Channel, round: u32) {
    let batch = channel.info().batch_bytes as usize;
    let mut got = vec![0u8; batch];
    for slot in 0..channel.info().slots.len() as u32 {
        channel.wait_writable(slot, Duration::from_secs(5)).expect("writable");
        channel.publish_copy(slot, &pattern(slot, round, batch)).expect("publish");
        assert_eq!(channel.consume(slot, &mut got).expect("consume"), batch);
        assert_eq!(got, pattern(slot, round, batch), "slot {slot} round {round}");
    }
}

fn wait_stats(client: &Client, what: &str, done: impl Fn(&Stats) -> bool) -> Stats {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = client.stats().expect("stats");
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {stats:?}");
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_exhausted_pool_refuses_clearly_keeps_serving_and_recovers() {
    // 4 KiB messages x 16 warps: 16 pages per run, 32 per slot, so 64 pages hold two channels.
    let daemon = Daemon::start("inject-pool", "[engine]\npool_pages = 64\n\n[limits]\nreserved_pages = 8\n");
    let client = connect(&daemon);
    let first = client.create_channel(&spec(1, 4096)).expect("first channel");
    let second = client.create_channel(&spec(1, 4096)).expect("second channel");
    let refused = client.create_channel(&spec(1, 4096)).expect_err("the pool is full");
    assert_eq!(refused.code(), ErrorCode::Exhausted, "{refused}");
    assert!(refused.to_string().contains("pages"), "the error names the pool: {refused}");
    let stats = client.stats().unwrap();
    assert_eq!((stats.channels, stats.pool_pages_used), (2, 64), "a refused channel keeps nothing");

    round_trip(&first, 0);
    round_trip(&second, 0);
    second.close().expect("close");
    let third = client.create_channel(&spec(1, 4096)).expect("pages freed by a close are reused");
    round_trip(&third, 1);
    round_trip(&first, 1);
    first.close().unwrap();
    third.close().unwrap();
    let stats = client.stats().unwrap();
    assert_eq!((stats.channels, stats.pool_pages_used, stats.pfq_depth), (0, 0, 0));
    assert_eq!(
        stats.faults_completed, 4,
        "one delivery per generation consumed: two rounds on the first channel, one on the others"
    );
    daemon.stop();
}

#[test]
fn a_killed_daemon_wakes_every_held_warp_and_a_restarted_one_serves_fresh_channels() {
    let mut daemon = Daemon::start("inject-restart", "[limits]\ndefault_timeout_ms = 60000\n");
    let client = connect(&daemon);
    let slots = 4;
    let channel = Arc::new(client.create_channel(&spec(slots, 256)).expect("channel"));
    round_trip(&channel, 0);

    // One consumer per slot, each held in the daemon: nothing is published.
    let consumers: Vec<_> = (0..slots)
        .map(|slot| {
            let channel = Arc::clone(&channel);
            thread::spawn(move || {
                let mut got = vec![0u8; channel.info().batch_bytes as usize];
                let result = channel.consume(slot, &mut got);
                (result, Instant::now())
            })
        })
        .collect();
    let watcher = connect(&daemon);
    wait_stats(&watcher, "every consumer to be held", |s| s.pfq_depth == slots);
    daemon.signal(nix::sys::signal::Signal::SIGKILL);
    let killed = Instant::now();
    for consumer in consumers {
        let (result, woke) = consumer.join().expect("consumer thread");
        assert!(matches!(result, Err(Error::DaemonGone)), "a held consumer got {result:?}");
        assert!(woke.duration_since(killed) < DEATH_NOTICE, "woken {:?} after the kill", woke.duration_since(killed));
    }
    let after = client.stats();
    assert!(matches!(after, Err(ref e) if e.code() == ErrorCode::Connect), "a request to a dead daemon: {after:?}");
    assert!(matches!(channel.wait_writable(0, Duration::from_secs(5)), Ok(()) | Err(Error::DaemonGone)));

    // The service manager restarts it: the socket is taken over, nothing of the old daemon's
    // channels survives, and a reconnecting application is served from an empty pool.
    daemon.respawn();
    let client = connect(&daemon);
    let stats = client.stats().unwrap();
    assert_eq!((stats.channels, stats.pool_pages_used, stats.pfq_depth, stats.clients), (0, 0, 0, 1));
    let fresh = client.create_channel(&spec(slots, 256)).expect("a channel on the new daemon");
    for round in 0..3 {
        round_trip(&fresh, round);
    }
    let stats = client.stats().unwrap();
    assert_eq!(stats.faults_completed, 3 * u64::from(slots));
    drop(channel);
    drop(fresh);
    daemon.stop();
}

#[test]
fn a_full_fault_ring_drops_faults_that_come_again_after_a_replay_and_none_is_lost() {
    let daemon = Daemon::start("inject-ring-full", "[limits]\ndefault_timeout_ms = 60000\n");
    let client = connect(&daemon);
    // More slots than the channel's fault ring has entries, one consumer warp batch each.
    let slots = wic_proto::shm::FAULT_RING_ENTRIES + 44;
    let channel = Arc::new(client.create_channel(&spec(slots, 64)).expect("channel"));
    let batch = channel.info().batch_bytes as usize;

    // With wicd stopped nothing drains the ring: the first 256 faults fill it, the rest find
    // it full and are dropped, as a GPU's fault buffer drops them, until a replay.
    daemon.signal(nix::sys::signal::Signal::SIGSTOP);
    wait_stopped(daemon.child.id());
    let consumers: Vec<_> = (0..slots)
        .map(|slot| {
            let channel = Arc::clone(&channel);
            thread::spawn(move || {
                let mut got = vec![0u8; batch];
                channel.consume(slot, &mut got).map(|_| got)
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    daemon.signal(nix::sys::signal::Signal::SIGCONT);
    for slot in 0..slots {
        channel.publish_copy(slot, &pattern(slot, 0, batch)).expect("publish");
    }
    for (slot, consumer) in consumers.into_iter().enumerate() {
        let got = consumer.join().expect("consumer thread").expect("consume");
        assert_eq!(got, pattern(slot as u32, 0, batch), "slot {slot}");
    }
    let stats = client.stats().unwrap();
    // wicd counts a full ring once per whole ring's worth of entries it read, never more.
    let rings = stats.faults_captured / u64::from(wic_proto::shm::FAULT_RING_ENTRIES);
    assert!((1..=rings).contains(&stats.fault_buffer_overflows), "wicd found the ring full: {stats:?}");
    // Each warp turned away counted itself, in the channel's own figure.
    let mut lister = wic_proto::client::Client::connect(&daemon.socket, "test").expect("connect to wicd");
    let listed = match lister.call(&Request::Channels {}).expect("channels") {
        Reply::Channels { channels } => channels,
        other => panic!("unexpected {other:?}"),
    };
    let ring = listed.iter().find(|c| c.channel == channel.info().channel).expect("the channel is listed");
    assert!(ring.client_overflows >= 44, "at least the faults past the ring were dropped: {ring:?}");
    assert_eq!(stats.faults_completed, u64::from(slots), "each slot delivered once");
    assert_eq!((stats.pfq_depth, stats.faults_timed_out), (0, 0));
    drop(channel);
    daemon.stop();
}

/// Waits until every thread of `pid` is stopped: a signalled stop takes effect thread by
/// thread, and a fast path still running would drain faults meant to find the ring full.
fn wait_stopped(pid: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("wicd's threads");
        let stopped = tasks.flatten().all(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // The state follows the parenthesised command name.
            stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
        });
        if stopped {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "wicd did not stop within 5 s");
        thread::sleep(Duration::from_millis(5));
    }
}
