//! Between the engine's page pool and applications' address spaces.
//!
//! The engine allocates a channel's pages in its own pool; on a real GPU they are pages of the
//! application's managed memory. A channel is placed at a base address the application chose:
//! its runs, slot by slot (P then P'), then its PAT pages, each run contiguous. The
//! [`Translator`] gives ring records' pages their engine addresses and turns engine commands
//! into kernel commands, refusing anything that does not belong to a placed channel.

use wic_engine::{
    pool_page, ChannelId, ChannelLayout, Command, DataSource, EngineConfig, FaultEntry, Fill, GpuId, RawFaultEntry,
    VaWidth, PAGE_SIZE,
};
use wic_kabi::{self as kabi, WicCommand};

/// Why a command or record could not be translated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandError {
    /// An engine address no placed channel covers.
    Unplaced { va: u64 },
    /// Producer data that is not in a host buffer the daemon can read.
    NoHostData { va: u64 },
    /// The batch it was in could not be submitted to the module: it did not run.
    NotSubmitted,
}

impl std::fmt::Display for CommandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unplaced { va } => write!(f, "engine page {va:#x} belongs to no placed channel"),
            Self::NoHostData { va } => write!(f, "no host data for the run at {va:#x}"),
            Self::NotSubmitted => f.write_str("its batch could not be submitted to the module"),
        }
    }
}

impl std::error::Error for CommandError {}

/// Where the host producers' bytes are in the daemon: what a kernel command's `arg` points to.
pub trait HostBytes {
    /// The daemon's address of the `len` bytes `source` names in `channel`'s producer buffer.
    fn data(&self, channel: ChannelId, source: DataSource, len: u64) -> Option<u64>;
    /// The daemon's address of the `pages` head words of `slot` of `channel` (an in-place
    /// publish, [`Fill::Heads`]).
    fn heads(&self, channel: ChannelId, slot: u32, pages: u32) -> Option<u64>;
}

/// A function giving the data's address serves callers with no in-place producers.
impl<F: Fn(ChannelId, DataSource, u64) -> Option<u64>> HostBytes for F {
    fn data(&self, channel: ChannelId, source: DataSource, len: u64) -> Option<u64> {
        self(channel, source, len)
    }

    fn heads(&self, _: ChannelId, _: u32, _: u32) -> Option<u64> {
        None
    }
}

/// Where a channel's pages are in its application: the PCM range, then the PAT range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub space_id: u32,
    pub base: u64,
    pub pcm_bytes: u64,
    pub pat_bytes: u64,
    /// (engine VA, process VA, pages) of every run and PAT page.
    pub runs: Vec<(u64, u64, u32)>,
}

impl Placement {
    /// Places `layout` at `base` in space `space_id`.
    pub fn new(layout: &ChannelLayout, space_id: u32, base: u64) -> Self {
        let run_bytes = u64::from(layout.pages_per_run) * PAGE_SIZE;
        let mut runs = Vec::new();
        let mut at = base;
        for slot in &layout.slots {
            for va in slot.runs {
                runs.push((va, at, layout.pages_per_run));
                at += run_bytes;
            }
        }
        let pcm_bytes = at - base;
        for pat in layout.slots.iter().filter_map(|s| s.pat) {
            for va in pat {
                runs.push((va, at, 1));
                at += PAGE_SIZE;
            }
        }
        Self { space_id, base, pcm_bytes, pat_bytes: at - base - pcm_bytes, runs }
    }

    /// The process address of an engine run start, if this placement has it.
    pub fn process_va(&self, engine_va: u64) -> Option<u64> {
        self.runs.iter().find(|(va, ..)| *va == engine_va).map(|(_, process, _)| *process)
    }
}

