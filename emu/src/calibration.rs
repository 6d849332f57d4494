//! The emulator's constants, each with its provenance, read from `calibration.toml`.
//!
//! The built-in file is compiled in; `Calibration::from_toml` reads another one (for example a
//! file of values measured on a real GPU). A missing or malformed constant is an error, never a
//! silent default, and so is one outside its allowed range (see [`Calibration::from_toml`]).

use std::fmt::Debug;
use std::ops::RangeInclusive;

use serde::Deserialize;

/// One constant and where it came from.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Constant<T> {
    pub value: T,
    pub source: String,
    /// True only for values measured on real hardware.
    #[serde(default)]
    pub measured: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    pub sms: Constant<u32>,
    pub warp_slots_per_sm: Constant<u32>,
    pub schedulers_per_sm: Constant<u32>,
    pub clock_ghz: Constant<f64>,
    pub warp_ipc: Constant<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    pub buffer_entries: Constant<u32>,
    pub batch_max: Constant<u32>,
    pub interrupt_to_bh_ns: Constant<u64>,
    pub batch_fixed_ns: Constant<u64>,
    pub per_fault_ns: Constant<u64>,
    pub replay_ns: Constant<u64>,
    pub cpu_fault_ns: Constant<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    pub pcie_gbps: Constant<f64>,
    pub pcie_latency_ns: Constant<u64>,
    pub nvlink_gbps: Constant<f64>,
    pub nvlink_latency_ns: Constant<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    pub memcpy_gbps: Constant<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Poll {
    /// A spinning warp's share of issue slots, relative to a computing warp's.
    pub issue_weight: Constant<f64>,
    /// wic.cuh's poll with a host producer (see `sim::Mode::Poll`): from the host's publish of a
    /// small message to the one warp spinning on its ready word having it...
    pub host_one_way_ns: Constant<u64>,
    /// ...and what each further warp spinning on host memory adds to it.
    pub host_one_way_per_spinner_ns: Constant<u64>,
    /// The host thread's own time in one publish (the copy, its completion, the ready words),
    /// with one warp spinning...
    pub host_publish_ns: Constant<u64>,
    /// ...and what each further spinning warp adds to it.
    pub host_publish_per_spinner_ns: Constant<u64>,
    /// From a producer kernel on another GPU starting to write a small message to the warp
    /// spinning on its ready word across the link having it.
    pub peer_one_way_ns: Constant<u64>,
    /// Speed, relative to alone, of memory accesses that leave the SM while warps of the SM
    /// spin on words in host memory (their arithmetic pays only the issue weight).
    pub host_spin_memory_progress: Constant<f64>,
}

impl Poll {
    /// Speed, relative to alone, of work that spends `memory_share` of its time alone on memory
    /// accesses leaving the SM, beside warps spinning on host memory.
    pub fn progress_beside_host_spinners(&self, memory_share: f64) -> f64 {
        progress(1.0, self.host_spin_memory_progress.value, memory_share)
    }
}

/// wic.cuh's push transport on the stock driver (see `sim::Mode::Push`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Push {
    /// From a host thread's publish of a small message to the waiting warp having it.
    pub host_one_way_ns: Constant<u64>,
    /// The host thread's own time in one publish (the driver calls): a host producer
    /// publishes no faster than one batch per this long.
    pub host_publish_ns: Constant<u64>,
    /// From a producer kernel on another GPU starting to write a small message to the warp
    /// having it.
    pub peer_one_way_ns: Constant<u64>,
}

/// What a warp stalled on a replayable fault costs the other warps of its SM (see `sim`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stall {
    /// Speed of arithmetic work, relative to alone, while a warp of its SM is fault-stalled.
    pub compute_progress: Constant<f64>,
    /// Speed of work on memory accesses that leave the SM (L1 misses), likewise.
    pub memory_progress: Constant<f64>,
}

impl Stall {
    /// Speed, relative to alone, of work that spends `memory_share` of its time alone on memory
    /// accesses leaving the SM, while a warp of its SM is fault-stalled: the two parts slow down
    /// each by its own measured factor, one after the other.
    pub fn progress(&self, memory_share: f64) -> f64 {
        progress(self.compute_progress.value, self.memory_progress.value, memory_share)
    }
}

