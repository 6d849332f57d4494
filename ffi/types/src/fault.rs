//! Decoding and encoding of GPU replayable fault-buffer entries.
//!
//! The layout is the 32-byte `NVC369_BUF_ENTRY` of the MMU fault buffer class (`clc369.h` in
//! NVIDIA's open GPU kernel modules), shared by Volta, Turing, Ampere, Ada and Hopper: eight
//! little-endian DWORDs holding the instance block, the faulting VA, a timestamp, the engine and
//! the fault/access/client descriptors. Fault types are the `NV_PFAULT_FAULT_TYPE_*` values and
//! access types the `NV_PFAULT_ACCESS_TYPE_*` values of `dev_fault.h`.
//!
//! [`FaultEntry::decode`] is on the Monitor's hot path: a few shifts and masks, no allocation.
//! [`FaultEntry::encode`] is its inverse, used by the emulated GPU to produce entries.

use std::fmt;

/// Size in bytes of one fault-buffer entry.
const ENTRY_BYTES: usize = 32;
/// Number of hex digits in the textual form of one entry.
const ENTRY_HEX_DIGITS: usize = ENTRY_BYTES * 2;

/// DWORD 0 `INST_APERTURE`, bits [9:8].
const DW0_INST_APERTURE_SHIFT: u32 = 8;
const DW0_INST_APERTURE_MASK: u32 = 0b11 << DW0_INST_APERTURE_SHIFT;
/// DWORD 0 `INST_LO`, bits [31:12]: bits [31:12] of the instance pointer, in place.
const DW0_INST_LO_MASK: u32 = 0xFFFF_F000;
/// DWORD 2 `ADDR_PHYS_APERTURE`, bits [1:0].
const DW2_ADDR_PHYS_APERTURE_MASK: u32 = 0b11;
/// DWORD 2 `ADDR_LO`, bits [31:12]: bits [31:12] of the VA, in place.
const DW2_ADDR_LO_MASK: u32 = 0xFFFF_F000;
/// DWORD 6 `ENGINE_ID`, bits [8:0].
const DW6_ENGINE_ID_MASK: u32 = 0x1FF;
/// DWORD 7 `FAULT_TYPE`, bits [4:0].
const DW7_FAULT_TYPE_MASK: u32 = 0x1F;
/// DWORD 7 `REPLAYABLE_FAULT`, bit 7.
const DW7_REPLAYABLE_FAULT: u32 = 1 << 7;
/// DWORD 7 `CLIENT`, bits [14:8].
const DW7_CLIENT_SHIFT: u32 = 8;
const DW7_CLIENT_MASK: u32 = 0x7F << DW7_CLIENT_SHIFT;
/// DWORD 7 `ACCESS_TYPE`, bits [19:16].
const DW7_ACCESS_TYPE_SHIFT: u32 = 16;
const DW7_ACCESS_TYPE_MASK: u32 = 0xF << DW7_ACCESS_TYPE_SHIFT;
/// DWORD 7 `MMU_CLIENT_TYPE`, bit 20 (set: HUB, clear: GPC).
const DW7_MMU_CLIENT_TYPE_HUB: u32 = 1 << 20;
/// DWORD 7 `GPC_ID`, bits [28:24].
const DW7_GPC_ID_SHIFT: u32 = 24;
const DW7_GPC_ID_MASK: u32 = 0x1F << DW7_GPC_ID_SHIFT;
/// DWORD 7 `PROTECTED_MODE`, bit 29.
const DW7_PROTECTED_MODE: u32 = 1 << 29;
/// DWORD 7 `REPLAYABLE_FAULT_EN`, bit 30.
const DW7_REPLAYABLE_FAULT_EN: u32 = 1 << 30;
/// DWORD 7 `VALID`, bit 31.
const DW7_VALID: u32 = 1 << 31;

/// The `*_HI` DWORDs hold bits [63:32] of their 64-bit address.
const HI_DWORD_SHIFT: u32 = 32;
/// Mask selecting the 4 KiB page of an address.
const PAGE_MASK: u64 = !0xFFF;

/// Extracts the field selected by `mask` (in place) from `dw`, shifted down by `shift`.
#[inline]
const fn get(dw: u32, mask: u32, shift: u32) -> u32 {
    (dw & mask) >> shift
}

/// Places `value` into the field selected by `mask`, truncating it to the field's width.
#[inline]
const fn put(value: u32, mask: u32, shift: u32) -> u32 {
    (value << shift) & mask
}

/// Returns `dw` if `flag` is set, 0 otherwise.
#[inline]
const fn bit(flag: bool, dw: u32) -> u32 {
    if flag {
        dw
    } else {
        0
    }
}

/// One raw entry as the hardware wrote it, bytes in memory order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(transparent)]
pub struct RawFaultEntry(pub [u8; 32]);

impl RawFaultEntry {
    /// DWORD `i` (0..8) of the entry, read little-endian.
    ///
    /// # Panics
    /// If `i >= 8`.
    #[inline]
    pub fn dword(&self, i: usize) -> u32 {
        let o = i * 4;
        u32::from_le_bytes([self.0[o], self.0[o + 1], self.0[o + 2], self.0[o + 3]])
    }

