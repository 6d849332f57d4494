//! The daemon's fault-ring reader (`wic_kernel_io::ring::RecordRing`) on a mapping whose header comes
//! from the input, through publishes, reads and corruptions the input orders (format in
//! `src/ring.rs`).
//!
//! Opening must succeed exactly for a header the reader speaks and a mapping large enough. Every
//! read must return at most its limit and at most a ring's worth, only records whose slot holds
//! exactly what was returned (sequence number included), in order, all from the last ring's
//! worth before the head it saw; its index moves on by what it returned plus what it counted as
//! torn, and only jumps when it counts a bad head. While the input only publishes and reads as
//! the module and wicd do, the reads return exactly what was published, in order, and count
//! nothing wrong.

#![no_main]

use std::collections::VecDeque;

use libfuzzer_sys::fuzz_target;
use wic_engine::RawFaultEntry;
use wic_fuzz::ring::{record_for, Mapping, RingOp, RingScript, DROPPED_OFFSET, HEADER_BYTES, HEAD_OFFSET, RECORD_BYTES, TAIL_OFFSET};
use wic_kernel_io::ring::{RecordRing, Record, RingAnomalies, RingError};
use wic_kabi::{ring_bytes, WIC_RECORD_EXPIRED, WIC_RECORD_PAT, WIC_RECORD_UNSUPPORTED_GPU, WIC_RING_MAGIC};

/// How opening a mapping of `len` bytes holding the input's header should end, from the
/// header's description in `wic_abi.h`: `Ok`, a refused header (`None`), or a mapping too small
/// for what it needs.
fn expected_open(script: &RingScript, len: usize) -> Result<(), Option<RingError>> {
    let too_small = |needed: u64| Some(RingError::TooSmall { len, needed });
    if len < HEADER_BYTES {
        return Err(too_small(HEADER_BYTES as u64));
    }
    if script.magic() != WIC_RING_MAGIC || script.record_size() as usize != RECORD_BYTES || !script.entries().is_power_of_two() {
        return Err(None);
    }
    let needed = ring_bytes(script.entries());
    if (len as u64) < needed {
        return Err(too_small(needed));
    }
    Ok(())
}

/// The record a reader should return for the slot contents `raw`.
fn as_read(raw: &wic_kabi::WicFaultRecord) -> Record {
    Record {
        seq: raw.seq,
        space_id: raw.space_id,
        gpu_id: raw.gpu_id,
        range_id: raw.range_id,
        pat: raw.flags & WIC_RECORD_PAT != 0,
        expired: raw.flags & WIC_RECORD_EXPIRED != 0,
        unsupported_gpu: raw.flags & WIC_RECORD_UNSUPPORTED_GPU != 0,
        held_ns: raw.held_ns,
        entry: RawFaultEntry(raw.entry),
    }
}

/// The module's side: publishes `n` records from the header's head, as `wic_record_fault()`
/// does, never overwriting a record the tail says is unread. Returns the records published.
fn publish(mapping: &Mapping, entries: u64, n: u8) -> Vec<Record> {
    let mut published = Vec::new();
    let mut head = mapping.load(HEAD_OFFSET);
    for _ in 0..n {
        if head.wrapping_sub(mapping.load(TAIL_OFFSET)) >= entries {
            break;
        }
        let record = record_for(head);
        mapping.write_record(Mapping::slot_offset(head, entries), &record);
        published.push(as_read(&record));
        head = head.wrapping_add(1);
        mapping.store(HEAD_OFFSET, head);
    }
    published
}

