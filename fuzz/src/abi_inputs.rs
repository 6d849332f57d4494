//! Structured inputs of `submit_validation` and `shim_ranges`, decoded from the fuzzer's bytes
//! with `arbitrary`. Most fields may be raw (any value at all) or drawn from the values that
//! pass, so that both refusals and accepted calls are common; zero bytes decode as a valid
//! call where one can be.

use arbitrary::{Arbitrary, Unstructured};
use wic_kabi::{
    WicCommand, WicRange, WicSubmit, WIC_CMD_COMPLETE, WIC_CMD_COMPLETE_COPY, WIC_CMD_COMPLETE_HEADS, WIC_CMD_REARM_PAT, WIC_CMD_REPLAY,
    WIC_CMD_SERVICE_PAT, WIC_MARKER_MAGIC, WIC_PAGE_SIZE, WIC_RANGE_PAT,
    WIC_RANGE_PCM, WIC_RANGE_SOURCE,
};

/// An address: a page number, or any value.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Addr {
    Page(u32),
    Raw(u64),
}

impl Addr {
    pub fn value(self) -> u64 {
        match self {
            Self::Page(page) => u64::from(page) * WIC_PAGE_SIZE,
            Self::Raw(value) => value,
        }
    }
}

/// A length: 1 to 65536 pages (`Pages(n)`: n + 1), or any value.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Length {
    Pages(u16),
    Raw(u64),
}

impl Length {
    pub fn value(self) -> u64 {
        match self {
            Self::Pages(n) => (u64::from(n) + 1) * WIC_PAGE_SIZE,
            Self::Raw(value) => value,
        }
    }
}

/// A space id from one byte: `n + 1`, wrapping, so that 0 decodes as space 1 and 255 as the
/// invalid id 0.
pub fn space_id(n: u8) -> u32 {
    n.wrapping_add(1).into()
}

/// A range kind: one of the two, or any value.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Kind {
    Pcm,
    Pat,
    Raw(u32),
}

impl Kind {
    pub fn value(self) -> u32 {
        match self {
            Self::Pcm => WIC_RANGE_PCM,
            Self::Pat => WIC_RANGE_PAT,
            Self::Raw(value) => value,
        }
    }
}

// --- submit_validation ------------------------------------------------------------------------

/// Spaces 1 to this many are attached for `submit_validation`.
pub const SUBMIT_SPACES: u32 = 3;

/// A batch of commands, checked against ranges registered first.
#[derive(Debug)]
pub struct SubmitInput {
    /// Registered in a process that maps everything; refused ones are left out.
    pub ranges: [RangeSpec; 8],
    pub batch: BatchSpec,
    /// As many as the bytes make.
    pub commands: Vec<CommandSpec>,
}

impl<'a> Arbitrary<'a> for SubmitInput {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Self { ranges: u.arbitrary()?, batch: u.arbitrary()?, commands: until_empty(u)? })
    }
}

/// Values decoded one after the other until the bytes run out: no length or continuation
/// bytes between them, so that every byte the fuzzer changes changes a value.
fn until_empty<'a, T: Arbitrary<'a>>(u: &mut Unstructured<'a>) -> arbitrary::Result<Vec<T>> {
    let mut values = Vec::new();
    while !u.is_empty() {
        values.push(u.arbitrary()?);
    }
    Ok(values)
}

/// A range to register in one of the attached spaces.
#[derive(Arbitrary, Debug)]
pub struct RangeSpec {
    /// Space `1 + space % SUBMIT_SPACES`.
    pub space: u8,
    pub start: Addr,
    pub length: Length,
    /// `RANGE_KINDS[kind % 3]`.
    pub kind: u8,
}

/// The three range kinds, PCM first so that zero bytes make a valid range.
const RANGE_KINDS: [u32; 3] = [WIC_RANGE_PCM, WIC_RANGE_PAT, WIC_RANGE_SOURCE];

