//! The record ring: records the module writes and the daemon reads.
//!
//! The module publishes a record by writing its sequence number last and then advancing the
//! header's `head`; the daemon advances `tail`. Nothing in the mapping is trusted: the daemon
//! keeps its own read index, a `head` that runs ahead by more than the ring's size or goes
//! backwards is reported, and a record whose sequence number is not the expected one (torn or
//! stale) is skipped and counted.

use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU64, Ordering};

use wic_engine::RawFaultEntry;
use wic_kabi::{
    WicFaultRecord, WicRingHeader, WIC_RECORD_EXPIRED, WIC_RECORD_PAT, WIC_RECORD_UNSUPPORTED_GPU, WIC_RING_MAGIC,
    WIC_RING_RECORDS_OFFSET,
};

/// A record as the 8-byte words the reader copies it in.
const RECORD_WORDS: usize = std::mem::size_of::<WicFaultRecord>() / 8;

/// A record, copied out of the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub space_id: u32,
    pub gpu_id: u32,
    pub range_id: u32,
    pub pat: bool,
    /// Not a fault: the module ended this hold itself ([`WIC_RECORD_EXPIRED`]).
    pub expired: bool,
    /// Not a held fault: the page was read on a GPU the module cannot hold faults of
    /// ([`WIC_RECORD_UNSUPPORTED_GPU`]).
    pub unsupported_gpu: bool,
    pub held_ns: u64,
    pub entry: RawFaultEntry,
}

/// What can be wrong with a ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingError {
    /// The mapping is too small for the header, or for the records it announces.
    TooSmall { len: usize, needed: u64 },
    /// The header's magic, record size or entry count is not what this daemon speaks.
    BadHeader(&'static str),
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooSmall { len, needed } => write!(f, "record ring mapping of {len} bytes, {needed} needed"),
            Self::BadHeader(what) => write!(f, "record ring header: {what}"),
        }
    }
}

impl std::error::Error for RingError {}

/// Counts of what a read found wrong.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RingAnomalies {
    /// Records whose sequence number was not the expected one.
    pub torn: u64,
    /// Times `head` was more than a ring ahead, or behind the daemon's index.
    pub bad_head: u64,
}

/// A reader of a mapped record ring.
pub struct RecordRing {
    base: NonNull<u8>,
    entries: u64,
    /// The next sequence number to read; the daemon's own, never read back from the mapping.
    next: u64,
    anomalies: RingAnomalies,
}

// SAFETY: the ring is plain shared memory accessed through atomics and volatile reads; the
// reader owns its index and may move to another thread.
unsafe impl Send for RecordRing {}

impl RecordRing {
    /// A reader of the ring mapped at `base` for `len` bytes.
    ///
    /// # Safety
    /// `base` must point to `len` bytes that stay mapped, readable and writable, and 8-byte
    /// aligned, for the reader's lifetime.
    pub unsafe fn new(base: NonNull<u8>, len: usize) -> Result<Self, RingError> {
        let header_len = std::mem::size_of::<WicRingHeader>();
        if len < header_len {
            return Err(RingError::TooSmall { len, needed: header_len as u64 });
        }
        // SAFETY: the caller guarantees `len` readable bytes, checked above to hold a header.
        let header = unsafe { std::ptr::read_volatile(base.as_ptr().cast::<WicRingHeader>()) };
        if header.magic != WIC_RING_MAGIC {
            return Err(RingError::BadHeader("wrong magic"));
        }
        if header.record_size as usize != std::mem::size_of::<WicFaultRecord>() {
            return Err(RingError::BadHeader("wrong record size"));
        }
        if !header.entries.is_power_of_two() {
            return Err(RingError::BadHeader("entry count is not a power of two"));
        }
        let needed = wic_kabi::ring_bytes(header.entries);
        if (len as u64) < needed {
            return Err(RingError::TooSmall { len, needed });
        }
        let ring = Self { base, entries: header.entries.into(), next: 0, anomalies: RingAnomalies::default() };
        let head = ring.head().load(Ordering::Acquire);
        Ok(Self { next: head, ..ring })
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: offsets come from the header struct, inside the mapping checked in `new`,
        // 8-byte aligned within an 8-byte aligned base.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    fn head(&self) -> &AtomicU64 {
        self.word(std::mem::offset_of!(WicRingHeader, head))
    }

