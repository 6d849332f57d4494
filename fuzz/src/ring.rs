//! The `fault_ring` target's input and the memory its reader runs on.
//!
//! Input format (little-endian throughout; missing bytes read as 0):
//!
//! | bytes | what |
//! |---|---|
//! | 0..192 | the ring header as the mapping holds it (`struct wic_ring_header`) |
//! | 192..194 | `i16`: added to the mapping's length, which is otherwise what the header's entry count needs (capped at [`MAX_MAPPING_BYTES`]); the sum is clamped to 0..=[`MAX_MAPPING_BYTES`] |
//! | then | operations, each a tag byte (taken modulo 5) and its operands, see [`RingOp`] |

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use wic_kabi::{
    ring_bytes, WicFaultRecord, WicRingHeader, WIC_RECORD_EXPIRED, WIC_RECORD_PAT, WIC_RECORD_UNSUPPORTED_GPU,
    WIC_RING_RECORDS_OFFSET,
};

/// Bytes of `struct wic_ring_header`.
pub const HEADER_BYTES: usize = std::mem::size_of::<WicRingHeader>();
/// Bytes of `struct wic_fault_record`.
pub const RECORD_BYTES: usize = std::mem::size_of::<WicFaultRecord>();
/// The largest mapping a run allocates: a ring of 1024 records.
pub const MAX_MAPPING_BYTES: usize = WIC_RING_RECORDS_OFFSET as usize + 1024 * RECORD_BYTES;

/// Offsets of the header's words that the module and the daemon change.
pub const HEAD_OFFSET: usize = std::mem::offset_of!(WicRingHeader, head);
pub const TAIL_OFFSET: usize = std::mem::offset_of!(WicRingHeader, tail);
pub const DROPPED_OFFSET: usize = std::mem::offset_of!(WicRingHeader, dropped);

/// What happens to the ring between and in reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingOp {
    /// Tag 0, `u8` n: the module publishes up to n records as it does (never past an unread
    /// record), each with contents derived from its sequence number.
    Publish(u8),
    /// Tag 1, `u16` limit: the daemon reads.
    Read(u16),
    /// Tag 2, `u64`: the header's head is overwritten.
    SetHead(u64),
    /// Tag 3, `u16` slot, `u64` seq: a record's sequence number is overwritten (slot modulo
    /// the ring's records).
    Tear { slot: u16, seq: u64 },
    /// Tag 4, `u16` word, `u64` value: any 8-byte word of the mapping is overwritten (word
    /// modulo the mapping's words).
    Scribble { word: u16, value: u64 },
}

/// A whole input: the header image, the length adjustment and the operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingScript {
    pub header: [u8; HEADER_BYTES],
    pub len_adjust: i16,
    pub ops: Vec<RingOp>,
}

/// Reads little-endian values off the front of a byte string, 0 past its end.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
}

impl RingScript {
    pub fn parse(data: &[u8]) -> Self {
        let mut r = Reader(data);
        let header = r.take::<HEADER_BYTES>();
        let len_adjust = i16::from_le_bytes(r.take());
        let mut ops = Vec::new();
        while !r.0.is_empty() {
            let [tag] = r.take();
            ops.push(match tag % 5 {
                0 => RingOp::Publish(u8::from_le_bytes(r.take())),
                1 => RingOp::Read(u16::from_le_bytes(r.take())),
                2 => RingOp::SetHead(u64::from_le_bytes(r.take())),
                3 => RingOp::Tear { slot: u16::from_le_bytes(r.take()), seq: u64::from_le_bytes(r.take()) },
                _ => RingOp::Scribble { word: u16::from_le_bytes(r.take()), value: u64::from_le_bytes(r.take()) },
            });
        }
        Self { header, len_adjust, ops }
    }

    /// The input bytes [`parse`](Self::parse) reads back as this script.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = self.header.to_vec();
        out.extend_from_slice(&self.len_adjust.to_le_bytes());
        for op in &self.ops {
            match *op {
                RingOp::Publish(n) => out.extend([0, n]),
                RingOp::Read(limit) => {
                    out.push(1);
                    out.extend(limit.to_le_bytes());
                }
                RingOp::SetHead(head) => {
                    out.push(2);
                    out.extend(head.to_le_bytes());
                }
                RingOp::Tear { slot, seq } => {
                    out.push(3);
                    out.extend(slot.to_le_bytes());
                    out.extend(seq.to_le_bytes());
                }
                RingOp::Scribble { word, value } => {
                    out.push(4);
                    out.extend(word.to_le_bytes());
                    out.extend(value.to_le_bytes());
                }
            }
        }
        out
    }

    /// A header image with these fields and zeros elsewhere.
    pub fn header_image(header: &WicRingHeader) -> [u8; HEADER_BYTES] {
        let mut image = [0; HEADER_BYTES];
        let mut put = |offset: usize, bytes: &[u8]| image[offset..offset + bytes.len()].copy_from_slice(bytes);
        put(std::mem::offset_of!(WicRingHeader, magic), &header.magic.to_le_bytes());
        put(std::mem::offset_of!(WicRingHeader, abi_version), &header.abi_version.to_le_bytes());
        put(std::mem::offset_of!(WicRingHeader, entries), &header.entries.to_le_bytes());
        put(std::mem::offset_of!(WicRingHeader, record_size), &header.record_size.to_le_bytes());
        put(HEAD_OFFSET, &header.head.to_le_bytes());
        put(DROPPED_OFFSET, &header.dropped.to_le_bytes());
        put(TAIL_OFFSET, &header.tail.to_le_bytes());
        image
    }

    fn header_u32(&self, offset: usize) -> u32 {
        u32::from_le_bytes(self.header[offset..offset + 4].try_into().expect("4 bytes"))
    }

    pub fn magic(&self) -> u32 {
        self.header_u32(std::mem::offset_of!(WicRingHeader, magic))
    }

    pub fn entries(&self) -> u32 {
        self.header_u32(std::mem::offset_of!(WicRingHeader, entries))
    }

    pub fn record_size(&self) -> u32 {
        self.header_u32(std::mem::offset_of!(WicRingHeader, record_size))
    }

    /// The mapping's length: what the header's entry count needs, adjusted and clamped.
    pub fn mapping_len(&self) -> usize {
        let needed = usize::try_from(ring_bytes(self.entries())).map_or(MAX_MAPPING_BYTES, |n| n.min(MAX_MAPPING_BYTES));
        needed.saturating_add_signed(self.len_adjust.into()).min(MAX_MAPPING_BYTES)
    }
}