    /// Replaces the faulting page's address with `va`'s, every other bit kept: the result is
    /// what [`FaultEntry::encode`] would give for the decoded entry with that address.
    #[inline]
    pub fn set_va(&mut self, va: u64) {
        let dw2 = (self.dword(2) & !DW2_ADDR_LO_MASK) | (va as u32 & DW2_ADDR_LO_MASK);
        // The `as u32` casts take the low DWORD of the address on purpose.
        self.0[8..12].copy_from_slice(&dw2.to_le_bytes());
        self.0[12..16].copy_from_slice(&((va >> HI_DWORD_SHIFT) as u32).to_le_bytes());
    }

    /// Builds an entry from its eight DWORDs, each stored little-endian.
    #[inline]
    pub fn from_dwords(d: [u32; 8]) -> Self {
        let mut bytes = [0u8; ENTRY_BYTES];
        for (chunk, dw) in bytes.chunks_exact_mut(4).zip(d) {
            chunk.copy_from_slice(&dw.to_le_bytes());
        }
        Self(bytes)
    }

    /// The entry as 64 lowercase hex digits, byte 0 first, no separators.
    pub fn to_hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(ENTRY_HEX_DIGITS);
        for b in self.0 {
            s.push(char::from(DIGITS[usize::from(b >> 4)]));
            s.push(char::from(DIGITS[usize::from(b & 0xF)]));
        }
        s
    }

    /// Parses 64 hex digits (either case), byte 0 first, as [`to_hex`](Self::to_hex) writes them.
    ///
    /// ASCII whitespace, `_` and `:` are ignored anywhere, and one `0x`/`0X` prefix is accepted
    /// after leading whitespace, so `0x00b2dcfe_01000000_…` and `00:b2:dc:fe …` both parse.
    ///
    /// # Errors
    /// [`HexError::BadDigit`] for the first other character, else [`HexError::WrongLength`]
    /// unless there are exactly 64 digits.
    pub fn from_hex(s: &str) -> Result<Self, HexError> {
        let body = s.trim_start_matches(|c: char| c.is_ascii_whitespace());
        let skipped = s.len() - body.len();
        let (body, skipped) = match body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
            Some(rest) => (rest, skipped + 2),
            None => (body, skipped),
        };
        // `skipped` counts ASCII bytes only, so it is also a character count.
        let mut bytes = [0u8; ENTRY_BYTES];
        let mut digits = 0usize;
        for (i, ch) in body.chars().enumerate() {
            if ch.is_ascii_whitespace() || ch == '_' || ch == ':' {
                continue;
            }
            let nibble = ch.to_digit(16).ok_or(HexError::BadDigit { ch, position: skipped + i })?;
            if let Some(b) = bytes.get_mut(digits / 2) {
                // Each byte starts at 0 and takes its high nibble, then its low one.
                // `to_digit(16)` is < 16, so the cast is lossless.
                *b = (*b << 4) | nibble as u8;
            }
            digits += 1;
        }
        if digits == ENTRY_HEX_DIGITS {
            Ok(Self(bytes))
        } else {
            Err(HexError::WrongLength { digits })
        }
    }
}

/// Why [`RawFaultEntry::from_hex`] rejected its input.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum HexError {
    /// The input held `digits` hex digits instead of 64.
    WrongLength {
        /// Number of hex digits found.
        digits: usize,
    },
    /// A character that is neither a hex digit nor an accepted separator.
    BadDigit {
        /// The offending character.
        ch: char,
        /// Its 0-based character index in the input.
        position: usize,
    },
}

impl fmt::Display for HexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::WrongLength { digits } => {
                write!(f, "a fault entry is {ENTRY_HEX_DIGITS} hex digits ({ENTRY_BYTES} bytes), got {digits}")
            }
            Self::BadDigit { ch, position } => {
                write!(f, "invalid hex digit {ch:?} at character {position} (0-based)")
            }
        }
    }
}

impl std::error::Error for HexError {}

/// Width of the GPU virtual address space, from which VAs are sign-extended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum VaWidth {
    /// 49-bit VAs: Volta, Turing, Ampere, Ada.
    Bits49,
    /// 57-bit VAs: Hopper.
    Bits57,
}

impl VaWidth {
    /// Number of VA bits.
    #[inline]
    pub const fn bits(self) -> u32 {
        match self {
            Self::Bits49 => 49,
            Self::Bits57 => 57,
        }
    }
}

/// Sign-extend the low `width` bits of a VA (bits above the width are discarded).
#[inline]
pub const fn canonical_va(va: u64, width: VaWidth) -> u64 {
    let unused = u64::BITS - width.bits();
    (((va << unused) as i64) >> unused) as u64
}

/// Memory aperture of the instance block (`INST_APERTURE`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Aperture {
    /// Video memory (0).
    Video,
    /// Coherent system memory (2).
    SysCoherent,
    /// Non-coherent system memory (3).
    SysNoncoherent,
    /// The reserved value 1.
    Reserved,
}

impl Aperture {
    /// The 2-bit field value.
    #[inline]
    pub const fn raw(self) -> u8 {
        match self {
            Self::Video => 0,
            Self::Reserved => 1,
            Self::SysCoherent => 2,
            Self::SysNoncoherent => 3,
        }
    }

    /// Decodes the 2-bit field value; bits above the low two are ignored.
    #[inline]
    pub const fn from_raw(raw: u8) -> Self {
        match raw & 0b11 {
            0 => Self::Video,
            2 => Self::SysCoherent,
            3 => Self::SysNoncoherent,
            _ => Self::Reserved,
        }
    }
}

impl fmt::Display for Aperture {
    /// The `clc369.h` name of the aperture.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Video => "VID_MEM",
            Self::SysCoherent => "SYS_MEM_COHERENT",
            Self::SysNoncoherent => "SYS_MEM_NONCOHERENT",
            Self::Reserved => "RESERVED",
        })
    }
}

