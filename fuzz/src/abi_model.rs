//! The rules `ffi/include/wic_abi.h` states for `/dev/wic`'s arguments, written a second time,
//! as plainly as possible, to judge the shim's checks by. Each rule is one test, in the order
//! the header lists the errors; `Err` holds the errno. Nothing here is shared with the C code
//! but the ABI's structs and constants.

use std::collections::BTreeMap;

use libc::{EEXIST, EFAULT, EINVAL, ENODEV, ENOENT, ENOSPC, ERANGE};
use wic_kabi::{
    WicCommand, WicRange, WicSubmit, WIC_CMD_COMPLETE, WIC_CMD_COMPLETE_COPY, WIC_CMD_COMPLETE_HEADS, WIC_CMD_REARM_PAT, WIC_CMD_REPLAY,
    WIC_CMD_SERVICE_PAT, WIC_MARKER_CHANNEL_CLOSED, WIC_MARKER_DAEMON_GONE, WIC_MARKER_DAEMON_STOPPING,
    WIC_MARKER_TIMEOUT, WIC_MAX_COMMANDS, WIC_MAX_GPU_ID, WIC_MAX_RANGES, WIC_MAX_RANGE_BYTES, WIC_MAX_SPACES, WIC_MAX_WRITE_BYTES,
    WIC_PAGE_SIZE, WIC_RANGE_PAT, WIC_RANGE_PCM, WIC_RANGE_SOURCE,
};

use crate::shim::RangeEntry;


/// The four error markers a `WIC_CMD_COMPLETE` without data may write.
const MARKERS: [u64; 4] = [WIC_MARKER_TIMEOUT, WIC_MARKER_CHANNEL_CLOSED, WIC_MARKER_DAEMON_STOPPING, WIC_MARKER_DAEMON_GONE];

/// `struct wic_submit`: 1 to `WIC_MAX_COMMANDS` commands, no flags.
pub fn submit(sub: &WicSubmit) -> Result<(), i32> {
    if sub.count == 0 || sub.count > WIC_MAX_COMMANDS || sub.flags != 0 {
        return Err(EINVAL);
    }
    Ok(())
}

/// `struct wic_command`, against the ranges of its space (`None`: no such space attached).
pub fn command(cmd: &WicCommand, space: Option<&[RangeEntry]>) -> Result<(), i32> {
    let op = cmd.opcode;
    if cmd.reserved != 0 || cmd.result != 0 {
        return Err(EINVAL);
    }
    // Opcodes 1 to 4 (the steps of a completion as commands of their own) are not used.
    if !(WIC_CMD_SERVICE_PAT..=WIC_CMD_COMPLETE_HEADS).contains(&op) {
        return Err(EINVAL);
    }
    // "@gpu_id: the GPU the command concerns, 1 to WIC_MAX_GPU_ID".
    if cmd.gpu_id == 0 || cmd.gpu_id > WIC_MAX_GPU_ID {
        return Err(ENODEV);
    }
    // A completion fills with data when it has a length, else with a marker; a copy always
    // with data, and so does a heads completion (its data is the head words).
    let copy = op == WIC_CMD_COMPLETE_COPY;
    let heads = op == WIC_CMD_COMPLETE_HEADS;
    let complete = op == WIC_CMD_COMPLETE || copy || heads;
    let data = copy || heads || (op == WIC_CMD_COMPLETE && cmd.length != 0);
    let marker = op == WIC_CMD_COMPLETE && cmd.length == 0;
    // @length, @arg and @companion are 0 unless the opcode uses them.
    if (!data && cmd.length != 0) || (!data && !marker && cmd.arg != 0) || (!complete && cmd.companion != 0) {
        return Err(EINVAL);
    }
    // A replay names no pages.
    if op == WIC_CMD_REPLAY {
        return Ok(());
    }
    let pat = op == WIC_CMD_SERVICE_PAT || op == WIC_CMD_REARM_PAT;
    let max_pages = if pat { 1 } else { WIC_MAX_RANGE_BYTES / WIC_PAGE_SIZE };
    if cmd.pages == 0 || u64::from(cmd.pages) > max_pages || !cmd.va.is_multiple_of(WIC_PAGE_SIZE) {
        return Err(EINVAL);
    }
    let bytes = u64::from(cmd.pages) * WIC_PAGE_SIZE;
    let Some(end) = cmd.va.checked_add(bytes) else {
        return Err(EINVAL);
    };
    // The companion: page aligned, not past 2^64 - 1, sharing no page with the run.
    let companion_end = if complete {
        let Some(companion_end) = cmd.companion.checked_add(bytes) else {
            return Err(EINVAL);
        };
        if !cmd.companion.is_multiple_of(WIC_PAGE_SIZE) || (cmd.companion < end && cmd.va < companion_end) {
            return Err(EINVAL);
        }
        companion_end
    } else {
        0
    };
    let Some(ranges) = space else {
        return Err(ENOENT);
    };
    let kind = if pat { WIC_RANGE_PAT } else { WIC_RANGE_PCM };
    let inside = |kind: u32, start: u64, end: u64| ranges.iter().any(|r| r.kind == kind && r.start <= start && end <= r.end);
    if !inside(kind, cmd.va, end) || (complete && !inside(WIC_RANGE_PCM, cmd.companion, companion_end)) {
        return Err(ERANGE);
    }
    if data && (cmd.length == 0 || cmd.length > bytes || cmd.length > u64::from(WIC_MAX_WRITE_BYTES)) {
        return Err(EINVAL);
    }
    // "WIC_CMD_COMPLETE_HEADS: exactly 8 x @pages".
    if heads && cmd.length != 8 * u64::from(cmd.pages) {
        return Err(EINVAL);
    }
    if marker && !MARKERS.contains(&cmd.arg) {
        return Err(EINVAL);
    }
    // "ERANGE when a copy's source bytes are not inside one WIC_RANGE_SOURCE range".
    if copy && !cmd.arg.checked_add(cmd.length).is_some_and(|source_end| inside(WIC_RANGE_SOURCE, cmd.arg, source_end)) {
        return Err(ERANGE);
    }
    Ok(())
}

