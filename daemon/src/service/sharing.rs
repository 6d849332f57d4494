//! The deployment rule for held faults (docs/operations.md): a held replayable fault blocks
//! preemption of its channel, so every other context time-sliced on that GPU (or MIG
//! partition) waits while wic holds it. A GPU is safe for wic when nothing else can be
//! time-sliced with its applications: MIG on (partitions are scheduled apart), or compute mode
//! EXCLUSIVE_PROCESS (one context). The check is pure: NVML's answer comes in, the verdict
//! goes out.

use serde::Deserialize;

use crate::nvml::{ComputeMode, Gpu, NvmlError};

/// `[shim] gpu_sharing`: what wicd does when an application attaches while a GPU would let
/// other contexts be time-sliced with wic's held faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SharingPolicy {
    /// Attach, and log a warning naming each such GPU (and when the GPUs cannot be checked).
    Warn,
    /// Refuse the attachment, naming them; also when the GPUs cannot be checked.
    Refuse,
    /// Do not look.
    Ignore,
}

/// Why `gpu` lets other contexts be time-sliced with a held fault, or `None` when it does not.
pub fn shared(gpu: &Gpu) -> Option<String> {
    if gpu.mig {
        return None;
    }
    match gpu.compute_mode {
        ComputeMode::ExclusiveProcess | ComputeMode::Prohibited => None,
        mode => Some(format!(
            "GPU {} ({}, {}) is in compute mode {mode} without MIG: other contexts there stall while wic holds a fault",
            gpu.index, gpu.name, gpu.uuid
        )),
    }
}

/// The verdict of `policy` on NVML's `survey`: the warnings to log, or why to refuse.
pub fn check(policy: SharingPolicy, survey: &Result<Vec<Gpu>, NvmlError>) -> Result<Vec<String>, String> {
    let findings = match (policy, survey) {
        (SharingPolicy::Ignore, _) => return Ok(Vec::new()),
        (_, Err(e)) => vec![format!("cannot check how the GPUs are shared ({e})")],
        (_, Ok(gpus)) => gpus.iter().filter_map(shared).collect(),
    };
    match policy {
        SharingPolicy::Refuse if !findings.is_empty() => Err(format!(
            "{}; give each wic application an EXCLUSIVE_PROCESS GPU or a MIG partition (docs/operations.md), or set [shim] gpu_sharing = \"warn\"",
            findings.join("; ")
        )),
        _ => Ok(findings),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, compute_mode: ComputeMode, mig: bool) -> Gpu {
        Gpu { index, name: "NVIDIA H100".into(), uuid: format!("GPU-{index}"), compute_mode, mig }
    }

    #[test]
    fn only_a_time_sliced_gpu_without_mig_is_shared() {
        assert_eq!(shared(&gpu(0, ComputeMode::ExclusiveProcess, false)), None);
        assert_eq!(shared(&gpu(0, ComputeMode::Prohibited, false)), None);
        assert_eq!(shared(&gpu(0, ComputeMode::Default, true)), None, "MIG partitions are scheduled apart");
        for mode in [ComputeMode::Default, ComputeMode::ExclusiveThread, ComputeMode::Unknown(9)] {
            let why = shared(&gpu(3, mode, false)).expect("shared");
            assert!(why.contains("GPU 3 (NVIDIA H100, GPU-3)") && why.contains(&mode.to_string()), "{why}");
        }
    }

    #[test]
    fn warn_attaches_refuse_does_not_and_ignore_looks_at_nothing() {
        let survey = Ok(vec![gpu(0, ComputeMode::ExclusiveProcess, false), gpu(1, ComputeMode::Default, false)]);
        let warnings = check(SharingPolicy::Warn, &survey).expect("warn attaches");
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].starts_with("GPU 1 "), "{warnings:?}");
        let refused = check(SharingPolicy::Refuse, &survey).expect_err("refused");
        assert!(
            refused.contains("GPU 1 ") && !refused.contains("GPU 0 ") && refused.contains("gpu_sharing"),
            "{refused}"
        );
        assert_eq!(check(SharingPolicy::Ignore, &survey), Ok(Vec::new()));
        let safe = Ok(vec![gpu(0, ComputeMode::ExclusiveProcess, false), gpu(1, ComputeMode::Default, true)]);
        assert_eq!(check(SharingPolicy::Refuse, &safe), Ok(Vec::new()));
    }

    #[test]
    fn gpus_that_cannot_be_checked_are_said_so_and_refused_under_refuse() {
        let missing = Err(NvmlError::Missing("cannot load libnvidia-ml.so.1".into()));
        let warnings = check(SharingPolicy::Warn, &missing).expect("warn attaches");
        assert!(warnings.len() == 1 && warnings[0].contains("cannot check"), "{warnings:?}");
        assert!(check(SharingPolicy::Refuse, &missing).is_err());
        assert_eq!(check(SharingPolicy::Ignore, &missing), Ok(Vec::new()));
    }
}