/// Speed, relative to alone, of work that spends `memory_share` of its time alone on memory
/// accesses leaving the SM, when its arithmetic goes at `compute` and those accesses at `memory`
/// of their speed alone: the two parts slow down each by its own factor, one after the other.
fn progress(compute: f64, memory: f64, memory_share: f64) -> f64 {
    1.0 / ((1.0 - memory_share) / compute + memory_share / memory)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Daemon {
    pub wakeup_ns: Constant<u64>,
    pub engine_per_entry_ns: Constant<u64>,
    pub submission_ns: Constant<u64>,
    pub per_page_ns: Constant<u64>,
    pub publish_ns: Constant<u64>,
}

/// Every constant of the model.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    pub gpu: Gpu,
    pub fault: Fault,
    pub link: Link,
    pub host: Host,
    pub poll: Poll,
    pub push: Push,
    pub stall: Stall,
    pub daemon: Daemon,
}

/// The calibration file shipped with the emulator.
pub const BUILT_IN: &str = include_str!("../calibration.toml");

// The ranges a calibration file's constants must lie in. Each is physically generous (an H100,
// and any GPU, link or host like it, lies well inside) and together they keep the model's work
// bounded: the SM and warp-slot counts size the emulated GPUs and the loops that fill them, the
// fault buffer and batch sizes bound what one bottom half holds, every latency and per-item cost
// is at most a second and every rate is above zero, so each step of a run takes a finite time.
// The emulator adds those times saturating, and a run whose clock would pass 2^62 ns, that stops
// making progress or that reaches a state the model does not follow (a wait timed out) ends as an
// error (see `sim::try_run`): no calibration makes it panic, overflow or wrap.

/// SMs per GPU (H100 SXM5: 132).
pub const SMS: RangeInclusive<u32> = 1..=1024;
/// Resident warps per SM (H100: 64).
pub const WARP_SLOTS_PER_SM: RangeInclusive<u32> = 1..=1024;
/// Warp schedulers per SM (H100: 4).
pub const SCHEDULERS_PER_SM: RangeInclusive<u32> = 1..=64;
/// SM clock in GHz (H100: 1.98).
pub const CLOCK_GHZ: RangeInclusive<f64> = 0.01..=10.0;
/// Instructions per cycle of one warp alone (estimate: 0.5).
pub const WARP_IPC: RangeInclusive<f64> = 0.001..=4.0;
/// Entries of the replayable fault buffer, and faults in one bottom-half batch (both 2^20 at most).
pub const FAULT_ENTRIES: RangeInclusive<u32> = 1..=1 << 20;
/// Every latency and per-item cost in nanoseconds: zero (to leave a cost out) to one second.
pub const LATENCY_NS: RangeInclusive<u64> = 0..=1_000_000_000;
/// Every rate in GB/s: 10 MB/s to 100 TB/s.
pub const GBPS: RangeInclusive<f64> = 0.01..=100_000.0;
/// The issue-slot share of a polling warp relative to a computing one.
pub const ISSUE_WEIGHT: RangeInclusive<f64> = 0.0..=1.0;
/// Speed beside a fault-stalled warp, relative to alone: above zero (a run must end) to 1.
pub const PROGRESS: RangeInclusive<f64> = 1e-6..=1.0;

/// `value` of constant `name` if it lies within `range`; an error naming all three otherwise (a
/// float that is not a number lies in no range). Floats are shown as `Debug` writes them: `10.0`,
/// `1e-300`, `NaN`.
fn within<T: PartialOrd + Debug>(name: &str, value: T, range: &RangeInclusive<T>) -> Result<(), String> {
    if range.contains(&value) {
        return Ok(());
    }
    Err(format!(
        "calibration: {name} = {value:?} is outside the allowed range {:?} to {:?}",
        range.start(),
        range.end()
    ))
}

