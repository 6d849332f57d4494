//! The text forms of what wicd reports and of decoded fault entries.
//!
//! Every function here is pure: it takes the data and returns the text, so each output format
//! is tested without a daemon.

use std::fmt::Write as _;

use serde_json::{json, Value};
use wic_proto::message::{ChannelSummary, Histogram, Producer, Stats, Status, Submissions};
use wic_types::fault::{FaultEntry, RawFaultEntry, VaWidth};

/// Nanoseconds per second, for the unit conversions.
const NS_PER_SEC: f64 = 1e9;

/// Log2 buckets always exported for the wake latency: up to `2^36 - 1` ns (about 69 s). A fixed
/// set keeps the Prometheus series stable between scrapes; rarer, larger buckets are added when
/// they hold values.
const LATENCY_EXPORTED_BUCKETS: u32 = 36;

/// Log2 buckets always exported for batch sizes: up to 65535 entries, beyond any fault buffer.
const BATCH_EXPORTED_BUCKETS: u32 = 16;

/// How a scalar statistic behaves over time, which decides its Prometheus type.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// Only grows while the daemon runs.
    Counter,
    /// A level that goes up and down.
    Gauge,
}

/// One scalar field of [`Stats`], with what both the human and the Prometheus forms need.
struct Scalar {
    /// Section of the human form.
    group: &'static str,
    /// The field's name in [`Stats`] (and so in its JSON).
    name: &'static str,
    kind: Kind,
    help: &'static str,
    value: u64,
}

/// Every scalar field of `s`, in the order of the human form. Listing them once keeps the human
/// and Prometheus forms from drifting apart.
fn scalars(s: &Stats) -> [Scalar; 25] {
    use Kind::{Counter, Gauge};
    let row = |group, name, kind, help, value: u64| Scalar { group, name, kind, help, value };
    [
        row("faults", "faults_captured", Counter, "Fault-buffer entries fetched.", s.faults_captured),
        row("faults", "faults_held", Counter, "Requests that had to wait for their data.", s.faults_held),
        row("faults", "faults_completed", Counter, "Requests completed with data.", s.faults_completed),
        row("faults", "faults_timed_out", Counter, "Requests completed with the timeout marker.", s.faults_timed_out),
        row(
            "faults",
            "faults_cancelled",
            Counter,
            "Requests completed with the channel-closed or stopping marker.",
            s.faults_cancelled,
        ),
        row("faults", "faults_ignored", Counter, "Entries that were duplicates, stale or not ours.", s.faults_ignored),
        row(
            "faults",
            "fault_buffer_overflows",
            Counter,
            "Faults that found the fault buffer full.",
            s.fault_buffer_overflows,
        ),
        row("faults", "replays", Counter, "Replays issued.", s.replays),
        row(
            "faults",
            "commands_failed",
            Counter,
            "Commands the backend could not carry out (the daemon logs each).",
            s.commands_failed,
        ),
        row(
            "faults",
            "faults_expired_in_module",
            Counter,
            "Holds the kernel module ended at its own bound (max_hold_ms): each stalled the GPU that long.",
            s.faults_expired_in_module,
        ),
        row("monitor", "pfq_depth", Gauge, "Requests waiting now.", u64::from(s.pfq_depth)),
        row("monitor", "dab_updates", Counter, "Data-availability bits set.", s.dab_updates),
        row("monitor", "pat_faults", Counter, "Producer publishes seen as faults on PAT pages.", s.pat_faults),
        row("monitor", "host_publishes", Counter, "Host publishes (doorbell and socket).", s.host_publishes),
        row("pool", "pool_pages", Gauge, "Pages in the page pool.", u64::from(s.pool_pages)),
        row("pool", "pool_pages_used", Gauge, "Pool pages in use.", u64::from(s.pool_pages_used)),
        row(
            "pool",
            "pool_longest_free_run",
            Gauge,
            "Longest run of contiguous free pool pages.",
            u64::from(s.pool_longest_free_run),
        ),
        row("uvm", "uvm_spaces", Gauge, "Address spaces observed through nvidia-uvm-tools.", u64::from(s.uvm_spaces)),
        row("uvm", "uvm_faults_watched", Counter, "Observed GPU faults on watched pages.", s.uvm_faults_watched),
        row("uvm", "uvm_faults_other", Counter, "Observed GPU faults on other pages.", s.uvm_faults_other),
        row("uvm", "uvm_replays", Counter, "Fault replays the driver reported.", s.uvm_replays),
        row("uvm", "uvm_faults_unpaired", Counter, "Watched faults whose replay was not seen.", s.uvm_faults_unpaired),
        row(
            "uvm",
            "uvm_events_dropped",
            Counter,
            "Fault events the driver dropped (queue full).",
            s.uvm_events_dropped,
        ),
        row("service", "channels", Gauge, "Channels open.", u64::from(s.channels)),
        row("service", "clients", Gauge, "Clients connected.", u64::from(s.clients)),
    ]
}

