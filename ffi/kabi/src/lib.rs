//! The kernel ABI of `/dev/wic`: the Rust view of `ffi/include/wic_abi.h`, which is the one
//! definition. A test in `tests/tests/kernel_abi.rs` compiles the header and compares every
//! size, offset and constant with this crate.
//!
//! A leaf crate (it takes only [`wic_types::ErrorMarker`] and [`wic_types::c_struct!`]), so the
//! daemon's side of the device (`wic-kernel-io`) does not depend on the client protocol.

// Input reaches this crate from devices and files: failures are errors, never panics.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use wic_types::{c_struct, ErrorMarker};

/// `WIC_ABI_VERSION`: negotiated first, by [`WIC_IOC_VERSION`].
pub const WIC_ABI_VERSION: u32 = 6;
/// `WIC_PAGE_SIZE`.
pub const WIC_PAGE_SIZE: u64 = 4096;
/// `WIC_MAX_SPACES`: VA spaces one session may attach.
pub const WIC_MAX_SPACES: u32 = 64;
/// `WIC_MAX_RANGES`: ranges one session may register.
pub const WIC_MAX_RANGES: u32 = 1024;
/// `WIC_MAX_HELD`: faults the module holds at once.
pub const WIC_MAX_HELD: u32 = 4096;
/// `WIC_MAX_COMMANDS`: commands in one submission.
pub const WIC_MAX_COMMANDS: u32 = 1024;
/// `WIC_MAX_RANGE_BYTES`: the longest range.
pub const WIC_MAX_RANGE_BYTES: u64 = 1 << 36;
/// `WIC_MAX_WRITE_BYTES`: the most bytes one completion copies.
pub const WIC_MAX_WRITE_BYTES: u32 = 1 << 20;
/// `WIC_MAX_CONCURRENT_BATCHES`: batches of one session that run at once at most.
pub const WIC_MAX_CONCURRENT_BATCHES: u32 = 4;
/// `WIC_MAX_GPU_ID`: GPU ids are nvidia-uvm's, 1 to this (0 is the CPU).
pub const WIC_MAX_GPU_ID: u32 = 256;

/// `WIC_MARKER_MAGIC`: the high half of every error marker.
pub const WIC_MARKER_MAGIC: u64 = ErrorMarker::MAGIC;
/// `WIC_MARKER_TIMEOUT`.
pub const WIC_MARKER_TIMEOUT: u64 = ErrorMarker::Timeout.word();
/// `WIC_MARKER_CHANNEL_CLOSED`.
pub const WIC_MARKER_CHANNEL_CLOSED: u64 = ErrorMarker::ChannelClosed.word();
/// `WIC_MARKER_DAEMON_STOPPING`.
pub const WIC_MARKER_DAEMON_STOPPING: u64 = ErrorMarker::DaemonStopping.word();
/// `WIC_MARKER_DAEMON_GONE`: what the module writes when the daemon's file is released.
pub const WIC_MARKER_DAEMON_GONE: u64 = ErrorMarker::DaemonGone.word();

/// `WIC_RANGE_PCM`: consumer pages, whose read faults are held until data arrives.
pub const WIC_RANGE_PCM: u32 = 1;
/// `WIC_RANGE_PAT`: producer pages, whose write faults signal availability.
pub const WIC_RANGE_PAT: u32 = 2;
/// `WIC_RANGE_SOURCE`: a GPU producer's data, read by [`WIC_CMD_COMPLETE_COPY`]; its faults
/// are never held.
pub const WIC_RANGE_SOURCE: u32 = 3;

/// `WIC_CMD_SERVICE_PAT`.
pub const WIC_CMD_SERVICE_PAT: u32 = 5;
/// `WIC_CMD_REARM_PAT`.
pub const WIC_CMD_REARM_PAT: u32 = 6;
/// `WIC_CMD_REPLAY`.
pub const WIC_CMD_REPLAY: u32 = 7;
/// `WIC_CMD_COMPLETE`: a slot's whole wake-up, fill, companion unmap and map, in one command.
pub const WIC_CMD_COMPLETE: u32 = 8;
/// `WIC_CMD_COMPLETE_COPY`: [`WIC_CMD_COMPLETE`] for a GPU producer, its data copied from the
/// application's memory (by the copy engine of the GPU holding it).
pub const WIC_CMD_COMPLETE_COPY: u32 = 9;
/// `WIC_CMD_COMPLETE_HEADS`: [`WIC_CMD_COMPLETE`] of a run a host producer wrote in place, all
/// but the first 8 bytes of each page: `length` is 8 x `pages` and `arg` the daemon's address of
/// the head words, word i written at the start of page i; the module writes nothing else.
pub const WIC_CMD_COMPLETE_HEADS: u32 = 10;

