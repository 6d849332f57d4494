//! The checks with I/O a request passes before the fast path is asked to act on it: a new
//! channel's timeout against the backend's own bound on a held fault ([`super::hold`]), and the
//! shim's rules on GPUs ([`sharing`]): which GPUs a channel may use, by nvidia-uvm's listing of
//! its GPUs now, and, at an attachment, what to do about GPUs that time-slice other contexts
//! with held faults, by NVML's survey (an operator may change a GPU's compute mode between two
//! attachments). What they read, they read off the control plane's threads.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use wic_proto::message::{ChannelSpec, ErrorCode, Producer, WireError};
use wic_types::uvm_gpu::{UvmGpus, PROCFS_GPUS};

use super::backend::BackendTraits;
use super::hold::HoldBound;
use super::registry::Peer;
use super::sharing::{self, GpuRules, SharingPolicy};
use crate::nvml;

/// The checks, as the backend and the configuration set them.
pub struct Admission {
    /// The backend's bound on a held fault, if it has one.
    hold_bound: Option<HoldBound>,
    /// What to do at attach about GPUs that time-slice other contexts with held faults, and
    /// which GPUs channels may use; `None` where no fault is held (the emulated backend).
    gpu_rules: Option<GpuRules>,
    /// Whether the log said already that NVML cannot tell how the GPUs are shared.
    unchecked_gpus_told: AtomicBool,
}

fn error(code: ErrorCode, message: impl Into<String>) -> WireError {
    WireError::new(code, message)
}

impl Admission {
    pub fn new(backend: &BackendTraits, gpu_rules: Option<GpuRules>) -> Self {
        Self { hold_bound: backend.hold_bound, gpu_rules, unchecked_gpus_told: AtomicBool::new(false) }
    }

    /// Whether a channel of `spec` (its timeout set) may be created: its timeout ends well
    /// below the backend's bound on a hold, as the bound is now, and its GPUs are among
    /// `[shim] gpus`.
    pub async fn channel(&self, spec: &ChannelSpec) -> Result<(), WireError> {
        if let Some(bound) = self.hold_bound {
            if let Some(bound_ms) = tokio::task::spawn_blocking(bound.read_ms).await.ok().flatten() {
                bound.admit(spec.timeout_ns, bound_ms)?;
            }
        }
        match self.gpu_rules.as_ref().filter(|r| !r.allowed.is_empty()) {
            Some(rules) => admit_gpus(rules, spec).await,
            None => Ok(()),
        }
    }

    /// The deployment rule for held faults, asked of NVML at each attachment of an address
    /// space: a GPU that time-slices other contexts with wic's held faults is logged, or the
    /// attachment refused, as `[shim] gpu_sharing` says.
    pub async fn space(&self, peer: Peer) -> Result<(), WireError> {
        let Some(rules) = self.gpu_rules.as_ref().filter(|r| r.sharing != SharingPolicy::Ignore) else {
            return Ok(());
        };
        // NVML's calls reach the driver and can take a while: off the control plane's threads.
        let survey = tokio::task::spawn_blocking(nvml::survey)
            .await
            .map_err(|e| error(ErrorCode::Io, format!("checking the GPUs: {e}")))?;
        let warnings = sharing::check(rules, &survey).map_err(|refusal| error(ErrorCode::Unsupported, refusal))?;
        // Without NVML every attachment would say the same: once is enough.
        let first_unchecked = survey.is_err() && !self.unchecked_gpus_told.swap(true, Ordering::Relaxed);
        for warning in warnings {
            if survey.is_ok() || first_unchecked {
                tracing::warn!(pid = peer.pid, uid = peer.uid, "attaching an address space: {warning}");
            } else {
                tracing::debug!(pid = peer.pid, uid = peer.uid, "attaching an address space: {warning}");
            }
        }
        Ok(())
    }
}

/// Whether the channel's GPUs are among `[shim] gpus`, by nvidia-uvm's listing of its GPUs now.
async fn admit_gpus(rules: &GpuRules, spec: &ChannelSpec) -> Result<(), WireError> {
    let gpus = tokio::task::spawn_blocking(|| UvmGpus::read(Path::new(PROCFS_GPUS)))
        .await
        .map_err(|e| error(ErrorCode::Io, format!("reading nvidia-uvm's GPUs: {e}")))?
        .map_err(|e| error(ErrorCode::Unsupported, format!("{PROCFS_GPUS}: {e}: is nvidia-uvm loaded?")))?;
    rules
        .admit(&gpus, spec.consumer_gpu)
        .map_err(|why| error(ErrorCode::Permission, format!("consumer_gpu: {why}")))?;
    if let Producer::Gpu { gpu, .. } = spec.producer {
        rules.admit(&gpus, gpu).map_err(|why| error(ErrorCode::Permission, format!("producer gpu: {why}")))?;
    }
    Ok(())
}
