//! The deployment rule for held faults (docs/operations.md): a held replayable fault blocks
//! preemption of its channel, so every other context time-sliced on that GPU (or MIG
//! partition) waits while wic holds it. A GPU is safe for wic when nothing else can be
//! time-sliced with its applications: MIG on (partitions are scheduled apart), or compute mode
//! EXCLUSIVE_PROCESS (one context). The check is pure: NVML's answer comes in, the verdict
//! goes out.

use serde::Deserialize;
use wic_types::uvm_gpu::{Uuid, UvmGpus};

use crate::nvml::{ComputeMode, Gpu, NvmlError};

/// The shim backend's rules for GPUs: what to do about shared ones, and which may be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuRules {
    pub sharing: SharingPolicy,
    /// `[shim] gpus`: the GPUs wic may hold faults on; empty: every GPU.
    pub allowed: Vec<Uuid>,
}

impl GpuRules {
    /// Whether `uuid` (NVML's, with its `GPU-` prefix) is one of the allowed GPUs.
    fn covers(&self, uuid: &str) -> bool {
        self.allowed.is_empty() || Uuid::parse(uuid).is_some_and(|uuid| self.allowed.contains(&uuid))
    }

    /// Whether a channel may use the GPU nvidia-uvm calls `id`, by the GPUs nvidia-uvm has
    /// registered now (`gpus`): one of the allowed GPUs, or a MIG instance of one.
    pub fn admit(&self, gpus: &UvmGpus, id: u16) -> Result<(), String> {
        if self.allowed.is_empty() {
            return Ok(());
        }
        let Some(gpu) = gpus.by_id(u32::from(id)) else {
            return Err(format!(
                "GPU {id} is not registered with nvidia-uvm: name a GPU by the id wic_uvm_gpu_id() gives for it"
            ));
        };
        if self.allowed.contains(&gpu.parent) || gpu.instances.iter().any(|i| self.allowed.contains(i)) {
            return Ok(());
        }
        Err(format!("GPU {id} (GPU-{}) is not one of [shim] gpus, the GPUs wic may hold faults on here", gpu.parent))
    }
}

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