/// The fault type (`FAULT_TYPE`, an `NV_PFAULT_FAULT_TYPE_*` value).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FaultType {
    /// Invalid page-directory entry (0).
    InvalidPde,
    /// Invalid page-table entry (2).
    InvalidPte,
    /// Write to a read-only page (6, `RO_VIOLATION`).
    WriteViolation,
    /// Read of a write-only page (7, `WO_VIOLATION`).
    ReadViolation,
    /// Atomic on a page that does not allow it (0xF, `ATOMIC_VIOLATION`).
    Atomic,
    /// Any other value: a fatal fault. Holds the raw value; build it with
    /// [`from_raw`](Self::from_raw) so that it never holds one of the values above.
    Fatal(u8),
}

impl FaultType {
    /// Whether the fault cannot be serviced by migrating or mapping a page.
    #[inline]
    pub const fn is_fatal(self) -> bool {
        matches!(self, Self::Fatal(_))
    }

    /// The raw field value.
    #[inline]
    pub const fn raw(self) -> u8 {
        match self {
            Self::InvalidPde => 0,
            Self::InvalidPte => 2,
            Self::WriteViolation => 6,
            Self::ReadViolation => 7,
            Self::Atomic => 0xF,
            Self::Fatal(raw) => raw,
        }
    }

    /// Classifies a raw field value; values without a serviceable meaning are [`Self::Fatal`].
    #[inline]
    pub const fn from_raw(raw: u8) -> Self {
        match raw {
            0 => Self::InvalidPde,
            2 => Self::InvalidPte,
            6 => Self::WriteViolation,
            7 => Self::ReadViolation,
            0xF => Self::Atomic,
            _ => Self::Fatal(raw),
        }
    }
}

impl fmt::Display for FaultType {
    /// The `NV_PFAULT_FAULT_TYPE_*` name, with `INVALID_` spelled out for PDE/PTE.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.raw() {
            0 => "INVALID_PDE",
            1 => "PDE_SIZE",
            2 => "INVALID_PTE",
            3 => "VA_LIMIT_VIOLATION",
            4 => "UNBOUND_INST_BLOCK",
            5 => "PRIV_VIOLATION",
            6 => "RO_VIOLATION",
            7 => "WO_VIOLATION",
            8 => "PITCH_MASK_VIOLATION",
            9 => "WORK_CREATION",
            0xA => "UNSUPPORTED_APERTURE",
            0xB => "COMPRESSION_FAILURE",
            0xC => "UNSUPPORTED_KIND",
            0xD => "REGION_VIOLATION",
            0xE => "POISONED",
            0xF => "ATOMIC_VIOLATION",
            _ => "UNKNOWN",
        })
    }
}

/// The access that faulted (`ACCESS_TYPE`, an `NV_PFAULT_ACCESS_TYPE_*` value).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AccessType {
    /// Virtual read (0).
    Read,
    /// Virtual write (1).
    Write,
    /// Virtual strong atomic (2).
    AtomicStrong,
    /// Virtual prefetch (3).
    Prefetch,
    /// Virtual weak atomic (4).
    AtomicWeak,
    /// Physical read (8).
    PhysRead,
    /// Physical write (9).
    PhysWrite,
    /// Physical atomic (10).
    PhysAtomic,
    /// Physical prefetch (11).
    PhysPrefetch,
    /// Any other (reserved) value, kept raw; build it with [`from_raw`](Self::from_raw).
    Reserved(u8),
}

impl AccessType {
    /// The raw field value.
    #[inline]
    pub const fn raw(self) -> u8 {
        match self {
            Self::Read => 0,
            Self::Write => 1,
            Self::AtomicStrong => 2,
            Self::Prefetch => 3,
            Self::AtomicWeak => 4,
            Self::PhysRead => 8,
            Self::PhysWrite => 9,
            Self::PhysAtomic => 10,
            Self::PhysPrefetch => 11,
            Self::Reserved(raw) => raw,
        }
    }

    /// Decodes a raw field value; unassigned values become [`Self::Reserved`].
    #[inline]
    pub const fn from_raw(raw: u8) -> Self {
        match raw {
            0 => Self::Read,
            1 => Self::Write,
            2 => Self::AtomicStrong,
            3 => Self::Prefetch,
            4 => Self::AtomicWeak,
            8 => Self::PhysRead,
            9 => Self::PhysWrite,
            10 => Self::PhysAtomic,
            11 => Self::PhysPrefetch,
            _ => Self::Reserved(raw),
        }
    }

    /// Whether the access modifies memory: writes and atomics, virtual or physical.
    #[inline]
    pub const fn is_write(self) -> bool {
        matches!(self, Self::Write | Self::AtomicStrong | Self::AtomicWeak | Self::PhysWrite | Self::PhysAtomic)
    }
}

impl fmt::Display for AccessType {
    /// The `NV_PFAULT_ACCESS_TYPE_*` name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Read => "VIRT_READ",
            Self::Write => "VIRT_WRITE",
            Self::AtomicStrong => "VIRT_ATOMIC_STRONG",
            Self::Prefetch => "VIRT_PREFETCH",
            Self::AtomicWeak => "VIRT_ATOMIC_WEAK",
            Self::PhysRead => "PHYS_READ",
            Self::PhysWrite => "PHYS_WRITE",
            Self::PhysAtomic => "PHYS_ATOMIC",
            Self::PhysPrefetch => "PHYS_PREFETCH",
            Self::Reserved(_) => "RESERVED",
        })
    }
}

