//! The shim's argument checks, `shim/wic_validate.h`, compiled for user space by `build.rs`
//! (through `c/shim_validate.c`), and a session's range tables changed only through them, as
//! `wic_register()` and `wic_unregister()` in `wic_shim.c` change them.

use std::os::raw::c_int;
use std::ptr;

use wic_kabi::{WicCommand, WicRange, WicSubmit, WIC_MAX_SPACES};

/// `struct wic_range_entry`: a registered range.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RangeEntry {
    pub start: u64,
    pub end: u64,
    pub id: u32,
    pub kind: u32,
    pub run_pages: u32,
    pub gone: u32,
    pub unsupported_told: u32,
    /// The kernel's count and bitmaps of pages held without a held-table entry: never set here.
    pub untabled_pending: u32,
    pub untabled: usize,
}

/// `struct wic_range_list`, borrowing a slice; the C side only reads through it.
#[repr(C)]
struct RangeList {
    entries: *const RangeEntry,
    nr: u32,
}

impl RangeList {
    fn of(ranges: &[RangeEntry]) -> Self {
        let nr = u32::try_from(ranges.len()).expect("a space holds at most WIC_MAX_RANGES ranges");
        Self { entries: ranges.as_ptr(), nr }
    }
}

/// `struct wic_fuzz_mm` of `c/shim_validate.c`: the mappings of a fake process.
#[repr(C)]
struct FakeMm {
    maps: *const [u64; 2],
    nr: u32,
}

extern "C" {
    fn wic_fuzz_check_submit(sub: *const WicSubmit) -> c_int;
    fn wic_fuzz_check_command(cmd: *const WicCommand, space: *const RangeList) -> c_int;
    fn wic_fuzz_check_register(
        r: *const WicRange,
        space: *const RangeList,
        nr_ranges: u32,
        mm: *const FakeMm,
        end: *mut u64,
        at: *mut u32,
    ) -> c_int;
    fn wic_fuzz_ranges_insert(dst: *mut RangeEntry, src: *const RangeList, at: u32, entry: *const RangeEntry);
    fn wic_fuzz_range_index(list: *const RangeList, range_id: u32) -> c_int;
    fn wic_fuzz_ranges_remove(dst: *mut RangeEntry, src: *const RangeList, at: u32);
    fn wic_fuzz_range_entry_size() -> std::os::raw::c_ulong;
}

/// A C verdict: 0 is `Ok`, `-errno` is `Err(errno)`.
fn verdict(ret: c_int) -> Result<(), i32> {
    if ret == 0 {
        Ok(())
    } else {
        Err(-ret)
    }
}

/// `wic_check_submit()`.
pub fn check_submit(sub: &WicSubmit) -> Result<(), i32> {
    // SAFETY: `sub` is a live `struct wic_submit` (layout checked by wic-proto's ABI test),
    // only read.
    verdict(unsafe { wic_fuzz_check_submit(sub) })
}

/// `wic_check_command()` against the ranges of the command's space (`None`: not attached).
pub fn check_command(cmd: &WicCommand, space: Option<&[RangeEntry]>) -> Result<(), i32> {
    let list = space.map(RangeList::of);
    let list_ptr = list.as_ref().map_or(ptr::null(), |list| list as *const RangeList);
    // SAFETY: `cmd` is a live `struct wic_command`; `list_ptr` is null or points to a list of
    // `nr` live entries that outlives the call; both are only read.
    verdict(unsafe { wic_fuzz_check_command(cmd, list_ptr) })
}

/// A session's spaces and their ranges, kept as `wic_shim.c` keeps them: checked with
/// `wic_check_register()`, copied with `wic_ranges_insert()` and `wic_ranges_remove()`.
/// Attaching needs a UVM file in the kernel; here it is a plain switch.
pub struct Session {
    /// Space `id` at index `id - 1`; `None` while it is not attached.
    spaces: Vec<Option<Vec<RangeEntry>>>,
    next_range_id: u32,
}

impl Default for Session {
    fn default() -> Self {
        // SAFETY: a function of no argument returning a constant.
        let c_size = unsafe { wic_fuzz_range_entry_size() };
        assert_eq!(c_size as usize, std::mem::size_of::<RangeEntry>(), "RangeEntry is not struct wic_range_entry");
        Self { spaces: vec![None; WIC_MAX_SPACES as usize], next_range_id: 1 }
    }
}

