//! An application's GPU faults, observed through the UVM tools interface of NVIDIA's stock
//! driver (`/dev/nvidia-uvm-tools`): no patched nvidia-uvm, no `wic_shim.ko`.
//!
//! The application hands wicd its open `/dev/nvidia-uvm` descriptor; [`EventTracker::attach`]
//! opens a new file on `/dev/nvidia-uvm-tools` (the driver keeps one tracker per file), gives
//! the driver an event queue and its control block in wicd's own memory, and subscribes to the
//! GPU fault, fault replay and fatal fault events of that descriptor's VA space.
//! [`EventTracker::poll_events`] drains the queue; [`FaultStats`] (sans-IO) counts the faults on
//! watched pages and pairs each with the replay that ended it, for a latency.
//!
//! What the driver requires, as read in `kernel-open/nvidia-uvm/uvm_tools.c` of
//! NVIDIA/open-gpu-kernel-modules (the same in every 580.x tag, 580.65.06 to 580.142, and
//! unchanged through 595.45.04):
//!
//! - `uvmFd` is a descriptor number in the *caller's* table (`fget`), and its file must be an
//!   initialized VA-space file of nvidia-uvm (`UVM_INITIALIZE` done). A `/proc/PID/fd/N` reopen
//!   is a new, uninitialized file, and the secondary nvidia-uvm file a process makes with
//!   `UVM_MM_INITIALIZE` (CUDA holds one beside its VA-space file) is not a VA-space file: both
//!   get `NV_ERR_ILLEGAL_ACTION`. The very file must come over a socket (`SCM_RIGHTS`) or by
//!   `pidfd_getfd`.
//! - the queue and the control block are user memory passed by address, pinned by the driver
//!   (`pin_user_pages`, write access) and not `mmap`ed from the tools file; each address must be
//!   page aligned and nonzero (`NV_ERR_INVALID_ADDRESS` otherwise) and must not be a mapping of
//!   nvidia-uvm. `queueBufferSize` counts *entries*: a power of two, at least 2.
//! - the tracker keeps a reference on the nvidia-uvm file until the tools file is closed: drop
//!   the tracker when the application leaves, or its VA space outlives it.
//! - `UVM_TOOLS_INIT_EVENT_TRACKER_V2` (since 565) makes a queue of [`abi::EventEntryV2`]
//!   (72 bytes); the V1 call makes 64-byte V1 entries with 8-bit GPU indices. Only V2 is used
//!   here: drivers before 565 answer `EINVAL`.
//! - the protocol of the control block ([`abi::ToolsEventControlData`]): the driver writes an
//!   entry at `put_behind`, then stores the next index to `put_ahead` and `put_behind`; it drops
//!   an event (and counts it in `dropped[type]`) when only one free slot is left before
//!   `get_behind`, so a queue of n entries holds n - 1. The reader announces with `get_ahead`
//!   how far it has taken entries (the driver's wakeup test: `(put_behind - get_ahead) mod n >=
//!   threshold`, threshold n / 2 until set) and frees slots with `get_behind`. All indices are
//!   kept reduced modulo n.
//! - `poll` on the tools file reports `POLLIN` while that test holds; [`EventTracker::attach`]
//!   sets the threshold to 1.
//! - replay events are queued when the replay's push completes on the GPU, through a driver
//!   work queue: they can arrive after faults of the next batch. [`flush_events`] (an ioctl on
//!   the nvidia-uvm file) pushes completed ones out.
//! - CPU timestamps are `CLOCK_MONOTONIC_RAW` nanoseconds (`ktime_get_raw_ts64`); GPU
//!   timestamps are the GPU's nanosecond timer.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use nix::errno::Errno;
use nix::sys::mman::{madvise, mmap_anonymous, munmap, MapFlags, MmapAdvise, ProtFlags};
use wic_engine::Histogram;

/// The user ABI of nvidia-uvm's tools interface, re-declared from the headers of
/// NVIDIA/open-gpu-kernel-modules, tag 580.142 (identical in every 580.x tag):
/// `kernel-open/nvidia-uvm/uvm_ioctl.h` (requests, parameter structs), `uvm_types.h` (events,
/// control block) and `kernel-open/common/inc/nvstatuscodes.h` (status codes). Sizes and
/// offsets are checked by the tests against the numbers the headers give on x86-64.
pub mod abi {
    // Requests (uvm_ioctl.h). On Linux `UVM_IOCTL_BASE(i)` is `i`: the request is the plain
    // number, the argument a pointer to the parameter struct, and the driver answers 0 with
    // the outcome in the struct's last field, `rmStatus` (an NV_STATUS).

    /// `UVM_TOOLS_INIT_EVENT_TRACKER` (tools file): a queue of V1 entries, or counters.
    pub const UVM_TOOLS_INIT_EVENT_TRACKER: u32 = 56;
    /// `UVM_TOOLS_SET_NOTIFICATION_THRESHOLD` (tools file).
    pub const UVM_TOOLS_SET_NOTIFICATION_THRESHOLD: u32 = 57;
    /// `UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS` (tools file).
    pub const UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS: u32 = 58;
    /// `UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS` (tools file).
    pub const UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS: u32 = 59;
    /// `UVM_TOOLS_FLUSH_EVENTS` (nvidia-uvm file, which must be an initialized VA space).
    pub const UVM_TOOLS_FLUSH_EVENTS: u32 = 67;
    /// `UVM_TOOLS_INIT_EVENT_TRACKER_V2` (tools file): a queue of [`EventEntryV2`].
    pub const UVM_TOOLS_INIT_EVENT_TRACKER_V2: u32 = 76;

    // UvmEventType (uvm_types.h); bit `1 << type` enables a type.
    pub const EVENT_TYPE_CPU_FAULT: u8 = 1;
    pub const EVENT_TYPE_MIGRATION: u8 = 2;
    pub const EVENT_TYPE_GPU_FAULT: u8 = 3;
    pub const EVENT_TYPE_GPU_FAULT_REPLAY: u8 = 4;
    pub const EVENT_TYPE_FAULT_BUFFER_OVERFLOW: u8 = 5;
    pub const EVENT_TYPE_FATAL_FAULT: u8 = 6;
    pub const EVENT_TYPE_READ_DUPLICATE: u8 = 7;
    pub const EVENT_TYPE_READ_DUPLICATE_INVALIDATE: u8 = 8;
    pub const EVENT_TYPE_PAGE_SIZE_CHANGE: u8 = 9;
    pub const EVENT_TYPE_THRASHING_DETECTED: u8 = 10;
    pub const EVENT_TYPE_THROTTLING_START: u8 = 11;
    pub const EVENT_TYPE_THROTTLING_END: u8 = 12;
    pub const EVENT_TYPE_MAP_REMOTE: u8 = 13;
    pub const EVENT_TYPE_EVICTION: u8 = 14;
    /// `UvmEventNumTypes`: types 1 to 14 may be enabled (62 and 63 are test events, refused
    /// unless the module was loaded with `uvm_enable_builtin_tests=1`).
    pub const EVENT_NUM_TYPES: u8 = 15;
    /// `UvmEventNumTypesAll`: the length of the control block's `dropped` array.
    pub const EVENT_NUM_TYPES_ALL: usize = 64;

    /// The enable bit of an event type (`UVM_EVENT_ENABLE_*`).
    pub const fn event_flag(event_type: u8) -> u64 {
        1 << event_type
    }

    // UvmEventMemoryAccessType.
    pub const ACCESS_TYPE_READ: u8 = 1;
    pub const ACCESS_TYPE_WRITE: u8 = 2;
    pub const ACCESS_TYPE_ATOMIC: u8 = 3;
    pub const ACCESS_TYPE_PREFETCH: u8 = 4;

    // UvmEventFaultClientType: GPC faults are replayable, HUB faults are not.
    pub const CLIENT_TYPE_GPC: u8 = 1;
    pub const CLIENT_TYPE_HUB: u8 = 2;

    // NV_STATUS codes (nvstatuscodes.h) the tools calls return.
    pub const NV_OK: u32 = 0;
    pub const NV_ERR_ILLEGAL_ACTION: u32 = 0x16;
    pub const NV_ERR_IN_USE: u32 = 0x17;
    pub const NV_ERR_INSUFFICIENT_PERMISSIONS: u32 = 0x1b;
    pub const NV_ERR_INVALID_ADDRESS: u32 = 0x1e;
    pub const NV_ERR_INVALID_ARGUMENT: u32 = 0x1f;
    pub const NV_ERR_INVALID_STATE: u32 = 0x40;
    pub const NV_ERR_NO_MEMORY: u32 = 0x51;
    pub const NV_ERR_NOT_SUPPORTED: u32 = 0x56;
    pub const NV_ERR_GENERIC: u32 = 0xffff;