/// Which side of the MMU the faulting client sits on (`MMU_CLIENT_TYPE`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MmuClientType {
    /// A client in a GPC (0); `gpc_id` says which.
    Gpc,
    /// A HUB client (1): copy engines, host, display, …
    Hub,
}

impl fmt::Display for MmuClientType {
    /// `GPC` or `HUB`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Gpc => "GPC",
            Self::Hub => "HUB",
        })
    }
}

/// MMU engine id that graphics-engine (GPC) faults carry on Hopper (driver notes, section 2).
pub const GPC_ENGINE_ID: u16 = 384;

/// A decoded entry, every field.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FaultEntry {
    /// Aperture of the faulting context's instance block (`INST_APERTURE`).
    pub instance_aperture: Aperture,
    /// Address of the instance block, 4 KiB-aligned (`INST_HI:INST_LO`).
    pub instance_ptr: u64,
    /// `ADDR_PHYS_APERTURE`, raw 2 bits (meaningful for physical accesses only).
    pub address_aperture: u8,
    /// Faulting VA, 4 KiB-aligned and canonical (`ADDR_HI:ADDR_LO`, sign-extended).
    pub va: u64,
    /// GPU timestamp of the fault, ns (`TIMESTAMP_HI:TIMESTAMP_LO`).
    pub timestamp: u64,
    /// MMU engine id of the faulting unit (`ENGINE_ID`, 9 bits).
    pub engine_id: u16,
    /// The fault type (`FAULT_TYPE`).
    pub fault_type: FaultType,
    /// Whether the fault is replayable (`REPLAYABLE_FAULT`).
    pub replayable: bool,
    /// MMU client id (`CLIENT`, 7 bits).
    pub client_id: u8,
    /// The faulting access (`ACCESS_TYPE`).
    pub access_type: AccessType,
    /// GPC or HUB client (`MMU_CLIENT_TYPE`).
    pub client_type: MmuClientType,
    /// GPC of a GPC client (`GPC_ID`, 5 bits).
    pub gpc_id: u8,
    /// The access was made in protected mode (`PROTECTED_MODE`).
    pub protected_mode: bool,
    /// Replayable faults were enabled for the access (`REPLAYABLE_FAULT_EN`).
    pub replayable_fault_enabled: bool,
    /// The entry has been fully written by the GPU (`VALID`).
    pub valid: bool,
}

impl FaultEntry {
    /// The entry a GPC client writes for a replayable fault on `va`: what the emulated GPUs
    /// produce, with the instance block and SM placement the caller chose.
    pub fn replayable_gpc(
        va: u64,
        access_type: AccessType,
        timestamp: u64,
        instance_ptr: u64,
        gpc_id: u8,
        client_id: u8,
    ) -> Self {
        Self {
            instance_aperture: Aperture::Video,
            instance_ptr,
            address_aperture: 0,
            va,
            timestamp,
            engine_id: GPC_ENGINE_ID,
            fault_type: FaultType::InvalidPte,
            replayable: true,
            client_id,
            access_type,
            client_type: MmuClientType::Gpc,
            gpc_id,
            protected_mode: false,
            replayable_fault_enabled: true,
            valid: true,
        }
    }

    /// The faulting address alone, as [`decode`](Self::decode) gives it: what the fault path
    /// needs to look ahead at the entries it is about to handle.
    #[inline]
    pub fn decode_va(raw: &RawFaultEntry, width: VaWidth) -> u64 {
        let va = (u64::from(raw.dword(3)) << HI_DWORD_SHIFT) | u64::from(raw.dword(2) & DW2_ADDR_LO_MASK);
        canonical_va(va, width)
    }

    /// Decode; total (never fails): reserved values are kept in the enums.
    ///
    /// ADDR bits above `width` are ignored; the VA is sign-extended from bit `width - 1`.
    #[inline]
    pub fn decode(raw: &RawFaultEntry, width: VaWidth) -> Self {
        let dw0 = raw.dword(0);
        let dw2 = raw.dword(2);
        let dw7 = raw.dword(7);
        let instance_ptr = (u64::from(raw.dword(1)) << HI_DWORD_SHIFT) | u64::from(dw0 & DW0_INST_LO_MASK);
        let client_type = if dw7 & DW7_MMU_CLIENT_TYPE_HUB != 0 { MmuClientType::Hub } else { MmuClientType::Gpc };
        // Every `as u8`/`as u16` below narrows a value already masked to its field width.
        Self {
            instance_aperture: Aperture::from_raw(get(dw0, DW0_INST_APERTURE_MASK, DW0_INST_APERTURE_SHIFT) as u8),
            instance_ptr,
            address_aperture: (dw2 & DW2_ADDR_PHYS_APERTURE_MASK) as u8,
            va: Self::decode_va(raw, width),
            timestamp: (u64::from(raw.dword(5)) << HI_DWORD_SHIFT) | u64::from(raw.dword(4)),
            engine_id: (raw.dword(6) & DW6_ENGINE_ID_MASK) as u16,
            fault_type: FaultType::from_raw((dw7 & DW7_FAULT_TYPE_MASK) as u8),
            replayable: dw7 & DW7_REPLAYABLE_FAULT != 0,
            client_id: get(dw7, DW7_CLIENT_MASK, DW7_CLIENT_SHIFT) as u8,
            access_type: AccessType::from_raw(get(dw7, DW7_ACCESS_TYPE_MASK, DW7_ACCESS_TYPE_SHIFT) as u8),
            client_type,
            gpc_id: get(dw7, DW7_GPC_ID_MASK, DW7_GPC_ID_SHIFT) as u8,
            protected_mode: dw7 & DW7_PROTECTED_MODE != 0,
            replayable_fault_enabled: dw7 & DW7_REPLAYABLE_FAULT_EN != 0,
            valid: dw7 & DW7_VALID != 0,
        }
    }

