//! The shared-memory regions behind the fast paths, and the futex calls that wait on them.
//!
//! wicd creates every region as a sealed memfd (it cannot shrink, so a client can never make
//! the daemon fault on a truncated mapping) and passes it with the channel reply:
//!
//! - the **consumer region** is the emulated GPU's view of a channel: one state word per page
//!   (mapped or not, the futex a stalled warp sleeps on is the replay counter), the channel's
//!   fault ring (raw 32-byte fault-buffer entries, written by stalled warps) and the pages;
//! - the **producer region** is the host producer's: per-slot `published` and `delivered`
//!   generation counters, the dirty bits the daemon scans after a doorbell, and the slot buffers;
//!   after them, the in-place area: per slot, the run the producer may write in place next, the
//!   side of its pending in-place publish, a count of in-place publishes that missed their
//!   generation, and the run's head words (docs/architecture.md, "Host producers in place").
//!   A region without that area (a daemon older than it) still opens: in place is then
//!   unsupported.
//!
//! The daemon trusts nothing it reads here: it keeps its own ring index, bounds every scan and
//! computes every offset itself.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use wic_types::{RawFaultEntry, PAGE_SIZE};

/// Bytes of every region header.
pub const HEADER_BYTES: usize = 64;
/// Entries in a consumer region's fault ring, the size of a UVM fault batch.
pub const FAULT_RING_ENTRIES: u32 = 256;
/// Bytes of one fault-ring entry: a sequence word, then the raw entry.
pub const RING_ENTRY_BYTES: usize = 8 + 32;

const CONSUMER_MAGIC: u32 = u32::from_le_bytes(*b"WICC");
const PRODUCER_MAGIC: u32 = u32::from_le_bytes(*b"WICP");
const LAYOUT_VERSION: u32 = 1;

/// A page-state word: the page is not mapped, an access faults.
pub const PAGE_UNMAPPED: u32 = 0;
/// A page-state word: the page is mapped, an access reads it.
pub const PAGE_MAPPED: u32 = 1;

/// Lifecycle of a channel as its regions show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ChannelState {
    Open = 0,
    Closed = 1,
    Stopping = 2,
}

impl ChannelState {
    fn from_raw(raw: u32) -> Self {
        match raw {
            0 => Self::Open,
            2 => Self::Stopping,
            _ => Self::Closed,
        }
    }
}

/// Why a region handed over by the daemon cannot be used.
#[derive(Debug)]
pub enum ShmError {
    Io(io::Error),
    /// The region's header does not describe a region of this kind and version.
    BadHeader(&'static str),
}

impl std::fmt::Display for ShmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(e) => write!(f, "shared region: {e}"),
            Self::BadHeader(what) => write!(f, "shared region: {what}"),
        }
    }
}

impl std::error::Error for ShmError {}

impl From<io::Error> for ShmError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

impl From<nix::Error> for ShmError {
    fn from(e: nix::Error) -> Self {
        Self::Io(e.into())
    }
}

fn align_up(value: usize, to: usize) -> usize {
    value.div_ceil(to) * to
}

/// Where things are in a consumer region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerLayout {
    pub slots: u32,
    pub pages_per_run: u32,
}

impl ConsumerLayout {
    /// Pages of the channel: P and P' for every slot.
    pub fn pages(&self) -> usize {
        self.slots as usize * 2 * self.pages_per_run as usize
    }

    fn ring_offset(&self) -> usize {
        align_up(HEADER_BYTES + 4 * self.pages(), 8)
    }

    fn data_offset(&self) -> usize {
        align_up(self.ring_offset() + RING_ENTRY_BYTES * FAULT_RING_ENTRIES as usize, PAGE_SIZE as usize)
    }

    /// Total bytes of the region.
    pub fn bytes(&self) -> usize {
        self.data_offset() + self.pages() * PAGE_SIZE as usize
    }

    /// Index of the first page of `slot`'s run for generations of parity `side`.
    pub fn run_page(&self, slot: u32, side: usize) -> usize {
        (slot as usize * 2 + side) * self.pages_per_run as usize
    }
}

/// Where things are in a producer region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerLayout {
    pub slots: u32,
    pub batch_bytes: u64,
}

impl ProducerLayout {
    fn delivered_offset(&self) -> usize {
        HEADER_BYTES + 4 * self.slots as usize
    }

