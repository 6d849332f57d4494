use std::fs::File;
use std::fs::OpenOptions;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::abi;
use super::error::checked;
use super::error::UvmToolsError;
use super::event::Event;
use super::queue::EventQueue;
use super::queue::QueueMemory;
use super::raw;

/// A UVM tools event queue on one application's VA space.
pub struct EventTracker {
    // Field order matters: the tools file closes first, so the driver unpins the queue before
    // it is unmapped. The mapping is only held, for `queue` and the driver to use.
    file: File,
    queue: EventQueue,
    _memory: QueueMemory,
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
        let tracker = Self { file, queue, _memory: memory };
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