    /// Encode back to raw; the inverse of [`decode`](Self::decode) for entries whose fields fit
    /// their bit widths: `va` page-aligned and canonical for the width, `instance_ptr`
    /// 4K-aligned, `engine_id` < 512, `client_id` < 128, `gpc_id` < 32, raw fault type < 32,
    /// raw access type < 16, `address_aperture` < 4.
    ///
    /// Out-of-range fields are truncated to their width: the low 12 bits of `va` and
    /// `instance_ptr` are dropped, and the other fields keep their low bits only.
    /// The VA is written as its full 64-bit value, so a canonical high-half VA is stored
    /// sign-extended in `ADDR_HI`; `decode` discards the bits above the VA width either way.
    #[inline]
    pub fn encode(&self) -> RawFaultEntry {
        let dw0 = put(u32::from(self.instance_aperture.raw()), DW0_INST_APERTURE_MASK, DW0_INST_APERTURE_SHIFT)
            | (self.instance_ptr as u32 & DW0_INST_LO_MASK);
        let dw2 =
            (u32::from(self.address_aperture) & DW2_ADDR_PHYS_APERTURE_MASK) | (self.va as u32 & DW2_ADDR_LO_MASK);
        let dw7 = (u32::from(self.fault_type.raw()) & DW7_FAULT_TYPE_MASK)
            | bit(self.replayable, DW7_REPLAYABLE_FAULT)
            | put(u32::from(self.client_id), DW7_CLIENT_MASK, DW7_CLIENT_SHIFT)
            | put(u32::from(self.access_type.raw()), DW7_ACCESS_TYPE_MASK, DW7_ACCESS_TYPE_SHIFT)
            | bit(self.client_type == MmuClientType::Hub, DW7_MMU_CLIENT_TYPE_HUB)
            | put(u32::from(self.gpc_id), DW7_GPC_ID_MASK, DW7_GPC_ID_SHIFT)
            | bit(self.protected_mode, DW7_PROTECTED_MODE)
            | bit(self.replayable_fault_enabled, DW7_REPLAYABLE_FAULT_EN)
            | bit(self.valid, DW7_VALID);
        // The `as u32` casts of 64-bit values take their low DWORD on purpose.
        RawFaultEntry::from_dwords([
            dw0,
            (self.instance_ptr >> HI_DWORD_SHIFT) as u32,
            dw2,
            (self.va >> HI_DWORD_SHIFT) as u32,
            self.timestamp as u32,
            (self.timestamp >> HI_DWORD_SHIFT) as u32,
            u32::from(self.engine_id) & DW6_ENGINE_ID_MASK,
            dw7,
        ])
    }

    /// The 4 KiB page-aligned canonical VA of the fault. `va` is already page-aligned when the
    /// entry came from [`decode`](Self::decode); this is the accessor to use for page lookups.
    #[inline]
    pub fn page(&self) -> u64 {
        self.va & PAGE_MASK
    }
}

impl fmt::Display for FaultEntry {
    /// A human multi-line description of every field, one per line (for `wicctl decode-fault`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        let fatal = if self.fault_type.is_fatal() { "fatal" } else { "serviceable" };
        let direction = if self.access_type.is_write() { "write" } else { "read" };
        writeln!(f, "valid:               {}", yes_no(self.valid))?;
        writeln!(f, "va:                  {:#018x}", self.va)?;
        writeln!(f, "fault type:          {} ({:#04x}, {fatal})", self.fault_type, self.fault_type.raw())?;
        writeln!(f, "access type:         {} ({:#x}, {direction})", self.access_type, self.access_type.raw())?;
        writeln!(f, "replayable:          {}", yes_no(self.replayable))?;
        writeln!(f, "replayable fault en: {}", yes_no(self.replayable_fault_enabled))?;
        writeln!(f, "instance ptr:        {:#018x}", self.instance_ptr)?;
        writeln!(f, "instance aperture:   {} ({})", self.instance_aperture, self.instance_aperture.raw())?;
        writeln!(f, "address aperture:    {}", self.address_aperture)?;
        writeln!(f, "timestamp:           {} ns", self.timestamp)?;
        writeln!(f, "engine id:           {:#05x}", self.engine_id)?;
        writeln!(f, "client id:           {:#04x}", self.client_id)?;
        writeln!(f, "client type:         {}", self.client_type)?;
        writeln!(f, "gpc id:              {}", self.gpc_id)?;
        write!(f, "protected mode:      {}", yes_no(self.protected_mode))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every field of an entry as raw numbers, for the independent builder.
    #[derive(Clone, Copy, Debug)]
    struct Fields {
        inst_aperture: u8,
        inst_ptr: u64,
        addr_aperture: u8,
        /// Canonical VA.
        va: u64,
        /// Garbage written into `ADDR_HI` above the VA width, which decode must ignore.
        va_junk: u64,
        timestamp: u64,
        engine: u16,
        fault_type: u8,
        replayable: bool,
        client: u8,
        access: u8,
        hub: bool,
        gpc: u8,
        protected: bool,
        replayable_en: bool,
        valid: bool,
    }