    fn tail(&self) -> &AtomicU64 {
        self.word(std::mem::offset_of!(WicRingHeader, tail))
    }

    /// Faults the module held but could not record (they fault again after a replay).
    pub fn dropped(&self) -> u64 {
        self.word(std::mem::offset_of!(WicRingHeader, dropped)).load(Ordering::Relaxed)
    }

    /// What reads have found wrong so far.
    pub fn anomalies(&self) -> RingAnomalies {
        self.anomalies
    }

    /// Records in the ring.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Whether records are waiting.
    pub fn pending(&self) -> bool {
        self.head().load(Ordering::Acquire) != self.next
    }

    /// Appends every published record to `out`, up to `limit`, and hands their slots back to
    /// the module. Returns how many were appended.
    pub fn read(&mut self, out: &mut Vec<Record>, limit: usize) -> usize {
        self.read_with(limit, |seq, rec| {
            out.push(Record {
                seq,
                space_id: rec.space_id,
                gpu_id: rec.gpu_id,
                range_id: rec.range_id,
                pat: rec.flags & WIC_RECORD_PAT != 0,
                expired: rec.flags & WIC_RECORD_EXPIRED != 0,
                unsupported_gpu: rec.flags & WIC_RECORD_UNSUPPORTED_GPU != 0,
                held_ns: rec.held_ns,
                entry: RawFaultEntry(rec.entry),
            })
        })
    }

    /// Hands every published record, up to `limit`, to `each` with its sequence number, in
    /// ring order, and hands their slots back to the module. Returns how many were handed.
    /// `each` sees a copy taken under the seqlock, so it may keep whatever it likes of it.
    #[inline]
    pub fn read_with(&mut self, limit: usize, mut each: impl FnMut(u64, &WicFaultRecord)) -> usize {
        let head = self.head().load(Ordering::Acquire);
        let ahead = head.wrapping_sub(self.next);
        if ahead > self.entries {
            // A head more than a ring ahead: only the last ring's worth can still be there.
            // A head behind us: nothing new to read.
            self.anomalies.bad_head += 1;
            // Sequence numbers wrap around, so a head below `entries` is a head like any other.
            self.next = if ahead > u64::MAX / 2 { head } else { head.wrapping_sub(self.entries) };
        }
        let mut handed = 0;
        while self.next != head && handed < limit {
            let seq = self.next;
            self.next = self.next.wrapping_add(1);
            let offset = WIC_RING_RECORDS_OFFSET as usize
                + (seq & (self.entries - 1)) as usize * std::mem::size_of::<WicFaultRecord>();
            // The module never writes a slot the tail has not passed (a full ring drops the
            // fault instead), so the record stays put while it is copied. Its sequence number,
            // checked before and after the copy, catches a record of another lap: one not
            // written yet, or a head the module got wrong.
            if self.word(offset).load(Ordering::Acquire) != seq {
                self.anomalies.torn += 1;
                continue;
            }
            let mut words = [0u64; RECORD_WORDS];
            for (i, word) in words.iter_mut().enumerate() {
                *word = self.word(offset + 8 * i).load(Ordering::Relaxed);
            }
            fence(Ordering::Acquire);
            if self.word(offset).load(Ordering::Relaxed) != seq {
                self.anomalies.torn += 1;
                continue;
            }
            // SAFETY: `WicFaultRecord` is `repr(C)` plain data, integers and bytes only, so
            // every bit pattern is a valid value; `transmute` itself checks the sizes match.
            let rec: WicFaultRecord = unsafe { std::mem::transmute(words) };
            each(seq, &rec);
            handed += 1;
        }
        self.tail().store(self.next, Ordering::Release);
        handed
    }
}