    /// `UVM_TOOLS_INIT_EVENT_TRACKER_PARAMS`, also the V2 call's (56 bytes).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct InitEventTrackerParams {
        /// IN: address of the queue (page aligned).
        pub queue_buffer: u64,
        /// IN: entries in the queue (a power of two, at least 2); 0 makes a counter tracker.
        pub queue_buffer_size: u64,
        /// IN: address of the [`ToolsEventControlData`] (page aligned).
        pub control_buffer: u64,
        /// IN: `NvProcessorUuid processor` (counter trackers only).
        pub processor: [u8; 16],
        /// IN: `allProcessors` (counter trackers only).
        pub all_processors: u32,
        /// IN: the nvidia-uvm descriptor, in the caller's table.
        pub uvm_fd: u32,
        /// OUT: NV_STATUS.
        pub rm_status: u32,
        pub padding: u32,
    }

    /// `UVM_TOOLS_SET_NOTIFICATION_THRESHOLD_PARAMS` (8 bytes).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct SetNotificationThresholdParams {
        pub notification_threshold: u32,
        pub rm_status: u32,
    }

    /// `UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS_PARAMS` and `..._DISABLE_EVENTS_PARAMS` (16 bytes).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct EventQueueEventsParams {
        pub event_type_flags: u64,
        pub rm_status: u32,
        pub padding: u32,
    }

    /// `UVM_TOOLS_FLUSH_EVENTS_PARAMS` (4 bytes).
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct FlushEventsParams {
        pub rm_status: u32,
    }

    /// `UvmToolsEventControlData` (528 bytes): the queue's indices and dropped-event counters,
    /// shared with the driver. Accessed only through atomics at these fields' offsets.
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    pub struct ToolsEventControlData {
        /// Entries between `get_ahead` and `get_behind` are being read (the reader's).
        pub get_ahead: u32,
        pub get_behind: u32,
        /// Entries between `put_ahead` and `put_behind` are being written (the driver's; equal
        /// outside its lock).
        pub put_ahead: u32,
        pub put_behind: u32,
        /// Events the driver dropped on a full queue, per type (the driver's, 64-bit atomics).
        pub dropped: [u64; EVENT_NUM_TYPES_ALL],
    }

    /// `UvmEventEntry_V2` (72 bytes, 8-byte aligned): a union of the V2 event structs, each
    /// starting with its `eventType` byte; the driver zeroes it before filling one in.
    #[repr(C, align(8))]
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct EventEntryV2 {
        pub bytes: [u8; 72],
    }

    /// `UvmEventGpuFaultInfo_V2` (40 bytes): one GPU fault, at the start of its servicing.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct GpuFaultInfoV2 {
        pub event_type: u8,
        /// `UvmEventFaultType`.
        pub fault_type: u8,
        /// The processor id of the GPU (`uvm_id_value`: GPUs from 1, the CPU is 0).
        pub gpu_index: u16,
        /// `gpcId` (replayable faults) or `channelId` (non-replayable), a union.
        pub gpc_or_channel_id: u16,
        /// The MMU client id, architecture specific.
        pub client_id: u16,
        /// The faulting virtual address.
        pub address: u64,
        /// CPU time when the driver started servicing the fault.
        pub time_stamp: u64,
        /// GPU time when the GPU wrote the fault buffer entry.
        pub time_stamp_gpu: u64,
        /// Per-GPU id of the batch of faults serviced before one replay.
        pub batch_id: u32,
        /// `UvmEventFaultClientType`.
        pub client_type: u8,
        /// `UvmEventMemoryAccessType`.
        pub access_type: u8,
        pub padding16bits: u16,
    }

    /// `UvmEventGpuFaultReplayInfo_V2` (24 bytes): the end of a batch's fault handling.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct GpuFaultReplayInfoV2 {
        pub event_type: u8,
        pub client_type: u8,
        pub gpu_index: u16,
        pub batch_id: u32,
        /// CPU time when the replay was queued on the GPU.
        pub time_stamp: u64,
        /// GPU time when the replay finished executing on the GPU.
        pub time_stamp_gpu: u64,
    }

    /// `UvmEventFatalFaultInfo_V2` (24 bytes): a fault the driver could not service.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct FatalFaultInfoV2 {
        pub event_type: u8,
        pub fault_type: u8,
        pub access_type: u8,
        /// `UvmEventFatalReason`.
        pub reason: u8,
        pub processor_index: u16,
        pub padding16bits: u16,
        pub address: u64,
        /// CPU time when the fault was found fatal.
        pub time_stamp: u64,
    }

    mod sealed {
        pub trait Sealed {}
        impl Sealed for super::GpuFaultInfoV2 {}
        impl Sealed for super::GpuFaultReplayInfoV2 {}
        impl Sealed for super::FatalFaultInfoV2 {}
    }

    /// An event struct of an [`EventEntryV2`]: integers only (every bit pattern is a value),
    /// no larger than the entry.
    pub trait EventInfo: sealed::Sealed + Copy {}
    impl EventInfo for GpuFaultInfoV2 {}
    impl EventInfo for GpuFaultReplayInfoV2 {}
    impl EventInfo for FatalFaultInfoV2 {}

    const _: () = {
        assert!(std::mem::size_of::<GpuFaultInfoV2>() <= std::mem::size_of::<EventEntryV2>());
        assert!(std::mem::size_of::<GpuFaultReplayInfoV2>() <= std::mem::size_of::<EventEntryV2>());
        assert!(std::mem::size_of::<FatalFaultInfoV2>() <= std::mem::size_of::<EventEntryV2>());
    };

    impl EventEntryV2 {
        /// An all-zero entry.
        pub const ZERO: Self = Self { bytes: [0; 72] };

        /// The `eventType` byte every event struct starts with.
        pub fn event_type(&self) -> u8 {
            self.bytes[0]
        }

        /// The entry read as event struct `T` (whatever its `eventType` says).
        pub fn view<T: EventInfo>(&self) -> T {
            // SAFETY: `EventInfo` types are plain-integer `repr(C)` structs no larger than the
            // entry (asserted above), so the read stays inside `self.bytes` and every bit
            // pattern is a valid `T`; `read_unaligned` needs no alignment.
            unsafe { std::ptr::read_unaligned(self.bytes.as_ptr().cast::<T>()) }
        }

        /// An entry holding `info`, zero beyond it, as the driver writes one.
        pub fn from_info<T: EventInfo>(info: T) -> Self {
            let mut entry = Self::ZERO;
            // SAFETY: as in `view`: `T` fits in the entry; the write is unaligned-safe.
            unsafe { std::ptr::write_unaligned(entry.bytes.as_mut_ptr().cast::<T>(), info) };
            entry
        }
    }
}

/// The raw ioctls, for callers that must send what [`EventTracker`] would not.
pub mod raw {
    use super::abi;

    nix::ioctl_readwrite_bad!(
        /// `UVM_TOOLS_INIT_EVENT_TRACKER_V2`, on a tools file.
        init_event_tracker_v2,
        abi::UVM_TOOLS_INIT_EVENT_TRACKER_V2,
        abi::InitEventTrackerParams
    );
    nix::ioctl_readwrite_bad!(
        /// `UVM_TOOLS_SET_NOTIFICATION_THRESHOLD`, on a tools file.
        set_notification_threshold,
        abi::UVM_TOOLS_SET_NOTIFICATION_THRESHOLD,
        abi::SetNotificationThresholdParams
    );
    nix::ioctl_readwrite_bad!(
        /// `UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS`, on a tools file.
        enable_events,
        abi::UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS,
        abi::EventQueueEventsParams
    );
    nix::ioctl_readwrite_bad!(
        /// `UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS`, on a tools file.
        disable_events,
        abi::UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS,
        abi::EventQueueEventsParams
    );
    nix::ioctl_readwrite_bad!(
        /// `UVM_TOOLS_FLUSH_EVENTS`, on an nvidia-uvm file.
        flush_events,
        abi::UVM_TOOLS_FLUSH_EVENTS,
        abi::FlushEventsParams
    );
}