/// `WIC_RING_MAGIC`: "WICR".
pub const WIC_RING_MAGIC: u32 = 0x5749_4352;
/// `WIC_RING_RECORDS_OFFSET`: records start one page into the ring.
pub const WIC_RING_RECORDS_OFFSET: u64 = WIC_PAGE_SIZE;
/// `WIC_RECORD_PAT`: the fault hit a PAT range.
pub const WIC_RECORD_PAT: u32 = 1;
/// `WIC_RECORD_EXPIRED`: the module ended the hold itself (`max_hold_ms`), completing the
/// fault's whole run with the timeout marker; not a new fault.
pub const WIC_RECORD_EXPIRED: u32 = 2;
/// `WIC_RECORD_UNSUPPORTED_GPU`: not a held fault: a page of the range faulted on a GPU wic
/// cannot hold faults of, registered in the space after it was attached; serviced without its
/// data. Posted once per space and GPU; wicd fails the channel.
pub const WIC_RECORD_UNSUPPORTED_GPU: u32 = 4;

/// `WIC_RING_BYTES(entries)`: the size of the mapped ring.
pub const fn ring_bytes(entries: u32) -> u64 {
    WIC_RING_RECORDS_OFFSET + entries as u64 * std::mem::size_of::<WicFaultRecord>() as u64
}

c_struct! {
    /// `struct wic_version`: version negotiation.
    pub struct WicVersion = "wic_version" {
        /// In: the daemon's version; out: the module's.
        pub abi_version: u32,
        /// Out: records in the fault ring.
        pub ring_entries: u32,
        /// Out: VA spaces one session may attach.
        pub max_spaces: u32,
        /// Out: ranges one session may register.
        pub max_ranges: u32,
        /// Out: faults held at once.
        pub max_held: u32,
        /// Out: commands in one submission.
        pub max_commands: u32,
    }
}

c_struct! {
    /// `struct wic_attach`: attach an application's UVM VA space.
    pub struct WicAttach = "wic_attach" {
        /// In: the daemon's descriptor of the application's UVM file.
        pub uvm_fd: i32,
        /// Out: the space's id.
        pub space_id: u32,
    }
}

c_struct! {
    /// `struct wic_range`: register a range of an attached space.
    pub struct WicRange = "wic_range" {
        /// In: the space.
        pub space_id: u32,
        /// In: [`WIC_RANGE_PCM`], [`WIC_RANGE_PAT`] or [`WIC_RANGE_SOURCE`].
        pub kind: u32,
        /// In: page-aligned start.
        pub start: u64,
        /// In: page-aligned length.
        pub length: u64,
        /// Out: the range's id.
        pub range_id: u32,
        /// In: [`WIC_RANGE_PCM`]: the pages of each of the range's runs (pairs of runs laid
        /// end to end), or 0; other kinds: 0.
        pub run_pages: u32,
    }
}

c_struct! {
    /// `struct wic_command`: one command of a submission.
    pub struct WicCommand = "wic_command" {
        /// `WIC_CMD_*`.
        pub opcode: u32,
        /// The space the pages belong to.
        pub space_id: u32,
        /// The GPU the command concerns.
        pub gpu_id: u32,
        /// Pages from `va`.
        pub pages: u32,
        /// Page-aligned start.
        pub va: u64,
        /// Bytes to copy ([`WIC_CMD_COMPLETE`] with data, [`WIC_CMD_COMPLETE_COPY`]); 8 x
        /// `pages` ([`WIC_CMD_COMPLETE_HEADS`]).
        pub length: u64,
        /// The daemon's address of the bytes or of the head words
        /// ([`WIC_CMD_COMPLETE_HEADS`]), the application's ([`WIC_CMD_COMPLETE_COPY`]), or the
        /// marker.
        pub arg: u64,
        /// [`WIC_CMD_COMPLETE`], [`WIC_CMD_COMPLETE_COPY`], [`WIC_CMD_COMPLETE_HEADS`]: the
        /// slot's other run, unmapped before `va` is mapped.
        pub companion: u64,
        /// Out: 0 or a negative errno.
        pub result: i32,
        /// Must be 0.
        pub reserved: u32,
    }
}