    fn dirty_offset(&self) -> usize {
        align_up(self.delivered_offset() + 4 * self.slots as usize, 8)
    }

    /// Words of the dirty bitmap.
    pub fn dirty_words(&self) -> usize {
        (self.slots as usize).div_ceil(64)
    }

    fn data_offset(&self) -> usize {
        align_up(self.dirty_offset() + 8 * self.dirty_words(), PAGE_SIZE as usize)
    }

    /// Bytes of the region before the in-place area: what a region without it holds.
    fn base_bytes(&self) -> usize {
        self.data_offset() + self.slots as usize * self.batch_bytes as usize
    }

    /// Pages of one run: the head words a slot has.
    pub fn pages_per_run(&self) -> usize {
        self.batch_bytes.div_ceil(PAGE_SIZE) as usize
    }

    fn in_place_offset(&self) -> usize {
        align_up(self.base_bytes(), 64)
    }

    fn writable_side_offset(&self) -> usize {
        self.in_place_offset() + 4 * self.slots as usize
    }

    fn missed_offset(&self) -> usize {
        self.writable_side_offset() + 4 * self.slots as usize
    }

    fn heads_offset(&self) -> usize {
        align_up(self.missed_offset() + 4 * self.slots as usize, 8)
    }

    /// Total bytes of the region.
    pub fn bytes(&self) -> usize {
        self.heads_offset() + 8 * self.slots as usize * self.pages_per_run()
    }
}

/// A shared mapping of a whole memfd.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access through it is either atomic or a
// byte copy whose races with the peer process are part of the protocol (bytes are handed over
// by the generation counters and page states, which are atomics with acquire/release order).
unsafe impl Send for Mapping {}
// SAFETY: as above: shared access goes through atomics or explicitly racy byte copies.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(fd: impl AsFd, len: usize) -> io::Result<Self> {
        let length = std::num::NonZeroUsize::new(len).ok_or_else(|| io::Error::other("empty region"))?;
        // SAFETY: a fresh shared mapping at an address the kernel picks; it aliases nothing in
        // this process, and the fd's size was checked (or set and sealed) to be at least `len`.
        let base =
            unsafe { mmap(None, length, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED, fd, 0) }?;
        Ok(Self { base: base.cast(), len })
    }

    fn ptr(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len), "region access out of bounds");
        // SAFETY: in bounds, checked above.
        unsafe { self.base.as_ptr().add(offset) }
    }

    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        assert_eq!(offset % 4, 0);
        // SAFETY: in bounds and aligned (the base is page-aligned); AtomicU32 has the layout of
        // u32 and any bit pattern is valid.
        unsafe { &*self.ptr(offset, 4).cast::<AtomicU32>() }
    }

    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        assert_eq!(offset % 8, 0);
        // SAFETY: in bounds and aligned, as for `u32_at`.
        unsafe { &*self.ptr(offset, 8).cast::<AtomicU64>() }
    }

    /// Copies bytes out; the peer may write concurrently only where the protocol says the bytes
    /// are not ours to read, so a torn copy is never consumed.
    fn read(&self, offset: usize, dst: &mut [u8]) {
        let src = self.ptr(offset, dst.len());
        // SAFETY: `src` is in bounds for `dst.len()` bytes and cannot overlap a Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) }
    }

    fn write(&self, offset: usize, src: &[u8]) {
        let dst = self.ptr(offset, src.len());
        // SAFETY: `dst` is in bounds for `src.len()` bytes. `src` may lie in this very mapping
        // (a C caller publishing a slot's own buffer by copy), so the copy allows overlap.
        unsafe { std::ptr::copy(src.as_ptr(), dst, src.len()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no reference into it outlives self.
        let _ = unsafe { munmap(self.base.cast(), self.len) };
    }
}

/// Creates a sealed memfd of `len` bytes: it can be neither shrunk nor grown by a client.
fn sealed_memfd(name: &CStr, len: usize) -> io::Result<OwnedFd> {
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)?;
    nix::unistd::ftruncate(&fd, len as i64)?;
    fcntl(&fd, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL))?;
    Ok(fd)
}

fn mapped_len(fd: &OwnedFd) -> io::Result<usize> {
    let stat = nix::sys::stat::fstat(fd)?;
    Ok(stat.st_size as usize)
}