/// The name of an NV_STATUS the tools calls return, if it is one of them.
pub fn nv_status_name(status: u32) -> Option<&'static str> {
    Some(match status {
        abi::NV_OK => "NV_OK",
        abi::NV_ERR_ILLEGAL_ACTION => "NV_ERR_ILLEGAL_ACTION",
        abi::NV_ERR_IN_USE => "NV_ERR_IN_USE",
        abi::NV_ERR_INSUFFICIENT_PERMISSIONS => "NV_ERR_INSUFFICIENT_PERMISSIONS",
        abi::NV_ERR_INVALID_ADDRESS => "NV_ERR_INVALID_ADDRESS",
        abi::NV_ERR_INVALID_ARGUMENT => "NV_ERR_INVALID_ARGUMENT",
        abi::NV_ERR_INVALID_STATE => "NV_ERR_INVALID_STATE",
        abi::NV_ERR_NO_MEMORY => "NV_ERR_NO_MEMORY",
        abi::NV_ERR_NOT_SUPPORTED => "NV_ERR_NOT_SUPPORTED",
        abi::NV_ERR_GENERIC => "NV_ERR_GENERIC",
        _ => return None,
    })
}

/// What can go wrong with the UVM tools interface.
#[derive(Debug)]
pub enum UvmToolsError {
    /// Opening the tools device failed.
    Open(io::Error),
    /// A system call failed: an ioctl, or the allocation of the queue.
    Ioctl { call: &'static str, errno: Errno },
    /// The driver answered the call with a non-zero NV_STATUS in `rmStatus`.
    Status { call: &'static str, nv_status: u32 },
    /// A queue size or buffer the driver would refuse, or that this reader cannot use.
    Layout(String),
}

impl UvmToolsError {
    /// Whether the driver refused the nvidia-uvm file as not being an initialized VA space
    /// (CUDA's secondary file, or a reopened one): worth trying another of the process's files.
    pub fn is_not_va_space(&self) -> bool {
        matches!(self, Self::Status { nv_status: abi::NV_ERR_ILLEGAL_ACTION, .. })
    }
}

impl std::fmt::Display for UvmToolsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Open(e) => write!(f, "cannot open the UVM tools device: {e}"),
            Self::Ioctl { call, errno } => {
                write!(f, "{call}: {}", errno.desc())?;
                if *call == "UVM_TOOLS_INIT_EVENT_TRACKER_V2" && *errno == Errno::EINVAL {
                    write!(f, " (drivers before 565 lack this call)")?;
                }
                Ok(())
            }
            Self::Status { call, nv_status } => {
                match nv_status_name(*nv_status) {
                    Some(name) => write!(f, "{call}: {name} ({nv_status:#x})")?,
                    None => write!(f, "{call}: NV_STATUS {nv_status:#x}")?,
                }
                if self.is_not_va_space() {
                    write!(f, " (not an initialized nvidia-uvm VA-space file)")?;
                }
                Ok(())
            }
            Self::Layout(what) => write!(f, "UVM event queue: {what}"),
        }
    }
}

impl std::error::Error for UvmToolsError {}

/// Checks an ioctl's errno and then its `rmStatus`.
fn checked(call: &'static str, result: nix::Result<libc::c_int>, rm_status: u32) -> Result<(), UvmToolsError> {
    result.map_err(|errno| UvmToolsError::Ioctl { call, errno })?;
    match rm_status {
        abi::NV_OK => Ok(()),
        nv_status => Err(UvmToolsError::Status { call, nv_status }),
    }
}

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

/// A reader of a V2 event queue and its control block, laid out as the driver writes them.
/// The reader keeps its own index; an index read from the control block is reduced modulo the
/// queue's size before use, so nothing there can make it read outside the queue.
pub struct EventQueue {
    control: NonNull<u8>,
    entries: NonNull<abi::EventEntryV2>,
    count: u32,
    /// The next entry to read, in `0..count`; the reader's own.
    get: u32,
    skipped: u64,
    bad_put: u64,
}

// SAFETY: the queue is plain memory accessed through atomics and volatile copies; the reader
// owns its index and may move to another thread.
unsafe impl Send for EventQueue {}

impl EventQueue {
    /// A reader of the queue of `count` entries at `entries` with its control block at
    /// `control`. It starts at the control block's `get_behind`.
    ///
    /// # Safety
    /// `control` must point to a [`abi::ToolsEventControlData`] and `entries` to `count`
    /// [`abi::EventEntryV2`]s, both 8-byte aligned, readable and writable, and staying so for
    /// the reader's lifetime; nothing but the driver's producer and this reader may write them.
    pub unsafe fn new(control: NonNull<u8>, entries: NonNull<u8>, count: u32) -> Result<Self, UvmToolsError> {
        if !count.is_power_of_two() || count < 2 {
            return Err(UvmToolsError::Layout(format!("{count} entries is not a power of two of at least 2")));
        }
        if (control.as_ptr() as usize | entries.as_ptr() as usize) & 7 != 0 {
            return Err(UvmToolsError::Layout("buffers not 8-byte aligned".into()));
        }
        let mut queue = Self { control, entries: entries.cast(), count, get: 0, skipped: 0, bad_put: 0 };
        queue.get = queue.index(std::mem::offset_of!(abi::ToolsEventControlData, get_behind)).load(Ordering::Relaxed)
            & queue.mask();
        queue.index(std::mem::offset_of!(abi::ToolsEventControlData, get_ahead)).store(queue.get, Ordering::Release);
        Ok(queue)
    }

    fn mask(&self) -> u32 {
        self.count - 1
    }

    fn index(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: `offset` is one of the four index fields of the control block that `new`'s
        // caller guarantees, 4-byte aligned within an 8-byte aligned block.
        unsafe { &*self.control.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    fn dropped_counter(&self, event_type: usize) -> &AtomicU64 {
        debug_assert!(event_type < abi::EVENT_NUM_TYPES_ALL);
        let offset = std::mem::offset_of!(abi::ToolsEventControlData, dropped) + 8 * event_type;
        // SAFETY: inside the control block's `dropped` array (callers pass an index below
        // its length), 8-byte aligned; the driver updates it with 64-bit atomics.
        unsafe { &*self.control.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// The driver's `put_behind`, reduced to an index (counted when it was not one).
    fn put(&mut self) -> u32 {
        let put = self.index(std::mem::offset_of!(abi::ToolsEventControlData, put_behind)).load(Ordering::Acquire);
        if put > self.mask() {
            self.bad_put += 1;
        }
        put & self.mask()
    }

    /// Entries in the queue: `count`, of which the driver fills at most `count - 1`.
    pub fn entries(&self) -> u32 {
        self.count
    }

    /// Entries published and not yet read.
    pub fn pending(&mut self) -> u32 {
        self.put().wrapping_sub(self.get) & self.mask()
    }

    /// Appends every published event to `out`, hands the slots back to the driver and returns
    /// how many entries were taken (events of other types included).
    pub fn read(&mut self, out: &mut Vec<Event>) -> usize {
        let put = self.put();
        if put == self.get {
            return 0;
        }
        // Announce how far we take: the driver's wakeup test counts from `get_ahead`.
        self.index(std::mem::offset_of!(abi::ToolsEventControlData, get_ahead)).store(put, Ordering::Release);
        let mut taken = 0;
        while self.get != put {
            // SAFETY: `get` is below `count` (reduced by the mask), so the entry lies inside
            // the queue that `new`'s caller guarantees. The driver does not write it until
            // `get_behind` moves past it, which happens below, after the copy.
            let entry = unsafe { std::ptr::read_volatile(self.entries.as_ptr().add(self.get as usize)) };
            match Event::decode(&entry) {
                Some(event) => out.push(event),
                None => self.skipped += 1,
            }
            self.get = (self.get + 1) & self.mask();
            taken += 1;
        }
        // Release: our copies of the entries happen before the driver may reuse their slots.
        self.index(std::mem::offset_of!(abi::ToolsEventControlData, get_behind)).store(put, Ordering::Release);
        taken
    }

    /// Events the driver dropped on a full queue, all types together.
    pub fn dropped(&self) -> u64 {
        (0..abi::EVENT_NUM_TYPES_ALL).map(|t| self.dropped_counter(t).load(Ordering::Relaxed)).sum()
    }

    /// Events of `event_type` the driver dropped on a full queue.
    pub fn dropped_of(&self, event_type: u8) -> u64 {
        match usize::from(event_type) {
            t if t < abi::EVENT_NUM_TYPES_ALL => self.dropped_counter(t).load(Ordering::Relaxed),
            _ => 0,
        }
    }

    /// Entries of event types this module does not decode.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Times `put_behind` was not an index of the queue (the driver never writes such a value).
    pub fn bad_put(&self) -> u64 {
        self.bad_put
    }
}

/// The size of a page, for the driver's alignment checks.
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        size if size > 0 => size as usize,
        _ => 4096,
    }
}

/// The anonymous mapping that holds the control block (first page or pages) and the queue
/// (from the next page boundary).
struct QueueMemory {
    base: NonNull<u8>,
    len: usize,
    queue_offset: usize,
}

impl QueueMemory {
    fn new(entries: u32) -> Result<Self, UvmToolsError> {
        let page = page_size();
        let queue_offset = std::mem::size_of::<abi::ToolsEventControlData>().next_multiple_of(page);
        let queue_len = (entries as usize)
            .checked_mul(std::mem::size_of::<abi::EventEntryV2>())
            .ok_or_else(|| UvmToolsError::Layout(format!("{entries} entries overflow")))?
            .next_multiple_of(page);
        let len = queue_offset + queue_len;
        let nonzero = NonZeroUsize::new(len).expect("the control block is not empty");
        // SAFETY: a new private anonymous mapping at an address of the kernel's choosing:
        // it aliases nothing, and it is unmapped in Drop.
        let map = unsafe {
            mmap_anonymous(None, nonzero, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_PRIVATE)
        }
        .map_err(|errno| UvmToolsError::Ioctl { call: "mmap of the event queue", errno })?;
        let memory = Self { base: map.cast(), len, queue_offset };
        // The driver pins these pages; a fork would otherwise have to copy them for the child.
        // SAFETY: advice on the mapping made above, which only this process uses.
        unsafe { madvise(map, len, MmapAdvise::MADV_DONTFORK) }
            .map_err(|errno| UvmToolsError::Ioctl { call: "madvise of the event queue", errno })?;
        Ok(memory)
    }

    fn control(&self) -> NonNull<u8> {
        self.base
    }

    fn queue(&self) -> NonNull<u8> {
        // SAFETY: `queue_offset` is inside the mapping (the queue follows the control pages).
        unsafe { self.base.add(self.queue_offset) }
    }
}

// SAFETY: the mapping is owned by this struct alone and only unmapped in Drop; the tracker
// that holds it may move to another thread.
unsafe impl Send for QueueMemory {}

impl Drop for QueueMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; the queue reader that points into it is dropped
        // with the tracker that owns both.
        let _ = unsafe { munmap(self.base.cast(), self.len) };
    }
}