/// The verdict of `rules` on NVML's `survey` of the GPUs they cover: the warnings to log, or
/// why to refuse.
pub fn check(rules: &GpuRules, survey: &Result<Vec<Gpu>, NvmlError>) -> Result<Vec<String>, String> {
    let policy = rules.sharing;
    let findings = match (policy, survey) {
        (SharingPolicy::Ignore, _) => return Ok(Vec::new()),
        (_, Err(e)) => vec![format!("cannot check how the GPUs are shared ({e})")],
        (_, Ok(gpus)) => gpus.iter().filter(|gpu| rules.covers(&gpu.uuid)).filter_map(shared).collect(),
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

    fn uuid_of(index: u32) -> String {
        format!("{index:08x}-0000-0000-0000-000000000000")
    }

    fn gpu(index: u32, compute_mode: ComputeMode, mig: bool) -> Gpu {
        Gpu { index, name: "NVIDIA H100".into(), uuid: format!("GPU-{}", uuid_of(index)), compute_mode, mig }
    }

    fn rules(sharing: SharingPolicy) -> GpuRules {
        GpuRules { sharing, allowed: Vec::new() }
    }

    #[test]
    fn only_a_time_sliced_gpu_without_mig_is_shared() {
        assert_eq!(shared(&gpu(0, ComputeMode::ExclusiveProcess, false)), None);
        assert_eq!(shared(&gpu(0, ComputeMode::Prohibited, false)), None);
        assert_eq!(shared(&gpu(0, ComputeMode::Default, true)), None, "MIG partitions are scheduled apart");
        for mode in [ComputeMode::Default, ComputeMode::ExclusiveThread, ComputeMode::Unknown(9)] {
            let why = shared(&gpu(3, mode, false)).expect("shared");
            let named = format!("GPU 3 (NVIDIA H100, GPU-{})", uuid_of(3));
            assert!(why.contains(&named) && why.contains(&mode.to_string()), "{why}");
        }
    }

    #[test]
    fn warn_attaches_refuse_does_not_and_ignore_looks_at_nothing() {
        let survey = Ok(vec![gpu(0, ComputeMode::ExclusiveProcess, false), gpu(1, ComputeMode::Default, false)]);
        let warnings = check(&rules(SharingPolicy::Warn), &survey).expect("warn attaches");
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].starts_with("GPU 1 "), "{warnings:?}");
        let refused = check(&rules(SharingPolicy::Refuse), &survey).expect_err("refused");
        assert!(
            refused.contains("GPU 1 ") && !refused.contains("GPU 0 ") && refused.contains("gpu_sharing"),
            "{refused}"
        );
        assert_eq!(check(&rules(SharingPolicy::Ignore), &survey), Ok(Vec::new()));
        let safe = Ok(vec![gpu(0, ComputeMode::ExclusiveProcess, false), gpu(1, ComputeMode::Default, true)]);
        assert_eq!(check(&rules(SharingPolicy::Refuse), &safe), Ok(Vec::new()));
    }

    #[test]
    fn only_the_allowed_gpus_are_judged() {
        let survey = Ok(vec![gpu(0, ComputeMode::ExclusiveProcess, false), gpu(1, ComputeMode::Default, false)]);
        let first = Uuid::parse(&uuid_of(0)).unwrap();
        let mixed = GpuRules { sharing: SharingPolicy::Refuse, allowed: vec![first] };
        assert_eq!(check(&mixed, &survey), Ok(Vec::new()), "GPU 1 is not wic's: its sharing is not wic's concern");
        let second = GpuRules { allowed: vec![Uuid::parse(&uuid_of(1)).unwrap()], ..mixed };
        assert!(check(&second, &survey).is_err_and(|why| why.contains("GPU 1 ")));
    }

    #[test]
    fn gpus_that_cannot_be_checked_are_said_so_and_refused_under_refuse() {
        let missing = Err(NvmlError::Missing("cannot load libnvidia-ml.so.1".into()));
        let warnings = check(&rules(SharingPolicy::Warn), &missing).expect("warn attaches");
        assert!(warnings.len() == 1 && warnings[0].contains("cannot check"), "{warnings:?}");
        assert!(check(&rules(SharingPolicy::Refuse), &missing).is_err());
        assert_eq!(check(&rules(SharingPolicy::Ignore), &missing), Ok(Vec::new()));
    }

    #[test]
    fn channels_are_admitted_on_allowed_gpus_and_their_mig_instances_alone() {
        let (a, b, gi) = (uuid_of(0xa), uuid_of(0xb), uuid_of(0xc));
        let links = [
            ("1".to_string(), format!("GPU-{a}/0")),
            ("9".to_string(), format!("GPU-{b}/0")),
            ("17".to_string(), format!("GPU-{}/1", uuid_of(0xd))),
            (format!("GI-{gi}"), format!("GPU-{}/1", uuid_of(0xd))),
        ];
        let gpus = UvmGpus::from_entries(links.iter().map(|(n, t)| (n.as_str(), Some(t.as_str()))));
        let every = rules(SharingPolicy::Refuse);
        assert_eq!((every.admit(&gpus, 9), every.admit(&gpus, 200)), (Ok(()), Ok(())), "no list: every GPU");
        let listed = GpuRules { allowed: vec![Uuid::parse(&a).unwrap(), Uuid::parse(&gi).unwrap()], ..every };
        assert_eq!(listed.admit(&gpus, 1), Ok(()));
        assert_eq!(listed.admit(&gpus, 17), Ok(()), "a MIG instance named by its UUID");
        let refused = listed.admit(&gpus, 9).expect_err("not listed");
        assert!(refused.contains(&format!("GPU 9 (GPU-{b})")) && refused.contains("[shim] gpus"), "{refused}");
        assert!(listed.admit(&gpus, 5).is_err_and(|why| why.contains("not registered with nvidia-uvm")));
    }
}