impl RangeSpec {
    pub fn request(&self) -> WicRange {
        WicRange {
            space_id: 1 + u32::from(self.space) % SUBMIT_SPACES,
            kind: RANGE_KINDS[usize::from(self.kind) % RANGE_KINDS.len()],
            start: self.start.value(),
            length: self.length.value(),
            range_id: 0,
            run_pages: 0,
        }
    }
}

/// `struct wic_submit`'s count and flags.
#[derive(Arbitrary, Debug)]
pub struct BatchSpec {
    /// `None`: the number of commands.
    pub count: Option<u32>,
    pub flags: u32,
}

impl BatchSpec {
    pub fn request(&self, commands: usize) -> WicSubmit {
        let count = self.count.unwrap_or_else(|| u32::try_from(commands).unwrap_or(u32::MAX));
        WicSubmit { commands: 0, count, flags: self.flags }
    }
}

/// The opcodes, in the order the corpus was made with: 1 to 4, which the module refuses since
/// kernel ABI 5 (a completion's steps as commands of their own), then the five it runs; then
/// the heads completion of kernel ABI 6.
const OPCODES: [u32; 10] = [
    4, // was WIC_CMD_MAP: zero bytes made a valid command of it
    3,
    1,
    2,
    WIC_CMD_SERVICE_PAT,
    WIC_CMD_REARM_PAT,
    WIC_CMD_REPLAY,
    WIC_CMD_COMPLETE,
    WIC_CMD_COMPLETE_COPY,
    WIC_CMD_COMPLETE_HEADS,
];

/// A command's opcode: one of the ten, or any value.
#[derive(Arbitrary, Debug)]
pub enum OpcodeSpec {
    /// `OPCODES[n % 10]`.
    Known(u8),
    Raw(u32),
}

/// Where a command's pages are: inside a registered range, or anywhere.
#[derive(Arbitrary, Debug)]
pub enum PagesAt {
    /// Page `page` of registered range `range % ranges`, in that range's space (of address 0
    /// in space 1 when no range was registered).
    InRange { range: u8, page: u16 },
    Raw { space_id: u32, va: u64 },
}

/// A command's `arg`: 0, an error marker word with any code, an address in a registered range
/// (the source of a copy), or any value.
#[derive(Arbitrary, Debug)]
pub enum ArgSpec {
    Zero,
    Marker(u8),
    /// Byte `offset` of registered range `range % ranges` (of address 0 when none was).
    InRange { range: u8, offset: u16 },
    Raw(u64),
}

/// A command's page count: 1 to 256 (`Few(n)`: n + 1), or any value.
#[derive(Arbitrary, Debug)]
pub enum PagesSpec {
    Few(u8),
    Raw(u32),
}

/// A command's `companion`: 0, some pages before or after its own pages (so often in the same
/// range, and sometimes overlapping them), or any value.
#[derive(Arbitrary, Debug)]
pub enum CompanionSpec {
    Zero,
    /// `va + pages * WIC_PAGE_SIZE`, wrapping.
    PagesAway(i16),
    Raw(u64),
}

/// `struct wic_command`.
#[derive(Arbitrary, Debug)]
pub struct CommandSpec {
    pub opcode: OpcodeSpec,
    pub at: PagesAt,
    /// The GPU id unless `raw_gpu_id` is given: 0 (the CPU's, refused) and valid ones; the
    /// raw id reaches the rest.
    pub gpu_id: u8,
    pub raw_gpu_id: Option<u32>,
    pub pages: PagesSpec,
    pub length: u64,
    pub arg: ArgSpec,
    pub companion: CompanionSpec,
    pub result: i32,
    pub reserved: u32,
    /// `length` is 8 x the command's pages whatever `length` says, as a heads completion needs
    /// (last: an input's last command decodes as it did before the field was added).
    pub length_per_page: bool,
}