/// Header words shared by both region kinds.
mod word {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const SLOTS: usize = 8;
    pub const STATE: usize = 12;
    /// Consumer: pages per run. Producer: low half of batch bytes.
    pub const PARAM_LO: usize = 16;
    /// Consumer: 0. Producer: high half of batch bytes.
    pub const PARAM_HI: usize = 20;
    /// Consumer: replay counter (futex). Producer: unused.
    pub const REPLAY_SEQ: usize = 24;
    /// Consumer: next ring index a warp may claim.
    pub const RING_RESERVE: usize = 32;
    /// Consumer: next ring index the daemon reads.
    pub const RING_GET: usize = 40;
    /// Consumer: faults that found the ring full.
    pub const OVERFLOWS: usize = 48;
}

/// The identifying words of a region header: written by the daemon, checked by clients.
struct Header {
    magic: u32,
    slots: u32,
    /// `PARAM_LO` and `PARAM_HI`.
    params: [u32; 2],
}

impl Header {
    /// Creates a sealed memfd of `bytes`, maps it and writes the header, magic last.
    fn create(&self, name: &CStr, bytes: usize) -> io::Result<(Mapping, OwnedFd)> {
        let fd = sealed_memfd(name, bytes)?;
        let map = Mapping::new(&fd, bytes)?;
        map.u32_at(word::SLOTS).store(self.slots, Ordering::Relaxed);
        map.u32_at(word::PARAM_LO).store(self.params[0], Ordering::Relaxed);
        map.u32_at(word::PARAM_HI).store(self.params[1], Ordering::Relaxed);
        map.u32_at(word::VERSION).store(LAYOUT_VERSION, Ordering::Relaxed);
        map.u32_at(word::MAGIC).store(self.magic, Ordering::Release);
        Ok((map, fd))
    }

    /// Maps `bytes` of a received region and checks its header is this one.
    fn open(&self, fd: &OwnedFd, bytes: usize) -> Result<Mapping, ShmError> {
        if mapped_len(fd)? < bytes {
            return Err(ShmError::BadHeader("region smaller than its layout"));
        }
        let map = Mapping::new(fd, bytes)?;
        if map.u32_at(word::MAGIC).load(Ordering::Acquire) != self.magic {
            return Err(ShmError::BadHeader("wrong magic"));
        }
        if map.u32_at(word::VERSION).load(Ordering::Acquire) != LAYOUT_VERSION {
            return Err(ShmError::BadHeader("unsupported layout version"));
        }
        let params =
            [map.u32_at(word::PARAM_LO).load(Ordering::Relaxed), map.u32_at(word::PARAM_HI).load(Ordering::Relaxed)];
        if map.u32_at(word::SLOTS).load(Ordering::Relaxed) != self.slots || params != self.params {
            return Err(ShmError::BadHeader("layout differs from the channel reply"));
        }
        Ok(map)
    }
}

/// A channel's consumer region.
pub struct ConsumerRegion {
    map: Mapping,
    layout: ConsumerLayout,
}

/// A fault could not be posted: the ring holds [`FAULT_RING_ENTRIES`] unread entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingFull;

impl ConsumerRegion {
    /// Creates the region (daemon side): every page unmapped, the ring empty.
    pub fn create(layout: ConsumerLayout) -> io::Result<(Self, OwnedFd)> {
        let header = Header { magic: CONSUMER_MAGIC, slots: layout.slots, params: [layout.pages_per_run, 0] };
        let (map, fd) = header.create(c"wic-consumer", layout.bytes())?;
        Ok((Self { map, layout }, fd))
    }

    /// Maps a region received from the daemon and checks it matches `layout`.
    pub fn open(fd: &OwnedFd, layout: ConsumerLayout) -> Result<Self, ShmError> {
        let header = Header { magic: CONSUMER_MAGIC, slots: layout.slots, params: [layout.pages_per_run, 0] };
        Ok(Self { map: header.open(fd, layout.bytes())?, layout })
    }

    /// The region's layout.
    pub fn layout(&self) -> ConsumerLayout {
        self.layout
    }

    /// The state word of page `index` of the channel.
    pub fn page_state(&self, index: usize) -> &AtomicU32 {
        assert!(index < self.layout.pages(), "page {index} beyond the channel");
        self.map.u32_at(HEADER_BYTES + 4 * index)
    }

    /// Sets `pages` page states from `first`; mapping releases the data written before it.
    pub fn set_pages(&self, first: usize, pages: usize, state: u32) {
        for index in first..first + pages {
            self.page_state(index).store(state, Ordering::Release);
        }
    }