/// Inclusive upper bound of log2 bucket `index`: 0, 1, 3, 7, …, `u64::MAX` (bucket 0 holds 0,
/// bucket `i` holds `[2^(i-1), 2^i - 1]`).
fn log2_upper_bound(index: u32) -> u64 {
    match index {
        0 => 0,
        i => u64::MAX >> (u64::BITS - i.min(u64::BITS)),
    }
}

/// The nearest-rank `q`-quantile of `h` as far as its buckets tell: the inclusive upper bound
/// of the bucket holding it, clamped to the histogram's maximum. So it is never below the true
/// value and, for log2 buckets, at most `2 * true + 1`.
///
/// `q` is clamped to `[0, 1]` (NaN counts as 0); `None` when no bucket holds a value.
pub fn quantile_from_buckets(h: &Histogram, q: f64) -> Option<u64> {
    let total: u64 = h.buckets.iter().map(|[_, n]| n).sum();
    if total == 0 {
        return None;
    }
    let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
    // Nearest rank is 1-based: ceil(q * n), at least the first value.
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    h.buckets.iter().find_map(|&[upper, n]| {
        seen += n;
        (seen >= rank).then_some(upper.min(h.max))
    })
}

/// `ns` nanoseconds with a unit that keeps it short: `850 ns`, `12.30 µs`, `4.56 ms`, `1.20 s`.
fn human_ns(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.2} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / NS_PER_SEC)
    }
}

/// A count of entries: whole numbers as such, means with one decimal.
fn human_count(n: f64) -> String {
    if n.fract() == 0.0 {
        format!("{n:.0}")
    } else {
        format!("{n:.1}")
    }
}

/// An uptime as `3d 4h 5m 6s`, leaving out leading zero units.
fn human_uptime(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let (d, h, m, s) = (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}d {h}h {m}m {s}s")
    } else if h > 0 {
        format!("{h}h {m}m {s}s")
    } else if m > 0 {
        format!("{m}m {s}s")
    } else {
        format!("{s}s")
    }
}

/// `name  value` lines with the names padded to a common width.
fn key_values(rows: &[(&str, String)]) -> String {
    let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    rows.iter().map(|(name, value)| format!("{name:<width$}  {value}\n")).collect()
}

/// `wicctl status`: the daemon's identity and load, one `name  value` line each.
pub fn status(s: &Status) -> String {
    key_values(&[
        ("version", s.version.clone()),
        ("protocol", s.protocol.to_string()),
        ("pid", s.pid.to_string()),
        ("backend", s.backend.clone()),
        ("gpus", s.gpus.to_string()),
        ("uptime", human_uptime(s.uptime_ns)),
        ("clients", s.clients.to_string()),
        ("channels", s.channels.to_string()),
        ("held", s.held.to_string()),
        ("pool", format!("{}/{} pages used", s.pool_pages_used, s.pool_pages)),
        ("draining", if s.draining { "yes: new channels are refused (wicctl drain --undo)" } else { "no" }.into()),
    ])
}

/// How a table column lines up its cells.
#[derive(Clone, Copy)]
enum Align {
    Left,
    Right,
}