/// `text`, a calibration file, with the integer constant `key` (`section.name`, as
/// [`Calibration::table`] names it) set to `value`, marked measured and given `source`. Only
/// those three fields change: the file's comments, layout and other constants stay as written,
/// so the provenance of the rest survives. The result is checked as [`Calibration::from_toml`]
/// checks any file.
pub fn set_measured(text: &str, key: &str, value: u64, source: &str) -> Result<String, String> {
    let mut file: toml_edit::DocumentMut = text.parse().map_err(|e| format!("calibration: {e}"))?;
    let constant = key
        .split('.')
        .try_fold(file.as_item_mut(), |item, part| item.get_mut(part))
        .and_then(toml_edit::Item::as_table_like_mut)
        .ok_or_else(|| format!("calibration: the file has no constant {key}"))?;
    let value = i64::try_from(value).map_err(|_| format!("calibration: {key} = {value} is past a TOML integer"))?;
    constant.insert("value", toml_edit::value(value));
    constant.insert("source", toml_edit::value(source));
    constant.insert("measured", toml_edit::value(true));
    let text = file.to_string();
    Calibration::from_toml(&text)?;
    Ok(text)
}

impl Calibration {
    /// Parses and checks a calibration file: every constant must be present, known and within its
    /// range ([`SMS`], [`WARP_SLOTS_PER_SM`], [`SCHEDULERS_PER_SM`], [`CLOCK_GHZ`], [`WARP_IPC`],
    /// [`FAULT_ENTRIES`], [`LATENCY_NS`], [`GBPS`], [`ISSUE_WEIGHT`], [`PROGRESS`]).
    pub fn from_toml(text: &str) -> Result<Self, String> {
        let cal: Self = toml::from_str(text).map_err(|e| format!("calibration: {e}"))?;
        cal.checked()
    }

    /// The built-in calibration.
    pub fn built_in() -> Self {
        Self::from_toml(BUILT_IN).expect("the built-in calibration is valid")
    }

    /// Multiplies the fault path's latencies (the GPU's and nvidia-uvm's part of serving a
    /// fault: interrupt to bottom half, batch, per fault, replay, CPU fault) by `factor`,
    /// saturating; wicd's own costs stay.
    pub fn scale_fault_path(&mut self, factor: f64) {
        for (_, latency) in self.latencies_mut().into_iter().take(5) {
            *latency = (*latency as f64 * factor).round() as u64;
        }
    }

