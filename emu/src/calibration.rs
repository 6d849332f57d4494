//! The emulator's constants, each with its provenance, read from `calibration.toml`.
//!
//! The built-in file is compiled in; `Calibration::from_toml` reads another one (for example a
//! file of values measured on a real GPU). A missing or malformed constant is an error, never a
//! silent default.

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
    pub issue_weight: Constant<f64>,
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
    pub daemon: Daemon,
}

/// The calibration file shipped with the emulator.
pub const BUILT_IN: &str = include_str!("../calibration.toml");

impl Calibration {
    /// Parses and checks a calibration file.
    pub fn from_toml(text: &str) -> Result<Self, String> {
        let cal: Self = toml::from_str(text).map_err(|e| format!("calibration: {e}"))?;
        cal.check()?;
        Ok(cal)
    }

    /// The built-in calibration.
    pub fn built_in() -> Self {
        Self::from_toml(BUILT_IN).expect("the built-in calibration is valid")
    }

    fn check(&self) -> Result<(), String> {
        let positive = [
            ("gpu.sms", f64::from(self.gpu.sms.value)),
            ("gpu.warp_slots_per_sm", f64::from(self.gpu.warp_slots_per_sm.value)),
            ("gpu.schedulers_per_sm", f64::from(self.gpu.schedulers_per_sm.value)),
            ("gpu.clock_ghz", self.gpu.clock_ghz.value),
            ("gpu.warp_ipc", self.gpu.warp_ipc.value),
            ("fault.buffer_entries", f64::from(self.fault.buffer_entries.value)),
            ("fault.batch_max", f64::from(self.fault.batch_max.value)),
            ("link.pcie_gbps", self.link.pcie_gbps.value),
            ("link.nvlink_gbps", self.link.nvlink_gbps.value),
            ("host.memcpy_gbps", self.host.memcpy_gbps.value),
        ];
        for (name, value) in positive {
            if !(value > 0.0 && value.is_finite()) {
                return Err(format!("calibration: {name} must be positive, got {value}"));
            }
        }
        if !(0.0..=1.0).contains(&self.poll.issue_weight.value) {
            return Err("calibration: poll.issue_weight must be within 0..=1".into());
        }
        Ok(())
    }

    /// (name, value, source, measured) of every constant, for reports.
    pub fn table(&self) -> Vec<(&'static str, String, &str, bool)> {
        fn row<'c, T: std::fmt::Display>(name: &'static str, c: &'c Constant<T>) -> (&'static str, String, &'c str, bool) {
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
            row("daemon.wakeup_ns", &self.daemon.wakeup_ns),
            row("daemon.engine_per_entry_ns", &self.daemon.engine_per_entry_ns),
            row("daemon.submission_ns", &self.daemon.submission_ns),
            row("daemon.per_page_ns", &self.daemon.per_page_ns),
            row("daemon.publish_ns", &self.daemon.publish_ns),
        ]
    }

    /// Nanoseconds to move `bytes` over PCIe, latency included.
    pub fn pcie_ns(&self, bytes: u64) -> u64 {
        self.link.pcie_latency_ns.value + transfer_ns(bytes, self.link.pcie_gbps.value)
    }

    /// Nanoseconds to move `bytes` over NVLink, latency included.
    pub fn nvlink_ns(&self, bytes: u64) -> u64 {
        self.link.nvlink_latency_ns.value + transfer_ns(bytes, self.link.nvlink_gbps.value)
    }

    /// Nanoseconds for the host to copy `bytes`.
    pub fn memcpy_ns(&self, bytes: u64) -> u64 {
        transfer_ns(bytes, self.host.memcpy_gbps.value)
    }
}

/// GB/s is bytes per nanosecond.
fn transfer_ns(bytes: u64, gbps: f64) -> u64 {
    (bytes as f64 / gbps).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_parses_and_every_constant_has_a_source() {
        let cal = Calibration::built_in();
        assert_eq!(cal.table().len(), 23);
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