/// A table with a header row, columns two spaces apart and no trailing blanks.
fn table(columns: &[(&str, Align)], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, (title, _))| rows.iter().map(|row| row[i].chars().count()).fold(title.len(), usize::max))
        .collect();
    let header: Vec<String> = columns.iter().map(|(title, _)| (*title).to_owned()).collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(columns)
            .zip(&widths)
            .map(|((cell, (_, align)), &width)| match align {
                Align::Left => format!("{cell:<width$}"),
                Align::Right => format!("{cell:>width$}"),
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// `wicctl channels`: one row per channel, or `no channels`. `CLIENT_OVERFLOWS` is what the
/// channel's consumers report, unchecked by wicd, unlike the other counters.
pub fn channels(list: &[ChannelSummary]) -> String {
    if list.is_empty() {
        return "no channels\n".to_owned();
    }
    use Align::{Left, Right};
    let columns = [
        ("ID", Right),
        ("OWNER", Left),
        ("GPU", Right),
        ("PRODUCER", Left),
        ("MSG_BYTES", Right),
        ("SLOTS", Right),
        ("PAGES", Right),
        ("ATTACHED", Right),
        ("PUBLISHES", Right),
        ("DELIVERIES", Right),
        ("TIMEOUTS", Right),
        ("CLIENT_OVERFLOWS", Right),
    ];
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|c| {
            let producer = match c.spec.producer {
                Producer::Host => "host".to_owned(),
                Producer::Gpu { gpu, .. } => format!("gpu{gpu}"),
            };
            vec![
                c.channel.to_string(),
                format!("{}/{}", c.owner_pid, c.owner_uid),
                c.spec.consumer_gpu.to_string(),
                producer,
                c.spec.message_bytes.to_string(),
                c.spec.slots.to_string(),
                c.pages.to_string(),
                c.attached.to_string(),
                c.publishes.to_string(),
                c.deliveries.to_string(),
                c.timeouts.to_string(),
                c.client_overflows.to_string(),
            ]
        })
        .collect();
    table(&columns, &rows)
}

/// The human lines of one histogram: count, mean, p50, p99 and max, named `<prefix>_<what>`,
/// each value shown by `show`; `-` where an empty histogram has no value.
fn histogram_rows(prefix: &str, h: &Histogram, show: impl Fn(f64) -> String) -> Vec<(String, String)> {
    let dash = || "-".to_owned();
    let mean = (h.count > 0).then(|| h.sum as f64 / h.count as f64);
    let quantile = |q| quantile_from_buckets(h, q).map_or_else(dash, |v| show(v as f64));
    vec![
        (format!("{prefix}_count"), h.count.to_string()),
        (format!("{prefix}_mean"), mean.map_or_else(dash, &show)),
        (format!("{prefix}_p50"), quantile(0.5)),
        (format!("{prefix}_p99"), quantile(0.99)),
        (format!("{prefix}_max"), if h.count > 0 { show(h.max as f64) } else { dash() }),
    ]
}

/// wicd's command batches to the kernel module: how many, their mean time and pages (what
/// `wicd calibrate` fits the model's submission and per-page costs to).
fn submission_rows(s: &Submissions) -> Vec<(String, String)> {
    let mean = |sum: u64| if s.count > 0 { Some(sum as f64 / s.count as f64) } else { None };
    let dash = || "-".to_owned();
    vec![
        ("submissions".to_owned(), s.count.to_string()),
        ("submission_mean".to_owned(), mean(s.ns).map_or_else(dash, human_ns)),
        ("submission_pages_mean".to_owned(), mean(s.pages).map_or_else(dash, |p| format!("{p:.1}"))),
    ]
}

/// `wicctl stats`: every counter as a `name  value` line, in sections (faults, monitor, pool,
/// latency, batches, service). `completed_per_sec`, known from the second sample of a watch on,
/// adds the rate of `faults_completed`.
pub fn stats(s: &Stats, completed_per_sec: Option<f64>) -> String {
    let mut sections: Vec<(&str, Vec<(String, String)>)> = Vec::new();
    for scalar in scalars(s) {
        if sections.last().map(|(group, _)| *group) != Some(scalar.group) {
            // Latency and batches come between the pool and the uvm sections, the observed
            // latencies at the end of the uvm section.
            if scalar.group == "uvm" {
                sections.push(("latency", histogram_rows("wake_latency", &s.wake_latency_ns, human_ns)));
                let mut batches = histogram_rows("batch_sizes", &s.batch_sizes, human_count);
                batches.extend(submission_rows(&s.submissions));
                sections.push(("batches", batches));
            }
            if scalar.group == "service" {
                let rows = &mut sections.last_mut().expect("the uvm section").1;
                rows.extend(histogram_rows("uvm_fault_latency", &s.uvm_fault_latency_ns, human_ns));
                rows.extend(histogram_rows("uvm_fault_gpu_latency", &s.uvm_fault_gpu_latency_ns, human_ns));
            }
            sections.push((scalar.group, Vec::new()));
        }
        let rows = &mut sections.last_mut().expect("pushed above").1;
        rows.push((scalar.name.to_owned(), scalar.value.to_string()));
        if scalar.name == "faults_completed" {
            if let Some(rate) = completed_per_sec {
                rows.push(("faults_completed_per_sec".to_owned(), format!("{rate:.1}")));
            }
        }
    }
    let all_rows = || sections.iter().flat_map(|(_, rows)| rows);
    let name_width = all_rows().map(|(name, _)| name.len()).max().unwrap_or(0);
    let value_width = all_rows().map(|(_, value)| value.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for (group, rows) in &sections {
        let _ = writeln!(out, "{group}");
        for (name, value) in rows {
            let _ = writeln!(out, "  {name:<name_width$}  {value:>value_width$}");
        }
    }
    out
}

/// The header printed before each sample of `wicctl stats --watch`.
pub fn watch_header(timestamp: &str) -> String {
    format!("--- {timestamp} ---\n")
}

/// Writes the `# HELP` and `# TYPE` lines that open a metric family.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value with `\`, `"` and newlines escaped as the exposition format requires.
fn escape_label(value: &str) -> String {
    value.replace('\\', r"\\").replace('"', "\\\"").replace('\n', r"\n")
}

/// The unit a histogram is exported in.
#[derive(Clone, Copy)]
enum Unit {
    /// Recorded in nanoseconds, exported in seconds.
    Seconds,
    /// Exported as recorded.
    Plain,
}

impl Unit {
    /// `value` in the exported unit, as text that parses back as a float.
    fn show(self, value: u64) -> String {
        match self {
            // f64's Display is the shortest text that round-trips, never in exponent form.
            Self::Seconds => (value as f64 / NS_PER_SEC).to_string(),
            Self::Plain => value.to_string(),
        }
    }
}

/// Writes `h` as a Prometheus histogram: cumulative `_bucket{le=…}` samples over the log2
/// buckets `0..=exported` plus any other bucket holding values, then `+Inf`, `_sum` and
/// `_count`.
fn histogram(out: &mut String, name: &str, help: &str, h: &Histogram, unit: Unit, exported: u32) {
    family(out, name, "histogram", help);
    let mut held = h.buckets.clone();
    held.sort_unstable();
    let mut bounds: Vec<u64> =
        (0..=exported).map(log2_upper_bound).chain(held.iter().map(|[upper, _]| *upper)).collect();
    bounds.sort_unstable();
    bounds.dedup();
    let mut held = held.iter().peekable();
    let mut cumulative = 0u64;
    for bound in bounds {
        while let Some([_, n]) = held.next_if(|[upper, _]| *upper <= bound) {
            cumulative = cumulative.saturating_add(*n);
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {cumulative}", unit.show(bound));
    }
    // The buckets add up to the count; should they not, +Inf must still not fall below them.
    let count = h.count.max(cumulative);
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum {}", unit.show(h.sum));
    let _ = writeln!(out, "{name}_count {count}");
}

/// `wicctl metrics`: the statistics in the Prometheus text exposition format 0.0.4.
pub fn metrics(s: &Stats, status: &Status) -> String {
    let mut out = String::new();
    family(&mut out, "wic_info", "gauge", "The daemon's version and backend; always 1.");
    let _ = writeln!(
        out,
        "wic_info{{version=\"{}\",backend=\"{}\"}} 1",
        escape_label(&status.version),
        escape_label(&status.backend)
    );
    family(&mut out, "wic_uptime_seconds", "gauge", "Time since the daemon started.");
    let _ = writeln!(out, "wic_uptime_seconds {}", Unit::Seconds.show(status.uptime_ns));
    family(&mut out, "wic_gpus", "gauge", "GPUs the daemon serves.");
    let _ = writeln!(out, "wic_gpus {}", status.gpus);
    for scalar in scalars(s) {
        let (name, kind) = match scalar.kind {
            Kind::Counter => (format!("wic_{}_total", scalar.name), "counter"),
            Kind::Gauge => (format!("wic_{}", scalar.name), "gauge"),
        };
        family(&mut out, &name, kind, scalar.help);
        let _ = writeln!(out, "{name} {}", scalar.value);
    }
    histogram(
        &mut out,
        "wic_wake_latency_seconds",
        "Time from a fault to its replay.",
        &s.wake_latency_ns,
        Unit::Seconds,
        LATENCY_EXPORTED_BUCKETS,
    );
    histogram(
        &mut out,
        "wic_uvm_fault_latency_seconds",
        "Observed GPU fault: fetched by the driver to the replay of its batch (CPU clock).",
        &s.uvm_fault_latency_ns,
        Unit::Seconds,
        LATENCY_EXPORTED_BUCKETS,
    );
    histogram(
        &mut out,
        "wic_uvm_fault_gpu_latency_seconds",
        "Observed GPU fault: written by the GPU to its replay done (GPU clock).",
        &s.uvm_fault_gpu_latency_ns,
        Unit::Seconds,
        LATENCY_EXPORTED_BUCKETS,
    );
    histogram(
        &mut out,
        "wic_batch_size",
        "Entries per fetched fault batch.",
        &s.batch_sizes,
        Unit::Plain,
        BATCH_EXPORTED_BUCKETS,
    );
    out
}

/// `wicctl decode-fault`: every field of `raw` decoded with VAs `width` wide, one per line,
/// then the VA width and the eight DWORDs.
pub fn fault_text(raw: &RawFaultEntry, width: VaWidth) -> String {
    let entry = FaultEntry::decode(raw, width);
    let dwords: Vec<String> = (0..8).map(|i| format!("{:08x}", raw.dword(i))).collect();
    // The labels line up with those of FaultEntry's Display.
    format!("{entry}\nva width:            {} bits\ndwords:              {}\n", width.bits(), dwords.join(" "))
}

/// `wicctl decode-fault --json`: the fields of `raw` as a JSON object. Addresses and DWORDs are
/// hex strings, since 64-bit values do not survive every JSON reader as numbers.
pub fn fault_json(raw: &RawFaultEntry, width: VaWidth) -> Value {
    let e = FaultEntry::decode(raw, width);
    let dwords: Vec<String> = (0..8).map(|i| format!("{:#010x}", raw.dword(i))).collect();
    json!({
        "raw": raw.to_hex(),
        "va_bits": width.bits(),
        "valid": e.valid,
        "va": format!("{:#018x}", e.va),
        "fault_type": e.fault_type.to_string(),
        "fault_type_raw": e.fault_type.raw(),
        "fatal": e.fault_type.is_fatal(),
        "access_type": e.access_type.to_string(),
        "access_type_raw": e.access_type.raw(),
        "write": e.access_type.is_write(),
        "replayable": e.replayable,
        "replayable_fault_enabled": e.replayable_fault_enabled,
        "instance_ptr": format!("{:#018x}", e.instance_ptr),
        "instance_aperture": e.instance_aperture.to_string(),
        "instance_aperture_raw": e.instance_aperture.raw(),
        "address_aperture": e.address_aperture,
        "timestamp_ns": e.timestamp,
        "engine_id": e.engine_id,
        "client_id": e.client_id,
        "client_type": e.client_type.to_string(),
        "gpc_id": e.gpc_id,
        "protected_mode": e.protected_mode,
        "dwords": dwords,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashSet};
    use wic_proto::message::ChannelSpec;
    use wic_types::fault::AccessType;

    /// Stats with a distinct value in every field and both histograms filled.
    fn sample_stats() -> Stats {
        Stats {
            faults_captured: 1001,
            faults_held: 1002,
            faults_completed: 1003,
            faults_timed_out: 1004,
            faults_cancelled: 1005,
            faults_ignored: 1006,
            pfq_depth: 7,
            dab_updates: 1008,
            pat_faults: 1009,
            host_publishes: 1010,
            pool_pages: 4096,
            pool_pages_used: 12,
            pool_longest_free_run: 4000,
            // Values 0, 5, 6, 700, 1500, 3_000_000 ns.
            wake_latency_ns: Histogram {
                count: 6,
                sum: 3_002_211,
                max: 3_000_000,
                buckets: vec![[0, 1], [7, 2], [1023, 1], [2047, 1], [(1 << 22) - 1, 1]],
            },
            // Batches of 1, 1, 3 entries.
            batch_sizes: Histogram { count: 3, sum: 5, max: 3, buckets: vec![[1, 2], [3, 1]] },
            fault_buffer_overflows: 1011,
            replays: 1012,
            commands_failed: 1018,
            faults_expired_in_module: 1019,
            channels: 2,
            clients: 3,
            uvm_spaces: 1,
            uvm_faults_watched: 1013,
            uvm_faults_other: 1014,
            uvm_replays: 1015,
            uvm_faults_unpaired: 1016,
            uvm_events_dropped: 1017,
            // Values 40_000 and 50_000 ns.
            uvm_fault_latency_ns: Histogram { count: 2, sum: 90_000, max: 50_000, buckets: vec![[65535, 2]] },
            uvm_fault_gpu_latency_ns: Histogram { count: 1, sum: 30_000, max: 30_000, buckets: vec![[32767, 1]] },
            // Batches of 2 pages in 3 us and 6 pages in 5 us.
            submissions: Submissions {
                count: 2,
                pages: 8,
                ns: 8_000,
                pages_squared: 40,
                pages_ns: 36_000,
                bytes: 12_288,
                pages_bytes: 61_440,
            },
        }
    }

    fn sample_status() -> Status {
        Status {
            version: "0.1.0".into(),
            protocol: 1,
            pid: 4242,
            backend: "emulated".into(),
            gpus: 2,
            uptime_ns: 93_784_000_000_000,
            clients: 3,
            channels: 2,
            held: 7,
            pool_pages: 4096,
            pool_pages_used: 12,
            draining: false,
        }
    }

    /// The scalar (number-valued) fields of `Stats`, read off its JSON so that a field added
    /// later is covered without touching this test.
    fn scalar_fields(s: &Stats) -> BTreeMap<String, u64> {
        let Value::Object(fields) = serde_json::to_value(s).unwrap() else { panic!("Stats is an object") };
        fields.into_iter().filter_map(|(name, value)| value.as_u64().map(|v| (name, v))).collect()
    }

    /// A metric name as the exposition format allows it.
    fn valid_metric_name(name: &str) -> bool {
        let mut chars = name.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    /// One parsed sample line.
    #[derive(Debug)]
    struct Sample {
        name: String,
        labels: BTreeMap<String, String>,
        value: f64,
    }

    /// Parses `name value` or `name{k="v",…} value`; panics on anything else.
    fn parse_sample(line: &str) -> Sample {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("value is not a float: {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels: {line}"));
                let labels = body
                    .split(',')
                    .map(|pair| {
                        let (key, quoted) = pair.split_once('=').unwrap_or_else(|| panic!("bad label: {line}"));
                        assert!(valid_metric_name(key), "bad label name: {line}");
                        let v = quoted.strip_prefix('"').and_then(|q| q.strip_suffix('"'));
                        (key.to_owned(), v.unwrap_or_else(|| panic!("unquoted label: {line}")).to_owned())
                    })
                    .collect();
                (name, labels)
            }
        };
        assert!(valid_metric_name(name), "bad metric name: {line}");
        Sample { name: name.to_owned(), labels, value }
    }

    /// The family a sample belongs to: histogram samples carry a suffix.
    fn family_of<'a>(sample: &'a str, types: &BTreeMap<String, String>) -> &'a str {
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = sample.strip_suffix(suffix) {
                if types.get(base).is_some_and(|t| t == "histogram") {
                    return base;
                }
            }
        }
        sample
    }

    #[test]
    fn prometheus_text_is_well_formed_and_complete() {
        let stats = sample_stats();
        let text = metrics(&stats, &sample_status());
        assert!(text.ends_with('\n'));

        let mut helps = HashSet::new();
        let mut types: BTreeMap<String, String> = BTreeMap::new();
        let mut finished: HashSet<String> = HashSet::new();
        let mut current: Option<String> = None;
        let mut samples: Vec<Sample> = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap();
                assert!(!help.is_empty(), "{line}");
                assert!(helps.insert(name.to_owned()), "second HELP for {name}");
                // A family's samples are contiguous: once left, it never comes back.
                if let Some(previous) = current.replace(name.to_owned()) {
                    finished.insert(previous);
                }
                assert!(!finished.contains(name), "family {name} repeated");
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert_eq!(current.as_deref(), Some(name), "TYPE right after its HELP: {line}");
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
                assert!(types.insert(name.to_owned(), kind.to_owned()).is_none(), "second TYPE for {name}");
            } else {
                assert!(!line.starts_with('#') && !line.is_empty(), "stray line: {line:?}");
                let sample = parse_sample(line);
                let family = family_of(&sample.name, &types);
                assert_eq!(current.as_deref(), Some(family), "sample outside its family: {line}");
                assert!(types.contains_key(family), "sample before TYPE: {line}");
                if types[family] == "counter" {
                    assert!(family.ends_with("_total"), "{line}");
                }
                samples.push(sample);
            }
        }
        let value = |name: &str| {
            let found: Vec<f64> = samples.iter().filter(|s| s.name == name).map(|s| s.value).collect();
            assert_eq!(found.len(), 1, "{name}: {found:?}");
            found[0]
        };

        for (field, expected) in scalar_fields(&stats) {
            let counter = format!("wic_{field}_total");
            let gauge = format!("wic_{field}");
            let name = if types.contains_key(&counter) { counter } else { gauge };
            assert_eq!(value(&name), expected as f64, "{name}");
        }
        assert_eq!(types["wic_faults_completed_total"], "counter");
        assert_eq!(value("wic_faults_completed_total"), 1003.0);
        assert_eq!(types["wic_pfq_depth"], "gauge");
        assert_eq!(value("wic_pool_pages_used"), 12.0);
        assert_eq!(value("wic_uptime_seconds"), 93_784.0);
        assert_eq!(value("wic_gpus"), 2.0);
        let info: Vec<&Sample> = samples.iter().filter(|s| s.name == "wic_info").collect();
        assert_eq!(info.len(), 1);
        assert_eq!(info[0].labels["version"], "0.1.0");
        assert_eq!(info[0].labels["backend"], "emulated");
        assert_eq!(info[0].value, 1.0);

        for (family, h, scale) in
            [("wic_wake_latency_seconds", &stats.wake_latency_ns, 1e-9), ("wic_batch_size", &stats.batch_sizes, 1.0)]
        {
            assert_eq!(types[family], "histogram");
            let buckets: Vec<(f64, f64)> = samples
                .iter()
                .filter(|s| s.name == format!("{family}_bucket"))
                .map(|s| (s.labels["le"].parse::<f64>().unwrap(), s.value))
                .collect();
            assert!(buckets.windows(2).all(|w| w[0].0 < w[1].0), "le ascending: {family}");
            assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "cumulative: {family}");
            let (last_le, last) = *buckets.last().unwrap();
            assert!(last_le.is_infinite());
            assert_eq!(last, value(&format!("{family}_count")));
            assert_eq!(last, h.count as f64);
            assert!((value(&format!("{family}_sum")) - h.sum as f64 * scale).abs() < 1e-9);
            // Each bucket of the daemon's histogram shows up with the count up to it.
            for [upper, _] in &h.buckets {
                let expected: u64 = h.buckets.iter().filter(|[u, _]| u <= upper).map(|[_, n]| n).sum();
                let le = *upper as f64 * scale;
                let got = buckets.iter().find(|(b, _)| (b - le).abs() <= le * 1e-12).unwrap();
                assert_eq!(got.1, expected as f64, "{family} le={le}");
            }
        }
        // The exported latency buckets do not depend on which ones hold values.
        let le_count = |s: &Stats| metrics(s, &sample_status()).matches("wic_wake_latency_seconds_bucket").count();
        assert_eq!(le_count(&stats), le_count(&Stats::default()));
    }

    #[test]
    fn label_values_are_escaped() {
        let status = Status { version: "1.0 \"beta\"\\x\n".into(), ..sample_status() };
        let text = metrics(&Stats::default(), &status);
        assert!(text.contains(r#"wic_info{version="1.0 \"beta\"\\x\n",backend="emulated"} 1"#), "{text}");
    }

    /// The nearest-rank quantile of `values` by sorting them.
    fn brute_quantile(values: &[u64], q: f64) -> u64 {
        let mut sorted = values.to_vec();
        sorted.sort_unstable();
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }

    /// The log2 bucket index of `value`, computed by search rather than by bit tricks.
    fn bucket_index(value: u64) -> u32 {
        (0..=64).find(|&i| value <= log2_upper_bound(i)).unwrap()
    }

    #[test]
    fn quantiles_match_brute_force() {
        let values = [0, 1, 3, 5, 6, 7, 7, 100, 1000, 1000, 40_000];
        // Bucketed by hand: 0 | 1 | 2..=3 | 4..=7 | 64..=127 | 512..=1023 | 32768..=65535.
        let h = Histogram {
            count: 11,
            sum: values.iter().sum(),
            max: 40_000,
            buckets: vec![[0, 1], [1, 1], [3, 1], [7, 4], [127, 1], [1023, 2], [65_535, 1]],
        };
        let mut bucketed: BTreeMap<u64, u64> = BTreeMap::new();
        for v in values {
            *bucketed.entry(log2_upper_bound(bucket_index(v))).or_default() += 1;
        }
        assert_eq!(bucketed.into_iter().map(|(upper, n)| [upper, n]).collect::<Vec<_>>(), h.buckets);
        for percent in 0..=100 {
            let q = f64::from(percent) / 100.0;
            let truth = brute_quantile(&values, q);
            let expected = log2_upper_bound(bucket_index(truth)).min(h.max);
            assert_eq!(quantile_from_buckets(&h, q), Some(expected), "q = {q}");
            assert!(expected >= truth && expected <= 2 * truth + 1);
        }
        assert_eq!(quantile_from_buckets(&h, 0.5), Some(7));
        assert_eq!(quantile_from_buckets(&h, 1.0), Some(40_000), "clamped to max, not 65535");
        assert_eq!(quantile_from_buckets(&h, 2.0), quantile_from_buckets(&h, 1.0));
        assert_eq!(quantile_from_buckets(&h, f64::NAN), Some(0));
        assert_eq!(quantile_from_buckets(&Histogram::default(), 0.5), None);
    }

    #[test]
    fn stats_text_lists_every_counter_in_sections() {
        let sample = sample_stats();
        let text = stats(&sample, Some(12.5));
        let sections: Vec<&str> = text.lines().filter(|l| !l.starts_with(' ')).collect();
        assert_eq!(sections, ["faults", "monitor", "pool", "latency", "batches", "uvm", "service"]);
        let rows: BTreeMap<&str, &str> = text
            .lines()
            .filter(|l| l.starts_with(' '))
            .map(|l| {
                let (name, value) = l.trim().split_once(' ').unwrap();
                (name, value.trim())
            })
            .collect();
        for (field, value) in scalar_fields(&sample) {
            assert_eq!(rows.get(field.as_str()), Some(&value.to_string().as_str()), "{field}");
        }
        assert_eq!(rows["faults_completed_per_sec"], "12.5");
        assert_eq!(rows["wake_latency_count"], "6");
        assert_eq!(rows["wake_latency_mean"], "500.37 µs");
        assert_eq!(rows["wake_latency_p50"], "7 ns");
        assert_eq!(rows["wake_latency_p99"], "3.00 ms");
        assert_eq!(rows["wake_latency_max"], "3.00 ms");
        assert_eq!(rows["batch_sizes_mean"], "1.7");
        assert_eq!(rows["batch_sizes_p50"], "1");
        assert_eq!(rows["batch_sizes_max"], "3");
        assert_eq!(rows["submissions"], "2");
        assert_eq!(rows["submission_mean"], "4.00 µs");
        assert_eq!(rows["submission_pages_mean"], "4.0");
        assert_eq!(rows["uvm_fault_latency_count"], "2");
        assert_eq!(rows["uvm_fault_latency_mean"], "45.00 µs");
        assert_eq!(rows["uvm_fault_latency_max"], "50.00 µs");
        assert_eq!(rows["uvm_fault_gpu_latency_p50"], "30.00 µs");
        // Values line up on the right.
        let ends: HashSet<usize> = text.lines().filter(|l| l.starts_with(' ')).map(|l| l.chars().count()).collect();
        assert_eq!(ends.len(), 1, "{text}");

        let empty = stats(&Stats::default(), None);
        assert!(!empty.contains("per_sec"));
        assert!(empty.lines().any(|l| l.split_whitespace().eq(["wake_latency_p99", "-"])), "{empty}");
    }

    #[test]
    fn human_units() {
        assert_eq!(human_ns(850.0), "850 ns");
        assert_eq!(human_ns(12_300.0), "12.30 µs");
        assert_eq!(human_ns(4_560_000.0), "4.56 ms");
        assert_eq!(human_ns(1.2e9), "1.20 s");
        assert_eq!(human_count(3.0), "3");
        assert_eq!(human_count(5.0 / 3.0), "1.7");
        assert_eq!(human_uptime(0), "0s");
        assert_eq!(human_uptime(61_000_000_000), "1m 1s");
        assert_eq!(human_uptime(93_784_000_000_000), "1d 2h 3m 4s");
    }

    #[test]
    fn status_summary() {
        let text = status(&sample_status());
        assert!(text.lines().any(|l| l.split_whitespace().eq(["uptime", "1d", "2h", "3m", "4s"])), "{text}");
        assert!(text.lines().any(|l| l.split_whitespace().eq(["pool", "12/4096", "pages", "used"])), "{text}");
        assert!(text.contains("emulated") && text.contains("4242"), "{text}");
    }

    fn summary(channel: u32, producer: Producer, publishes: u64) -> ChannelSummary {
        ChannelSummary {
            channel,
            owner_pid: 1234,
            owner_uid: 1000,
            spec: ChannelSpec { consumer_gpu: 0, producer, message_bytes: 64, slots: 8, timeout_ns: 0 },
            pages: 32,
            attached: 1,
            publishes,
            deliveries: publishes,
            timeouts: 0,
            client_overflows: 3,
        }
    }

    #[test]
    fn channel_table() {
        assert_eq!(channels(&[]), "no channels\n");

        let text = channels(&[
            summary(1, Producer::Host, 5),
            summary(12, Producer::Gpu { gpu: 1, base_va: 0x7f00_0000_0000 }, 1_234_567),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        let header: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(
            header,
            [
                "ID",
                "OWNER",
                "GPU",
                "PRODUCER",
                "MSG_BYTES",
                "SLOTS",
                "PAGES",
                "ATTACHED",
                "PUBLISHES",
                "DELIVERIES",
                "TIMEOUTS",
                "CLIENT_OVERFLOWS"
            ]
        );
        let first: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(first, ["1", "1234/1000", "0", "host", "64", "8", "32", "1", "5", "5", "0", "3"]);
        assert_eq!(lines[2].split_whitespace().nth(3), Some("gpu1"));
        // Every line has the same length: the last column is right-aligned, with no trailing blanks.
        assert!(lines.iter().all(|l| l.len() == lines[0].len() && !l.ends_with(' ')), "{text}");
        // Right-aligned columns end where their header ends.
        let end = |line: &str, word: &str| line.find(word).unwrap() + word.len();
        assert_eq!(end(lines[0], "PUBLISHES"), end(lines[2], "1234567"));
        // Left-aligned columns start where their header starts.
        assert_eq!(lines[0].find("PRODUCER"), lines[1].find("host"));
    }

    #[test]
    fn decodes_an_encoded_entry() {
        let va = 0x7f12_3456_7000;
        let entry = FaultEntry::replayable_gpc(va, AccessType::Write, 0x1234_5678, 0x1_fedc_b000, 3, 0x15);
        let raw = RawFaultEntry::from_hex(&entry.encode().to_hex()).unwrap();
        let text = fault_text(&raw, VaWidth::Bits57);
        assert!(text.contains("0x00007f1234567000"), "{text}");
        assert!(text.contains("VIRT_WRITE"), "{text}");
        assert!(text.contains("INVALID_PTE"), "{text}");
        assert!(text.lines().any(|l| l.split_whitespace().eq(["va", "width:", "57", "bits"])), "{text}");
        let dwords = text.lines().find(|l| l.starts_with("dwords:")).unwrap();
        let expected: Vec<String> = (0..8).map(|i| format!("{:08x}", raw.dword(i))).collect();
        assert!(dwords.split_whitespace().skip(1).eq(expected.iter().map(String::as_str)), "{dwords}");

        let value = fault_json(&raw, VaWidth::Bits49);
        assert_eq!(value["va"], "0x00007f1234567000");
        assert_eq!(value["access_type"], "VIRT_WRITE");
        assert_eq!(value["write"], true);
        assert_eq!(value["fault_type"], "INVALID_PTE");
        assert_eq!(value["gpc_id"], 3);
        assert_eq!(value["va_bits"], 49);
        assert_eq!(value["dwords"].as_array().unwrap().len(), 8);
        assert_eq!(value["raw"], raw.to_hex());
    }
}