/// Whether every byte of [start, end) lies in one of `mappings` ([start, end) each).
fn inside_mappings(mappings: &[[u64; 2]], start: u64, end: u64) -> bool {
    let mut sorted = mappings.to_vec();
    sorted.sort_unstable();
    // Merge touching mappings into the stretches they cover together.
    let mut stretches: Vec<[u64; 2]> = Vec::new();
    for [from, to] in sorted {
        match stretches.last_mut() {
            Some(last) if from <= last[1] => last[1] = last[1].max(to),
            _ => stretches.push([from, to]),
        }
    }
    stretches.iter().any(|&[from, to]| from <= start && end <= to)
}

/// A session's spaces and ranges as the rules describe them.
#[derive(Default)]
pub struct Session {
    /// Attached spaces by id, each with its ranges by start.
    spaces: BTreeMap<u32, BTreeMap<u64, RangeEntry>>,
    /// Ranges over all spaces.
    total: usize,
    /// Ids handed out so far.
    issued: u32,
}

impl Session {
    /// Attaches space `space_id` if it is a valid id and not attached yet.
    pub fn attach(&mut self, space_id: u32) {
        if (1..=WIC_MAX_SPACES).contains(&space_id) {
            self.spaces.entry(space_id).or_default();
        }
    }

    /// Detaches a space: its ranges go with it.
    pub fn detach(&mut self, space_id: u32) {
        if let Some(ranges) = self.spaces.remove(&space_id) {
            self.total -= ranges.len();
        }
    }

    /// The ranges of an attached space, sorted by start.
    pub fn ranges(&self, space_id: u32) -> Option<Vec<RangeEntry>> {
        self.spaces.get(&space_id).map(|ranges| ranges.values().copied().collect())
    }

    /// `struct wic_range`, registered in a process whose mappings are `mappings`; ids count
    /// from 1.
    pub fn register(&mut self, r: &WicRange, mappings: &[[u64; 2]]) -> Result<u32, i32> {
        if r.range_id != 0 || ![WIC_RANGE_PCM, WIC_RANGE_PAT, WIC_RANGE_SOURCE].contains(&r.kind) {
            return Err(EINVAL);
        }
        if !r.start.is_multiple_of(WIC_PAGE_SIZE) || !r.length.is_multiple_of(WIC_PAGE_SIZE) || r.length == 0 || r.length > WIC_MAX_RANGE_BYTES {
            return Err(EINVAL);
        }
        let Some(end) = r.start.checked_add(r.length) else {
            return Err(EINVAL);
        };
        // "A @run_pages that is not 0 must divide the range into pairs of runs ..., for a PCM
        // range only".
        let pair = 2 * u64::from(r.run_pages) * WIC_PAGE_SIZE;
        if r.run_pages != 0
            && (r.kind != WIC_RANGE_PCM || u64::from(r.run_pages) > WIC_MAX_RANGE_BYTES / WIC_PAGE_SIZE || !r.length.is_multiple_of(pair))
        {
            return Err(EINVAL);
        }
        let Some(ranges) = self.spaces.get_mut(&r.space_id) else {
            return Err(ENOENT);
        };
        if self.total >= WIC_MAX_RANGES as usize {
            return Err(ENOSPC);
        }
        if !inside_mappings(mappings, r.start, end) {
            return Err(EFAULT);
        }
        // Ranges are disjoint: if any overlaps [start, end), the last one starting before
        // `end` does.
        if ranges.range(..end).next_back().is_some_and(|(_, other)| other.end > r.start) {
            return Err(EEXIST);
        }
        self.issued += 1;
        self.total += 1;
        ranges.insert(r.start, RangeEntry { start: r.start, end, id: self.issued, kind: r.kind, run_pages: r.run_pages, gone: 0, unsupported_told: 0, untabled_pending: 0, untabled: 0 });
        Ok(self.issued)
    }

    /// `WIC_IOC_UNREGISTER` of the range with id `range_id`, whichever space holds it.
    pub fn unregister(&mut self, range_id: u32) -> Result<(), i32> {
        for ranges in self.spaces.values_mut() {
            if let Some(start) = ranges.values().find(|r| r.id == range_id).map(|r| r.start) {
                ranges.remove(&start);
                self.total -= 1;
                return Ok(());
            }
        }
        Err(ENOENT)
    }
}