/// A UVM tools event queue on one application's VA space.
pub struct EventTracker {
    // Field order matters: the tools file closes first, so the driver unpins the queue before
    // it is unmapped.
    file: File,
    queue: EventQueue,
    memory: QueueMemory,
}

impl EventTracker {
    /// The events [`EventTracker::attach`] enables: GPU faults, their replays, and fatal faults.
    pub const DEFAULT_EVENTS: u64 = abi::event_flag(abi::EVENT_TYPE_GPU_FAULT)
        | abi::event_flag(abi::EVENT_TYPE_GPU_FAULT_REPLAY)
        | abi::event_flag(abi::EVENT_TYPE_FATAL_FAULT);

    /// The largest queue [`EventTracker::attach`] makes (72 MiB).
    pub const MAX_QUEUE_ENTRIES: u32 = 1 << 20;

    /// Opens a new tools file at `tools_path` (normally `/dev/nvidia-uvm-tools`), gives it a
    /// queue of `queue_entries` V2 entries (a power of two, 2 to [`Self::MAX_QUEUE_ENTRIES`])
    /// on the VA space of `uvm_file`, an application's initialized `/dev/nvidia-uvm` file, sets
    /// the notification threshold to 1 and enables [`Self::DEFAULT_EVENTS`].
    pub fn attach(uvm_file: BorrowedFd<'_>, tools_path: &Path, queue_entries: u32) -> Result<Self, UvmToolsError> {
        if !queue_entries.is_power_of_two() || !(2..=Self::MAX_QUEUE_ENTRIES).contains(&queue_entries) {
            return Err(UvmToolsError::Layout(format!(
                "{queue_entries} entries: a power of two from 2 to {} is needed",
                Self::MAX_QUEUE_ENTRIES
            )));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(tools_path)
            .map_err(UvmToolsError::Open)?;
        let memory = QueueMemory::new(queue_entries)?;
        let mut params = abi::InitEventTrackerParams {
            queue_buffer: memory.queue().as_ptr() as u64,
            queue_buffer_size: u64::from(queue_entries),
            control_buffer: memory.control().as_ptr() as u64,
            uvm_fd: uvm_file.as_raw_fd() as u32,
            ..Default::default()
        };
        // SAFETY: the request and struct are the driver's (abi); `params` is valid for reads
        // and writes. The buffers it names are page aligned, writable, sized as the driver
        // computes (`queue_entries` V2 entries, one control block), and stay mapped until after
        // the tools file is closed (field order of `EventTracker`).
        let result = unsafe { raw::init_event_tracker_v2(file.as_raw_fd(), &mut params) };
        checked("UVM_TOOLS_INIT_EVENT_TRACKER_V2", result, params.rm_status)?;
        // SAFETY: the control block and queue just given to the driver, in `memory`, which the
        // tracker owns for as long as the reader; page aligned.
        let queue = unsafe { EventQueue::new(memory.control(), memory.queue(), queue_entries) }?;
        let tracker = Self { file, queue, memory };
        tracker.set_notification_threshold(1)?;
        tracker.enable_events(Self::DEFAULT_EVENTS)?;
        Ok(tracker)
    }

    /// The tools file: `poll` it for `POLLIN`, which the driver reports while at least the
    /// notification threshold's worth of entries is waiting.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Sets how many waiting entries make the tools file readable.
    pub fn set_notification_threshold(&self, entries: u32) -> Result<(), UvmToolsError> {
        let mut params = abi::SetNotificationThresholdParams { notification_threshold: entries, rm_status: 0 };
        // SAFETY: the driver's request and struct; `params` is valid for reads and writes.
        let result = unsafe { raw::set_notification_threshold(self.file.as_raw_fd(), &mut params) };
        checked("UVM_TOOLS_SET_NOTIFICATION_THRESHOLD", result, params.rm_status)
    }

    /// Subscribes to the event types of `flags` (`abi::event_flag` bits of types 1 to 14).
    pub fn enable_events(&self, flags: u64) -> Result<(), UvmToolsError> {
        let mut params = abi::EventQueueEventsParams { event_type_flags: flags, ..Default::default() };
        // SAFETY: the driver's request and struct; `params` is valid for reads and writes.
        let result = unsafe { raw::enable_events(self.file.as_raw_fd(), &mut params) };
        checked("UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS", result, params.rm_status)
    }

    /// Unsubscribes from the event types of `flags`.
    pub fn disable_events(&self, flags: u64) -> Result<(), UvmToolsError> {
        let mut params = abi::EventQueueEventsParams { event_type_flags: flags, ..Default::default() };
        // SAFETY: the driver's request and struct; `params` is valid for reads and writes.
        let result = unsafe { raw::disable_events(self.file.as_raw_fd(), &mut params) };
        checked("UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS", result, params.rm_status)
    }

    /// Appends the waiting events to `out`; returns how many entries were taken (skipped ones
    /// included).
    pub fn poll_events(&mut self, out: &mut Vec<Event>) -> usize {
        self.queue.read(out)
    }

    /// Events the driver dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.queue.dropped()
    }

    /// Entries of event types not decoded.
    pub fn skipped(&self) -> u64 {
        self.queue.skipped()
    }

    /// The queue reader.
    pub fn queue(&mut self) -> &mut EventQueue {
        &mut self.queue
    }

    /// The queue's size in bytes, control block included, as mapped.
    pub fn mapped_bytes(&self) -> usize {
        self.memory.len
    }
}

/// Makes the driver queue the events whose GPU work has completed (replays above all) without
/// waiting for its channels' next progress update: `UVM_TOOLS_FLUSH_EVENTS` on an initialized
/// nvidia-uvm file (any VA space: the flush is global).
pub fn flush_events(uvm_file: BorrowedFd<'_>) -> Result<(), UvmToolsError> {
    let mut params = abi::FlushEventsParams::default();
    // SAFETY: the driver's request and struct; `params` is valid for reads and writes.
    let result = unsafe { raw::flush_events(uvm_file.as_raw_fd(), &mut params) };
    checked("UVM_TOOLS_FLUSH_EVENTS", result, params.rm_status)
}

