//! The fault-entry decoder (`ffi/types/src/fault.rs`) on any 32 bytes, for both VA widths,
//! and the hex parser `wicctl decode-fault` uses on any text.
//!
//! The input's first 32 bytes (zero-padded) are the raw entry; the whole input, when it is
//! UTF-8, is also the text given to `RawFaultEntry::from_hex`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use wic_engine::fault::{canonical_va, AccessType, Aperture, FaultEntry, FaultType, HexError, RawFaultEntry, VaWidth};

/// Every field of the entry as `clc369.h` lays it out: (DWORD, lowest bit, width in bits).
/// `ADDR_HI` (DWORD 3) is left out: it holds the VA's high bits, which decode sign-extends.
const FIELDS: [(usize, u32, u32); 17] = [
    (0, 8, 2),   // INST_APERTURE
    (0, 12, 20), // INST_LO
    (1, 0, 32),  // INST_HI
    (2, 0, 2),   // ADDR_PHYS_APERTURE
    (2, 12, 20), // ADDR_LO
    (4, 0, 32),  // TIMESTAMP_LO
    (5, 0, 32),  // TIMESTAMP_HI
    (6, 0, 9),   // ENGINE_ID
    (7, 0, 5),   // FAULT_TYPE
    (7, 7, 1),   // REPLAYABLE_FAULT
    (7, 8, 7),   // CLIENT
    (7, 16, 4),  // ACCESS_TYPE
    (7, 20, 1),  // MMU_CLIENT_TYPE
    (7, 24, 5),  // GPC_ID
    (7, 29, 1),  // PROTECTED_MODE
    (7, 30, 1),  // REPLAYABLE_FAULT_EN
    (7, 31, 1),  // VALID
];

fn field(raw: &RawFaultEntry, (dword, lsb, bits): (usize, u32, u32)) -> u32 {
    let mask = if bits == 32 { u32::MAX } else { (1 << bits) - 1 };
    (raw.dword(dword) >> lsb) & mask
}

/// The VA an entry holds: `ADDR_HI:ADDR_LO` without the page offset, sign-extended from bit
/// `width - 1`, computed in 128-bit arithmetic rather than with shifts.
fn expected_va(raw: &RawFaultEntry, width: VaWidth) -> u64 {
    let stored = (u64::from(raw.dword(3)) << 32) | u64::from(raw.dword(2) & 0xFFFF_F000);
    let bits = width.bits();
    let low = i128::from(stored) & ((1i128 << bits) - 1);
    let signed = if low >= 1i128 << (bits - 1) { low - (1i128 << bits) } else { low };
    signed as u64
}

fn check_decode(raw: &RawFaultEntry, width: VaWidth) {
    let entry = FaultEntry::decode(raw, width);

    // Every field within its bit width, and the enums hold their raw value faithfully.
    assert!(entry.engine_id < 1 << 9 && entry.client_id < 1 << 7 && entry.gpc_id < 1 << 5, "{entry:?}");
    assert!(entry.address_aperture < 1 << 2 && entry.fault_type.raw() < 1 << 5 && entry.access_type.raw() < 1 << 4, "{entry:?}");
    assert_eq!(FaultType::from_raw(entry.fault_type.raw()), entry.fault_type);
    assert_eq!(AccessType::from_raw(entry.access_type.raw()), entry.access_type);
    assert_eq!(Aperture::from_raw(entry.instance_aperture.raw()), entry.instance_aperture);
    assert_eq!(entry.instance_ptr & 0xFFF, 0, "{entry:?}");

    // The VA: page-aligned, canonical for the width, and the one the entry holds.
    assert_eq!(entry.va, expected_va(raw, width), "{raw:?} at {} bits", width.bits());
    assert_eq!(canonical_va(entry.va, width), entry.va);
    assert_eq!(entry.page(), entry.va);

    // Re-encoding keeps every documented field, zeroes every other bit, and writes the
    // canonical VA into ADDR_HI.
    let encoded = entry.encode();
    for spec in FIELDS {
        assert_eq!(field(&encoded, spec), field(raw, spec), "field {spec:?} of {raw:?}");
    }
    assert_eq!(encoded.dword(3), (entry.va >> 32) as u32);
    let mut documented = [0u32; 8];
    documented[3] = u32::MAX;
    for (dword, lsb, bits) in FIELDS {
        documented[dword] |= (if bits == 32 { u32::MAX } else { (1 << bits) - 1 }) << lsb;
    }
    for (i, mask) in documented.iter().enumerate() {
        assert_eq!(encoded.dword(i) & !mask, 0, "reserved bits of DWORD {i} set by encode");
    }
    assert_eq!(FaultEntry::decode(&encoded, width), entry);

    // What `wicctl decode-fault` prints: one line per field.
    assert_eq!(entry.to_string().lines().count(), 15);
}

/// `from_hex` on any text: a success round-trips, a refusal names what is wrong.
fn check_hex_text(text: &str) {
    match RawFaultEntry::from_hex(text) {
        Ok(raw) => {
            assert_eq!(RawFaultEntry::from_hex(&raw.to_hex()), Ok(raw));
            assert_eq!(RawFaultEntry::from_hex(&raw.to_hex().to_uppercase()), Ok(raw));
        }
        Err(HexError::BadDigit { ch, position }) => {
            assert_eq!(text.chars().nth(position), Some(ch), "{text:?}");
            assert!(!ch.is_ascii_hexdigit(), "{ch:?} refused in {text:?}");
        }
        Err(HexError::WrongLength { digits }) => {
            // Every hex digit counts, but the 0 of one `0x` prefix after leading whitespace.
            let body = text.trim_start_matches(|c: char| c.is_ascii_whitespace());
            let prefix = usize::from(body.starts_with("0x") || body.starts_with("0X"));
            assert_ne!(digits, 64);
            assert_eq!(digits, text.chars().filter(char::is_ascii_hexdigit).count() - prefix, "{text:?}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = [0u8; 32];
    let n = data.len().min(32);
    bytes[..n].copy_from_slice(&data[..n]);
    let raw = RawFaultEntry(bytes);
    assert_eq!(RawFaultEntry::from_hex(&raw.to_hex()), Ok(raw));
    for width in [VaWidth::Bits49, VaWidth::Bits57] {
        check_decode(&raw, width);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        check_hex_text(text);
    }
});
