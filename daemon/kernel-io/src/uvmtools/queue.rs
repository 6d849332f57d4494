use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use nix::sys::mman::madvise;
use nix::sys::mman::mmap_anonymous;
use nix::sys::mman::munmap;
use nix::sys::mman::MapFlags;
use nix::sys::mman::MmapAdvise;
use nix::sys::mman::ProtFlags;

use super::abi;
use super::error::UvmToolsError;
use super::event::Event;

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
pub(super) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        size if size > 0 => size as usize,
        _ => 4096,
    }
}

/// The anonymous mapping that holds the control block (first page or pages) and the queue
/// (from the next page boundary).
pub(super) struct QueueMemory {
    base: NonNull<u8>,
    pub(super) len: usize,
    pub(super) queue_offset: usize,
}

impl QueueMemory {
    pub(super) fn new(entries: u32) -> Result<Self, UvmToolsError> {
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

    pub(super) fn control(&self) -> NonNull<u8> {
        self.base
    }

    pub(super) fn queue(&self) -> NonNull<u8> {
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