/// A watched fault waiting for its replay.
#[derive(Debug, Clone, Copy)]
struct Pending {
    gpu: u16,
    client: ClientType,
    batch: u32,
    cpu_ns: u64,
    gpu_ns: u64,
}

/// Counts and times the faults on watched pages (sans-IO: fed [`Event`]s).
///
/// A fault is watched if its address lies in one of the ranges `[start, end)`. A watched fault
/// waits for the replay that ends its batch: the next replay from the same GPU and client type
/// (replayable and non-replayable faults have separate batch counters) with the fault's batch
/// id and a CPU timestamp no earlier than the fault's. Matching the batch id, rather than taking
/// the next replay on the GPU, matters: the driver queues a replay only once it completed on
/// the GPU, so faults of the next batch often come before the previous batch's replay, and it
/// sends every VA space's replays to every tracker. Each pair gives a latency sample: replay
/// CPU time - fault CPU time (the driver's servicing of that batch from this fault on) and,
/// where both GPU timestamps are there, replay GPU time - fault GPU time (fault buffer write to
/// replay done: the stall the GPU saw). A waiting fault whose batch is more than
/// [`FaultStats::STALE_BATCHES`] behind a replay of its GPU, or that is pushed out of a full
/// wait list, is counted as unpaired (its replay was dropped or never sent, e.g. a cancelled
/// batch).
#[derive(Debug, Clone)]
pub struct FaultStats {
    /// Sorted, disjoint, non-empty.
    ranges: Vec<(u64, u64)>,
    watched_faults: u64,
    other_faults: u64,
    replays: u64,
    paired: u64,
    unpaired: u64,
    fatal_watched: u64,
    fatal_other: u64,
    latency_cpu: Histogram,
    latency_gpu: Histogram,
    pending: VecDeque<Pending>,
}

impl FaultStats {
    /// Batches a replay may run ahead of a waiting fault's batch before the fault is given up.
    pub const STALE_BATCHES: u32 = 64;
    /// Watched faults that may wait for their replay at once.
    pub const MAX_PENDING: usize = 1 << 16;
    /// Disjoint ranges one space may watch: every fault is looked up among them, and a client
    /// adding ranges without end must not grow wicd's memory or the fast path's work.
    pub const MAX_RANGES: usize = 1024;

    /// Statistics over the watched `ranges` (`start..end`; empty ones are ignored, overlapping
    /// ones merged; past [`Self::MAX_RANGES`] disjoint ones, the rest are left out).
    pub fn new(ranges: impl IntoIterator<Item = std::ops::Range<u64>>) -> Self {
        let mut stats = Self {
            ranges: Vec::new(),
            watched_faults: 0,
            other_faults: 0,
            replays: 0,
            paired: 0,
            unpaired: 0,
            fatal_watched: 0,
            fatal_other: 0,
            latency_cpu: Histogram::default(),
            latency_gpu: Histogram::default(),
            pending: VecDeque::new(),
        };
        for range in ranges {
            stats.watch(range);
        }
        stats
    }

    /// Adds `range` to the watched ones (empty ranges are ignored, overlapping ones merged);
    /// `false`, with nothing changed, if that would make more than [`Self::MAX_RANGES`].
    pub fn watch(&mut self, range: std::ops::Range<u64>) -> bool {
        if range.start >= range.end {
            return true;
        }
        let at = self.ranges.partition_point(|&(start, _)| start < range.start);
        let mut ranges = self.ranges.clone();
        ranges.insert(at, (range.start, range.end));
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (start, end) in ranges {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        if merged.len() > Self::MAX_RANGES {
            return false;
        }
        self.ranges = merged;
        true
    }

    /// Whether `address` lies in a watched range.
    pub fn watched(&self, address: u64) -> bool {
        let after = self.ranges.partition_point(|&(start, _)| start <= address);
        after > 0 && address < self.ranges[after - 1].1
    }

    /// Accounts one event.
    pub fn record(&mut self, event: &Event) {
        match *event {
            Event::Fault(fault) => {
                if !self.watched(fault.address) {
                    self.other_faults += 1;
                    return;
                }
                self.watched_faults += 1;
                if self.pending.len() == Self::MAX_PENDING {
                    self.pending.pop_front();
                    self.unpaired += 1;
                }
                self.pending.push_back(Pending {
                    gpu: fault.gpu_index,
                    client: fault.client,
                    batch: fault.batch_id,
                    cpu_ns: fault.cpu_ns,
                    gpu_ns: fault.gpu_ns,
                });
            }
            Event::Replay(replay) => {
                self.replays += 1;
                let (mut paired, mut unpaired) = (0, 0);
                let (latency_cpu, latency_gpu) = (&mut self.latency_cpu, &mut self.latency_gpu);
                self.pending.retain(|p| {
                    if p.gpu != replay.gpu_index || p.client != replay.client {
                        return true;
                    }
                    if p.batch == replay.batch_id && replay.cpu_ns >= p.cpu_ns {
                        latency_cpu.record(replay.cpu_ns - p.cpu_ns);
                        if p.gpu_ns != 0 && replay.gpu_ns >= p.gpu_ns {
                            latency_gpu.record(replay.gpu_ns - p.gpu_ns);
                        }
                        paired += 1;
                        return false;
                    }
                    let behind = replay.batch_id.wrapping_sub(p.batch) as i32;
                    if behind > Self::STALE_BATCHES as i32 {
                        unpaired += 1;
                        return false;
                    }
                    true
                });
                self.paired += paired;
                self.unpaired += unpaired;
            }
            Event::Fatal(fatal) => {
                if self.watched(fatal.address) {
                    self.fatal_watched += 1;
                } else {
                    self.fatal_other += 1;
                }
            }
        }
    }

    /// Accounts every event of `events`.
    pub fn record_all<'a>(&mut self, events: impl IntoIterator<Item = &'a Event>) {
        for event in events {
            self.record(event);
        }
    }

    /// The watched ranges, sorted and merged.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// Faults on watched pages.
    pub fn watched_faults(&self) -> u64 {
        self.watched_faults
    }

    /// Faults outside the watched ranges.
    pub fn other_faults(&self) -> u64 {
        self.other_faults
    }

    /// Replays seen (every VA space's).
    pub fn replays(&self) -> u64 {
        self.replays
    }

    /// Watched faults paired with their replay.
    pub fn paired(&self) -> u64 {
        self.paired
    }

    /// Watched faults given up without a replay.
    pub fn unpaired(&self) -> u64 {
        self.unpaired
    }

    /// Watched faults still waiting for their replay.
    pub fn waiting(&self) -> usize {
        self.pending.len()
    }

    /// Fatal faults on watched pages, and elsewhere.
    pub fn fatal(&self) -> (u64, u64) {
        (self.fatal_watched, self.fatal_other)
    }

    /// Replay CPU time - fault CPU time, ns, per paired fault.
    pub fn latency_cpu(&self) -> &Histogram {
        &self.latency_cpu
    }

    /// Replay GPU time - fault GPU time, ns, per paired fault with both GPU timestamps.
    pub fn latency_gpu(&self) -> &Histogram {
        &self.latency_gpu
    }
}

#[cfg(test)]
mod tests {
    use super::abi::*;
    use super::*;
    use std::mem::{offset_of, size_of};

    // The numbers below are those of the headers of NVIDIA/open-gpu-kernel-modules tag 580.142
    // (kernel-open/nvidia-uvm/uvm_ioctl.h, uvm_types.h; x86-64), the same in every 580.x tag.

    /// uvm_ioctl.h: the request numbers (`UVM_IOCTL_BASE(i)` is `i` on Linux).
    #[test]
    fn request_numbers_match_uvm_ioctl_h() {
        assert_eq!(UVM_TOOLS_INIT_EVENT_TRACKER, 56);
        assert_eq!(UVM_TOOLS_SET_NOTIFICATION_THRESHOLD, 57);
        assert_eq!(UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS, 58);
        assert_eq!(UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS, 59);
        assert_eq!(UVM_TOOLS_FLUSH_EVENTS, 67);
        assert_eq!(UVM_TOOLS_INIT_EVENT_TRACKER_V2, 76);
    }