/// A `WIC_CMD_COMPLETE_HEADS`: the wake-up of the `pages`-page run at `va` of space `space_id`
/// on GPU `gpu_id`, whose host producer wrote the batch into the run's pages itself, all but
/// the first 8 bytes of each page. The module writes the `pages` 8-byte head words at the
/// daemon's address `heads` (word i at the start of page i, and nothing else), unmaps the
/// `pages` pages at `companion`, maps the run and releases its held faults, as a
/// `WIC_CMD_COMPLETE` with data would after copying the whole batch. Addresses are the
/// process's, as [`Translator::to_kernel`] gives them; `heads` must stay readable until the
/// submission returns.
pub fn complete_heads(space_id: u32, gpu_id: u32, va: u64, pages: u32, companion: u64, heads: u64) -> WicCommand {
    WicCommand {
        opcode: kabi::WIC_CMD_COMPLETE_HEADS,
        space_id,
        gpu_id,
        pages,
        va,
        length: 8 * u64::from(pages),
        arg: heads,
        companion,
        ..WicCommand::default()
    }
}

/// Where a placed page is on the other side (the space matters on the process side), and how
/// many pages of its run start there; 0 pages marks a page no placed run covers. 16 bytes.
#[derive(Debug, Clone, Copy, Default)]
struct PageMapping {
    other_va: u64,
    pages_left: u32,
    space_id: u32,
}

impl PageMapping {
    /// The other side's address of `va`, if `va` and the `pages - 1` pages after it are placed.
    fn translate(&self, va: u64, pages: u32) -> Option<u64> {
        (self.pages_left > 0 && pages <= self.pages_left).then_some(self.other_va + va % PAGE_SIZE)
    }
}

/// A placement's process range, page by page.
#[derive(Debug)]
struct PlacedRange {
    space_id: u32,
    base: u64,
    /// The module's ids of the placement's registered ranges (PCM, then PAT or 0). The module
    /// never reuses an id, so a record of a channel closed since is known by its id even when
    /// a new channel sits at the same place.
    range_ids: [u32; 2],
    /// Engine side of each page of the range.
    pages: Vec<PageMapping>,
}

/// Translates between engine addresses and (space, process address): one table lookup per
/// engine address, and a binary search over placements then one lookup per process address.
#[derive(Debug)]
pub struct Translator {
    /// Address of the engine pool's page 0.
    pool_base: u64,
    /// Process side of each page of the engine's pool.
    pool: Vec<PageMapping>,
    /// Placements sorted by (space, base).
    ranges: Vec<PlacedRange>,
}

impl Translator {
    /// A translator for an engine configured as `config`.
    pub fn new(config: &EngineConfig) -> Self {
        Self {
            pool_base: config.pool_base,
            pool: vec![PageMapping::default(); config.pool_pages as usize],
            ranges: Vec::new(),
        }
    }

    /// Adds a placed channel, registered with the module as the ranges `range_ids` (PCM, then
    /// PAT if any). Runs outside the engine's pool or outside the placement's own range are not
    /// the placement's and are ignored.
    pub fn add(&mut self, placement: &Placement, range_ids: &[u32]) {
        let total_pages = (placement.pcm_bytes + placement.pat_bytes) / PAGE_SIZE;
        let mut ids = [0; 2];
        for (id, &range_id) in ids.iter_mut().zip(range_ids) {
            *id = range_id;
        }
        let mut range = PlacedRange {
            space_id: placement.space_id,
            base: placement.base,
            range_ids: ids,
            pages: vec![PageMapping::default(); total_pages as usize],
        };
        for &(engine_start, process_start, pages) in &placement.runs {
            let last = u64::from(pages.max(1) - 1) * PAGE_SIZE;
            let (Some(first_pool), Some(_)) = (
                pool_page(self.pool_base, engine_start, &self.pool),
                pool_page(self.pool_base, engine_start + last, &self.pool),
            ) else {
                continue;
            };
            let Some(first) = process_start.checked_sub(placement.base).map(|offset| (offset / PAGE_SIZE) as usize)
            else {
                continue;
            };
            let Some(process_pages) = range.pages.get_mut(first..first + pages as usize) else { continue };
            for (i, page) in process_pages.iter_mut().enumerate() {
                let (step, pages_left) = (i as u64 * PAGE_SIZE, pages - i as u32);
                *page = PageMapping { other_va: engine_start + step, pages_left, space_id: 0 };
                self.pool[first_pool + i] =
                    PageMapping { other_va: process_start + step, pages_left, space_id: placement.space_id };
            }
        }
        let at = self.ranges.partition_point(|r| (r.space_id, r.base) < (range.space_id, range.base));
        self.ranges.insert(at, range);
    }