    fn width_bits(width: VaWidth) -> u32 {
        match width {
            VaWidth::Bits49 => 49,
            VaWidth::Bits57 => 57,
        }
    }

    /// Sign extension written differently from `canonical_va`: OR in the high ones.
    fn sign_extend(va: u64, width: VaWidth) -> u64 {
        let w = width_bits(width);
        let low = va & ((1u64 << w) - 1);
        if low & (1u64 << (w - 1)) != 0 {
            low | !((1u64 << w) - 1)
        } else {
            low
        }
    }

    /// Builds the raw DWORDs field by field, shifting each value by its documented LSB.
    fn build(f: &Fields, width: VaWidth) -> RawFaultEntry {
        let w = width_bits(width);
        let mut dw = [0u32; 8];
        dw[0] |= (f.inst_aperture as u32) << 8;
        dw[0] |= (((f.inst_ptr >> 12) & 0xF_FFFF) as u32) << 12;
        dw[1] = (f.inst_ptr >> 32) as u32;
        dw[2] |= f.addr_aperture as u32;
        // Hardware form: the VA truncated to its width, plus junk above it.
        let stored_va = (f.va & ((1u64 << w) - 1)) | (f.va_junk << w);
        dw[2] |= (((stored_va >> 12) & 0xF_FFFF) as u32) << 12;
        dw[3] = (stored_va >> 32) as u32;
        dw[4] = (f.timestamp & 0xFFFF_FFFF) as u32;
        dw[5] = (f.timestamp >> 32) as u32;
        dw[6] |= f.engine as u32;
        dw[7] |= f.fault_type as u32;
        dw[7] |= (f.replayable as u32) << 7;
        dw[7] |= (f.client as u32) << 8;
        dw[7] |= (f.access as u32) << 16;
        dw[7] |= (f.hub as u32) << 20;
        dw[7] |= (f.gpc as u32) << 24;
        dw[7] |= (f.protected as u32) << 29;
        dw[7] |= (f.replayable_en as u32) << 30;
        dw[7] |= (f.valid as u32) << 31;
        let mut bytes = [0u8; 32];
        for (i, d) in dw.iter().enumerate() {
            for k in 0..4 {
                bytes[i * 4 + k] = (d >> (8 * k)) as u8;
            }
        }
        RawFaultEntry(bytes)
    }

    /// The struct `decode` must produce for `f`, with the enum mappings spelled out here.
    fn expected(f: &Fields) -> FaultEntry {
        FaultEntry {
            instance_aperture: match f.inst_aperture {
                0 => Aperture::Video,
                1 => Aperture::Reserved,
                2 => Aperture::SysCoherent,
                _ => Aperture::SysNoncoherent,
            },
            instance_ptr: f.inst_ptr,
            address_aperture: f.addr_aperture,
            va: f.va,
            timestamp: f.timestamp,
            engine_id: f.engine,
            fault_type: match f.fault_type {
                0 => FaultType::InvalidPde,
                2 => FaultType::InvalidPte,
                6 => FaultType::WriteViolation,
                7 => FaultType::ReadViolation,
                15 => FaultType::Atomic,
                x => FaultType::Fatal(x),
            },
            replayable: f.replayable,
            client_id: f.client,
            access_type: match f.access {
                0 => AccessType::Read,
                1 => AccessType::Write,
                2 => AccessType::AtomicStrong,
                3 => AccessType::Prefetch,
                4 => AccessType::AtomicWeak,
                8 => AccessType::PhysRead,
                9 => AccessType::PhysWrite,
                10 => AccessType::PhysAtomic,
                11 => AccessType::PhysPrefetch,
                x => AccessType::Reserved(x),
            },
            client_type: if f.hub { MmuClientType::Hub } else { MmuClientType::Gpc },
            gpc_id: f.gpc,
            protected_mode: f.protected,
            replayable_fault_enabled: f.replayable_en,
            valid: f.valid,
        }
    }

    fn width() -> impl Strategy<Value = VaWidth> {
        prop_oneof![Just(VaWidth::Bits49), Just(VaWidth::Bits57)]
    }

    /// A 4 KiB-aligned canonical VA for `width`: random (half of them in the negative half)
    /// or one of the edge pages.
    fn canonical_page(width: VaWidth) -> impl Strategy<Value = u64> {
        let w = width_bits(width);
        let top = 1u64 << (w - 1);
        prop_oneof![
            4 => any::<u64>().prop_map(move |r| sign_extend(r & !0xFFF, width)),
            1 => prop_oneof![
                Just(0u64),
                Just(top - 0x1000),             // highest positive page
                Just(sign_extend(top, width)),  // lowest negative page
                Just(0xFFFF_FFFF_FFFF_F000u64), // -4096
            ],
        ]
    }

    prop_compose! {
        fn fields(width: VaWidth)(
            inst_aperture in 0u8..4,
            inst_ptr in any::<u64>().prop_map(|p| p & !0xFFF),
            addr_aperture in 0u8..4,
            va in canonical_page(width),
            va_junk in any::<u64>(),
            timestamp in any::<u64>(),
            engine in 0u16..512,
            fault_type in 0u8..32,
            client in 0u8..128,
            access in 0u8..16,
            gpc in 0u8..32,
            flags in any::<[bool; 5]>(),
        ) -> Fields {
            Fields {
                inst_aperture, inst_ptr, addr_aperture, va, va_junk, timestamp, engine,
                fault_type, replayable: flags[0], client, access, hub: flags[1], gpc,
                protected: flags[2], replayable_en: flags[3], valid: flags[4],
            }
        }
    }