    /// uvm_ioctl.h: `UVM_TOOLS_INIT_EVENT_TRACKER_PARAMS` is 56 bytes; queueBuffer 0,
    /// queueBufferSize 8, controlBuffer 16, processor 24, allProcessors 40, uvmFd 44, rmStatus 48.
    #[test]
    fn init_event_tracker_params_layout() {
        type P = InitEventTrackerParams;
        assert_eq!(size_of::<P>(), 56);
        assert_eq!(
            [offset_of!(P, queue_buffer), offset_of!(P, queue_buffer_size), offset_of!(P, control_buffer)],
            [0, 8, 16]
        );
        assert_eq!([offset_of!(P, processor), offset_of!(P, all_processors), offset_of!(P, uvm_fd)], [24, 40, 44]);
        assert_eq!(offset_of!(P, rm_status), 48);
    }

    /// uvm_ioctl.h: SET_NOTIFICATION_THRESHOLD 8 bytes (rmStatus 4), ENABLE/DISABLE_EVENTS 16
    /// bytes (rmStatus 8), FLUSH_EVENTS 4 bytes.
    #[test]
    fn small_params_layout() {
        assert_eq!(size_of::<SetNotificationThresholdParams>(), 8);
        assert_eq!(offset_of!(SetNotificationThresholdParams, rm_status), 4);
        assert_eq!(size_of::<EventQueueEventsParams>(), 16);
        assert_eq!(offset_of!(EventQueueEventsParams, rm_status), 8);
        assert_eq!(size_of::<FlushEventsParams>(), 4);
    }

    /// uvm_types.h: `UvmToolsEventControlData` is 528 bytes: get_ahead 0, get_behind 4,
    /// put_ahead 8, put_behind 12, dropped[64] 16.
    #[test]
    fn control_data_layout() {
        type C = ToolsEventControlData;
        assert_eq!(size_of::<C>(), 528);
        assert_eq!(
            [offset_of!(C, get_ahead), offset_of!(C, get_behind), offset_of!(C, put_ahead), offset_of!(C, put_behind)],
            [0, 4, 8, 12]
        );
        assert_eq!(offset_of!(C, dropped), 16);
        assert_eq!(EVENT_NUM_TYPES_ALL, 64);
    }

    /// uvm_types.h: `UvmEventEntry_V2` is 72 bytes, 8-byte aligned.
    #[test]
    fn entry_layout() {
        assert_eq!(size_of::<EventEntryV2>(), 72);
        assert_eq!(std::mem::align_of::<EventEntryV2>(), 8);
    }

    /// uvm_types.h: `UvmEventGpuFaultInfo_V2` is 40 bytes: eventType 0, faultType 1, gpuIndex 2,
    /// gpcId/channelId 4, clientId 6, address 8, timeStamp 16, timeStampGpu 24, batchId 32,
    /// clientType 36, accessType 37.
    #[test]
    fn gpu_fault_info_v2_layout() {
        type F = GpuFaultInfoV2;
        assert_eq!(size_of::<F>(), 40);
        assert_eq!(
            [
                offset_of!(F, event_type),
                offset_of!(F, fault_type),
                offset_of!(F, gpu_index),
                offset_of!(F, gpc_or_channel_id)
            ],
            [0, 1, 2, 4]
        );
        assert_eq!([offset_of!(F, client_id), offset_of!(F, address), offset_of!(F, time_stamp)], [6, 8, 16]);
        assert_eq!([offset_of!(F, time_stamp_gpu), offset_of!(F, batch_id)], [24, 32]);
        assert_eq!([offset_of!(F, client_type), offset_of!(F, access_type)], [36, 37]);
    }

    /// uvm_types.h: `UvmEventGpuFaultReplayInfo_V2` is 24 bytes: eventType 0, clientType 1,
    /// gpuIndex 2, batchId 4, timeStamp 8, timeStampGpu 16.
    #[test]
    fn gpu_fault_replay_info_v2_layout() {
        type R = GpuFaultReplayInfoV2;
        assert_eq!(size_of::<R>(), 24);
        assert_eq!(
            [offset_of!(R, event_type), offset_of!(R, client_type), offset_of!(R, gpu_index), offset_of!(R, batch_id)],
            [0, 1, 2, 4]
        );
        assert_eq!([offset_of!(R, time_stamp), offset_of!(R, time_stamp_gpu)], [8, 16]);
    }

    /// uvm_types.h: `UvmEventFatalFaultInfo_V2` is 24 bytes: eventType 0, faultType 1,
    /// accessType 2, reason 3, processorIndex 4, address 8, timeStamp 16.
    #[test]
    fn fatal_fault_info_v2_layout() {
        type F = FatalFaultInfoV2;
        assert_eq!(size_of::<F>(), 24);
        assert_eq!([offset_of!(F, access_type), offset_of!(F, reason), offset_of!(F, processor_index)], [2, 3, 4]);
        assert_eq!([offset_of!(F, address), offset_of!(F, time_stamp)], [8, 16]);
    }

    /// uvm_types.h: UvmEventType numbering and the enable bits the tracker uses.
    #[test]
    fn event_numbering() {
        assert_eq!((EVENT_TYPE_GPU_FAULT, EVENT_TYPE_GPU_FAULT_REPLAY, EVENT_TYPE_FATAL_FAULT), (3, 4, 6));
        assert_eq!((EVENT_TYPE_EVICTION, EVENT_NUM_TYPES), (14, 15));
        assert_eq!(EventTracker::DEFAULT_EVENTS, 0b101_1000);
        // Only types 1..EVENT_NUM_TYPES are valid without the driver's test mode.
        assert_eq!(EventTracker::DEFAULT_EVENTS & !((1 << EVENT_NUM_TYPES) - 2), 0);
    }

    fn fault(gpu: u16, address: u64, batch: u32, cpu_ns: u64, gpu_ns: u64) -> GpuFaultInfoV2 {
        GpuFaultInfoV2 {
            event_type: EVENT_TYPE_GPU_FAULT,
            fault_type: 2,
            gpu_index: gpu,
            gpc_or_channel_id: 7,
            client_id: 9,
            address,
            time_stamp: cpu_ns,
            time_stamp_gpu: gpu_ns,
            batch_id: batch,
            client_type: CLIENT_TYPE_GPC,
            access_type: ACCESS_TYPE_READ,
            padding16bits: 0,
        }
    }

    fn replay(gpu: u16, batch: u32, cpu_ns: u64, gpu_ns: u64) -> GpuFaultReplayInfoV2 {
        GpuFaultReplayInfoV2 {
            event_type: EVENT_TYPE_GPU_FAULT_REPLAY,
            client_type: CLIENT_TYPE_GPC,
            gpu_index: gpu,
            batch_id: batch,
            time_stamp: cpu_ns,
            time_stamp_gpu: gpu_ns,
        }
    }

    /// A queue and control block in ordinary memory, and a producer that follows the driver's
    /// `enqueue_event` (uvm_tools.c): full when one free slot is left before `get_behind`, the
    /// dropped counter of the type incremented then; otherwise the entry is written at
    /// `put_behind` and the next index stored to `put_ahead` and `put_behind`.
    struct FakeQueue {
        mem: Vec<u64>,
        count: u32,
    }

    const CONTROL_WORDS: usize = size_of::<ToolsEventControlData>() / 8;

    impl FakeQueue {
        fn new(count: u32) -> Self {
            Self { mem: vec![0; CONTROL_WORDS + count as usize * 9], count }
        }

        fn control(&mut self) -> NonNull<u8> {
            NonNull::new(self.mem.as_mut_ptr().cast()).unwrap()
        }

        fn entries(&mut self) -> NonNull<u8> {
            NonNull::new(self.mem[CONTROL_WORDS..].as_mut_ptr().cast()).unwrap()
        }

        fn u32_at(&self, offset: usize) -> u32 {
            let word = self.mem[offset / 8];
            match offset % 8 {
                0 => word as u32,
                _ => (word >> 32) as u32,
            }
        }

        fn set_u32_at(&mut self, offset: usize, value: u32) {
            let word = &mut self.mem[offset / 8];
            *word = match offset % 8 {
                0 => (*word & !0xffff_ffff) | u64::from(value),
                _ => (*word & 0xffff_ffff) | (u64::from(value) << 32),
            };
        }

        fn get_ahead(&self) -> u32 {
            self.u32_at(offset_of!(ToolsEventControlData, get_ahead))
        }

        fn get_behind(&self) -> u32 {
            self.u32_at(offset_of!(ToolsEventControlData, get_behind))
        }