    fn page_offset(&self, index: usize) -> usize {
        self.layout.data_offset() + index * PAGE_SIZE as usize
    }

    /// Writes `bytes` at the start of page `index` (spilling into the following pages).
    pub fn write_pages(&self, index: usize, bytes: &[u8]) {
        assert!(index * PAGE_SIZE as usize + bytes.len() <= self.layout.pages() * PAGE_SIZE as usize);
        self.map.write(self.page_offset(index), bytes);
    }

    /// A pointer to page `index` of the channel, for a host producer that writes a run in
    /// place (the emulated GPU's memory is this region).
    pub fn page_ptr(&self, index: usize) -> *mut u8 {
        assert!(index < self.layout.pages());
        self.map.ptr(self.page_offset(index), PAGE_SIZE as usize)
    }

    /// Reads from the start of page `index`.
    pub fn read_pages(&self, index: usize, dst: &mut [u8]) {
        assert!(index * PAGE_SIZE as usize + dst.len() <= self.layout.pages() * PAGE_SIZE as usize);
        self.map.read(self.page_offset(index), dst);
    }

    /// The replay counter: bumped by every replay of the channel's GPU; stalled warps sleep on it.
    pub fn replay_seq(&self) -> &AtomicU32 {
        self.map.u32_at(word::REPLAY_SEQ)
    }

    /// Replays: stalled warps wake up and retry their access.
    pub fn replay(&self) {
        self.replay_seq().fetch_add(1, Ordering::AcqRel);
        futex_wake_all(self.replay_seq());
    }

    /// The channel's lifecycle state.
    pub fn state(&self) -> ChannelState {
        ChannelState::from_raw(self.map.u32_at(word::STATE).load(Ordering::Acquire))
    }

    /// Marks the channel closed or stopping and wakes every sleeper so it notices.
    pub fn set_state(&self, state: ChannelState) {
        self.map.u32_at(word::STATE).store(state as u32, Ordering::Release);
        self.replay();
    }

    /// Faults that found the ring full, as reported by the warps. The client writes this word
    /// at will: the daemon shows it as that channel's own claim, never in a daemon-wide total.
    pub fn overflows(&self) -> u64 {
        self.map.u64_at(word::OVERFLOWS).load(Ordering::Relaxed)
    }

    fn ring_slot(&self, index: u64) -> usize {
        self.layout.ring_offset() + (index % u64::from(FAULT_RING_ENTRIES)) as usize * RING_ENTRY_BYTES
    }

    /// Posts a fault entry (warp side): claims a ring index, writes the entry, then publishes
    /// it by storing the entry's sequence word.
    pub fn post_fault(&self, entry: &RawFaultEntry) -> Result<(), RingFull> {
        let reserve = self.map.u64_at(word::RING_RESERVE);
        let get = self.map.u64_at(word::RING_GET);
        let mut index = reserve.load(Ordering::Acquire);
        loop {
            if index.wrapping_sub(get.load(Ordering::Acquire)) >= u64::from(FAULT_RING_ENTRIES) {
                self.map.u64_at(word::OVERFLOWS).fetch_add(1, Ordering::Relaxed);
                return Err(RingFull);
            }
            match reserve.compare_exchange_weak(index, index + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(current) => index = current,
            }
        }
        let slot = self.ring_slot(index);
        self.map.write(slot + 8, &entry.0);
        self.map.u64_at(slot).store(index + 1, Ordering::Release);
        Ok(())
    }

    /// Takes up to [`FAULT_RING_ENTRIES`] posted entries (daemon side). `get` is the daemon's
    /// own copy of the read index; it is mirrored into the region for the warps' full check.
    pub fn take_faults(&self, get: &mut u64, out: &mut Vec<RawFaultEntry>) {
        for _ in 0..FAULT_RING_ENTRIES {
            let slot = self.ring_slot(*get);
            if self.map.u64_at(slot).load(Ordering::Acquire) != *get + 1 {
                break;
            }
            let mut raw = [0u8; 32];
            self.map.read(slot + 8, &mut raw);
            out.push(RawFaultEntry(raw));
            *get += 1;
        }
        self.map.u64_at(word::RING_GET).store(*get, Ordering::Release);
    }
}

/// A channel's producer region.
pub struct ProducerRegion {
    map: Mapping,
    layout: ProducerLayout,
    /// The mapping holds the in-place area (every region the daemon creates does).
    in_place: bool,
}

