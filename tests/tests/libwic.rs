//! libwic's Rust API and C ABI against a real wicd on the emulated GPU: publishing, consuming,
//! roles, error markers and a daemon that dies, each through the daemon's own service code.

use std::ffi::{c_char, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::ptr::{null, null_mut};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use wic::abi::*;
use wic::capi::*;
use wic::client::spec_from_abi;
use wic::{ChannelSpec, Client, ErrorCode, Producer, Role};
use wic_tests::Daemon;

/// Faults wait this long for their data: far longer than any test, so a timeout never comes by
/// accident.
const PATIENT: &str = "[limits]\ndefault_timeout_ms = 60000\n";

/// The test pattern: byte `i` of slot `slot`, generation `generation`.
fn pattern(slot: u32, generation: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(slot * 7).wrapping_add(generation.wrapping_mul(13)) as u8)
        .collect()
}

fn spec(message_bytes: u32, slots: u32) -> ChannelSpec {
    spec_from_abi(&WicChannelSpec { message_bytes, slots, ..WicChannelSpec::default() }).unwrap()
}

/// Waits until the daemon holds `held` faults.
fn wait_held(client: &Client, held: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.stats().unwrap().pfq_depth != held {
        assert!(Instant::now() < deadline, "the daemon never held {held} faults");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn owner_publishes_and_consumes_every_generation_in_order() {
    let daemon = Daemon::start("libwic-order", PATIENT);
    let client = Client::connect(Some(&daemon.socket)).unwrap();
    let ch = client.create_channel(&spec(100, 3)).unwrap();
    let batch = ch.info().batch_bytes as usize;
    let mut got = vec![0u8; batch];
    for generation in 0..5u32 {
        for slot in 0..3 {
            ch.wait_writable(slot, Duration::from_secs(5)).unwrap();
            ch.publish_copy(slot, &pattern(slot, generation, batch)).unwrap();
        }
        for slot in 0..3 {
            assert_eq!(ch.consume(slot, &mut got).unwrap(), batch);
            assert_eq!(got, pattern(slot, generation, batch), "slot {slot} generation {generation}");
        }
    }
    ch.close().unwrap();
    daemon.stop();
}

#[test]
fn producer_and_consumer_threads_hand_over_through_the_daemon() {
    let daemon = Daemon::start("libwic-threads", PATIENT);
    let owner = Client::connect(Some(&daemon.socket)).unwrap();
    let ch = owner.create_channel(&spec(64, 2)).unwrap();
    let token = ch.grant(Role::Producer, None).unwrap();
    let path = daemon.socket.clone();
    let producer = thread::spawn(move || {
        let client = Client::connect(Some(&path)).unwrap();
        let ch = client.attach(&token).unwrap();
        let batch = ch.info().batch_bytes as usize;
        for generation in 0..20 {
            for slot in 0..2 {
                ch.wait_writable(slot, Duration::from_secs(5)).unwrap();
                let buf = ch.slot_buffer(slot).unwrap();
                let data = pattern(slot, generation, batch);
                // SAFETY: the slot is writable (delivered == published), so the daemon does
                // not read the buffer, which holds batch_bytes bytes.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf, batch) };
                ch.publish(slot).unwrap();
            }
        }
        ch.close().unwrap();
    });
    let batch = ch.info().batch_bytes as usize;
    let mut got = vec![0u8; batch];
    for generation in 0..20 {
        for slot in 0..2 {
            ch.consume(slot, &mut got).unwrap();
            assert_eq!(got, pattern(slot, generation, batch));
        }
    }
    producer.join().unwrap();
    ch.close().unwrap();
    daemon.stop();
}

#[test]
fn publishing_twice_without_delivery_is_busy_and_waiting_times_out() {
    let daemon = Daemon::start("libwic-busy", PATIENT);
    let client = Client::connect(Some(&daemon.socket)).unwrap();
    let ch = client.create_channel(&spec(16, 1)).unwrap();
    ch.publish_copy(0, b"first").unwrap();
    assert_eq!(ch.publish_copy(0, b"second").unwrap_err().code(), ErrorCode::Busy);
    assert_eq!(ch.publish(0).unwrap_err().code(), ErrorCode::Busy);
    let start = Instant::now();
    let err = ch.wait_writable(0, Duration::from_millis(50)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::TimedOut);
    assert!(start.elapsed() >= Duration::from_millis(50));
    assert_eq!(ch.wait_writable(0, Duration::ZERO).unwrap_err().code(), ErrorCode::TimedOut);
    let mut got = [0u8; 5];
    assert_eq!(ch.consume(0, &mut got).unwrap(), 5);
    assert_eq!(&got, b"first", "the refused copy did not overwrite the buffer");
    ch.wait_writable(0, Duration::ZERO).unwrap();
    daemon.stop();
}

#[test]
fn arguments_and_roles_are_checked() {
    let daemon = Daemon::start("libwic-roles", PATIENT);
    let client = Client::connect(Some(&daemon.socket)).unwrap();
    let ch = client.create_channel(&spec(16, 2)).unwrap();
    let batch = ch.info().batch_bytes as usize;
    assert_eq!(ch.publish(2).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(ch.abi_slot(2).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(ch.consume(7, &mut []).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(ch.publish_copy(0, &vec![0; batch + 1]).unwrap_err().code(), ErrorCode::Invalid);
    assert_eq!(ch.grant(Role::Owner, None).unwrap_err().code(), ErrorCode::Invalid);

    // The owner's connection holds every role already: the others attach through their own.
    let other = Client::connect(Some(&daemon.socket)).unwrap();
    assert_eq!(client.attach(&ch.grant(Role::Consumer, None).unwrap()).unwrap_err().code(), ErrorCode::Invalid);
    let consumer = other.attach(&ch.grant(Role::Consumer, None).unwrap()).unwrap();
    assert_eq!(consumer.publish(0).unwrap_err().code(), ErrorCode::Permission);
    assert_eq!(consumer.slot_buffer(0).unwrap_err().code(), ErrorCode::Permission);
    assert_eq!(consumer.wait_writable(0, Duration::ZERO).unwrap_err().code(), ErrorCode::Permission);
    let producer = other.attach(&ch.grant(Role::Producer, None).unwrap()).unwrap();
    assert_eq!(producer.consume(0, &mut []).unwrap_err().code(), ErrorCode::Permission);
    assert_eq!(producer.grant(Role::Consumer, None).unwrap_err().code(), ErrorCode::Permission);
    assert_eq!(ch.abi_slot(0).unwrap().pat_va, [0, 0], "a host producer has no PAT pages");
    assert_eq!(ch.abi_info().role, WIC_ROLE_OWNER);
    assert_eq!(consumer.abi_info().role, WIC_ROLE_CONSUMER);

    // GPU producers are the shim's (their handles: the VM test); the emulated backend says so.
    let gpu = Producer::Gpu { gpu: 1, base_va: 0x10000 };
    let refused = client.create_channel(&ChannelSpec { producer: gpu, ..spec(16, 1) }).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Unsupported, "{refused}");
    daemon.stop();
}

#[test]
fn a_timeout_uses_up_the_generation_and_a_stopping_daemon_wakes_its_consumers() {
    let daemon = Daemon::start("libwic-markers", PATIENT);
    let client = Client::connect(Some(&daemon.socket)).unwrap();
    let hasty = client.create_channel(&ChannelSpec { timeout_ns: 50_000_000, ..spec(16, 1) }).unwrap();
    let mut got = [0u8; 16];
    assert_eq!(hasty.consume(0, &mut got).unwrap_err().code(), ErrorCode::TimedOut);
    hasty.publish_copy(0, b"generation one").unwrap();
    assert_eq!(hasty.consume(0, &mut got).unwrap(), 16, "the timed-out generation is not delivered again");
    assert_eq!(&got[..14], b"generation one");

    let patient = Arc::new(client.create_channel(&spec(16, 1)).unwrap());
    let consuming = {
        let patient = Arc::clone(&patient);
        thread::spawn(move || patient.consume(0, &mut [0u8; 16]).map(|_| ()))
    };
    wait_held(&client, 1);
    daemon.stop();
    assert_eq!(consuming.join().unwrap().unwrap_err().code(), ErrorCode::Stopping);
}

/// Writes `bytes` into `run` as the batch, the head bytes into its head words.
fn write_run(run: &wic::Run<'_>, bytes: &[u8]) {
    // SAFETY: the run was just lent by acquire_run and is not yet published; the bytes are one
    // batch.
    unsafe { run.write(0, bytes) };
}

#[test]
fn a_producer_writes_runs_in_place_and_its_consumers_read_them() {
    let daemon = Daemon::start("libwic-in-place", PATIENT);
    let client = Client::connect(Some(&daemon.socket)).unwrap();
    // Two pages a run: the second page's head is a head word too.
    let ch = client.create_channel(&spec(512, 2)).unwrap();
    let batch = ch.info().batch_bytes as usize;
    assert!(batch > 4096, "a run of more than one page");
    let mut got = vec![0u8; batch];
    for generation in 0..4u32 {
        for slot in 0..2 {
            let run = ch.acquire_run(slot, Duration::from_secs(5)).unwrap();
            assert_eq!(u32::from(run.side), generation % 2, "generation {generation} reads run {}", generation % 2);
            write_run(&run, &pattern(slot, generation, batch));
            ch.publish_run(&run).unwrap();
            assert_eq!(ch.publish_run(&run).unwrap_err().code(), ErrorCode::Busy);
        }
        for slot in 0..2 {
            assert_eq!(ch.consume(slot, &mut got).unwrap(), batch);
            assert_eq!(got, pattern(slot, generation, batch), "slot {slot} generation {generation}");
        }
    }
    // Buffer and in-place publishes mix on one slot.
    ch.wait_writable(0, Duration::from_secs(5)).unwrap();
    ch.publish_copy(0, &pattern(0, 9, batch)).unwrap();
    ch.consume(0, &mut got).unwrap();
    assert_eq!(got, pattern(0, 9, batch));
    let run = ch.acquire_run(0, Duration::from_secs(5)).unwrap();
    assert_eq!(run.side, 1, "the buffer publish used run 0");
    write_run(&run, &pattern(0, 10, batch));
    ch.publish_run(&run).unwrap();
    ch.consume(0, &mut got).unwrap();
    assert_eq!(got, pattern(0, 10, batch));

    let stats = client.stats().unwrap();
    assert_eq!(stats.host_publishes, 4 * 2 + 2);

    // Handles that cannot reach the pages are told so.
    let other = Client::connect(Some(&daemon.socket)).unwrap();
    let producer = other.attach(&ch.grant(Role::Producer, None).unwrap()).unwrap();
    ch.publish_copy(1, &pattern(1, 11, batch)).unwrap();
    let refused = producer.acquire_run(1, Duration::from_millis(50));
    assert_eq!(refused.unwrap_err().code(), ErrorCode::Unsupported, "at once, though the slot is busy");
    ch.consume(1, &mut got).unwrap();
    daemon.stop();
}

#[test]
fn an_in_place_publish_that_misses_its_generation_is_reported_and_never_read() {
    let daemon = Daemon::start("libwic-in-place-missed", PATIENT);
    let client = Client::connect(Some(&daemon.socket)).unwrap();
    let ch = client.create_channel(&ChannelSpec { timeout_ns: 50_000_000, ..spec(512, 1) }).unwrap();
    let batch = ch.info().batch_bytes as usize;
    let mut got = vec![0u8; batch];

    // The producer is still writing when generation 0 times out: its consumer reads the
    // marker, though the producer's bytes (all but the heads) are already in the run.
    let late = ch.acquire_run(0, Duration::from_secs(5)).unwrap();
    write_run(&late, &pattern(0, 0, batch));
    assert_eq!(ch.consume(0, &mut got).unwrap_err().code(), ErrorCode::TimedOut);
    // The producer, not knowing, finishes and publishes run 0: generation 1 reads run 1.
    write_run(&late, &pattern(0, 1, batch));
    ch.publish_run(&late).unwrap();
    assert_eq!(ch.wait_writable(0, Duration::from_secs(5)).unwrap_err().code(), ErrorCode::Stale);
    ch.wait_writable(0, Duration::ZERO).unwrap();

    // The next run is the other one; published in time, it is what generation 1 reads.
    let run = ch.acquire_run(0, Duration::from_secs(5)).unwrap();
    assert_eq!((late.side, run.side), (0, 1));
    write_run(&run, &pattern(0, 2, batch));
    ch.publish_run(&run).unwrap();
    assert_eq!(ch.consume(0, &mut got).unwrap(), batch);
    assert_eq!(got, pattern(0, 2, batch));
    ch.wait_writable(0, Duration::from_secs(5)).unwrap();

    // A miss found by acquire_run itself: generation 2 times out with nothing published,
    // then the run acquired before it ended is published too late.
    let stale = ch.acquire_run(0, Duration::from_secs(5)).unwrap();
    assert_eq!(ch.consume(0, &mut got).unwrap_err().code(), ErrorCode::TimedOut);
    write_run(&stale, &pattern(0, 3, batch));
    ch.publish_run(&stale).unwrap();
    assert_eq!(ch.acquire_run(0, Duration::from_secs(5)).unwrap_err().code(), ErrorCode::Stale);
    let run = ch.acquire_run(0, Duration::from_secs(5)).unwrap();
    assert_ne!(run.side, stale.side);
    write_run(&run, &pattern(0, 4, batch));
    ch.publish_run(&run).unwrap();
    assert_eq!(ch.consume(0, &mut got).unwrap(), batch);
    assert_eq!(got, pattern(0, 4, batch));

    // The misses were the owner's: a producer handle that never wrote in place hears of none.
    let other = Client::connect(Some(&daemon.socket)).unwrap();
    let producer = other.attach(&ch.grant(Role::Producer, None).unwrap()).unwrap();
    producer.wait_writable(0, Duration::from_secs(5)).unwrap();
    ch.wait_writable(0, Duration::from_secs(5)).unwrap();
    daemon.stop();
}

#[test]
fn closing_the_channel_wakes_consumers_and_producers() {
    let daemon = Daemon::start("libwic-close", PATIENT);
    let owner = Client::connect(Some(&daemon.socket)).unwrap();
    let ch = owner.create_channel(&spec(16, 2)).unwrap();
    let other = Client::connect(Some(&daemon.socket)).unwrap();
    let consumer = Arc::new(other.attach(&ch.grant(Role::Consumer, None).unwrap()).unwrap());
    let producer = Arc::new(other.attach(&ch.grant(Role::Producer, None).unwrap()).unwrap());
    // The consumer waits for slot 0, which nobody publishes; slot 1 is published, and its
    // producer waits for a delivery that no consumer asks for.
    let consuming = {
        let consumer = Arc::clone(&consumer);
        thread::spawn(move || consumer.consume(0, &mut [0u8; 16]).map(|_| ()))
    };
    producer.publish_copy(1, b"x").unwrap();
    let waiting = {
        let producer = Arc::clone(&producer);
        thread::spawn(move || producer.wait_writable(1, Duration::from_secs(10)))
    };
    wait_held(&owner, 1);
    let start = Instant::now();
    ch.close().unwrap();
    assert_eq!(consuming.join().unwrap().unwrap_err().code(), ErrorCode::Closed);
    assert_eq!(waiting.join().unwrap().unwrap_err().code(), ErrorCode::Closed);
    assert!(start.elapsed() < Duration::from_secs(1), "woken, not timed out");
    assert_eq!(consumer.consume(0, &mut [0u8; 16]).unwrap_err().code(), ErrorCode::Closed);
    assert_eq!(producer.publish(0).unwrap_err().code(), ErrorCode::Closed);
    daemon.stop();
}

#[test]
fn a_dead_daemon_is_noticed_by_waiters() {
    let daemon = Daemon::start("libwic-dead", PATIENT);
    let client = Client::connect(Some(&daemon.socket)).unwrap();
    let ch = client.create_channel(&spec(16, 2)).unwrap();
    // Published, and never delivered: no consumer asks for slot 0.
    ch.publish_copy(0, b"x").unwrap();
    let killer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(50));
        // SIGKILL: a dead daemon cleans nothing up, so only the hang-up tells.
        daemon.signal(Signal::SIGKILL);
        daemon
    });
    let start = Instant::now();
    assert_eq!(ch.wait_writable(0, Duration::from_secs(10)).unwrap_err().code(), ErrorCode::Connect);
    assert_eq!(ch.consume(1, &mut [0u8; 16]).unwrap_err().code(), ErrorCode::Connect);
    assert!(start.elapsed() < Duration::from_secs(5));
    drop(killer.join().unwrap());
}

#[test]
fn a_session_creates_attaches_and_reports_stats() {
    let daemon = Daemon::start("libwic-session", PATIENT);
    let host = WicChannelSpec { message_bytes: 64, slots: 2, ..WicChannelSpec::default() };
    let owner = Client::connect(Some(&daemon.socket)).unwrap();
    assert_eq!(owner.daemon().backend, "emulated");
    let channel = owner.create_channel(&spec_from_abi(&host).unwrap()).unwrap();
    assert_eq!(channel.role(), Role::Owner);
    let token = channel.grant(Role::Producer, None).unwrap();
    let producer = Client::connect(Some(&daemon.socket)).unwrap();
    let attached = producer.attach(&token).unwrap();
    assert_eq!(attached.role(), Role::Producer);
    assert_eq!(attached.id(), channel.id());
    assert_eq!(producer.attach("0123").unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(owner.stats().unwrap().channels, 1);
    attached.close().unwrap();
    channel.close().unwrap();
    assert_eq!(owner.stats().unwrap().channels, 0);

    // Channels outlive the client they were created through: they keep its connection.
    let channel = owner.create_channel(&spec_from_abi(&host).unwrap()).unwrap();
    drop(owner);
    assert!(channel.grant(Role::Consumer, Some(1000)).is_ok(), "the connection is still open");
    channel.close().unwrap();
    daemon.stop();
}

#[test]
fn the_whole_c_api_round_trips_through_the_daemon() {
    let daemon = Daemon::start("libwic-capi", PATIENT);
    let path = CString::new(daemon.socket.as_os_str().as_bytes()).unwrap();
    // SAFETY: every pointer passed is a live local or a handle the library returned.
    unsafe {
        let mut client = null_mut();
        assert_eq!(wic_connect(path.as_ptr(), &mut client), WIC_OK);
        let bad = WicChannelSpec { message_bytes: 64, slots: 2, reserved: 1, ..WicChannelSpec::default() };
        let mut ch = null_mut();
        assert_eq!(wic_channel_create(client, &bad, &mut ch), WIC_EINVALID);
        let bad = WicChannelSpec { producer_kind: 7, ..bad };
        assert_eq!(wic_channel_create(client, &bad, &mut ch), WIC_EINVALID);
        let spec = WicChannelSpec { message_bytes: 64, slots: 2, ..WicChannelSpec::default() };
        let mut bytes = 0;
        assert_eq!(wic_placement_bytes(client, &spec, &mut bytes), WIC_OK);
        assert_eq!(bytes, 2 * 2 * 4096, "two one-page runs per slot");
        let huge = WicChannelSpec { message_bytes: u32::MAX, slots: u32::MAX, ..spec };
        assert_eq!(wic_placement_bytes(client, &huge, &mut bytes), WIC_EINVALID, "past 64 bits");
        assert_eq!(wic_placement_bytes(client, &WicChannelSpec { slots: 0, ..spec }, &mut bytes), WIC_EINVALID);
        assert_eq!(wic_channel_create(client, &spec, &mut ch), WIC_OK);

        let mut info = WicChannelInfo::default();
        assert_eq!(wic_channel_info(ch, &mut info), WIC_OK);
        assert_eq!((info.role, info.slots, info.message_bytes), (WIC_ROLE_OWNER, 2, 64));
        assert_eq!(info.batch_bytes, u64::from(info.warps_per_batch) * 64);
        let mut slot = WicSlotInfo::default();
        assert_eq!(wic_channel_slot(ch, 1, &mut slot), WIC_OK);
        assert_ne!(slot.run_va[0], slot.run_va[1]);
        assert_eq!(slot.pat_va, [0, 0]);
        assert_eq!(wic_channel_slot(ch, 2, &mut slot), WIC_ENOT_FOUND);

        let mut token = [0 as c_char; WIC_TOKEN_LEN];
        assert_eq!(wic_channel_grant(ch, WIC_ROLE_OWNER as i32, -1, token.as_mut_ptr()), WIC_EINVALID);
        assert_eq!(wic_channel_grant(ch, 9, -1, token.as_mut_ptr()), WIC_EINVALID);
        assert_eq!(wic_channel_grant(ch, WIC_ROLE_PRODUCER as i32, -2, token.as_mut_ptr()), WIC_EINVALID);
        assert_eq!(wic_channel_grant(ch, WIC_ROLE_PRODUCER as i32, -1, token.as_mut_ptr()), WIC_OK);
        assert_eq!(CStr::from_ptr(token.as_ptr()).to_bytes().len(), 32);

        // Through a connection of its own: the owner's holds every role already.
        let mut other = null_mut();
        assert_eq!(wic_connect(path.as_ptr(), &mut other), WIC_OK);
        let mut producer = null_mut();
        assert_eq!(wic_channel_attach(client, token.as_ptr(), &mut producer), WIC_EINVALID);
        assert!(producer.is_null());
        assert_eq!(wic_channel_attach(other, token.as_ptr(), &mut producer), WIC_OK);
        let mut none = null_mut();
        assert_eq!(wic_channel_attach(other, c"nope".as_ptr(), &mut none), WIC_ENOT_FOUND);
        assert!(none.is_null());
        let batch = info.batch_bytes as usize;
        for generation in 0..3 {
            for s in 0..2 {
                assert_eq!(wic_wait_writable(producer, s, 5_000_000_000), WIC_OK);
                let buf = wic_slot_buffer(producer, s).cast::<u8>();
                assert!(!buf.is_null());
                let data = pattern(s, generation, batch);
                std::ptr::copy_nonoverlapping(data.as_ptr(), buf, batch);
                assert_eq!(wic_publish(producer, s), WIC_OK);
                assert_eq!(wic_publish(producer, s), WIC_EBUSY);
            }
            for s in 0..2 {
                let mut got = vec![0u8; batch + 10];
                assert_eq!(wic_consume(ch, s, got.as_mut_ptr().cast(), got.len()), WIC_OK);
                assert_eq!(got[..batch], pattern(s, generation, batch)[..]);
                assert!(got[batch..].iter().all(|b| *b == 0));
            }
        }
        assert_eq!(wic_consume(producer, 0, null_mut(), 0), WIC_EPERMISSION);
        assert_eq!(wic_consume(ch, 0, null_mut(), 1), WIC_EINVALID);
        assert_eq!(wic_publish_copy(producer, 0, null(), 1), WIC_EINVALID);
        let big = vec![0u8; batch + 1];
        assert_eq!(wic_publish_copy(producer, 0, big.as_ptr().cast(), big.len()), WIC_EINVALID);
        assert_eq!(wic_publish_copy(producer, 0, big.as_ptr().cast(), batch), WIC_OK);

        // In place, through the owner's handle, which holds the consumer region too; the
        // granted producer's handle cannot reach the pages.
        let mut run = WicRun::default();
        assert_eq!(wic_run_acquire(producer, 1, 0, &mut run), WIC_EUNSUPPORTED);
        assert_eq!(wic_run_acquire(ch, 1, 5_000_000_000, null_mut()), WIC_EINVALID);
        assert_eq!(wic_run_acquire(ch, 1, 5_000_000_000, &mut run), WIC_OK);
        assert_eq!((run.batch_bytes, run.pages, run.side), (info.batch_bytes, info.pages_per_run, 1));
        let data = pattern(1, 3, batch);
        assert_eq!(wic_run_write(&run, 0, data.as_ptr().cast(), batch), WIC_OK);
        assert_eq!(wic_run_write(&run, 1, data.as_ptr().cast(), batch), WIC_EINVALID, "past the batch");
        assert_eq!(wic_run_write(null(), 0, data.as_ptr().cast(), 1), WIC_EINVALID);
        assert_eq!(wic_run_publish(ch, 1, &WicRun { batch_bytes: 1, ..run }), WIC_EINVALID);
        assert_eq!(wic_run_publish(ch, 0, &run), WIC_EINVALID, "a run lent for slot 1");
        assert_eq!(wic_run_publish(ch, 1, &WicRun { reserved: 1, ..run }), WIC_EINVALID);
        assert_eq!(wic_run_publish(ch, 1, &run), WIC_OK);
        assert_eq!(wic_run_publish(ch, 1, &run), WIC_EBUSY);
        let mut got = vec![0u8; batch];
        assert_eq!(wic_consume(ch, 1, got.as_mut_ptr().cast(), batch), WIC_OK);
        assert_eq!(got, data);
        assert_eq!(wic_wait_writable(ch, 1, 5_000_000_000), WIC_OK);

        let mut stats = WicStats::default();
        assert_eq!(wic_stats(client, &mut stats), WIC_OK);
        assert_eq!(stats.channels, 1);
        wic_disconnect(client);
        wic_disconnect(other);
        assert_eq!(wic_channel_close(producer), WIC_OK);
        assert_eq!(wic_channel_close(ch), WIC_OK);
    }
    daemon.stop();
}