        /// Returns whether the event was queued (or dropped).
        fn enqueue(&mut self, entry: EventEntryV2) -> bool {
            let mask = self.count - 1;
            let get_behind = self.get_behind() & mask;
            let put_behind = self.u32_at(offset_of!(ToolsEventControlData, put_behind)) & mask;
            if (self.count + get_behind - put_behind) & mask == 1 {
                self.mem[offset_of!(ToolsEventControlData, dropped) / 8 + usize::from(entry.event_type())] += 1;
                return false;
            }
            let slot = CONTROL_WORDS + put_behind as usize * 9;
            for (i, chunk) in entry.bytes.chunks_exact(8).enumerate() {
                self.mem[slot + i] = u64::from_ne_bytes(chunk.try_into().unwrap());
            }
            let next = (put_behind + 1) & mask;
            self.set_u32_at(offset_of!(ToolsEventControlData, put_ahead), next);
            self.set_u32_at(offset_of!(ToolsEventControlData, put_behind), next);
            true
        }

        fn reader(&mut self) -> EventQueue {
            let (control, entries, count) = (self.control(), self.entries(), self.count);
            // SAFETY: the fake outlives the reader in every test; both areas are 8-byte
            // aligned parts of `mem` of the sizes the reader expects.
            unsafe { EventQueue::new(control, entries, count) }.unwrap()
        }
    }

    fn addresses(events: &[Event]) -> Vec<u64> {
        events
            .iter()
            .map(|e| match e {
                Event::Fault(f) => f.address,
                Event::Fatal(f) => f.address,
                Event::Replay(r) => u64::from(r.batch_id),
            })
            .collect()
    }

    #[test]
    fn reads_and_decodes_what_the_driver_writes() {
        let mut fake = FakeQueue::new(8);
        let mut queue = fake.reader();
        assert!(fake.enqueue(EventEntryV2::from_info(fault(1, 0x7f00_0000_1000, 5, 1_000, 50_000))));
        let mut migration = EventEntryV2::ZERO;
        migration.bytes[0] = EVENT_TYPE_MIGRATION;
        assert!(fake.enqueue(migration));
        assert!(fake.enqueue(EventEntryV2::from_info(replay(1, 5, 1_600, 52_000))));
        let fatal = FatalFaultInfoV2 {
            event_type: EVENT_TYPE_FATAL_FAULT,
            fault_type: 6,
            access_type: ACCESS_TYPE_WRITE,
            reason: 3,
            processor_index: 2,
            padding16bits: 0,
            address: 0xdead_0000,
            time_stamp: 2_000,
        };
        assert!(fake.enqueue(EventEntryV2::from_info(fatal)));
        assert_eq!(queue.pending(), 4);

        let mut out = Vec::new();
        assert_eq!(queue.read(&mut out), 4);
        assert_eq!(
            out,
            [
                Event::Fault(GpuFault {
                    gpu_index: 1,
                    address: 0x7f00_0000_1000,
                    access: EventAccessType::Read,
                    fault_type: EventFaultType::InvalidPte,
                    client: ClientType::Gpc,
                    gpc_or_channel: 7,
                    client_id: 9,
                    batch_id: 5,
                    cpu_ns: 1_000,
                    gpu_ns: 50_000,
                }),
                Event::Replay(GpuReplay {
                    gpu_index: 1,
                    client: ClientType::Gpc,
                    batch_id: 5,
                    cpu_ns: 1_600,
                    gpu_ns: 52_000
                }),
                Event::Fatal(FatalFault {
                    processor_index: 2,
                    address: 0xdead_0000,
                    access: EventAccessType::Write,
                    fault_type: EventFaultType::Fatal(6),
                    reason: 3,
                    cpu_ns: 2_000,
                }),
            ]
        );
        assert_eq!(queue.skipped(), 1);
        assert_eq!((fake.get_ahead(), fake.get_behind()), (4, 4));
        assert_eq!(queue.pending(), 0);
        assert_eq!(queue.read(&mut out), 0);
    }

    #[test]
    fn wraps_around() {
        let mut fake = FakeQueue::new(8);
        let mut queue = fake.reader();
        let mut out = Vec::new();
        let mut next = 0u64;
        for round in 0..10 {
            let n = [5, 6, 7, 3][round % 4];
            for _ in 0..n {
                assert!(fake.enqueue(EventEntryV2::from_info(fault(1, next, 0, 0, 0))));
                next += 1;
            }
            assert_eq!(queue.read(&mut out), n);
            assert_eq!(fake.get_behind(), (next % 8) as u32, "indices stay reduced modulo the size");
        }
        assert_eq!(addresses(&out), (0..next).collect::<Vec<_>>());
        assert_eq!((queue.dropped(), queue.skipped(), queue.bad_put()), (0, 0, 0));
    }

    #[test]
    fn a_full_queue_holds_one_less_than_its_size_and_counts_drops() {
        let mut fake = FakeQueue::new(4);
        let mut queue = fake.reader();
        for address in 0..5 {
            let queued = fake.enqueue(EventEntryV2::from_info(fault(1, address, 0, 0, 0)));
            assert_eq!(queued, address < 3, "event {address}");
        }
        assert!(!fake.enqueue(EventEntryV2::from_info(replay(1, 0, 0, 0))));
        assert_eq!(
            (queue.dropped(), queue.dropped_of(EVENT_TYPE_GPU_FAULT), queue.dropped_of(EVENT_TYPE_GPU_FAULT_REPLAY)),
            (3, 2, 1)
        );
        let mut out = Vec::new();
        assert_eq!(queue.read(&mut out), 3);
        assert_eq!(addresses(&out), [0, 1, 2]);
        // The freed slots take new events, across the end of the queue.
        for address in 10..13 {
            assert!(fake.enqueue(EventEntryV2::from_info(fault(1, address, 0, 0, 0))));
        }
        out.clear();
        assert_eq!(queue.read(&mut out), 3);
        assert_eq!(addresses(&out), [10, 11, 12]);
    }

    #[test]
    fn starts_at_get_behind_and_survives_a_bad_put() {
        let mut fake = FakeQueue::new(8);
        fake.set_u32_at(offset_of!(ToolsEventControlData, get_behind), 6);
        fake.set_u32_at(offset_of!(ToolsEventControlData, put_behind), 6);
        let mut queue = fake.reader();
        assert_eq!(fake.get_ahead(), 6);
        for address in 0..4 {
            assert!(fake.enqueue(EventEntryV2::from_info(fault(1, address, 0, 0, 0))));
        }
        let mut out = Vec::new();
        assert_eq!(queue.read(&mut out), 4);
        assert_eq!(addresses(&out), [0, 1, 2, 3]);
        assert_eq!(fake.get_behind(), 2);
        // An index no driver writes is reduced and counted, never followed out of the queue.
        fake.set_u32_at(offset_of!(ToolsEventControlData, put_behind), 0xffff_fff3);
        out.clear();
        assert_eq!(queue.read(&mut out), 1);
        assert!(queue.bad_put() >= 1);
        assert_eq!(fake.get_behind(), 3);
    }

    #[test]
    fn refuses_sizes_the_driver_refuses() {
        let mut fake = FakeQueue::new(8);
        let (control, entries) = (fake.control(), fake.entries());
        for count in [0, 1, 6] {
            // SAFETY: as in `FakeQueue::reader`; the size is refused before any access.
            assert!(matches!(unsafe { EventQueue::new(control, entries, count) }, Err(UvmToolsError::Layout(_))));
        }
        let dir = std::env::temp_dir();
        let borrowed = fake_fd();
        for entries in [0, 3, EventTracker::MAX_QUEUE_ENTRIES * 2] {
            assert!(matches!(EventTracker::attach(borrowed.as_fd(), &dir, entries), Err(UvmToolsError::Layout(_))));
        }
    }

    #[test]
    fn queue_memory_is_page_aligned_as_the_driver_checks() {
        let page = page_size();
        let memory = QueueMemory::new(1024).unwrap();
        assert_eq!(memory.control().as_ptr() as usize % page, 0);
        assert_eq!(memory.queue().as_ptr() as usize % page, 0);
        assert!(memory.queue_offset >= size_of::<ToolsEventControlData>());
        assert!(memory.len >= memory.queue_offset + 1024 * size_of::<EventEntryV2>());
        assert_eq!(memory.len % page, 0);
        // The reader works on it as on the fake: fresh memory is an empty queue at index 0.
        // SAFETY: `memory` outlives the reader; both areas are page aligned and sized.
        let mut queue = unsafe { EventQueue::new(memory.control(), memory.queue(), 1024) }.unwrap();
        assert_eq!((queue.pending(), queue.dropped()), (0, 0));
    }

    #[test]
    fn trackers_and_readers_can_move_between_threads() {
        fn send<T: Send>() {}
        send::<EventTracker>();
        send::<EventQueue>();
        send::<FaultStats>();
    }