/// A host producer's pending in-place publish, as the daemon takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publish {
    /// The slot buffer holds the batch.
    Buffer,
    /// The producer wrote run `side` of the slot in place, and its head words.
    InPlace { side: u8 },
}

impl ProducerRegion {
    /// Creates the region (daemon side): nothing published.
    pub fn create(layout: ProducerLayout) -> io::Result<(Self, OwnedFd)> {
        let (map, fd) = Self::header(layout).create(c"wic-producer", layout.bytes())?;
        Ok((Self { map, layout, in_place: true }, fd))
    }

    /// Maps a region received from the daemon and checks it matches `layout`; one without the
    /// in-place area (from an older daemon) is mapped without it.
    pub fn open(fd: &OwnedFd, layout: ProducerLayout) -> Result<Self, ShmError> {
        let in_place = mapped_len(fd)? >= layout.bytes();
        let bytes = if in_place { layout.bytes() } else { layout.base_bytes() };
        Ok(Self { map: Self::header(layout).open(fd, bytes)?, layout, in_place })
    }

    /// Whether the region has the in-place area.
    pub fn supports_in_place(&self) -> bool {
        self.in_place
    }

    fn header(layout: ProducerLayout) -> Header {
        let batch = layout.batch_bytes;
        Header { magic: PRODUCER_MAGIC, slots: layout.slots, params: [batch as u32, (batch >> 32) as u32] }
    }

    /// The region's layout.
    pub fn layout(&self) -> ProducerLayout {
        self.layout
    }

    /// Generations the producer has published for `slot`.
    pub fn published(&self, slot: u32) -> &AtomicU32 {
        assert!(slot < self.layout.slots);
        self.map.u32_at(HEADER_BYTES + 4 * slot as usize)
    }

    /// Generations the daemon has delivered (copied out) for `slot`; producers sleep on it.
    pub fn delivered(&self, slot: u32) -> &AtomicU32 {
        assert!(slot < self.layout.slots);
        self.map.u32_at(self.layout.delivered_offset() + 4 * slot as usize)
    }

    fn dirty_word(&self, word: usize) -> &AtomicU64 {
        self.map.u64_at(self.layout.dirty_offset() + 8 * word)
    }

    /// Byte offset of `slot`'s buffer in the data area.
    pub fn slot_offset(&self, slot: u32) -> u64 {
        u64::from(slot) * self.layout.batch_bytes
    }

    /// Writes into `slot`'s buffer (producer side).
    pub fn write_slot(&self, slot: u32, bytes: &[u8]) {
        assert!(slot < self.layout.slots && bytes.len() as u64 <= self.layout.batch_bytes);
        self.map.write(self.layout.data_offset() + self.slot_offset(slot) as usize, bytes);
    }

    /// Reads `dst.len()` bytes at `offset` of the data area (daemon side: the delivery copy).
    pub fn read_data(&self, offset: u64, dst: &mut [u8]) {
        let end = offset.checked_add(dst.len() as u64).expect("offset in range");
        assert!(end <= u64::from(self.layout.slots) * self.layout.batch_bytes);
        self.map.read(self.layout.data_offset() + offset as usize, dst);
    }

    /// The address in this mapping of `len` bytes at `offset` of the data area, or `None` past
    /// its end: what the shim backend hands the kernel module to copy from.
    pub fn data_address(&self, offset: u64, len: u64) -> Option<u64> {
        let end = offset.checked_add(len)?;
        if end > u64::from(self.layout.slots) * self.layout.batch_bytes {
            return None;
        }
        Some(self.map.ptr(self.layout.data_offset() + offset as usize, len as usize) as u64)
    }

    /// A raw pointer to `slot`'s buffer, for libwic's zero-copy `wic_slot_buffer`.
    pub fn slot_ptr(&self, slot: u32) -> *mut u8 {
        assert!(slot < self.layout.slots);
        self.map.ptr(self.layout.data_offset() + self.slot_offset(slot) as usize, self.layout.batch_bytes as usize)
    }

    fn in_place_word(&self, slot: u32) -> &AtomicU32 {
        assert!(self.in_place && slot < self.layout.slots);
        self.map.u32_at(self.layout.in_place_offset() + 4 * slot as usize)
    }

