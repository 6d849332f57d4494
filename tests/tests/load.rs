//! The load bench against a real wicd: 128 clients with 4 channels each keep every message
//! exactly once, get everything reclaimed and stay within the memory, descriptor and latency
//! bounds; a broken bound fails the run and is named. And channels churned on many connections
//! at once, whose ids wicd hands out again as soon as they are free, each keep their record
//! until their owner destroys them. And wicd lifts a low inherited descriptor limit.

use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use serde_json::{json, Value};
use wic_proto::client::Client;
use wic_proto::message::{ChannelSpec, Producer, Reply, Request, Role};

const CLIENTS: u64 = 128;
const CHANNELS: u64 = 4;
const ROUNDS: u64 = 3;
const MESSAGES: u64 = 8;
const ABORT_EVERY: u64 = 8;
/// Generous: a debug build of wicd on two cores, with the other tests running beside it.
const CONTROL_P99_MS: u64 = 1000;
const RSS_GROWTH_KIB: u64 = 4096;

fn wic_load(args: &[&str]) -> (Output, String, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_wic-load"))
        .arg("--wicd")
        .arg(wic_tests::binary("wicd"))
        .args(args)
        .output()
        .expect("run wic-load");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or(Value::Null);
    (out, stdout, summary)
}

fn number(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{v} is not a count"))
}

#[test]
fn many_clients_with_several_channels_each_stay_bounded_and_lose_nothing() {
    let (clients, channels, rounds, messages, abort_every) =
        (CLIENTS.to_string(), CHANNELS.to_string(), ROUNDS.to_string(), MESSAGES.to_string(), ABORT_EVERY.to_string());
    let (p99, growth) = (CONTROL_P99_MS.to_string(), RSS_GROWTH_KIB.to_string());
    let (out, stdout, s) = wic_load(&[
        "--clients",
        &clients,
        "--channels",
        &channels,
        "--rounds",
        &rounds,
        "--messages",
        &messages,
        "--abort-every",
        &abort_every,
        "--max-control-p99-ms",
        &p99,
        "--max-rss-growth-kib",
        &growth,
    ]);
    let context = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "wic-load failed:\n{context}");
    for named in
        ["p99", "delivery", "control", "wicd RSS KiB", "wicd descriptors", "a connection past max_clients is refused"]
    {
        assert!(stdout.contains(named), "the summary does not name {named}:\n{stdout}");
    }

    // The verdict is not taken on trust: the numbers are checked again here.
    assert_eq!(s["broken"], json!([]), "{context}");
    assert_eq!(number(&s["failures"]), 0, "{context}");
    let aborts = CLIENTS / ABORT_EVERY * ROUNDS;
    let due = (CLIENTS * ROUNDS - aborts) * CHANNELS * MESSAGES + aborts * CHANNELS * (MESSAGES / 2);
    assert_eq!((number(&s["consumed"]), number(&s["consumed_due"])), (due, due), "{context}");
    assert_eq!((number(&s["aborts"]), number(&s["closed_as_expected"])), (aborts, aborts), "{context}");
    let counters = &s["daemon_counters"];
    assert_eq!(number(&counters["faults_completed"]), due, "wicd delivered each message once: {context}");
    assert_eq!(number(&counters["faults_timed_out"]), 0, "{context}");

    let end = &s["daemon_end"];
    assert_eq!(
        (number(&end["clients"]), number(&end["channels"]), number(&end["held"]), number(&end["pfq_depth"])),
        (1, 0, 0, 0),
        "{context}"
    );
    assert_eq!(number(&end["engine_channels"]), 0, "{context}");
    assert_eq!(number(&end["pool_pages_used"]), 0, "{context}");
    assert_eq!(end["pool_longest_free_run"], end["pool_pages"], "the pool is whole again: {context}");
    assert_eq!(s["fds"]["end"], s["fds"]["baseline"], "{context}");
    assert!(
        number(&s["fds"]["peak"]) > number(&s["fds"]["baseline"]) + 2 * CLIENTS,
        "the peak saw every connection: {context}"
    );
    let rss = &s["rss_kib"];
    let growth = number(&rss["after_last_round"]).saturating_sub(number(&rss["after_first_round"]));
    assert!(growth <= RSS_GROWTH_KIB, "RSS grew {growth} KiB from round 1 to the last: {context}");

    let latency = &s["latency"];
    for kind in ["connect", "create", "grant", "attach", "stats", "destroy"] {
        assert!(number(&latency[kind]["count"]) > 0, "no {kind} measured: {context}");
    }
    assert_eq!(number(&latency["delivery"]["count"]), due, "{context}");
    assert_eq!(number(&latency["create"]["count"]), CLIENTS * ROUNDS * CHANNELS, "{context}");
    let control_p99 = latency["control"]["p99_ms"].as_f64().expect("a p99");
    assert!(control_p99 > 0.0 && control_p99 <= CONTROL_P99_MS as f64, "control p99 {control_p99} ms: {context}");
}