    /// Every latency constant with its key, the fault path's five first.
    pub(crate) fn latencies_mut(&mut self) -> [(&'static str, &mut u64); 20] {
        let (f, l, d, p, q) = (&mut self.fault, &mut self.link, &mut self.daemon, &mut self.push, &mut self.poll);
        [
            ("fault.interrupt_to_bh_ns", &mut f.interrupt_to_bh_ns.value),
            ("fault.batch_fixed_ns", &mut f.batch_fixed_ns.value),
            ("fault.per_fault_ns", &mut f.per_fault_ns.value),
            ("fault.replay_ns", &mut f.replay_ns.value),
            ("fault.cpu_fault_ns", &mut f.cpu_fault_ns.value),
            ("link.pcie_latency_ns", &mut l.pcie_latency_ns.value),
            ("link.nvlink_latency_ns", &mut l.nvlink_latency_ns.value),
            ("daemon.wakeup_ns", &mut d.wakeup_ns.value),
            ("daemon.engine_per_entry_ns", &mut d.engine_per_entry_ns.value),
            ("daemon.submission_ns", &mut d.submission_ns.value),
            ("daemon.per_page_ns", &mut d.per_page_ns.value),
            ("daemon.publish_ns", &mut d.publish_ns.value),
            ("push.host_one_way_ns", &mut p.host_one_way_ns.value),
            ("push.host_publish_ns", &mut p.host_publish_ns.value),
            ("push.peer_one_way_ns", &mut p.peer_one_way_ns.value),
            ("poll.host_one_way_ns", &mut q.host_one_way_ns.value),
            ("poll.host_one_way_per_spinner_ns", &mut q.host_one_way_per_spinner_ns.value),
            ("poll.host_publish_ns", &mut q.host_publish_ns.value),
            ("poll.host_publish_per_spinner_ns", &mut q.host_publish_per_spinner_ns.value),
            ("poll.peer_one_way_ns", &mut q.peer_one_way_ns.value),
        ]
    }

    fn checked(mut self) -> Result<Self, String> {
        let (g, f) = (&self.gpu, &self.fault);
        within("gpu.sms", g.sms.value, &SMS)?;
        within("gpu.warp_slots_per_sm", g.warp_slots_per_sm.value, &WARP_SLOTS_PER_SM)?;
        within("gpu.schedulers_per_sm", g.schedulers_per_sm.value, &SCHEDULERS_PER_SM)?;
        within("gpu.clock_ghz", g.clock_ghz.value, &CLOCK_GHZ)?;
        within("gpu.warp_ipc", g.warp_ipc.value, &WARP_IPC)?;
        within("fault.buffer_entries", f.buffer_entries.value, &FAULT_ENTRIES)?;
        within("fault.batch_max", f.batch_max.value, &FAULT_ENTRIES)?;
        for (name, value) in self.latencies_mut() {
            within(name, *value, &LATENCY_NS)?;
        }
        let l = &self.link;
        for (name, value) in [
            ("link.pcie_gbps", l.pcie_gbps.value),
            ("link.nvlink_gbps", l.nvlink_gbps.value),
            ("host.memcpy_gbps", self.host.memcpy_gbps.value),
        ] {
            within(name, value, &GBPS)?;
        }
        within("poll.issue_weight", self.poll.issue_weight.value, &ISSUE_WEIGHT)?;
        within("stall.compute_progress", self.stall.compute_progress.value, &PROGRESS)?;
        within("stall.memory_progress", self.stall.memory_progress.value, &PROGRESS)?;
        within("poll.host_spin_memory_progress", self.poll.host_spin_memory_progress.value, &PROGRESS)?;
        Ok(self)
    }

    /// (name, value, source, measured) of every constant, for reports.
    pub fn table(&self) -> Vec<(&'static str, String, &str, bool)> {
        fn row<'c, T: std::fmt::Display>(
            name: &'static str,
            c: &'c Constant<T>,
        ) -> (&'static str, String, &'c str, bool) {
            (name, c.value.to_string(), c.source.as_str(), c.measured)
        }
        vec![
            row("gpu.sms", &self.gpu.sms),
            row("gpu.warp_slots_per_sm", &self.gpu.warp_slots_per_sm),
            row("gpu.schedulers_per_sm", &self.gpu.schedulers_per_sm),
            row("gpu.clock_ghz", &self.gpu.clock_ghz),
            row("gpu.warp_ipc", &self.gpu.warp_ipc),
            row("fault.buffer_entries", &self.fault.buffer_entries),
            row("fault.batch_max", &self.fault.batch_max),
            row("fault.interrupt_to_bh_ns", &self.fault.interrupt_to_bh_ns),
            row("fault.batch_fixed_ns", &self.fault.batch_fixed_ns),
            row("fault.per_fault_ns", &self.fault.per_fault_ns),
            row("fault.replay_ns", &self.fault.replay_ns),
            row("fault.cpu_fault_ns", &self.fault.cpu_fault_ns),
            row("link.pcie_gbps", &self.link.pcie_gbps),
            row("link.pcie_latency_ns", &self.link.pcie_latency_ns),
            row("link.nvlink_gbps", &self.link.nvlink_gbps),
            row("link.nvlink_latency_ns", &self.link.nvlink_latency_ns),
            row("host.memcpy_gbps", &self.host.memcpy_gbps),
            row("poll.issue_weight", &self.poll.issue_weight),
            row("poll.host_one_way_ns", &self.poll.host_one_way_ns),
            row("poll.host_one_way_per_spinner_ns", &self.poll.host_one_way_per_spinner_ns),
            row("poll.host_publish_ns", &self.poll.host_publish_ns),
            row("poll.host_publish_per_spinner_ns", &self.poll.host_publish_per_spinner_ns),
            row("poll.peer_one_way_ns", &self.poll.peer_one_way_ns),
            row("poll.host_spin_memory_progress", &self.poll.host_spin_memory_progress),
            row("push.host_one_way_ns", &self.push.host_one_way_ns),
            row("push.host_publish_ns", &self.push.host_publish_ns),
            row("push.peer_one_way_ns", &self.push.peer_one_way_ns),
            row("stall.compute_progress", &self.stall.compute_progress),
            row("stall.memory_progress", &self.stall.memory_progress),
            row("daemon.wakeup_ns", &self.daemon.wakeup_ns),
            row("daemon.engine_per_entry_ns", &self.daemon.engine_per_entry_ns),
            row("daemon.submission_ns", &self.daemon.submission_ns),
            row("daemon.per_page_ns", &self.daemon.per_page_ns),
            row("daemon.publish_ns", &self.daemon.publish_ns),
        ]
    }