    /// The run of `slot` its producer may write in place next (0 or 1): the daemon sets it
    /// once the run is unmapped on the consumer GPU (the companion of a completed generation),
    /// before it counts that generation's publish delivered.
    pub fn writable_side(&self, slot: u32) -> &AtomicU32 {
        assert!(self.in_place && slot < self.layout.slots);
        self.map.u32_at(self.layout.writable_side_offset() + 4 * slot as usize)
    }

    /// In-place publishes of `slot` that missed their generation: it had ended (timed out,
    /// expired in the module, or its completion failed) before their data could be mapped,
    /// so its consumers read an error marker instead.
    pub fn missed(&self, slot: u32) -> &AtomicU32 {
        assert!(self.in_place && slot < self.layout.slots);
        self.map.u32_at(self.layout.missed_offset() + 4 * slot as usize)
    }

    /// `slot`'s head words, one per page of a run: the first 8 bytes of each page of an
    /// in-place batch, which the daemon's completion writes and the producer never does.
    pub fn heads_ptr(&self, slot: u32) -> *mut u64 {
        assert!(self.in_place && slot < self.layout.slots);
        let pages = self.layout.pages_per_run();
        self.map.ptr(self.layout.heads_offset() + 8 * slot as usize * pages, 8 * pages).cast()
    }

    /// Reads `slot`'s head words (daemon side).
    pub fn read_heads(&self, slot: u32, dst: &mut [u64]) {
        let pages = self.layout.pages_per_run();
        assert!(dst.len() <= pages);
        let mut bytes = vec![0u8; 8 * dst.len()];
        self.map.read(self.layout.heads_offset() + 8 * slot as usize * pages, &mut bytes);
        for (word, chunk) in dst.iter_mut().zip(bytes.chunks_exact(8)) {
            *word = u64::from_ne_bytes(chunk.try_into().expect("8 bytes"));
        }
    }

    /// Publishes `slot` in place (producer side): run `side` and the head words hold the
    /// batch. Fails with `false` if the previous generation has not been delivered yet.
    pub fn publish_in_place(&self, slot: u32, side: u8) -> bool {
        if !self.claim(slot) {
            return false;
        }
        // Marked only once claimed, so a refused publish leaves no mark for the next one; the
        // daemon reads it after the dirty bit, whose release orders it first.
        self.in_place_word(slot).store(u32::from(side) + 1, Ordering::Relaxed);
        self.mark_dirty(slot);
        true
    }

    /// How `slot`'s publish just taken by [`Self::take_published`] carries its batch (daemon
    /// side); takes the in-place mark, so that the next publish starts from the buffer.
    pub fn take_publish(&self, slot: u32) -> Publish {
        if !self.in_place {
            return Publish::Buffer;
        }
        match self.in_place_word(slot).swap(0, Ordering::AcqRel) {
            0 => Publish::Buffer,
            mark => Publish::InPlace { side: ((mark - 1) & 1) as u8 },
        }
    }

    /// Records that `slot`'s run `side` is unmapped on the consumer GPU and may be written in
    /// place (daemon side).
    pub fn set_writable_side(&self, slot: u32, side: u8) {
        if self.in_place {
            self.writable_side(slot).store(u32::from(side), Ordering::Release);
        }
    }

    /// Records that `slot`'s in-place publish missed its generation, and lets the producer
    /// publish again (daemon side).
    pub fn mark_missed(&self, slot: u32) {
        self.missed(slot).fetch_add(1, Ordering::AcqRel);
        self.mark_delivered(slot);
    }

    /// Publishes `slot` (producer side): the buffer must already hold the data. Fails with
    /// `false` if the previous generation has not been delivered yet.
    pub fn publish(&self, slot: u32) -> bool {
        if !self.claim(slot) {
            return false;
        }
        self.mark_dirty(slot);
        true
    }