    fn width_and_fields() -> impl Strategy<Value = (VaWidth, Fields)> {
        width().prop_flat_map(|w| (Just(w), fields(w)))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn decode_matches_independent_builder((w, f) in width_and_fields()) {
            prop_assert_eq!(FaultEntry::decode(&build(&f, w), w), expected(&f));
        }

        #[test]
        fn decode_of_encode_is_identity((w, f) in width_and_fields()) {
            let e = expected(&f);
            prop_assert_eq!(FaultEntry::decode(&e.encode(), w), e);
        }

        #[test]
        fn encode_of_decode_is_identity(w in width(), mut dw in any::<[u32; 8]>()) {
            // Zero the reserved bits; make ADDR_HI above the width a copy of the sign bit,
            // since encode writes the canonical 64-bit VA.
            dw[0] &= 0xFFFF_F300;
            dw[2] &= 0xFFFF_F003;
            dw[6] &= 0x0000_01FF;
            dw[7] &= 0xFF1F_7F9F;
            let va = sign_extend((u64::from(dw[3]) << 32) | u64::from(dw[2] & 0xFFFF_F000), w);
            dw[3] = (va >> 32) as u32;
            let raw = RawFaultEntry::from_dwords(dw);
            prop_assert_eq!(FaultEntry::decode(&raw, w).encode(), raw);
        }

        #[test]
        fn set_va_is_encode_with_the_new_address((w, f) in width_and_fields(), va in any::<u64>()) {
            let va = canonical_va(va, w) & PAGE_MASK;
            let e = expected(&f);
            let mut raw = e.encode();
            raw.set_va(va);
            prop_assert_eq!(raw, FaultEntry { va, ..e }.encode());
        }

        #[test]
        fn hex_round_trip(bytes in any::<[u8; 32]>()) {
            let raw = RawFaultEntry(bytes);
            let hex = raw.to_hex();
            prop_assert_eq!(hex.len(), 64);
            prop_assert_eq!(RawFaultEntry::from_hex(&hex), Ok(raw));
            prop_assert_eq!(RawFaultEntry::from_hex(&hex.to_uppercase()), Ok(raw));
        }

        #[test]
        fn canonical_va_matches_sign_extend(w in width(), va in any::<u64>()) {
            prop_assert_eq!(canonical_va(va, w), sign_extend(va, w));
        }
    }

    #[test]
    fn dwords_are_little_endian() {
        let raw = RawFaultEntry::from_dwords([0x0403_0201, 0, 0, 0, 0, 0, 0, 0x8000_0000]);
        assert_eq!(raw.0[..4], [1, 2, 3, 4]);
        assert_eq!(raw.0[31], 0x80);
        assert_eq!(raw.dword(0), 0x0403_0201);
        assert_eq!(raw.dword(7), 0x8000_0000);
    }

    #[test]
    fn hopper_read_invalid_pte() {
        let raw =
            RawFaultEntry::from_hex("00b2dcfe 01000000 00705634 127f0000 efcdab89 23010000 40000000 821500c3").unwrap();
        let e = FaultEntry::decode(&raw, VaWidth::Bits57);
        assert_eq!(e.instance_aperture, Aperture::SysCoherent);
        assert_eq!(e.instance_ptr, 0x0000_0001_fedc_b000);
        assert_eq!(e.address_aperture, 0);
        assert_eq!(e.va, 0x7f12_3456_7000);
        assert_eq!(e.page(), 0x7f12_3456_7000);
        assert_eq!(e.timestamp, 0x0000_0123_89ab_cdef);
        assert_eq!(e.engine_id, 0x40);
        assert_eq!(e.fault_type, FaultType::InvalidPte);
        assert!(!e.fault_type.is_fatal());
        assert!(e.replayable);
        assert_eq!(e.client_id, 0x15);
        assert_eq!(e.access_type, AccessType::Read);
        assert!(!e.access_type.is_write());
        assert_eq!(e.client_type, MmuClientType::Gpc);
        assert_eq!(e.gpc_id, 3);
        assert!(!e.protected_mode);
        assert!(e.replayable_fault_enabled);
        assert!(e.valid);
        assert_eq!(e.encode(), raw);
        // The VA is in the low half of both widths.
        assert_eq!(FaultEntry::decode(&raw, VaWidth::Bits49), e);
    }

    #[test]
    fn bit_48_sign_extends_for_49_bit_vas() {
        let raw = RawFaultEntry::from_hex("0x00000000_00000000_00200000_00000100_00000000_00000000_00000000_860001c0")
            .unwrap();
        let e = FaultEntry::decode(&raw, VaWidth::Bits49);
        assert_eq!(e.va, 0xffff_0000_0000_2000);
        assert_eq!(e.fault_type, FaultType::WriteViolation);
        assert_eq!(e.access_type, AccessType::Write);
        assert!(e.access_type.is_write());
        assert!(e.replayable && e.replayable_fault_enabled && e.valid);
        // Bit 48 is an ordinary address bit of a 57-bit VA.
        assert_eq!(FaultEntry::decode(&raw, VaWidth::Bits57).va, 0x0001_0000_0000_2000);
    }