/// A record ring in ordinary memory, laid out and written the way the module writes it: for
/// benchmarks of the reader and the path behind it, and for the reader's tests.
pub struct MemoryRing {
    mem: Vec<u64>,
    entries: u32,
}

impl MemoryRing {
    /// An empty ring of `entries` records, a power of two.
    pub fn new(entries: u32) -> Self {
        let mut ring = Self { mem: vec![0; wic_kabi::ring_bytes(entries) as usize / 8], entries };
        let header = WicRingHeader {
            magic: WIC_RING_MAGIC,
            abi_version: wic_kabi::WIC_ABI_VERSION,
            entries,
            record_size: std::mem::size_of::<WicFaultRecord>() as u32,
            ..Default::default()
        };
        // SAFETY: the buffer holds at least the header and is 8-byte aligned.
        unsafe { std::ptr::write(ring.mem.as_mut_ptr().cast(), header) };
        ring
    }

    /// Where the ring starts, for [`RecordRing::new`].
    pub fn base(&mut self) -> NonNull<u8> {
        NonNull::from(&mut self.mem[..]).cast()
    }

    /// The ring's size in bytes.
    pub fn bytes(&self) -> usize {
        self.mem.len() * 8
    }

    /// Writes `record` into the slot of sequence number `seq`; a `record.seq` other than
    /// `seq` makes a torn or stale record.
    pub fn write(&mut self, seq: u64, record: &Record) {
        let offset = WIC_RING_RECORDS_OFFSET as usize
            + (seq % u64::from(self.entries)) as usize * std::mem::size_of::<WicFaultRecord>();
        let raw = WicFaultRecord {
            seq: record.seq,
            space_id: record.space_id,
            gpu_id: record.gpu_id,
            range_id: record.range_id,
            flags: if record.pat { WIC_RECORD_PAT } else { 0 }
                | if record.expired { WIC_RECORD_EXPIRED } else { 0 }
                | if record.unsupported_gpu { WIC_RECORD_UNSUPPORTED_GPU } else { 0 },
            held_ns: record.held_ns,
            entry: record.entry.0,
        };
        // SAFETY: the slot lies inside the buffer (index masked by the entry count) and is
        // 8-byte aligned.
        unsafe { std::ptr::write(self.mem.as_mut_ptr().cast::<u8>().add(offset).cast(), raw) };
    }

    /// Publishes every record before `head`.
    pub fn publish(&mut self, head: u64) {
        self.set(std::mem::offset_of!(WicRingHeader, head), head);
    }

    /// How far the reader has handed records back.
    pub fn tail(&self) -> u64 {
        self.mem[std::mem::offset_of!(WicRingHeader, tail) / 8]
    }