    /// Claims `slot`'s next generation: false if the previous one is not delivered yet. A
    /// compare-exchange, so two threads publishing one slot cannot both succeed.
    fn claim(&self, slot: u32) -> bool {
        let delivered = self.delivered(slot).load(Ordering::Acquire);
        self.published(slot)
            .compare_exchange(delivered, delivered.wrapping_add(1), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Sets `slot`'s dirty bit, which the daemon's scan takes.
    fn mark_dirty(&self, slot: u32) {
        self.dirty_word(slot as usize / 64).fetch_or(1 << (slot % 64), Ordering::AcqRel);
    }

    /// Whether `slot` was published since the daemon's last scan ([`Self::take_published`]):
    /// its publish has not reached the engine yet. Reads the dirty bit without taking it, for
    /// an observer that times the daemon's scan (wic-bench's `doorbell`).
    pub fn publish_pending(&self, slot: u32) -> bool {
        assert!(slot < self.layout.slots);
        self.dirty_word(slot as usize / 64).load(Ordering::Acquire) & (1 << (slot % 64)) != 0
    }

    /// Takes the dirty bits (daemon side), calling `each` with every slot published since the
    /// last scan.
    pub fn take_published(&self, mut each: impl FnMut(u32)) {
        for word in 0..self.layout.dirty_words() {
            let mut bits = self.dirty_word(word).swap(0, Ordering::AcqRel);
            while bits != 0 {
                let slot = word as u32 * 64 + bits.trailing_zeros();
                bits &= bits - 1;
                if slot < self.layout.slots {
                    each(slot);
                }
            }
        }
    }

    /// Records a delivery of `slot` (daemon side) and wakes a producer waiting to reuse it.
    pub fn mark_delivered(&self, slot: u32) {
        self.delivered(slot).fetch_add(1, Ordering::AcqRel);
        futex_wake_all(self.delivered(slot));
    }

    /// The channel's lifecycle state.
    pub fn state(&self) -> ChannelState {
        ChannelState::from_raw(self.map.u32_at(word::STATE).load(Ordering::Acquire))
    }

    /// Marks the channel closed or stopping and wakes every waiting producer.
    pub fn set_state(&self, state: ChannelState) {
        self.map.u32_at(word::STATE).store(state as u32, Ordering::Release);
        for slot in 0..self.layout.slots {
            futex_wake_all(self.delivered(slot));
        }
    }
}

/// Sleeps while `word` holds `expected`, at most `timeout`. Spurious wake-ups are allowed:
/// callers re-check their condition.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: FUTEX_WAIT on a valid, aligned u32 that lives as long as this call; the timespec
    // is a valid relative timeout. Shared (not PRIVATE) because the word is in a MAP_SHARED
    // region other processes wake.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec);
    }
}