// `Mapping::record` and `Mapping::write_record` pack the record's 32-bit fields in pairs.
const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(WicFaultRecord, space_id) == 8 && offset_of!(WicFaultRecord, gpu_id) == 12);
    assert!(offset_of!(WicFaultRecord, range_id) == 16 && offset_of!(WicFaultRecord, flags) == 20);
    assert!(offset_of!(WicFaultRecord, held_ns) == 24 && offset_of!(WicFaultRecord, entry) == 32);
};

/// The record the fake module writes for sequence number `seq`: every field derived from it.
pub fn record_for(seq: u64) -> WicFaultRecord {
    let mut entry = [0; 32];
    for (chunk, word) in entry.chunks_exact_mut(8).zip([seq, !seq, seq.rotate_left(13), seq ^ 0x5749_4352]) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    WicFaultRecord {
        seq,
        space_id: seq as u32,
        gpu_id: (seq >> 32) as u32,
        range_id: !seq as u32,
        flags: (seq & u64::from(WIC_RECORD_PAT | WIC_RECORD_EXPIRED | WIC_RECORD_UNSUPPORTED_GPU)) as u32,
        held_ns: seq.rotate_left(29),
        entry,
    }
}

/// Memory standing in for the mapped ring: 8-byte words the reader reads and the test
/// writes, through atomics, while the reader holds a pointer to them.
pub struct Mapping {
    words: Box<[AtomicU64]>,
    len: usize,
}

impl Mapping {
    /// `len` bytes, starting with as much of `header` as fits; zeros after it.
    pub fn new(len: usize, header: &[u8; HEADER_BYTES]) -> Self {
        let words: Box<[AtomicU64]> = (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect();
        let mapping = Self { words, len };
        for (i, chunk) in header.chunks_exact(8).enumerate().take(len / 8) {
            mapping.store(i * 8, u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        mapping
    }

    /// The mapping's length in bytes.
    pub fn bytes(&self) -> usize {
        self.len
    }

    /// Where the reader is told the ring is mapped.
    pub fn base(&self) -> NonNull<u8> {
        // The reader writes through this pointer too; the words are atomics, which allow it.
        NonNull::from(&*self.words).cast()
    }

    /// Words of the mapping (`len` rounded up to 8 bytes).
    pub fn words(&self) -> usize {
        self.words.len()
    }

    pub fn load(&self, offset: usize) -> u64 {
        self.words[offset / 8].load(Ordering::Acquire)
    }

    pub fn store(&self, offset: usize, value: u64) {
        self.words[offset / 8].store(value, Ordering::Release);
    }

    /// Offset of the record slot that sequence number `seq` uses in a ring of `entries`.
    pub fn slot_offset(seq: u64, entries: u64) -> usize {
        WIC_RING_RECORDS_OFFSET as usize + (seq % entries) as usize * RECORD_BYTES
    }

    /// The record at `offset`, word by word.
    pub fn record(&self, offset: usize) -> WicFaultRecord {
        let word = |i: usize| self.load(offset + 8 * i);
        let mut entry = [0; 32];
        for (i, chunk) in entry.chunks_exact_mut(8).enumerate() {
            chunk.copy_from_slice(&word(4 + i).to_le_bytes());
        }
        WicFaultRecord {
            seq: word(0),
            space_id: word(1) as u32,
            gpu_id: (word(1) >> 32) as u32,
            range_id: word(2) as u32,
            flags: (word(2) >> 32) as u32,
            held_ns: word(3),
            entry,
        }
    }

    /// Writes `record` at `offset` the way the module does: its sequence number last.
    pub fn write_record(&self, offset: usize, record: &WicFaultRecord) {
        self.store(offset + 8, u64::from(record.space_id) | (u64::from(record.gpu_id) << 32));
        self.store(offset + 16, u64::from(record.range_id) | (u64::from(record.flags) << 32));
        self.store(offset + 24, record.held_ns);
        for (i, chunk) in record.entry.chunks_exact(8).enumerate() {
            self.store(offset + 32 + 8 * i, u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        self.store(offset, record.seq);
    }
}