    fn fake_fd() -> File {
        File::open("/dev/null").unwrap()
    }

    #[test]
    fn attach_reports_a_missing_device() {
        let missing = Path::new("/nonexistent/nvidia-uvm-tools");
        let err = EventTracker::attach(fake_fd().as_fd(), missing, 1024).err().unwrap();
        assert!(matches!(err, UvmToolsError::Open(ref e) if e.kind() == io::ErrorKind::NotFound), "{err}");
    }

    #[test]
    fn errors_name_the_status() {
        let e = UvmToolsError::Status { call: "UVM_TOOLS_INIT_EVENT_TRACKER_V2", nv_status: NV_ERR_ILLEGAL_ACTION };
        assert!(e.is_not_va_space());
        assert_eq!(
            e.to_string(),
            "UVM_TOOLS_INIT_EVENT_TRACKER_V2: NV_ERR_ILLEGAL_ACTION (0x16) (not an initialized nvidia-uvm VA-space file)"
        );
        let e = UvmToolsError::Ioctl { call: "UVM_TOOLS_INIT_EVENT_TRACKER_V2", errno: Errno::EINVAL };
        assert!(e.to_string().ends_with("(drivers before 565 lack this call)"));
        assert_eq!(UvmToolsError::Status { call: "x", nv_status: 0x1234 }.to_string(), "x: NV_STATUS 0x1234");
    }

    fn fault_event(gpu: u16, address: u64, batch: u32, cpu_ns: u64, gpu_ns: u64) -> Event {
        Event::decode(&EventEntryV2::from_info(fault(gpu, address, batch, cpu_ns, gpu_ns))).unwrap()
    }

    fn replay_event(gpu: u16, batch: u32, cpu_ns: u64, gpu_ns: u64) -> Event {
        Event::decode(&EventEntryV2::from_info(replay(gpu, batch, cpu_ns, gpu_ns))).unwrap()
    }

    #[test]
    fn ranges_are_merged_and_half_open() {
        let stats = FaultStats::new([0x3000..0x5000, 0x1000..0x2000, 0x1800..0x3000, 0x9000..0x9000]);
        assert_eq!(stats.ranges(), [(0x1000, 0x5000)]);
        assert!(!stats.watched(0xfff));
        assert!(stats.watched(0x1000));
        assert!(stats.watched(0x4fff));
        assert!(!stats.watched(0x5000));
        assert!(!stats.watched(0x9000));
        let stats = FaultStats::new([0x1000..0x2000, 0x3000..0x4000]);
        assert!(!stats.watched(0x2000) && !stats.watched(0x2fff) && stats.watched(0x3000));
        // Ranges added one by one end up as if given at once.
        let mut grown = FaultStats::new(None);
        for range in [0x3000..0x5000, 0x1000..0x2000, 0x1800..0x3000, 0x9000..0x9000] {
            assert!(grown.watch(range));
        }
        assert_eq!(grown.ranges(), [(0x1000, 0x5000)]);
    }

    #[test]
    fn a_space_watches_a_bounded_number_of_disjoint_ranges() {
        let mut stats = FaultStats::new(None);
        let page = |i: u64| i * 0x2000..i * 0x2000 + 0x1000;
        for i in 0..FaultStats::MAX_RANGES as u64 {
            assert!(stats.watch(page(i)));
        }
        assert!(!stats.watch(page(FaultStats::MAX_RANGES as u64)), "one more disjoint range is refused");
        assert_eq!(stats.ranges().len(), FaultStats::MAX_RANGES, "and changes nothing");
        assert!(stats.watch(0..0x7000), "a range that merges others is taken");
        assert_eq!(stats.ranges().len(), FaultStats::MAX_RANGES - 3);
    }

    #[test]
    fn pairs_faults_with_the_replay_of_their_batch() {
        let mut stats = FaultStats::new(Some(0x1000..0x3000));
        stats.record_all(&[
            fault_event(1, 0x1000, 5, 1_000, 10_000), // A
            fault_event(1, 0x2000, 5, 1_100, 10_500), // B
            fault_event(1, 0x9000, 5, 1_150, 10_600), // outside
            fault_event(2, 0x1000, 5, 1_200, 0),      // D, another GPU, no GPU timestamp
            fault_event(1, 0x1000, 6, 1_500, 11_000), // E, the next batch, before batch 5's replay
            replay_event(1, 5, 1_600, 12_000),        // ends A (600 / 2000) and B (500 / 1500)
            replay_event(2, 4, 1_300, 0),             // an earlier batch: D waits
            replay_event(2, 5, 1_250, 5),             // ends D (50; no GPU sample)
        ]);
        assert_eq!((stats.watched_faults(), stats.other_faults(), stats.replays()), (4, 1, 3));
        assert_eq!((stats.paired(), stats.unpaired(), stats.waiting()), (3, 0, 1));

        let cpu = stats.latency_cpu();
        assert_eq!((cpu.count(), cpu.sum(), cpu.max(), cpu.min()), (3, 1_150, 600, Some(50)));
        // 50 in [32, 63], 500 in [256, 511], 600 in [512, 1023].
        assert_eq!(cpu.buckets().collect::<Vec<_>>(), [(63, 1), (511, 1), (1023, 1)]);
        assert_eq!(cpu.quantile(0.5), Some(511));
        let gpu = stats.latency_gpu();
        assert_eq!((gpu.count(), gpu.sum(), gpu.max()), (2, 3_500, 2_000));
        assert_eq!(gpu.buckets().collect::<Vec<_>>(), [(2047, 2)]);

        // E is ended by its own batch's replay.
        stats.record(&replay_event(1, 6, 1_900, 11_700));
        assert_eq!((stats.paired(), stats.waiting()), (4, 0));
        assert_eq!(stats.latency_cpu().max(), 600);
        assert_eq!(stats.latency_gpu().sum(), 3_500 + 700);
    }

    #[test]
    fn a_replay_queued_before_the_fault_was_serviced_does_not_end_it() {
        let mut stats = FaultStats::new(Some(0..u64::MAX));
        stats.record(&replay_event(1, 8, 900, 0));
        stats.record(&fault_event(1, 0x1000, 8, 1_000, 0));
        stats.record(&replay_event(1, 8, 950, 0)); // same batch, but earlier than the fault
        assert_eq!((stats.paired(), stats.waiting()), (0, 1));
        stats.record(&replay_event(1, 8, 1_400, 0));
        assert_eq!((stats.paired(), stats.latency_cpu().sum()), (1, 400));
    }

    #[test]
    fn replays_of_other_client_types_do_not_pair() {
        let mut stats = FaultStats::new(Some(0..u64::MAX));
        stats.record(&fault_event(1, 0x1000, 3, 1_000, 0));
        let mut hub = replay(1, 3, 2_000, 0);
        hub.client_type = CLIENT_TYPE_HUB;
        stats.record(&Event::decode(&EventEntryV2::from_info(hub)).unwrap());
        assert_eq!((stats.paired(), stats.waiting()), (0, 1));
    }

    #[test]
    fn faults_whose_replay_never_comes_are_given_up() {
        let mut stats = FaultStats::new(Some(0..u64::MAX));
        stats.record(&fault_event(1, 0x1000, u32::MAX - 1, 1_000, 0));
        stats.record(&replay_event(1, (u32::MAX - 1).wrapping_add(FaultStats::STALE_BATCHES), 2_000, 0));
        assert_eq!((stats.unpaired(), stats.waiting()), (0, 1), "within the slack (batch ids wrap)");
        stats.record(&replay_event(1, (u32::MAX - 1).wrapping_add(FaultStats::STALE_BATCHES + 1), 2_000, 0));
        assert_eq!((stats.unpaired(), stats.waiting(), stats.paired()), (1, 0, 0));

        for i in 0..=FaultStats::MAX_PENDING as u64 {
            stats.record(&fault_event(1, i, 0, 0, 0));
        }
        assert_eq!((stats.unpaired(), stats.waiting()), (2, FaultStats::MAX_PENDING));
    }

    #[test]
    fn fatal_faults_are_counted_by_range() {
        let mut stats = FaultStats::new(Some(0x1000..0x2000));
        for address in [0x1000, 0x3000, 0x1fff] {
            let fatal = FatalFaultInfoV2 { event_type: EVENT_TYPE_FATAL_FAULT, address, ..Default::default() };
            stats.record(&Event::decode(&EventEntryV2::from_info(fatal)).unwrap());
        }
        assert_eq!(stats.fatal(), (2, 1));
    }
}
