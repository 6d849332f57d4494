//! The run's numbers, the bounds they are held to, and the summary: a table for people, then
//! one JSON line for scripts and the test.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use wic_proto::message::{Stats, Status};

use crate::daemon::Usage;
use crate::latency::{Kind, Latencies, Summary};

/// Limits a run must stay within.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub control_p99: Duration,
    pub rss_growth_kib: u64,
    pub fd_slack: u64,
}

/// The daemon's state at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub status: Status,
    pub stats: Stats,
    pub usage: Usage,
}

/// What was asked and what happened.
pub struct Report {
    pub clients: u32,
    pub channels: u32,
    pub rounds: u32,
    pub messages: u32,
    pub slots: u32,
    pub message_bytes: u32,
    pub published: u64,
    pub consumed: u64,
    /// What the consumers had to get, from the shape of the run.
    pub consumed_due: u64,
    pub bytes_checked: u64,
    pub aborts: u64,
    pub aborts_due: u64,
    pub closed_as_expected: u64,
    /// Publishes an aborting producer made just before dropping its connection: the daemon
    /// may destroy the channel before it reads their doorbell.
    pub publishes_at_aborts: u64,
    pub latencies: Latencies,
    pub failures: Vec<String>,
    pub baseline: Snapshot,
    pub after_first_round: Option<Usage>,
    pub after_last_round: Option<Usage>,
    pub peak_rss_kib: u64,
    pub peak_fds: Option<u64>,
    pub peak_channels: u32,
    pub peak_clients: u32,
    pub end: Snapshot,
    /// The longest wait, after a round, for the daemon's channels and pages to return.
    pub slowest_reclaim: Duration,
    /// Rounds after which they did not return in time.
    pub unreclaimed: Vec<String>,
    /// Whether a connection past `max_clients` was refused (when this program set the limit).
    pub limit_refusal: Option<Result<(), String>>,
    /// Where the daemon this program started logged, and the warnings and errors there.
    pub log_path: Option<PathBuf>,
    pub log_problems: Option<Vec<String>>,
    pub stopped: Result<(), String>,
    pub elapsed: Duration,
    pub bounds: Bounds,
}

/// One named check.
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