#[test]
fn a_broken_bound_fails_the_run_and_names_it() {
    let (out, stdout, s) = wic_load(&[
        "--clients",
        "4",
        "--channels",
        "1",
        "--rounds",
        "2",
        "--messages",
        "4",
        "--max-control-p99-ms",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FAIL control p99 within bound"), "{stdout}");
    assert_eq!(s["broken"], json!(["control p99 within bound"]), "only that bound is broken:\n{stdout}");
}

#[test]
fn bad_options_are_refused() {
    let (out, _, _) = wic_load(&["--clients", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--clients"));
}

/// Channel ids are reused as soon as a channel is destroyed, and the control plane serves many
/// connections at once: a destroy and a create on other connections racing for one id must
/// each leave the other's channel alone.
#[test]
fn channels_churned_on_many_connections_are_each_destroyed_once() {
    const CONNECTIONS: usize = 32;
    const CYCLES: usize = 200;
    let daemon = wic_tests::Daemon::start("churn", "");
    let spec = ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes: 64, slots: 1, timeout_ns: 0 };
    let lost: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..CONNECTIONS)
            .map(|_| {
                scope.spawn(|| {
                    let mut client = Client::connect(&daemon.socket, "churn").expect("connect");
                    let mut lost = Vec::new();
                    for _ in 0..CYCLES {
                        let channel = match client.call(&Request::CreateChannel { spec, base_va: None }) {
                            Ok(Reply::Channel(info)) => info.channel,
                            other => panic!("create: {other:?}"),
                        };
                        if let Err(e) = client.call(&Request::Grant { channel, role: Role::Consumer, uid: None }) {
                            lost.push(format!("grant on own channel {channel}: {e}"));
                        }
                        if let Err(e) = client.call(&Request::DestroyChannel { channel }) {
                            lost.push(format!("destroying own channel {channel}: {e}"));
                        }
                    }
                    lost
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("worker")).collect()
    });
    let mut monitor = Client::connect(&daemon.socket, "monitor").expect("connect");
    let Ok(Reply::Stats(stats)) = monitor.call(&Request::Stats {}) else { panic!("no stats") };
    assert!(
        lost.is_empty(),
        "{} of {} channels lost their record, first: {}",
        lost.len(),
        CONNECTIONS * CYCLES,
        lost[0]
    );
    assert_eq!((stats.channels, stats.pool_pages_used), (0, 0), "channels left behind in the engine");
    daemon.stop();
}

/// wicd holds several descriptors per channel, so it must not stay at a low inherited soft
/// limit: started with a soft limit of 64, it raises it to the hard one.
#[test]
fn wicd_raises_its_soft_descriptor_limit_to_the_hard_one() {
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    assert!(hard > 64, "the hard descriptor limit {hard} leaves nothing to test");
    let daemon = wic_tests::Daemon::start_with("fd-limit", "", |command| {
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // setrlimit, which is async-signal-safe, and allocates nothing.
        unsafe {
            command.pre_exec(move || setrlimit(Resource::RLIMIT_NOFILE, 64, hard).map_err(std::io::Error::from));
        }
    });
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", daemon.child.id())).expect("wicd's limits");
    let open_files: Vec<&str> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a descriptor limit line")
        .split_whitespace()
        .collect();
    assert_eq!(open_files[3..5], [hard.to_string(), hard.to_string()], "{limits}");
    assert!(daemon.stop().contains(&format!("descriptor limit raised from 64 to {hard}")));
}