/// Wakes every process sleeping on `word`.
pub fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only reads the address as a key; it never dereferences other memory.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u8) -> RawFaultEntry {
        RawFaultEntry([n; 32])
    }

    #[test]
    fn layouts_do_not_overlap_and_data_is_page_aligned() {
        for (slots, ppr) in [(1, 1), (3, 2), (4096, 1), (7, 16)] {
            let c = ConsumerLayout { slots, pages_per_run: ppr };
            assert!(c.ring_offset() >= HEADER_BYTES + 4 * c.pages());
            assert!(c.data_offset() >= c.ring_offset() + RING_ENTRY_BYTES * FAULT_RING_ENTRIES as usize);
            assert_eq!(c.data_offset() % PAGE_SIZE as usize, 0);
            assert_eq!(c.run_page(slots - 1, 1) + ppr as usize, c.pages());
            let p = ProducerLayout { slots, batch_bytes: 1000 * u64::from(ppr) };
            assert!(p.dirty_offset() >= p.delivered_offset() + 4 * slots as usize);
            assert_eq!(p.data_offset() % PAGE_SIZE as usize, 0);
            assert_eq!(p.base_bytes(), p.data_offset() + slots as usize * 1000 * ppr as usize);
            // The in-place area comes after everything a region without it has.
            assert!(p.in_place_offset() >= p.base_bytes());
            assert_eq!(p.missed_offset(), p.writable_side_offset() + 4 * slots as usize);
            assert!(p.heads_offset() >= p.missed_offset() + 4 * slots as usize);
            assert_eq!(p.heads_offset() % 8, 0);
            assert_eq!(p.pages_per_run(), (1000 * ppr as usize).div_ceil(PAGE_SIZE as usize));
            assert_eq!(p.bytes(), p.heads_offset() + 8 * slots as usize * p.pages_per_run());
        }
    }

    #[test]
    fn a_region_without_the_in_place_area_opens_and_publishes_from_the_buffer() {
        let layout = ProducerLayout { slots: 2, batch_bytes: 5000 };
        // What an older daemon creates: the region up to the slot buffers.
        let (_daemon, fd) = ProducerRegion::header(layout).create(c"wic-producer", layout.base_bytes()).unwrap();
        let producer = ProducerRegion::open(&fd, layout).unwrap();
        assert!(!producer.supports_in_place());
        assert_eq!(producer.take_publish(0), Publish::Buffer);
        assert!(producer.publish(0), "the buffer path works as before");
    }

    #[test]
    fn an_in_place_publish_marks_its_run_only_once_claimed() {
        let layout = ProducerLayout { slots: 1, batch_bytes: 8192 };
        let (daemon, fd) = ProducerRegion::create(layout).unwrap();
        let producer = ProducerRegion::open(&fd, layout).unwrap();
        assert!(producer.supports_in_place());
        assert!(producer.publish_in_place(0, 1));
        // Refused while the first is not delivered: it must leave the mark as it was.
        assert!(!producer.publish_in_place(0, 0));
        let mut slots = Vec::new();
        daemon.take_published(|slot| slots.push(slot));
        assert_eq!((slots, daemon.take_publish(0)), (vec![0], Publish::InPlace { side: 1 }));
        daemon.set_writable_side(0, 0);
        daemon.mark_missed(0);
        assert_eq!(producer.missed(0).load(Ordering::Acquire), 1);
        assert_eq!(producer.writable_side(0).load(Ordering::Acquire), 0);
        // A buffer publish after it reads as one.
        assert!(producer.publish(0));
        daemon.take_published(|_| ());
        assert_eq!(daemon.take_publish(0), Publish::Buffer);
    }

    #[test]
    fn ring_passes_entries_in_order_and_refuses_beyond_capacity() {
        let (region, fd) = ConsumerRegion::create(ConsumerLayout { slots: 1, pages_per_run: 1 }).unwrap();
        let warp = ConsumerRegion::open(&fd, region.layout()).unwrap();
        let mut get = 0;
        let mut out = Vec::new();
        for round in 0..3u8 {
            for n in 0..FAULT_RING_ENTRIES {
                warp.post_fault(&entry(n as u8 ^ round)).unwrap();
            }
            assert_eq!(warp.post_fault(&entry(0)), Err(RingFull));
            out.clear();
            region.take_faults(&mut get, &mut out);
            assert_eq!(out.len(), FAULT_RING_ENTRIES as usize);
            assert!(out.iter().enumerate().all(|(n, e)| e.0[0] == n as u8 ^ round));
        }
        assert_eq!(region.overflows(), 3);
        out.clear();
        region.take_faults(&mut get, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn producer_publish_waits_for_delivery_and_dirty_bits_are_taken_once() {
        let layout = ProducerLayout { slots: 130, batch_bytes: 16 };
        let (daemon, fd) = ProducerRegion::create(layout).unwrap();
        let producer = ProducerRegion::open(&fd, layout).unwrap();
        producer.write_slot(129, b"0123456789abcdef");
        assert!(producer.publish(129));
        assert!(producer.publish(3));
        assert!(!producer.publish(129), "not delivered yet");
        assert!(daemon.publish_pending(129) && daemon.publish_pending(3) && !daemon.publish_pending(4));
        let mut seen = Vec::new();
        daemon.take_published(|s| seen.push(s));
        assert_eq!(seen, vec![3, 129]);
        assert!(!producer.publish_pending(129) && !producer.publish_pending(3), "the scan took them");
        seen.clear();
        daemon.take_published(|s| seen.push(s));
        assert!(seen.is_empty());
        let mut bytes = [0u8; 16];
        daemon.read_data(daemon.slot_offset(129), &mut bytes);
        assert_eq!(&bytes, b"0123456789abcdef");
        daemon.mark_delivered(129);
        assert!(producer.publish(129));
    }

    #[test]
    fn regions_are_sealed_against_shrinking_and_checked_on_open() {
        let layout = ConsumerLayout { slots: 2, pages_per_run: 1 };
        let (_region, fd) = ConsumerRegion::create(layout).unwrap();
        assert!(nix::unistd::ftruncate(&fd, 0).is_err(), "a client must not shrink the region");
        let other = ConsumerLayout { slots: 1, pages_per_run: 1 };
        assert!(ConsumerRegion::open(&fd, other).is_err());
        let (_p, pfd) = ProducerRegion::create(ProducerLayout { slots: 2, batch_bytes: 8 }).unwrap();
        assert!(matches!(
            ConsumerRegion::open(&pfd, ConsumerLayout { slots: 1, pages_per_run: 1 }),
            Err(ShmError::BadHeader(_))
        ));
    }
}