fn check(name: &'static str, ok: bool, detail: String) -> Check {
    Check { name, ok, detail }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn counter_delta(report: &Report, counter: impl Fn(&Stats) -> u64) -> u64 {
    counter(&report.end.stats).wrapping_sub(counter(&report.baseline.stats))
}

impl Report {
    /// Every check, in the order they are reported.
    pub fn checks(&self) -> Vec<Check> {
        let (base, end) = (&self.baseline, &self.end);
        let completed = counter_delta(self, |s| s.faults_completed);
        let publishes = counter_delta(self, |s| s.host_publishes);
        let timed_out = counter_delta(self, |s| s.faults_timed_out);
        let control = self.latencies.control();
        let mut checks = vec![
            check("no unexpected failure", self.failures.is_empty(), format!("{} failures", self.failures.len())),
            check(
                "every message consumed once, every byte checked",
                self.consumed == self.consumed_due,
                format!("{} consumed, {} due", self.consumed, self.consumed_due),
            ),
            check(
                "each abort closed the channel its consumer waited on",
                self.aborts == self.aborts_due && self.closed_as_expected == self.aborts,
                format!(
                    "{} aborts of {} due, {} consumers woken with CLOSED",
                    self.aborts, self.aborts_due, self.closed_as_expected
                ),
            ),
            check(
                "wicd delivered each consumed message once",
                completed == self.consumed,
                format!("faults_completed +{completed}, {} consumed", self.consumed),
            ),
            check(
                "wicd saw the publishes",
                publishes <= self.published && publishes + self.publishes_at_aborts >= self.published,
                format!(
                    "host_publishes +{publishes}, {} published ({} just before aborts)",
                    self.published, self.publishes_at_aborts
                ),
            ),
            check("no held consumer timed out", timed_out == 0, format!("faults_timed_out +{timed_out}")),
            check(
                "channels reclaimed after every round",
                self.unreclaimed.is_empty(),
                if self.unreclaimed.is_empty() {
                    format!("slowest {:.1} ms", ms(self.slowest_reclaim))
                } else {
                    self.unreclaimed.join("; ")
                },
            ),
            check(
                "clients, channels, held faults back to baseline",
                (end.status.clients, end.status.channels, end.stats.channels, end.status.held, end.stats.pfq_depth)
                    == (
                        base.status.clients,
                        base.status.channels,
                        base.stats.channels,
                        base.status.held,
                        base.stats.pfq_depth,
                    ),
                format!(
                    // The control plane's channel records and the engine's channels are counted apart.
                    "clients {} -> {}, channels {} -> {} (in the engine {} -> {}), held {} -> {}, PFQ {} -> {}",
                    base.status.clients,
                    end.status.clients,
                    base.status.channels,
                    end.status.channels,
                    base.stats.channels,
                    end.stats.channels,
                    base.status.held,
                    end.status.held,
                    base.stats.pfq_depth,
                    end.stats.pfq_depth
                ),
            ),
            check(
                "pool pages back to baseline",
                end.stats.pool_pages_used == base.stats.pool_pages_used
                    && end.stats.pool_longest_free_run == base.stats.pool_longest_free_run,
                format!(
                    "used {} -> {} of {}, longest free run {} -> {}",
                    base.stats.pool_pages_used,
                    end.stats.pool_pages_used,
                    end.stats.pool_pages,
                    base.stats.pool_longest_free_run,
                    end.stats.pool_longest_free_run
                ),
            ),
            check(
                "control p99 within bound",
                control.p99 <= self.bounds.control_p99,
                format!("{:.2} ms, bound {:.0} ms", ms(control.p99), ms(self.bounds.control_p99)),
            ),
        ];
        if let (Some(first), Some(last)) = (self.after_first_round, self.after_last_round) {
            let growth = last.rss_kib.saturating_sub(first.rss_kib);
            checks.push(check(
                "RSS does not grow with rounds",
                growth <= self.bounds.rss_growth_kib,
                format!(
                    "{} KiB after round 1, {} after the last: +{growth}, bound {}",
                    first.rss_kib, last.rss_kib, self.bounds.rss_growth_kib
                ),
            ));
        }
        if let (Some(before), Some(after)) = (base.usage.fds, end.usage.fds) {
            checks.push(check(
                "descriptors back to baseline",
                after.abs_diff(before) <= self.bounds.fd_slack,
                format!("{before} -> {after}, slack {}", self.bounds.fd_slack),
            ));
        }
        if let Some(refusal) = &self.limit_refusal {
            checks.push(check(
                "a connection past max_clients is refused",
                refusal.is_ok(),
                refusal.clone().err().unwrap_or_else(|| "EXHAUSTED".into()),
            ));
        }
        if let Some(problems) = &self.log_problems {
            checks.push(check(
                "wicd logged no warning or error",
                problems.is_empty(),
                problems
                    .first()
                    .cloned()
                    .map_or_else(|| "none".into(), |first| format!("{} lines, first: {first}", problems.len())),
            ));
        }
        checks.push(check(
            "wicd stops cleanly",
            self.stopped.is_ok(),
            self.stopped.clone().err().unwrap_or_else(|| "SIGTERM: exit 0, socket removed".into()),
        ));
        checks
    }

    /// The summary for people.
    pub fn print(&self, checks: &[Check]) {
        println!(
            "wic-load: {} clients x {} channels x {} rounds; {} messages of {} bytes per channel and round, {} slots",
            self.clients, self.channels, self.rounds, self.messages, self.message_bytes, self.slots
        );
        println!(
            "messages: {} published, {} consumed, {:.1} MB checked; {} aborts; {:.1} s",
            self.published,
            self.consumed,
            self.bytes_checked as f64 / 1e6,
            self.aborts,
            self.elapsed.as_secs_f64()
        );
        println!("{:<10} {:>9} {:>10} {:>10} {:>10}", "latency", "count", "p50 ms", "p99 ms", "max ms");
        let row = |name: &str, s: Summary| {
            println!("{name:<10} {:>9} {:>10.3} {:>10.3} {:>10.3}", s.count, ms(s.p50), ms(s.p99), ms(s.max));
        };
        for kind in Kind::CONTROL {
            row(kind.name(), self.latencies.summary(kind));
        }
        row("control", self.latencies.control());
        row("delivery", self.latencies.summary(Kind::Delivery));
        let kib = |u: Option<Usage>| u.map_or_else(|| "-".into(), |u| u.rss_kib.to_string());
        println!(
            "wicd RSS KiB: baseline {}, after round 1 {}, after the last round {}, peak {} (high-water mark {}), end {}",
            self.baseline.usage.rss_kib,
            kib(self.after_first_round),
            kib(self.after_last_round),
            self.peak_rss_kib,
            self.end.usage.hwm_kib,
            self.end.usage.rss_kib
        );
        let fds = |n: Option<u64>| n.map_or_else(|| "unreadable".into(), |n| n.to_string());
        println!(
            "wicd descriptors: baseline {}, peak {}, end {}; peak {} clients, {} channels",
            fds(self.baseline.usage.fds),
            fds(self.peak_fds),
            fds(self.end.usage.fds),
            self.peak_clients,
            self.peak_channels
        );
        if let Some(path) = &self.log_path {
            println!("wicd log: {}", path.display());
        }
        for c in checks {
            println!("{} {}: {}", if c.ok { "ok  " } else { "FAIL" }, c.name, c.detail);
        }
        for failure in self.failures.iter().take(20) {
            println!("failure: {failure}");
        }
        if self.failures.len() > 20 {
            println!("... and {} more failures", self.failures.len() - 20);
        }
    }

    /// The summary for scripts: one line of JSON.
    pub fn json(&self, checks: &[Check]) -> Value {
        let latency =
            |s: Summary| json!({"count": s.count, "p50_ms": ms(s.p50), "p99_ms": ms(s.p99), "max_ms": ms(s.max)});
        let mut latencies = serde_json::Map::new();
        for kind in Kind::CONTROL.into_iter().chain([Kind::Delivery]) {
            latencies.insert(kind.name().into(), latency(self.latencies.summary(kind)));
        }
        latencies.insert("control".into(), latency(self.latencies.control()));
        let (base, end) = (&self.baseline, &self.end);
        json!({
            "clients": self.clients,
            "channels": self.channels,
            "rounds": self.rounds,
            "messages_per_channel": self.messages,
            "slots": self.slots,
            "message_bytes": self.message_bytes,
            "published": self.published,
            "consumed": self.consumed,
            "consumed_due": self.consumed_due,
            "bytes_checked": self.bytes_checked,
            "aborts": self.aborts,
            "closed_as_expected": self.closed_as_expected,
            "failures": self.failures.len(),
            "latency": latencies,
            "rss_kib": {
                "baseline": base.usage.rss_kib,
                "after_first_round": self.after_first_round.map(|u| u.rss_kib),
                "after_last_round": self.after_last_round.map(|u| u.rss_kib),
                "peak": self.peak_rss_kib,
                "high_water_mark": end.usage.hwm_kib,
                "end": end.usage.rss_kib,
            },
            "fds": {"baseline": base.usage.fds, "peak": self.peak_fds, "end": end.usage.fds},
            "daemon_end": {
                "clients": end.status.clients,
                "channels": end.status.channels,
                "engine_channels": end.stats.channels,
                "held": end.status.held,
                "pfq_depth": end.stats.pfq_depth,
                "pool_pages": end.stats.pool_pages,
                "pool_pages_used": end.stats.pool_pages_used,
                "pool_longest_free_run": end.stats.pool_longest_free_run,
            },
            "daemon_baseline": {
                "clients": base.status.clients,
                "channels": base.status.channels,
                "pool_pages_used": base.stats.pool_pages_used,
            },
            "daemon_counters": {
                "faults_completed": counter_delta(self, |s| s.faults_completed),
                "faults_held": counter_delta(self, |s| s.faults_held),
                "faults_cancelled": counter_delta(self, |s| s.faults_cancelled),
                "faults_timed_out": counter_delta(self, |s| s.faults_timed_out),
                "faults_ignored": counter_delta(self, |s| s.faults_ignored),
                "host_publishes": counter_delta(self, |s| s.host_publishes),
                "replays": counter_delta(self, |s| s.replays),
            },
            "slowest_reclaim_ms": ms(self.slowest_reclaim),
            "seconds": self.elapsed.as_secs_f64(),
            "bounds": {
                "control_p99_ms": ms(self.bounds.control_p99),
                "rss_growth_kib": self.bounds.rss_growth_kib,
                "fd_slack": self.bounds.fd_slack,
            },
            "broken": checks.iter().filter(|c| !c.ok).map(|c| c.name).collect::<Vec<_>>(),
        })
    }
}
