use super::abi;

/// How a GPU accessed the faulting address (`UvmEventMemoryAccessType`): the driver's event
/// numbering, not the fault buffer's (`wic_types::fault::AccessType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventAccessType {
    Read,
    Write,
    Atomic,
    Prefetch,
    Other(u8),
}

impl EventAccessType {
    pub fn from_raw(raw: u8) -> Self {
        match raw {
            abi::ACCESS_TYPE_READ => Self::Read,
            abi::ACCESS_TYPE_WRITE => Self::Write,
            abi::ACCESS_TYPE_ATOMIC => Self::Atomic,
            abi::ACCESS_TYPE_PREFETCH => Self::Prefetch,
            other => Self::Other(other),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Atomic => "atomic",
            Self::Prefetch => "prefetch",
            Self::Other(_) => "other",
        }
    }
}

/// Why the GPU faulted (`UvmEventFaultType`): the driver's event numbering, not the fault
/// buffer's (`wic_types::fault::FaultType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventFaultType {
    InvalidPde,
    InvalidPte,
    Write,
    Atomic,
    /// 5 and up: faults of kinds the driver treats as fatal (PDE size, limit, privilege, ...).
    Fatal(u8),
    Other(u8),
}

impl EventFaultType {
    pub fn from_raw(raw: u8) -> Self {
        match raw {
            1 => Self::InvalidPde,
            2 => Self::InvalidPte,
            3 => Self::Write,
            4 => Self::Atomic,
            5..=16 => Self::Fatal(raw),
            other => Self::Other(other),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::InvalidPde => "invalid-pde",
            Self::InvalidPte => "invalid-pte",
            Self::Write => "write",
            Self::Atomic => "atomic",
            Self::Fatal(_) => "fatal-kind",
            Self::Other(_) => "other",
        }
    }
}

/// Which MMU client faulted (`UvmEventFaultClientType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientType {
    /// Graphics/compute engines: replayable faults.
    Gpc,
    /// Other engines (copy engines, ...): non-replayable faults.
    Hub,
    Other(u8),
}

impl ClientType {
    pub fn from_raw(raw: u8) -> Self {
        match raw {
            abi::CLIENT_TYPE_GPC => Self::Gpc,
            abi::CLIENT_TYPE_HUB => Self::Hub,
            other => Self::Other(other),
        }
    }
}

/// A GPU fault, as the driver began servicing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuFault {
    /// The GPU's processor index (1 for the first GPU the VA space registered; 0 is the CPU).
    pub gpu_index: u16,
    pub address: u64,
    pub access: EventAccessType,
    pub fault_type: EventFaultType,
    pub client: ClientType,
    /// The GPC (replayable faults) or channel (non-replayable) id.
    pub gpc_or_channel: u16,
    pub client_id: u16,
    /// The per-GPU batch the fault was serviced in; its replay carries the same id.
    pub batch_id: u32,
    /// CPU time (`CLOCK_MONOTONIC_RAW`, ns) when the driver started servicing it.
    pub cpu_ns: u64,
    /// GPU time (ns) when the GPU wrote the fault buffer entry.
    pub gpu_ns: u64,
}

/// A fault replay (replayable faults) or channel reschedule (non-replayable): the end of a
/// batch's fault handling. The driver sends replays of every VA space's batches to every
/// tracker that asked for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuReplay {
    pub gpu_index: u16,
    pub client: ClientType,
    pub batch_id: u32,
    /// CPU time (`CLOCK_MONOTONIC_RAW`, ns) when the replay was queued on the GPU.
    pub cpu_ns: u64,
    /// GPU time (ns) when the replay finished executing.
    pub gpu_ns: u64,
}

/// A fault the driver found fatal (the faulting context is torn down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FatalFault {
    pub processor_index: u16,
    pub address: u64,
    pub access: EventAccessType,
    pub fault_type: EventFaultType,
    /// `UvmEventFatalReason`.
    pub reason: u8,
    pub cpu_ns: u64,
}

/// The events this module decodes; others are counted as skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Fault(GpuFault),
    Replay(GpuReplay),
    Fatal(FatalFault),
}

impl Event {
    /// Decodes an entry, or `None` for an event type this module does not decode.
    pub fn decode(entry: &abi::EventEntryV2) -> Option<Self> {
        match entry.event_type() {
            abi::EVENT_TYPE_GPU_FAULT => {
                let f: abi::GpuFaultInfoV2 = entry.view();
                Some(Self::Fault(GpuFault {
                    gpu_index: f.gpu_index,
                    address: f.address,
                    access: EventAccessType::from_raw(f.access_type),
                    fault_type: EventFaultType::from_raw(f.fault_type),
                    client: ClientType::from_raw(f.client_type),
                    gpc_or_channel: f.gpc_or_channel_id,
                    client_id: f.client_id,
                    batch_id: f.batch_id,
                    cpu_ns: f.time_stamp,
                    gpu_ns: f.time_stamp_gpu,
                }))
            }
            abi::EVENT_TYPE_GPU_FAULT_REPLAY => {
                let r: abi::GpuFaultReplayInfoV2 = entry.view();
                Some(Self::Replay(GpuReplay {
                    gpu_index: r.gpu_index,
                    client: ClientType::from_raw(r.client_type),
                    batch_id: r.batch_id,
                    cpu_ns: r.time_stamp,
                    gpu_ns: r.time_stamp_gpu,
                }))
            }
            abi::EVENT_TYPE_FATAL_FAULT => {
                let f: abi::FatalFaultInfoV2 = entry.view();
                Some(Self::Fatal(FatalFault {
                    processor_index: f.processor_index,
                    address: f.address,
                    access: EventAccessType::from_raw(f.access_type),
                    fault_type: EventFaultType::from_raw(f.fault_type),
                    reason: f.reason,
                    cpu_ns: f.time_stamp,
                }))
            }
            _ => None,
        }
    }
}
