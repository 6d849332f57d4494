//! The user ABI of nvidia-uvm's tools interface, re-declared from the headers of
//! NVIDIA/open-gpu-kernel-modules, tag 580.142 (identical in every 580.x tag):
//! `kernel-open/nvidia-uvm/uvm_ioctl.h` (requests, parameter structs), `uvm_types.h` (events,
//! control block) and `kernel-open/common/inc/nvstatuscodes.h` (status codes). Sizes and
//! offsets are checked by the tests against the numbers the headers give on x86-64.

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