    /// Removes a placed channel.
    pub fn remove(&mut self, placement: &Placement) {
        let key = (placement.space_id, placement.base);
        let Ok(at) = self.ranges.binary_search_by(|r| (r.space_id, r.base).cmp(&key)) else { return };
        for mapping in self.ranges.remove(at).pages.iter().filter(|m| m.pages_left > 0) {
            if let Some(index) = pool_page(self.pool_base, mapping.other_va, &self.pool) {
                self.pool[index] = PageMapping::default();
            }
        }
    }

    #[inline]
    fn to_process(&self, engine_va: u64, pages: u32) -> Result<(u32, u64), CommandError> {
        let mapping =
            pool_page(self.pool_base, engine_va, &self.pool).map(|index| self.pool[index]).unwrap_or_default();
        let process_va = mapping.translate(engine_va, pages).ok_or(CommandError::Unplaced { va: engine_va })?;
        Ok((mapping.space_id, process_va))
    }

    /// The engine's address of the page `entry` of space `space_id` faulted on, recorded for
    /// the module's range `range_id`, or `None` for a page no placed channel has or a range
    /// that is not its placement's (a stale record of a closed channel).
    #[inline]
    pub fn engine_va(&self, space_id: u32, range_id: u32, entry: &RawFaultEntry, width: VaWidth) -> Option<u64> {
        let page = FaultEntry::decode_va(entry, width) & !(PAGE_SIZE - 1);
        let key = (space_id, page);
        let range = &self.ranges[self.ranges.partition_point(|r| (r.space_id, r.base) <= key).checked_sub(1)?];
        if range.space_id != space_id || !range.range_ids.contains(&range_id) {
            return None;
        }
        let index = usize::try_from((page - range.base) / PAGE_SIZE).ok()?;
        range.pages.get(index)?.translate(page, 1)
    }