c_struct! {
    /// `struct wic_submit`: a batch of commands; also the io_uring command payload.
    pub struct WicSubmit = "wic_submit" {
        /// The daemon's address of `count` [`WicCommand`]s.
        pub commands: u64,
        /// 1 to [`WIC_MAX_COMMANDS`].
        pub count: u32,
        /// Must be 0.
        pub flags: u32,
    }
}

c_struct! {
    /// `struct wic_ring_header`: the first page of the mapped fault ring.
    pub struct WicRingHeader = "wic_ring_header" {
        /// [`WIC_RING_MAGIC`].
        pub magic: u32,
        /// [`WIC_ABI_VERSION`].
        pub abi_version: u32,
        /// Records in the ring, a power of two.
        pub entries: u32,
        /// `size_of::<WicFaultRecord>()`.
        pub record_size: u32,
        /// Padding to the module's cache line.
        pub pad0: [u64; 6],
        /// Written by the module: the next sequence number it will write.
        pub head: u64,
        /// Written by the module: faults held but not recorded.
        pub dropped: u64,
        /// Padding to the daemon's cache line.
        pub pad1: [u64; 6],
        /// Written by the daemon: the next sequence number it will read.
        pub tail: u64,
        /// Padding to the end of the cache line.
        pub pad2: [u64; 7],
    }
}

c_struct! {
    /// `struct wic_fault_record`: one held fault.
    pub struct WicFaultRecord = "wic_fault_record" {
        /// The record's sequence number, written last.
        pub seq: u64,
        /// The fault's space.
        pub space_id: u32,
        /// The faulting GPU.
        pub gpu_id: u32,
        /// The registered range the page is in.
        pub range_id: u32,
        /// `WIC_RECORD_*`.
        pub flags: u32,
        /// CLOCK_MONOTONIC time the module held the fault.
        pub held_ns: u64,
        /// The raw hardware fault-buffer entry.
        pub entry: [u8; 32],
    }
}

/// `WIC_IOC_MAGIC`.
pub const WIC_IOC_MAGIC: u8 = b'W';

const fn ioc_rw<T>(nr: u8) -> u32 {
    nix::request_code_readwrite!(WIC_IOC_MAGIC, nr, std::mem::size_of::<T>()) as u32
}

const fn ioc_w<T>(nr: u8) -> u32 {
    nix::request_code_write!(WIC_IOC_MAGIC, nr, std::mem::size_of::<T>()) as u32
}

/// `WIC_IOC_VERSION`.
pub const WIC_IOC_VERSION: u32 = ioc_rw::<WicVersion>(0x00);
/// `WIC_IOC_ATTACH`.
pub const WIC_IOC_ATTACH: u32 = ioc_rw::<WicAttach>(0x01);
/// `WIC_IOC_DETACH`.
pub const WIC_IOC_DETACH: u32 = ioc_w::<u32>(0x02);
/// `WIC_IOC_REGISTER`.
pub const WIC_IOC_REGISTER: u32 = ioc_rw::<WicRange>(0x03);
/// `WIC_IOC_UNREGISTER`.
pub const WIC_IOC_UNREGISTER: u32 = ioc_w::<u32>(0x04);
/// `WIC_IOC_SUBMIT`: also the `cmd_op` of an io_uring `IORING_OP_URING_CMD`.
pub const WIC_IOC_SUBMIT: u32 = ioc_rw::<WicSubmit>(0x05);