    #[test]
    fn bit_56_sign_extends_for_57_bit_vas() {
        let raw = RawFaultEntry::from_hex(
            "00:00:00:00 00:00:00:00 00:b0:ad:de 00:00:00:01 \
             00:00:00:00 00:00:00:00 00:00:00:00 0f:00:14:80",
        )
        .unwrap();
        let e = FaultEntry::decode(&raw, VaWidth::Bits57);
        assert_eq!(e.va, 0xff00_0000_dead_b000);
        assert_eq!(e.fault_type, FaultType::Atomic);
        assert!(!e.fault_type.is_fatal());
        assert_eq!(e.access_type, AccessType::AtomicWeak);
        assert!(e.access_type.is_write());
        assert_eq!(e.client_type, MmuClientType::Hub);
        assert!(!e.replayable && e.valid);
        // A 49-bit decode drops bits 49..63, leaving a positive VA.
        assert_eq!(FaultEntry::decode(&raw, VaWidth::Bits49).va, 0xdead_b000);
    }

    #[test]
    fn fault_type_classification() {
        for raw in 0u8..32 {
            let t = FaultType::from_raw(raw);
            assert_eq!(t.raw(), raw);
            let serviceable = matches!(raw, 0 | 2 | 6 | 7 | 0xF);
            assert_eq!(t.is_fatal(), !serviceable, "fault type {raw:#x}");
        }
        let mut dw = [0u32; 8];
        dw[7] = DW7_VALID | 0xB;
        let e = FaultEntry::decode(&RawFaultEntry::from_dwords(dw), VaWidth::Bits49);
        assert_eq!(e.fault_type, FaultType::Fatal(0xB));
        assert!(e.fault_type.is_fatal());
        assert_eq!(e.fault_type.to_string(), "COMPRESSION_FAILURE");
    }

    #[test]
    fn access_type_classification() {
        for raw in 0u8..16 {
            let a = AccessType::from_raw(raw);
            assert_eq!(a.raw(), raw);
            assert_eq!(a.is_write(), matches!(raw, 1 | 2 | 4 | 9 | 10), "access {raw}");
            assert_eq!(matches!(a, AccessType::Reserved(_)), matches!(raw, 5..=7 | 12..), "{raw}");
        }
    }

    #[test]
    fn encode_truncates_out_of_range_fields() {
        let mut e = FaultEntry::decode(&RawFaultEntry([0; 32]), VaWidth::Bits49);
        e.engine_id = 0x3FF;
        e.client_id = 0xFF;
        e.gpc_id = 0xFF;
        e.address_aperture = 0xFF;
        e.fault_type = FaultType::Fatal(0x3F);
        e.access_type = AccessType::Reserved(0x1F);
        e.va = 0x1234_5FFF;
        e.instance_ptr = 0xABC;
        let d = FaultEntry::decode(&e.encode(), VaWidth::Bits49);
        assert_eq!(d.engine_id, 0x1FF);
        assert_eq!(d.client_id, 0x7F);
        assert_eq!(d.gpc_id, 0x1F);
        assert_eq!(d.address_aperture, 3);
        assert_eq!(d.fault_type, FaultType::Fatal(0x1F));
        assert_eq!(d.access_type, AccessType::Reserved(0xF));
        assert_eq!(d.va, 0x1234_5000);
        assert_eq!(d.instance_ptr, 0);
        // Nothing spilled into the neighbouring single-bit fields.
        assert!(!d.valid && !d.replayable && !d.protected_mode && !d.replayable_fault_enabled);
        assert_eq!(d.client_type, MmuClientType::Gpc);
    }

    #[test]
    fn from_hex_errors() {
        let digits63 = "0".repeat(63);
        assert_eq!(RawFaultEntry::from_hex(&digits63), Err(HexError::WrongLength { digits: 63 }));
        let msg = HexError::WrongLength { digits: 63 }.to_string();
        assert!(msg.contains("63") && msg.contains("64"), "{msg}");
        assert_eq!(RawFaultEntry::from_hex(&"0".repeat(65)), Err(HexError::WrongLength { digits: 65 }));
        assert_eq!(RawFaultEntry::from_hex(""), Err(HexError::WrongLength { digits: 0 }));

        let mut bad = "0".repeat(64);
        bad.replace_range(10..11, "g");
        let err = RawFaultEntry::from_hex(&bad).unwrap_err();
        assert_eq!(err, HexError::BadDigit { ch: 'g', position: 10 });
        let msg = err.to_string();
        assert!(msg.contains("'g'") && msg.contains("10"), "{msg}");
        // Positions count from the start of the input, prefix included.
        let err = RawFaultEntry::from_hex(&format!(" 0x{}z", "0".repeat(64))).unwrap_err();
        assert_eq!(err, HexError::BadDigit { ch: 'z', position: 67 });
        // "0x" is only a prefix, not a separator.
        assert!(matches!(
            RawFaultEntry::from_hex(&format!("00x{}", "0".repeat(62))),
            Err(HexError::BadDigit { ch: 'x', position: 2 })
        ));
    }

    #[test]
    fn display_names_the_fields() {
        let raw =
            RawFaultEntry::from_hex("00b2dcfe 01000000 00705634 127f0000 efcdab89 23010000 40000000 821500c3").unwrap();
        let text = FaultEntry::decode(&raw, VaWidth::Bits57).to_string();
        assert!(text.contains("0x00007f1234567000"), "{text}");
        assert!(text.contains("INVALID_PTE"), "{text}");
        assert!(text.contains("VIRT_READ"), "{text}");
        assert!(text.contains("SYS_MEM_COHERENT"), "{text}");
        assert!(text.contains("0x00000001fedcb000"), "{text}");
        assert_eq!(text.lines().count(), 15, "{text}");
    }
}