impl CommandSpec {
    /// The command, its pages placed among `ranges` (space id, first byte) as [`PagesAt`]
    /// says.
    pub fn command(&self, ranges: &[(u32, u64)]) -> WicCommand {
        let opcode = match self.opcode {
            OpcodeSpec::Known(n) => OPCODES[usize::from(n) % OPCODES.len()],
            OpcodeSpec::Raw(value) => value,
        };
        let (space_id, va) = match self.at {
            PagesAt::InRange { range, page } => match ranges.get(usize::from(range) % ranges.len().max(1)) {
                Some(&(space_id, start)) => (space_id, start.wrapping_add(u64::from(page) * WIC_PAGE_SIZE)),
                None => (1, u64::from(page) * WIC_PAGE_SIZE),
            },
            PagesAt::Raw { space_id, va } => (space_id, va),
        };
        let arg = match self.arg {
            ArgSpec::Zero => 0,
            ArgSpec::Marker(code) => WIC_MARKER_MAGIC | u64::from(code),
            ArgSpec::InRange { range, offset } => {
                ranges.get(usize::from(range) % ranges.len().max(1)).map_or(0, |&(_, start)| start).wrapping_add(u64::from(offset))
            }
            ArgSpec::Raw(value) => value,
        };
        let pages = match self.pages {
            PagesSpec::Few(n) => u32::from(n) + 1,
            PagesSpec::Raw(value) => value,
        };
        let companion = match self.companion {
            CompanionSpec::Zero => 0,
            CompanionSpec::PagesAway(pages) => va.wrapping_add_signed(i64::from(pages) * WIC_PAGE_SIZE as i64),
            CompanionSpec::Raw(value) => value,
        };
        WicCommand {
            opcode,
            space_id,
            gpu_id: self.raw_gpu_id.unwrap_or(u32::from(self.gpu_id)),
            pages,
            va,
            length: if self.length_per_page { 8 * u64::from(pages) } else { self.length },
            arg,
            companion,
            result: self.result,
            reserved: self.reserved,
        }
    }
}

// --- shim_ranges ------------------------------------------------------------------------------

/// Calls on the ranges of a session whose space 1 is attached, in a process with the given
/// mappings.
#[derive(Debug)]
pub struct RangesInput {
    pub mm: MmSpec,
    /// As many as the bytes make.
    pub ops: Vec<RangeOp>,
}

impl<'a> Arbitrary<'a> for RangesInput {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Self { mm: u.arbitrary()?, ops: until_empty(u)? })
    }
}

/// The mappings of the fake process.
#[derive(Arbitrary, Debug)]
pub enum MmSpec {
    /// One mapping over the whole address space.
    Everything,
    /// From page `first_page` on, each mapping `(gap, pages)` pages after the previous one's
    /// end (a gap of 0: touching).
    Mappings { first_page: u32, spans: Vec<(u8, u8)> },
}

impl MmSpec {
    /// The mappings, [start, end) each, sorted and not overlapping.
    pub fn mappings(&self) -> Vec<[u64; 2]> {
        match self {
            Self::Everything => vec![[0, u64::MAX]],
            Self::Mappings { first_page, spans } => {
                let mut at = u64::from(*first_page) * WIC_PAGE_SIZE;
                let mut mappings = Vec::new();
                for &(gap, pages) in spans.iter().filter(|&&(_, pages)| pages > 0) {
                    let start = at + u64::from(gap) * WIC_PAGE_SIZE;
                    at = start + u64::from(pages) * WIC_PAGE_SIZE;
                    mappings.push([start, at]);
                }
                mappings
            }
        }
    }
}

/// A range id to unregister: one handed out before, or any value.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum IdSpec {
    /// The `n % issued`-th id handed out (0 when none was).
    Issued(u8),
    Raw(u32),
}

/// One call, or a change of the session's spaces. Space ids are bytes read by [`space_id`].
#[derive(Arbitrary, Debug)]
pub enum RangeOp {
    Register { space: u8, kind: Kind, start: Addr, length: Length, range_id: u32, run_pages: u32 },
    Unregister(IdSpec),
    /// `count * MANY_STEP` one-page PCM ranges at every other page from `first_page`, the
    /// highest first: from a count of 205 on, past `WIC_MAX_RANGES`.
    RegisterMany { space: u8, first_page: u32, count: u8 },
    Attach(u8),
    Detach(u8),
}

/// Ranges one step of [`RangeOp::RegisterMany`]'s count registers.
pub const MANY_STEP: u64 = 5;