fuzz_target!(|data: &[u8]| {
    let script = RingScript::parse(data);
    let mapping = Mapping::new(script.mapping_len(), &script.header);
    // SAFETY: the mapping is 8-byte aligned, `bytes()` long, and outlives the reader (declared
    // first, dropped last); the test writes it only through atomics, between the reader's calls.
    let opened = unsafe { RecordRing::new(mapping.base(), mapping.bytes()) };
    match (&opened, expected_open(&script, mapping.bytes())) {
        (Ok(_), Ok(())) | (Err(RingError::BadHeader(_)), Err(None)) => {}
        (Err(got), Err(Some(want))) if *got == want => {}
        (got, want) => panic!("opening {script:?}: got {:?}, expected {want:?}", got.as_ref().err()),
    }
    let Ok(mut ring) = opened else { return };
    let entries = ring.entries();
    assert_eq!(entries, u64::from(script.entries()));

    // The reader's index, as the tail it writes back shows it: it starts at the head.
    let mut index = mapping.load(HEAD_OFFSET);
    // What was published and not yet read, while nothing but publishes and reads happened.
    let mut unread: Option<VecDeque<Record>> = Some(VecDeque::new());
    let mut out = Vec::new();
    mapping.store(TAIL_OFFSET, index);

    for op in &script.ops {
        match *op {
            RingOp::Publish(n) => {
                let published = publish(&mapping, entries, n);
                if let Some(unread) = unread.as_mut() {
                    unread.extend(published);
                }
            }
            RingOp::SetHead(head) => {
                mapping.store(HEAD_OFFSET, head);
                unread = None;
            }
            RingOp::Tear { slot, seq } => {
                mapping.store(Mapping::slot_offset(u64::from(slot), entries), seq);
                unread = None;
            }
            RingOp::Scribble { word, value } => {
                mapping.store(usize::from(word) % mapping.words() * 8, value);
                unread = None;
            }
            RingOp::Read(limit) => {
                let limit = usize::from(limit);
                let before = ring.anomalies();
                let head = mapping.load(HEAD_OFFSET);
                out.clear();
                let n = ring.read(&mut out, limit);
                let after = ring.anomalies();
                let tail = mapping.load(TAIL_OFFSET);

                assert_eq!(n, out.len());
                assert!(n <= limit && n as u64 <= entries, "{n} records from a read of {limit} in a ring of {entries}");
                // Every record is what its slot holds, from the ring's last round before the
                // head, in order.
                let mut last_distance = u64::MAX;
                for record in &out {
                    let slot = mapping.record(Mapping::slot_offset(record.seq, entries));
                    assert_eq!(*record, as_read(&slot), "a record the reader returned is not its slot's");
                    let distance = head.wrapping_sub(record.seq);
                    assert!((1..=entries).contains(&distance), "record {} read with the head at {head}", record.seq);
                    assert!(distance < last_distance, "records out of order: {out:?}");
                    last_distance = distance;
                    assert!(distance > head.wrapping_sub(tail), "record {} at or past the new tail {tail}", record.seq);
                }
                // The index ends within a ring of the head, at the head unless the limit
                // stopped it, and moves only by what it consumed unless the head was bad.
                assert!(head.wrapping_sub(tail) <= entries, "tail {tail}, head {head}");
                if n < limit {
                    assert_eq!(tail, head, "a read below its limit left records behind");
                }
                assert!(after.torn >= before.torn && (before.bad_head..=before.bad_head + 1).contains(&after.bad_head), "{before:?} -> {after:?}");
                if after.bad_head == before.bad_head {
                    let consumed = tail.wrapping_sub(index);
                    assert!(consumed <= entries, "the index jumped from {index} to {tail} on a good head");
                    assert_eq!(consumed, n as u64 + (after.torn - before.torn), "slots consumed but neither read nor torn");
                }
                assert_eq!(ring.pending(), head != tail);
                assert_eq!(ring.dropped(), mapping.load(DROPPED_OFFSET));
                index = tail;

                if let Some(unread) = unread.as_mut() {
                    let expected: Vec<Record> = unread.drain(..n.min(unread.len())).collect();
                    assert_eq!(out, expected, "a clean ring read other records than were published");
                    assert!(n == limit || unread.is_empty(), "published records left unread");
                    assert_eq!(after, RingAnomalies::default(), "anomalies counted on a clean ring");
                }
            }
        }
    }
});