    fn set(&mut self, offset: usize, value: u64) {
        self.mem[offset / 8] = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(fake: &mut MemoryRing, seq: u64, stored_seq: u64, va_byte: u8) {
        let record = Record {
            seq: stored_seq,
            space_id: 1,
            gpu_id: 2,
            range_id: 3,
            pat: false,
            expired: false,
            unsupported_gpu: false,
            held_ns: 9,
            entry: RawFaultEntry([va_byte; 32]),
        };
        fake.write(seq, &record);
    }

    fn reader(fake: &mut MemoryRing) -> RecordRing {
        let len = fake.bytes();
        // SAFETY: the fake outlives the reader in every test.
        unsafe { RecordRing::new(fake.base(), len) }.unwrap()
    }

    #[test]
    fn reads_published_records_in_order_and_moves_the_tail() {
        let mut fake = MemoryRing::new(256);
        let mut ring = reader(&mut fake);
        for seq in 0..5 {
            write(&mut fake, seq, seq, seq as u8);
        }
        fake.publish(5);
        let mut out = Vec::new();
        assert_eq!(ring.read(&mut out, usize::MAX), 5);
        assert_eq!(out.iter().map(|r| r.seq).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        assert_eq!(out[3].entry.0, [3; 32]);
        assert_eq!((out[0].space_id, out[0].gpu_id, out[0].range_id), (1, 2, 3));
        assert_eq!(fake.tail(), 5);
        assert!(!ring.pending());
    }

    #[test]
    fn wraps_around_and_honours_the_limit() {
        let mut fake = MemoryRing::new(256);
        let mut ring = reader(&mut fake);
        let mut out = Vec::new();
        for round in 0..3u64 {
            for seq in round * 200..(round + 1) * 200 {
                write(&mut fake, seq, seq, 0);
            }
            fake.publish((round + 1) * 200);
            assert_eq!(ring.read(&mut out, 150), 150);
            assert_eq!(ring.read(&mut out, 150), 50);
        }
        assert_eq!(out.len(), 600);
        assert!(out.windows(2).all(|w| w[1].seq == w[0].seq + 1));
        assert_eq!(ring.anomalies(), RingAnomalies::default());
    }

    #[test]
    fn torn_records_are_skipped_and_counted() {
        let mut fake = MemoryRing::new(256);
        let mut ring = reader(&mut fake);
        write(&mut fake, 0, 0, 0);
        write(&mut fake, 1, 77, 0); // stale sequence number
        write(&mut fake, 2, 2, 0);
        fake.publish(3);
        let mut out = Vec::new();
        ring.read(&mut out, usize::MAX);
        assert_eq!(out.iter().map(|r| r.seq).collect::<Vec<_>>(), [0, 2]);
        assert_eq!(ring.anomalies().torn, 1);
    }

    #[test]
    fn a_head_out_of_range_is_survived() {
        let mut fake = MemoryRing::new(256);
        let mut ring = reader(&mut fake);
        fake.publish(u64::MAX - 3); // far ahead (or, equally, behind)
        let mut out = Vec::new();
        ring.read(&mut out, usize::MAX);
        assert!(out.len() <= 256);
        assert_eq!(ring.anomalies().bad_head, 1);
        // Whatever the head said, the reader never indexes outside the ring.
        fake.publish(3);
        ring.read(&mut out, usize::MAX);
        assert!(ring.anomalies().bad_head >= 1);
    }

    #[test]
    fn a_head_far_ahead_across_the_sequence_wrap_is_survived() {
        let mut fake = MemoryRing::new(256);
        fake.publish(u64::MAX - 300);
        let mut ring = reader(&mut fake);
        // 401 ahead of the reader, past the wrap, and below the ring's size.
        fake.publish(100);
        for seq in (1..=256).map(|back| 100u64.wrapping_sub(back)) {
            write(&mut fake, seq, seq, 0);
        }
        let mut out = Vec::new();
        assert_eq!(ring.read(&mut out, usize::MAX), 256);
        assert_eq!(out.first().map(|r| r.seq), Some(100u64.wrapping_sub(256)));
        assert_eq!(ring.anomalies(), RingAnomalies { torn: 0, bad_head: 1 });
        assert_eq!(fake.tail(), 100);
    }

    #[test]
    fn bad_headers_are_refused() {
        let mut fake = MemoryRing::new(256);
        let len = fake.bytes();
        // SAFETY: as in `reader`.
        assert!(matches!(unsafe { RecordRing::new(fake.base(), 64) }, Err(RingError::TooSmall { .. })));
        // SAFETY: as in `reader`.
        assert!(matches!(unsafe { RecordRing::new(fake.base(), len - 8) }, Err(RingError::TooSmall { .. })));
        // Entries 300, record_size 64.
        fake.mem[1] = 300 | (64 << 32);
        assert_eq!(
            // SAFETY: as in `reader`.
            unsafe { RecordRing::new(fake.base(), len) }.err(),
            Some(RingError::BadHeader("entry count is not a power of two"))
        );
        fake.mem[0] = 0;
        // SAFETY: as in `reader`.
        assert_eq!(unsafe { RecordRing::new(fake.base(), len) }.err(), Some(RingError::BadHeader("wrong magic")));
    }
}