    /// Nanoseconds to move `bytes` over PCIe, latency included.
    pub fn pcie_ns(&self, bytes: u64) -> u64 {
        self.link.pcie_latency_ns.value.saturating_add(transfer_ns(bytes, self.link.pcie_gbps.value))
    }

    /// Nanoseconds to move `bytes` over NVLink, latency included.
    pub fn nvlink_ns(&self, bytes: u64) -> u64 {
        self.link.nvlink_latency_ns.value.saturating_add(transfer_ns(bytes, self.link.nvlink_gbps.value))
    }

    /// Nanoseconds for the host to copy `bytes`.
    pub fn memcpy_ns(&self, bytes: u64) -> u64 {
        transfer_ns(bytes, self.host.memcpy_gbps.value)
    }
}

/// GB/s is bytes per nanosecond. Saturates at `u64::MAX` (a cast from `f64` does).
pub(crate) fn transfer_ns(bytes: u64, gbps: f64) -> u64 {
    (bytes as f64 / gbps).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_parses_and_every_constant_has_a_source() {
        let cal = Calibration::built_in();
        assert_eq!(cal.table().len(), 34);
        assert!(cal.table().iter().all(|(_, _, source, _)| source.len() > 10));
    }

    #[test]
    fn missing_unknown_and_bad_constants_are_errors() {
        let without_sms = BUILT_IN.replace("[gpu.sms]\nvalue = 132\n", "[gpu.sms]\n");
        assert!(Calibration::from_toml(&without_sms).unwrap_err().contains("value"));
        let unknown = format!("{BUILT_IN}\n[gpu.bogus]\nvalue = 1\nsource = \"x\"\n");
        assert!(Calibration::from_toml(&unknown).is_err());
        let zero_clock = BUILT_IN.replace("value = 1.98", "value = 0.0");
        assert!(Calibration::from_toml(&zero_clock).unwrap_err().contains("gpu.clock_ghz"));
    }

    /// The built-in file with `key`'s value replaced by `value`.
    fn with_value(text: &str, key: &str, value: &str) -> String {
        let header = format!("[{key}]\nvalue = ");
        let start = text.find(&header).unwrap_or_else(|| panic!("no {key}")) + header.len();
        let end = start + text[start..].find('\n').expect("a line");
        format!("{}{value}{}", &text[..start], &text[end..])
    }

    const LATENCIES: [&str; 20] = [
        "fault.interrupt_to_bh_ns",
        "fault.batch_fixed_ns",
        "fault.per_fault_ns",
        "fault.replay_ns",
        "fault.cpu_fault_ns",
        "link.pcie_latency_ns",
        "link.nvlink_latency_ns",
        "daemon.wakeup_ns",
        "daemon.engine_per_entry_ns",
        "daemon.submission_ns",
        "daemon.per_page_ns",
        "daemon.publish_ns",
        "push.host_one_way_ns",
        "push.host_publish_ns",
        "push.peer_one_way_ns",
        "poll.host_one_way_ns",
        "poll.host_one_way_per_spinner_ns",
        "poll.host_publish_ns",
        "poll.host_publish_per_spinner_ns",
        "poll.peer_one_way_ns",
    ];
    const RATES: [&str; 3] = ["link.pcie_gbps", "link.nvlink_gbps", "host.memcpy_gbps"];

    /// One constant's range as a test sees it.
    struct Range {
        key: &'static str,
        /// The values at its ends, as a file writes them.
        ends: [&'static str; 2],
        /// Values past them, as a file writes them and as the error shows them.
        past: Vec<(&'static str, &'static str)>,
        /// The range as the error shows it.
        shown: &'static str,
    }

    /// Every constant's range.
    fn ranges() -> Vec<Range> {
        let all = vec![
            ("gpu.sms", ["1", "1024"], vec![("0", "0"), ("1025", "1025"), ("4294967295", "4294967295")], "1 to 1024"),
            (
                "gpu.warp_slots_per_sm",
                ["1", "1024"],
                vec![("0", "0"), ("1025", "1025"), ("4294967295", "4294967295")],
                "1 to 1024",
            ),
            ("gpu.schedulers_per_sm", ["1", "64"], vec![("0", "0"), ("65", "65")], "1 to 64"),
            (
                "gpu.clock_ghz",
                ["0.01", "10.0"],
                vec![("0.0", "0.0"), ("-1.0", "-1.0"), ("10.5", "10.5"), ("nan", "NaN"), ("inf", "inf")],
                "0.01 to 10.0",
            ),
            (
                "gpu.warp_ipc",
                ["0.001", "4.0"],
                vec![("0.0", "0.0"), ("4.5", "4.5"), ("1e-300", "1e-300")],
                "0.001 to 4.0",
            ),
            ("fault.buffer_entries", ["1", "1048576"], vec![("0", "0"), ("1048577", "1048577")], "1 to 1048576"),
            ("fault.batch_max", ["1", "1048576"], vec![("0", "0"), ("4294967295", "4294967295")], "1 to 1048576"),
            ("poll.issue_weight", ["0.0", "1.0"], vec![("-0.1", "-0.1"), ("1.5", "1.5"), ("nan", "NaN")], "0.0 to 1.0"),
            (
                "stall.compute_progress",
                ["0.000001", "1.0"],
                vec![("0.0", "0.0"), ("1.5", "1.5"), ("nan", "NaN")],
                "1e-6 to 1.0",
            ),
            (
                "stall.memory_progress",
                ["0.000001", "1.0"],
                vec![("0.0", "0.0"), ("-1.0", "-1.0"), ("inf", "inf")],
                "1e-6 to 1.0",
            ),
            (
                "poll.host_spin_memory_progress",
                ["0.000001", "1.0"],
                vec![("0.0", "0.0"), ("1.5", "1.5"), ("nan", "NaN")],
                "1e-6 to 1.0",
            ),
        ];
        let latencies = LATENCIES.map(|key| {
            let past = vec![("1000000001", "1000000001"), ("9223372036854775807", "9223372036854775807")];
            (key, ["0", "1000000000"], past, "0 to 1000000000")
        });
        let rates = RATES.map(|key| {
            let past = vec![("0.0", "0.0"), ("0.009", "0.009"), ("1e6", "1000000.0"), ("-inf", "-inf"), ("nan", "NaN")];
            (key, ["0.01", "100000.0"], past, "0.01 to 100000.0")
        });
        all.into_iter()
            .chain(latencies)
            .chain(rates)
            .map(|(key, ends, past, shown)| Range { key, ends, past, shown })
            .collect()
    }

    #[test]
    fn every_constant_has_a_range_and_the_built_in_lies_inside() {
        let keys: Vec<&str> = ranges().iter().map(|r| r.key).collect();
        let names: Vec<&str> = Calibration::built_in().table().iter().map(|r| r.0).collect();
        assert_eq!(keys.len(), names.len());
        assert!(names.iter().all(|name| keys.contains(name)), "{names:?}");
    }

    #[test]
    fn a_constant_past_its_range_is_refused_naming_the_key_the_value_and_the_range() {
        for Range { key, past, shown: range, .. } in ranges() {
            for (written, shown) in past {
                let e = Calibration::from_toml(&with_value(BUILT_IN, key, written)).expect_err(key);
                assert_eq!(e, format!("calibration: {key} = {shown} is outside the allowed range {range}"));
            }
        }
        // Past what TOML or the field's type holds: a parse error, not a panic.
        for (key, written) in
            [("gpu.sms", "4294967296"), ("fault.replay_ns", "18446744073709551615"), ("fault.replay_ns", "-1")]
        {
            let e = Calibration::from_toml(&with_value(BUILT_IN, key, written)).expect_err(key);
            assert!(e.starts_with("calibration: "), "{key} = {written}: {e}");
        }
    }

    #[test]
    fn the_ends_of_every_range_are_accepted() {
        for end in 0..2 {
            let text = ranges().iter().fold(BUILT_IN.to_string(), |text, r| with_value(&text, r.key, r.ends[end]));
            let cal = Calibration::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(cal.gpu.sms.value, [1, 1024][end]);
        }
    }

    #[test]
    fn setting_a_measured_constant_changes_it_alone_and_keeps_the_comments() {
        let text = set_measured(BUILT_IN, "daemon.per_page_ns", 173, "measured \"here\"").unwrap();
        let (cal, built_in) = (Calibration::from_toml(&text).unwrap(), Calibration::built_in());
        let c = &cal.daemon.per_page_ns;
        assert_eq!((c.value, c.source.as_str(), c.measured), (173, "measured \"here\"", true));
        let changed: Vec<_> = cal.table().into_iter().zip(built_in.table()).filter(|(a, b)| a != b).collect();
        assert_eq!(changed.len(), 1, "{changed:?}");
        assert!(text.contains("# Derived by device/bench/derive.py"), "{text}");
        // Already measured: `measured` is not written twice.
        let again = set_measured(&text, "daemon.per_page_ns", 174, "again").unwrap();
        assert_eq!(Calibration::from_toml(&again).unwrap().daemon.per_page_ns.value, 174);
    }

    #[test]
    fn an_inline_constant_is_set_too_and_bad_settings_are_refused() {
        let block = BUILT_IN.find("[daemon.publish_ns]").expect("the last constant");
        let inline = format!("{}[daemon]\npublish_ns = {{ value = 1000, source = \"old\" }}\n", &BUILT_IN[..block]);
        let cal = Calibration::from_toml(&set_measured(&inline, "daemon.publish_ns", 5, "new").unwrap()).unwrap();
        assert_eq!((cal.daemon.publish_ns.value, cal.daemon.publish_ns.measured), (5, true));
        let e = set_measured(BUILT_IN, "daemon.bogus_ns", 5, "x").unwrap_err();
        assert_eq!(e, "calibration: the file has no constant daemon.bogus_ns");
        let e = set_measured(BUILT_IN, "daemon.per_page_ns", 1_000_000_001, "x").unwrap_err();
        assert!(e.contains("daemon.per_page_ns = 1000000001 is outside"), "{e}");
        let e = set_measured(BUILT_IN, "gpu", 5, "x").unwrap_err();
        assert!(e.contains("unknown field `value`"), "{e}");
    }

    #[test]
    fn scaling_the_fault_path_leaves_wicds_costs() {
        let mut cal = Calibration::built_in();
        cal.scale_fault_path(0.5);
        let built_in = Calibration::built_in();
        assert_eq!(cal.fault.replay_ns.value, (built_in.fault.replay_ns.value as f64 * 0.5).round() as u64);
        assert_eq!(cal.fault.per_fault_ns.value, (built_in.fault.per_fault_ns.value as f64 * 0.5).round() as u64);
        assert_eq!(cal.daemon.wakeup_ns.value, built_in.daemon.wakeup_ns.value);
        assert_eq!(cal.link.pcie_latency_ns.value, built_in.link.pcie_latency_ns.value);
    }

    #[test]
    fn transfer_times_scale_with_bytes() {
        let cal = Calibration::built_in();
        assert_eq!(cal.pcie_ns(0), cal.link.pcie_latency_ns.value);
        assert!(cal.pcie_ns(1 << 20) > cal.nvlink_ns(1 << 20));
        let gbps = cal.host.memcpy_gbps.value;
        assert_eq!(cal.memcpy_ns(10_000), (10_000.0 / gbps).ceil() as u64, "10 kB at {gbps} GB/s");
        assert!(cal.memcpy_ns(20_000) >= 2 * cal.memcpy_ns(10_000) - 1);
    }
}