    /// The kernel command for `command`: a completion is one `WIC_CMD_COMPLETE`, its fill
    /// (data, or with length 0 a marker) on the run, the companion's unmap and the run's map;
    /// with a GPU producer's data, one `WIC_CMD_COMPLETE_COPY` from the producer's address in
    /// the application (its buffer is the channel's source range); with an in-place batch's
    /// head words, one `WIC_CMD_COMPLETE_HEADS`. `host` gives the daemon's address of a host
    /// producer's bytes. `None` for a command the daemon carries out itself
    /// ([`Command::MissedPublish`], [`Command::Expired`]).
    pub fn to_kernel(&self, command: &Command, host: &impl HostBytes) -> Result<Option<WicCommand>, CommandError> {
        let kernel = |opcode, gpu: GpuId, (space_id, va): (u32, u64), pages| WicCommand {
            opcode,
            space_id,
            gpu_id: gpu.into(),
            pages,
            va,
            ..WicCommand::default()
        };
        Ok(Some(match *command {
            Command::Complete { gpu, channel, slot, run_va, companion_va, pages, fill } => {
                let no_data = CommandError::NoHostData { va: run_va };
                let (opcode, length, arg) = match fill {
                    Fill::Data { len, source: DataSource::Gpu { va, .. } } => (kabi::WIC_CMD_COMPLETE_COPY, len, va),
                    Fill::Data { len, source } => {
                        (kabi::WIC_CMD_COMPLETE, len, host.data(channel, source, len).ok_or(no_data)?)
                    }
                    Fill::Marker(marker) => (kabi::WIC_CMD_COMPLETE, 0, marker.word()),
                    Fill::Heads => (
                        kabi::WIC_CMD_COMPLETE_HEADS,
                        8 * u64::from(pages),
                        host.heads(channel, slot, pages).ok_or(no_data)?,
                    ),
                };
                // Data longer than the run is refused here rather than by the module.
                let run = self.to_process(run_va, pages.max(length.div_ceil(PAGE_SIZE) as u32))?;
                let (_, companion) = self.to_process(companion_va, pages)?;
                WicCommand { length, arg, companion, ..kernel(opcode, gpu, run, pages) }
            }
            Command::ServicePat { gpu, va } => kernel(kabi::WIC_CMD_SERVICE_PAT, gpu, self.to_process(va, 1)?, 1),
            Command::RearmPat { gpu, va } => kernel(kabi::WIC_CMD_REARM_PAT, gpu, self.to_process(va, 1)?, 1),
            Command::Replay { gpu } => kernel(kabi::WIC_CMD_REPLAY, gpu, (0, 0), 0),
            Command::MissedPublish { .. } | Command::Expired { .. } => return Ok(None),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wic_engine::fault::AccessType;
    use wic_engine::{ChannelId, ChannelSpec, Engine, EngineConfig, ErrorMarker, Producer, SlotLayout, TagId};

    fn layout() -> ChannelLayout {
        let slot = |runs: [u64; 2], pat| SlotLayout { runs, tag: TagId(0), pat };
        ChannelLayout {
            id: ChannelId(1),
            pages_per_run: 2,
            batch_bytes: 8192,
            slots: vec![
                slot([0x10_0000, 0x10_2000], Some([0x20_0000, 0x20_1000])),
                slot([0x30_0000, 0x30_2000], Some([0x20_2000, 0x20_3000])),
            ],
        }
    }

    /// A read fault at `va`.
    fn fault(va: u64) -> RawFaultEntry {
        FaultEntry::replayable_gpc(va, AccessType::Read, 5, 0x1000, 0, 0).encode()
    }

    #[test]
    fn a_heads_completion_carries_one_word_per_page() {
        let c = complete_heads(7, 1, 0x7000_0000, 3, 0x7000_3000, 0xdead_0000);
        assert_eq!(
            (c.opcode, c.space_id, c.gpu_id, c.va, c.pages, c.length, c.arg, c.companion, c.result, c.reserved),
            (kabi::WIC_CMD_COMPLETE_HEADS, 7, 1, 0x7000_0000, 3, 24, 0xdead_0000, 0x7000_3000, 0, 0)
        );
    }

    #[test]
    fn a_placement_lays_runs_then_pat_pages_from_the_base() {
        let p = Placement::new(&layout(), 7, 0x7000_0000);
        assert_eq!((p.pcm_bytes, p.pat_bytes), (4 * 2 * 4096, 4 * 4096));
        assert_eq!(p.process_va(0x10_2000), Some(0x7000_2000));
        assert_eq!(p.process_va(0x30_0000), Some(0x7000_4000));
        assert_eq!(p.process_va(0x20_3000), Some(0x7000_8000 + 3 * 4096));
        assert_eq!(p.process_va(0x10_1000), None, "only run starts are listed");
    }

    #[test]
    fn a_placement_takes_what_the_spec_says_it_needs() {
        for (producer, message_bytes, slots) in
            [(Producer::Host, 100, 3), (Producer::Gpu { gpu: 1, base_va: 0 }, 5000, 2)]
        {
            let spec = ChannelSpec { consumer_gpu: 0, producer, message_bytes, slots, timeout_ns: 1 };
            let mut engine = Engine::new(EngineConfig::default()).unwrap();
            let layout = engine.open_channel(spec).unwrap();
            let p = Placement::new(&layout, 1, 0x1000_0000);
            assert_eq!(Some(p.pcm_bytes + p.pat_bytes), spec.placement_bytes(engine.config().warps_per_batch));
        }
        let host = |message_bytes, slots| ChannelSpec {
            consumer_gpu: 0,
            producer: Producer::Host,
            message_bytes,
            slots,
            timeout_ns: 1,
        };
        assert_eq!(host(0, 1).placement_bytes(16), None, "no message byte");
        assert_eq!(host(64, 0).placement_bytes(16), None, "no slot");
        // 2^24 pages per run: 2^27 slots would need 2^64 bytes.
        assert_eq!(host(u32::MAX, 1 << 27).placement_bytes(16), None, "past 64 bits");
        assert_eq!(host(u32::MAX, (1 << 27) - 1).placement_bytes(16), Some(((1 << 27) - 1) * (2 << 24) * PAGE_SIZE));
    }

    #[test]
    fn commands_translate_page_by_page_and_stay_inside_their_run() {
        let mut t = Translator::new(&EngineConfig {
            pool_base: 0x10_0000,
            pool_pages: 0x30_0000 / 4096,
            ..EngineConfig::default()
        });
        t.add(&Placement::new(&layout(), 7, 0x7000_0000), &[1, 2]);
        let host = |channel, _: DataSource, _: u64| (channel == ChannelId(3)).then_some(0xdead_0000);
        let data = |len| Fill::Data { len, source: DataSource::Host { offset: 0 } };
        let complete = |run_va, companion_va, fill| Command::Complete {
            gpu: 1,
            channel: ChannelId(3),
            slot: 0,
            run_va,
            companion_va,
            pages: 2,
            fill,
        };
        let commands = [
            complete(0x30_2000, 0x30_0000, data(5000)),
            complete(0x10_0000, 0x10_2000, Fill::Marker(ErrorMarker::Timeout)),
            // A GPU producer's bytes stay at the application's address: the module copies them.
            complete(
                0x10_2000,
                0x10_0000,
                Fill::Data { len: 4100, source: DataSource::Gpu { gpu: 2, va: 0x5000_0123 } },
            ),
            Command::ServicePat { gpu: 1, va: 0x20_3000 },
            Command::Replay { gpu: 1 },
        ];
        let fields: Vec<_> = commands
            .iter()
            .map(|command| t.to_kernel(command, &host).unwrap().unwrap())
            .map(|c| (c.opcode, c.space_id, c.gpu_id, c.va, c.pages, c.length, c.arg, c.companion))
            .collect();
        let marker = ErrorMarker::Timeout.word();
        assert_eq!(
            fields,
            [
                (kabi::WIC_CMD_COMPLETE, 7, 1, 0x7000_6000, 2, 5000, 0xdead_0000, 0x7000_4000),
                (kabi::WIC_CMD_COMPLETE, 7, 1, 0x7000_0000, 2, 0, marker, 0x7000_2000),
                (kabi::WIC_CMD_COMPLETE_COPY, 7, 1, 0x7000_2000, 2, 4100, 0x5000_0123, 0x7000_0000),
                (kabi::WIC_CMD_SERVICE_PAT, 7, 1, 0x7000_8000 + 3 * 4096, 1, 0, 0, 0),
                (kabi::WIC_CMD_REPLAY, 0, 1, 0, 0, 0, 0, 0),
            ]
        );
        // Past the end of a run, or nowhere: refused.
        let refused = [
            (complete(0x10_0000, 0x10_2000, data(3 * 4096)), CommandError::Unplaced { va: 0x10_0000 }),
            (complete(0x10_0000, 0x50_0000, data(1)), CommandError::Unplaced { va: 0x50_0000 }),
            (Command::RearmPat { gpu: 1, va: 0x50_0000 }, CommandError::Unplaced { va: 0x50_0000 }),
        ];
        for (command, error) in refused {
            assert_eq!(t.to_kernel(&command, &host), Err(error));
        }
        let no_data = t.to_kernel(&complete(0x10_0000, 0x10_2000, data(1)), &|_, _, _| None);
        assert_eq!(no_data, Err(CommandError::NoHostData { va: 0x10_0000 }));

        // An in-place batch: its slot's head words, one per page, from where the daemon has them.
        struct Heads;
        impl HostBytes for Heads {
            fn data(&self, _: ChannelId, _: DataSource, _: u64) -> Option<u64> {
                None
            }
            fn heads(&self, channel: ChannelId, slot: u32, pages: u32) -> Option<u64> {
                (channel == ChannelId(3) && pages == 2).then_some(0xbeef_0000 + u64::from(slot))
            }
        }
        let heads = t.to_kernel(&complete(0x30_2000, 0x30_0000, Fill::Heads), &Heads).unwrap().unwrap();
        assert_eq!(
            heads,
            complete_heads(7, 1, 0x7000_6000, 2, 0x7000_4000, 0xbeef_0000),
            "the same command as complete_heads() builds"
        );
        let unheaded = t.to_kernel(&complete(0x30_2000, 0x30_0000, Fill::Heads), &host);
        assert_eq!(unheaded, Err(CommandError::NoHostData { va: 0x30_2000 }));
        // What the daemon tells its producers itself has no kernel command.
        let missed = Command::MissedPublish { channel: ChannelId(3), slot: 0 };
        assert_eq!(t.to_kernel(&missed, &host), Ok(None));
    }

    #[test]
    fn records_map_to_engine_addresses_and_strangers_are_dropped() {
        let mut t = Translator::new(&EngineConfig {
            pool_base: 0x10_0000,
            pool_pages: 0x30_0000 / 4096,
            ..EngineConfig::default()
        });
        let placement = Placement::new(&layout(), 7, 0x7000_0000);
        t.add(&placement, &[1, 2]);
        let width = VaWidth::Bits57;
        assert_eq!(t.engine_va(7, 1, &fault(0x7000_5123), width), Some(0x30_1000));
        assert_eq!(t.engine_va(8, 1, &fault(0x7000_5000), width), None, "another space");
        assert_eq!(t.engine_va(7, 1, &fault(0x6fff_f000), width), None, "below the placement");
        assert_eq!(t.engine_va(7, 3, &fault(0x7000_5000), width), None, "another range");
        t.remove(&placement);
        assert_eq!(t.engine_va(7, 1, &fault(0x7000_0000), width), None, "removed");
        // A channel placed again at the same place registers new ranges: an unread record of
        // the closed one is not the new channel's.
        t.add(&placement, &[3, 4]);
        assert_eq!(t.engine_va(7, 1, &fault(0x7000_5000), width), None, "the closed channel's record");
        assert_eq!(t.engine_va(7, 3, &fault(0x7000_5000), width), Some(0x30_1000));
    }

    #[test]
    fn a_removed_channels_runs_make_room_for_the_next_without_crossing_over() {
        let mut t = Translator::new(&EngineConfig {
            pool_base: 0x10_0000,
            pool_pages: 0x30_0000 / 4096,
            ..EngineConfig::default()
        });
        let (first, second) = (Placement::new(&layout(), 7, 0x7000_0000), Placement::new(&layout(), 8, 0x9000_0000));
        t.add(&first, &[1, 2]);
        t.remove(&first);
        t.add(&second, &[3, 4]);
        let host = |_: ChannelId, _: DataSource, _: u64| None;
        let complete = Command::Complete {
            gpu: 1,
            channel: ChannelId(0),
            slot: 1,
            run_va: 0x30_2000,
            companion_va: 0x30_0000,
            pages: 2,
            fill: Fill::Marker(ErrorMarker::Timeout),
        };
        let kernel = t.to_kernel(&complete, &host).unwrap().unwrap();
        assert_eq!((kernel.space_id, kernel.va), (8, 0x9000_6000), "the engine run now belongs to the second channel");
        assert_eq!(t.engine_va(7, 1, &fault(0x7000_6000), VaWidth::Bits57), None, "the first channel is gone");
        assert_eq!(
            t.engine_va(8, 4, &fault(0x9000_8000), VaWidth::Bits57),
            Some(0x20_0000),
            "a PAT page of the second channel"
        );
    }
}