impl Session {
    fn slot(space_id: u32) -> Option<usize> {
        (1..=WIC_MAX_SPACES).contains(&space_id).then(|| space_id as usize - 1)
    }

    /// Attaches space `space_id` (1 to `WIC_MAX_SPACES`) if it is not yet; other ids are
    /// ignored.
    pub fn attach(&mut self, space_id: u32) {
        if let Some(slot) = Self::slot(space_id) {
            self.spaces[slot].get_or_insert_with(Vec::new);
        }
    }

    /// Detaches space `space_id` with its ranges, as `wic_detach()` does.
    pub fn detach(&mut self, space_id: u32) {
        if let Some(slot) = Self::slot(space_id) {
            self.spaces[slot] = None;
        }
    }

    /// The ranges of space `space_id`, or `None` when it is not attached.
    pub fn ranges(&self, space_id: u32) -> Option<&[RangeEntry]> {
        Self::slot(space_id).and_then(|slot| self.spaces[slot].as_deref())
    }

    /// Ranges over all spaces: `wic_session.nr_ranges`.
    pub fn nr_ranges(&self) -> u32 {
        let total: usize = self.spaces.iter().flatten().map(Vec::len).sum();
        u32::try_from(total).expect("at most WIC_MAX_RANGES ranges")
    }

    /// `WIC_IOC_REGISTER` in a process whose mappings are `mappings` ([start, end) each, sorted,
    /// not overlapping); the new range's id.
    pub fn register(&mut self, r: &WicRange, mappings: &[[u64; 2]]) -> Result<u32, i32> {
        let space = self.ranges(r.space_id).map(RangeList::of);
        let space_ptr = space.as_ref().map_or(ptr::null(), |list| list as *const RangeList);
        let nr = u32::try_from(mappings.len()).expect("a handful of mappings");
        let mm = FakeMm { maps: mappings.as_ptr(), nr };
        let (mut end, mut at) = (0u64, 0u32);
        // SAFETY: every pointer is to a live value or to a slice of the length given with it,
        // all outliving the call; the C side reads them and writes only `end` and `at`.
        verdict(unsafe { wic_fuzz_check_register(r, space_ptr, self.nr_ranges(), &mm, &mut end, &mut at) })?;

        let slot = Self::slot(r.space_id).expect("a range was accepted for an invalid space id");
        let old = self.spaces[slot].as_ref().expect("a range was accepted for a detached space");
        assert!(at as usize <= old.len(), "wic_check_register() put the range at {at} of {}", old.len());
        let entry = RangeEntry { start: r.start, end, id: self.next_range_id, kind: r.kind, run_pages: r.run_pages, gone: 0, unsupported_told: 0, untabled_pending: 0, untabled: 0 };
        let mut new = vec![RangeEntry::default(); old.len() + 1];
        // SAFETY: `new` has room for one entry more than `old`, `at` is at most `old.len()`
        // (checked above), and `old` and `entry` outlive the call.
        unsafe { wic_fuzz_ranges_insert(new.as_mut_ptr(), &RangeList::of(old), at, &entry) };
        self.spaces[slot] = Some(new);
        // As wic_register(): ids wrap around, skipping 0.
        self.next_range_id = self.next_range_id.wrapping_add(1).max(1);
        Ok(entry.id)
    }

    /// `WIC_IOC_UNREGISTER`: looks for the range in every space, in order.
    pub fn unregister(&mut self, range_id: u32) -> Result<(), i32> {
        for ranges in self.spaces.iter_mut().flatten() {
            // SAFETY: the list borrows `ranges`, which outlives the call; only read.
            let found = unsafe { wic_fuzz_range_index(&RangeList::of(ranges), range_id) };
            let Ok(at) = usize::try_from(found) else {
                assert_eq!(found, -libc::ENOENT, "wic_range_index() failed with another error");
                continue;
            };
            assert!(at < ranges.len(), "wic_range_index() found range {range_id} at {at} of {}", ranges.len());
            let mut new = vec![RangeEntry::default(); ranges.len() - 1];
            // As wic_unregister(): a space's last range leaves no table to copy into.
            if !new.is_empty() {
                // SAFETY: `new` has room for one entry less than `ranges`, `at` is an index
                // into `ranges` (checked above), and `ranges` outlives the call.
                unsafe { wic_fuzz_ranges_remove(new.as_mut_ptr(), &RangeList::of(ranges), at as u32) };
            }
            *ranges = new;
            return Ok(());
        }
        Err(libc::ENOENT)
    }
}