/// Every `WIC_*` constant of the header with its value, for the ABI test.
pub fn constants() -> Vec<(&'static str, i128)> {
    vec![
        ("WIC_ABI_VERSION", WIC_ABI_VERSION.into()),
        ("WIC_PAGE_SIZE", WIC_PAGE_SIZE.into()),
        ("WIC_MAX_SPACES", WIC_MAX_SPACES.into()),
        ("WIC_MAX_RANGES", WIC_MAX_RANGES.into()),
        ("WIC_MAX_HELD", WIC_MAX_HELD.into()),
        ("WIC_MAX_COMMANDS", WIC_MAX_COMMANDS.into()),
        ("WIC_MAX_RANGE_BYTES", WIC_MAX_RANGE_BYTES.into()),
        ("WIC_MAX_WRITE_BYTES", WIC_MAX_WRITE_BYTES.into()),
        ("WIC_MAX_CONCURRENT_BATCHES", WIC_MAX_CONCURRENT_BATCHES.into()),
        ("WIC_MAX_GPU_ID", WIC_MAX_GPU_ID.into()),
        ("WIC_MARKER_MAGIC", WIC_MARKER_MAGIC.into()),
        ("WIC_MARKER_TIMEOUT", WIC_MARKER_TIMEOUT.into()),
        ("WIC_MARKER_CHANNEL_CLOSED", WIC_MARKER_CHANNEL_CLOSED.into()),
        ("WIC_MARKER_DAEMON_STOPPING", WIC_MARKER_DAEMON_STOPPING.into()),
        ("WIC_MARKER_DAEMON_GONE", WIC_MARKER_DAEMON_GONE.into()),
        ("WIC_RANGE_PCM", WIC_RANGE_PCM.into()),
        ("WIC_RANGE_PAT", WIC_RANGE_PAT.into()),
        ("WIC_RANGE_SOURCE", WIC_RANGE_SOURCE.into()),
        ("WIC_CMD_SERVICE_PAT", WIC_CMD_SERVICE_PAT.into()),
        ("WIC_CMD_REARM_PAT", WIC_CMD_REARM_PAT.into()),
        ("WIC_CMD_REPLAY", WIC_CMD_REPLAY.into()),
        ("WIC_CMD_COMPLETE", WIC_CMD_COMPLETE.into()),
        ("WIC_CMD_COMPLETE_COPY", WIC_CMD_COMPLETE_COPY.into()),
        ("WIC_CMD_COMPLETE_HEADS", WIC_CMD_COMPLETE_HEADS.into()),
        ("WIC_RING_MAGIC", WIC_RING_MAGIC.into()),
        ("WIC_RING_RECORDS_OFFSET", WIC_RING_RECORDS_OFFSET.into()),
        ("WIC_RECORD_PAT", WIC_RECORD_PAT.into()),
        ("WIC_RECORD_EXPIRED", WIC_RECORD_EXPIRED.into()),
        ("WIC_RECORD_UNSUPPORTED_GPU", WIC_RECORD_UNSUPPORTED_GPU.into()),
        ("WIC_IOC_MAGIC", WIC_IOC_MAGIC.into()),
        ("WIC_IOC_VERSION", WIC_IOC_VERSION.into()),
        ("WIC_IOC_ATTACH", WIC_IOC_ATTACH.into()),
        ("WIC_IOC_DETACH", WIC_IOC_DETACH.into()),
        ("WIC_IOC_REGISTER", WIC_IOC_REGISTER.into()),
        ("WIC_IOC_UNREGISTER", WIC_IOC_UNREGISTER.into()),
        ("WIC_IOC_SUBMIT", WIC_IOC_SUBMIT.into()),
    ]
}

/// One struct of the header as Rust lays it out.
#[derive(Debug, Clone, Copy)]
pub struct StructLayout {
    /// Its C name, without `struct`.
    pub name: &'static str,
    /// `size_of`.
    pub size: usize,
    /// `align_of`.
    pub align: usize,
    /// Every field with its offset.
    pub fields: &'static [(&'static str, usize)],
}

impl StructLayout {
    /// `T`'s layout, under its C name and with its fields' offsets.
    pub fn of<T>(name: &'static str, fields: &'static [(&'static str, usize)]) -> Self {
        Self { name, size: std::mem::size_of::<T>(), align: std::mem::align_of::<T>(), fields }
    }
}

/// Every struct of the header.
pub fn structs() -> Vec<StructLayout> {
    vec![
        StructLayout::of::<WicVersion>(WicVersion::C_NAME, WicVersion::FIELDS),
        StructLayout::of::<WicAttach>(WicAttach::C_NAME, WicAttach::FIELDS),
        StructLayout::of::<WicRange>(WicRange::C_NAME, WicRange::FIELDS),
        StructLayout::of::<WicCommand>(WicCommand::C_NAME, WicCommand::FIELDS),
        StructLayout::of::<WicSubmit>(WicSubmit::C_NAME, WicSubmit::FIELDS),
        StructLayout::of::<WicRingHeader>(WicRingHeader::C_NAME, WicRingHeader::FIELDS),
        StructLayout::of::<WicFaultRecord>(WicFaultRecord::C_NAME, WicFaultRecord::FIELDS),
    ]
}
