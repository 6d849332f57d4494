//! The engine: the registry of channels and slots tying the Interrupter, the Monitor and the
//! Activator together, paper section 5.6.
//!
//! A channel has `slots` request slots; a slot serves one batch of warps (16 by default) and owns
//! two PCM runs, P and P', used in alternate generations, one tag (its DAB bit) and, for a GPU
//! producer, two PAT pages likewise alternating. Generation `g` of a slot faults on run `g % 2`;
//! waking it unmaps run `(g + 1) % 2`, so generation `g + 1` faults again. Any fault on the run
//! of the other parity is a stale packet from before the last wake-up and is dropped.
//!
//! Every page of the pool is classified by a flat table, so classifying a fault costs the same
//! whether 1K or 1M pages are registered.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::activator::{Activator, Command, DataSource, ErrorMarker, Wake};
use crate::fault::{FaultEntry, RawFaultEntry, VaWidth};
use crate::histogram::Histogram;
use crate::interrupter::{PagePool, PageRun, PoolError, TagAllocator, TagError, TagId};
use crate::monitor::{Dab, Enqueued, Pfq, PfqError};
use crate::prefetch::prefetch;
use crate::{pages_for_batch, ChannelSpec, GpuId, Nanos, Producer, PAGE_SIZE};

/// Fault entries whose state is prefetched together, a pipeline stage ahead of their handling:
/// enough misses in flight to cover memory latency, few enough that the lines are still cached
/// when they are used.
const LOOKAHEAD: usize = 16;

/// Engine-wide settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Virtual address of page 0 of the PCM/PAT pool (page aligned).
    pub pool_base: u64,
    /// Pages in the pool (paper: 16K pages, 64 MiB of 4 KiB pages).
    pub pool_pages: u32,
    /// Virtual-address width of the GPUs' fault entries.
    pub va_width: VaWidth,
    /// Warps served by one slot (paper: 16).
    pub warps_per_batch: u32,
    /// Slots over all channels; also the number of tags in the DAB.
    pub max_slots: u32,
}

impl EngineConfig {
    /// Address of pool page `page`.
    #[inline]
    pub fn page_va(&self, page: u32) -> u64 {
        self.pool_base + u64::from(page) * PAGE_SIZE
    }
}

/// Index of the page holding `va` in `table`, which has an entry per page of the pool that
/// starts at `pool_base`; `None` outside the pool. Bounded by the table's length, so indexing
/// the table with it is not checked again.
#[inline]
pub fn pool_page<T>(pool_base: u64, va: u64, table: &[T]) -> Option<usize> {
    let page = usize::try_from(va.checked_sub(pool_base)? / PAGE_SIZE).ok()?;
    (page < table.len()).then_some(page)
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            pool_base: 0x7f00_0000_0000,
            pool_pages: 16 * 1024,
            va_width: VaWidth::Bits57,
            warps_per_batch: 16,
            max_slots: 4096,
        }
    }
}

/// Identifies an open channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelId(pub u32);

/// Where one slot's pages are, as the device side needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotLayout {
    /// Runs P and P': generation `g` reads run `g % 2`.
    pub runs: [u64; 2],
    /// The slot's availability tag.
    pub tag: TagId,
    /// PAT pages for a GPU producer: generation `g` writes page `g % 2`.
    pub pat: Option<[u64; 2]>,
}

/// The device handle of a channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelLayout {
    pub id: ChannelId,
    pub pages_per_run: u32,
    /// Bytes of producer data per slot: warps per batch x message bytes.
    pub batch_bytes: u64,
    pub slots: Vec<SlotLayout>,
}

/// Why an engine call was refused. Nothing changed when one is returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// The configuration or a channel spec is unusable.
    Invalid(&'static str),
    Pool(PoolError),
    Tags(TagError),
    /// Every slot of the engine is in use.
    SlotsExhausted {
        requested: u32,
        free: u32,
    },
    UnknownChannel(ChannelId),
    SlotOutOfRange {
        channel: ChannelId,
        slot: u32,
        slots: u32,
    },
    /// [`Engine::publish`] on a channel whose producer is a GPU.
    NotHostProducer(ChannelId),
    /// The slot's data is already available and not consumed yet.
    AlreadyPublished {
        channel: ChannelId,
        slot: u32,
    },
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Invalid(why) => write!(f, "invalid request: {why}"),
            Self::Pool(e) => e.fmt(f),
            Self::Tags(e) => e.fmt(f),
            Self::SlotsExhausted { requested, free } => {
                write!(f, "{requested} slots requested but only {free} are free")
            }
            Self::UnknownChannel(id) => write!(f, "no channel {}", id.0),
            Self::SlotOutOfRange { channel, slot, slots } => {
                write!(f, "slot {slot} out of range for channel {} ({slots} slots)", channel.0)
            }
            Self::NotHostProducer(id) => {
                write!(f, "channel {} has a GPU producer: it publishes through PAT faults", id.0)
            }
            Self::AlreadyPublished { channel, slot } => {
                write!(f, "channel {} slot {slot} is already published and not consumed yet", channel.0)
            }
        }
    }
}

impl std::error::Error for EngineError {}

impl From<PoolError> for EngineError {
    fn from(e: PoolError) -> Self {
        Self::Pool(e)
    }
}

impl From<TagError> for EngineError {
    fn from(e: TagError) -> Self {
        Self::Tags(e)
    }
}

/// Counters, all monotonic except the gauges noted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub batches: u64,
    pub largest_batch: u32,
    /// Every entry handed to the engine.
    pub entries: u64,
    /// Entries without VALID or with a fatal fault type: never WIC's to hold.
    pub malformed: u64,
    /// Entries outside the pool or on a free page of it.
    pub foreign: u64,
    /// PCM or PAT entries raised by a GPU that is not the slot's consumer or producer.
    pub wrong_gpu: u64,
    /// New requests: first fault of a slot generation.
    pub requests: u64,
    /// Requests whose data was not there yet, so the fault was held.
    pub held: u64,
    /// Refaults of a request already held.
    pub duplicates: u64,
    /// Faults on the run of the other parity (raised before the last wake-up).
    pub stale: u64,
    /// PAT faults that published a tag.
    pub pat_publishes: u64,
    /// PAT faults on a tag already available.
    pub pat_duplicates: u64,
    /// Host publishes, in place ones included.
    pub host_publishes: u64,
    /// Host publishes whose producer wrote the run in place.
    pub in_place_publishes: u64,
    /// In-place publishes that missed their generation: it had ended (timed out, expired in
    /// the backend) or was on the other run when they came, so they were dropped.
    pub in_place_missed: u64,
    /// DAB bits set.
    pub dab_updates: u64,
    pub delivered: u64,
    /// Requests completed with the timeout marker, by the engine's deadline or the backend's
    /// own bound ([`Engine::expired_elsewhere`]).
    pub timed_out: u64,
    /// Holds the backend ended itself ([`Engine::expired_elsewhere`]), counted whether or not
    /// a slot moved on: each means a warp stalled for the module's whole bound.
    pub expired_elsewhere: u64,
    /// Held faults completed because their channel closed.
    pub closed_while_held: u64,
    /// Request-to-delivery time of every delivered request, 0 for one whose data was already
    /// available; its sum and max replace the former wait totals. Timeouts are not recorded.
    pub wake_latency_ns: Histogram,
    /// Entries per [`Engine::handle_faults`] call, to see how well the fault buffer batches.
    pub batch_sizes: Histogram,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PageUse {
    Free,
    Pcm { slot: u32, side: u8 },
    Pat { slot: u32, side: u8 },
}

/// [`SlotState::held_since`] of a slot whose request is not waiting.
const NOT_HELD: Nanos = Nanos::MAX;

/// What a fault reads and writes of its request slot: 32 bytes, two slots to a cache line, so
/// that with a million registered pages the slots a fault may touch still fit in the caches.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct SlotState {
    /// When the current generation's request arrived while it waits in the PFQ, else
    /// [`NOT_HELD`].
    held_since: Nanos,
    generation: u64,
    timeout: Nanos,
    tag: TagId,
    consumer_gpu: GpuId,
    /// The GPU whose writes to the PAT pages publish; a host-produced slot has no PAT pages,
    /// so for it the field is never read.
    producer_gpu: GpuId,
}

const _: () = assert!(std::mem::size_of::<SlotState>() == 32);

/// What only a wake-up reads of its slot: whose slot it is, where the data goes and where it
/// comes from.
struct SlotRoute {
    channel: ChannelId,
    /// The slot's index in its channel.
    index: u32,
    runs: [PageRun; 2],
    pat: Option<[u32; 2]>,
    source: DataSource,
    /// Bytes delivered per generation.
    len: u64,
    /// The publish waiting in the DAB was made in place: its wake-up writes the head words only.
    in_place: bool,
}

struct Channel {
    spec: ChannelSpec,
    slot_ids: Vec<u32>,
    runs: Vec<PageRun>,
}

/// The sans-IO WIC engine.
pub struct Engine {
    config: EngineConfig,
    pool: PagePool,
    tags: TagAllocator,
    dab: Dab,
    pfq: Pfq,
    pages: Vec<PageUse>,
    /// Per slot id; meaningful while the slot is live, which its route says.
    slots: Vec<SlotState>,
    routes: Vec<Option<SlotRoute>>,
    free_slots: Vec<u32>,
    channels: Vec<Option<Channel>>,
    /// (deadline, slot id, generation) of every hold, and of delivered holds until they reach
    /// the top or the heap is compacted; at most twice `max_slots` entries.
    deadlines: BinaryHeap<Reverse<(Nanos, u32, u64)>>,
    activator: Activator,
    woken: Vec<u32>,
    /// Channels a GPU the backend cannot hold faults of read without their data, not yet
    /// taken ([`Engine::take_unservable`]).
    unservable: Vec<ChannelId>,
    stats: EngineStats,
}

impl Engine {
    /// An engine with an empty pool.
    pub fn new(config: EngineConfig) -> Result<Self, EngineError> {
        // A mask, not `is_multiple_of` (Rust 1.87, past the workspace's 1.82): PAGE_SIZE is a power of two.
        if config.pool_base & (PAGE_SIZE - 1) != 0 {
            return Err(EngineError::Invalid("pool base is not page aligned"));
        }
        if config.warps_per_batch == 0 || config.max_slots == 0 {
            return Err(EngineError::Invalid("warps per batch and max slots must be positive"));
        }
        let pool_end = u64::from(config.pool_pages) * PAGE_SIZE;
        if config.pool_base.checked_add(pool_end).is_none() {
            return Err(EngineError::Invalid("pool does not fit in the address space"));
        }
        Ok(Self {
            pool: PagePool::new(config.pool_pages)?,
            tags: TagAllocator::new(config.max_slots),
            dab: Dab::new(config.max_slots),
            pfq: Pfq::new(config.max_slots, config.max_slots),
            pages: vec![PageUse::Free; config.pool_pages as usize],
            slots: vec![
                SlotState {
                    held_since: NOT_HELD,
                    generation: 0,
                    timeout: 0,
                    tag: TagId(0),
                    consumer_gpu: 0,
                    producer_gpu: 0
                };
                config.max_slots as usize
            ],
            routes: (0..config.max_slots).map(|_| None).collect(),
            free_slots: (0..config.max_slots).rev().collect(),
            channels: Vec::new(),
            deadlines: BinaryHeap::with_capacity(2 * config.max_slots as usize),
            activator: Activator::default(),
            woken: Vec::new(),
            unservable: Vec::new(),
            stats: EngineStats::default(),
            config,
        })
    }

    /// The configuration the engine runs with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The counters.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// The PCM/PAT page pool (free pages, longest free run).
    pub fn pool(&self) -> &PagePool {
        &self.pool
    }

    /// Requests waiting for data (PFQ depth).
    pub fn held(&self) -> u32 {
        self.pfq.depth()
    }

    /// Open channels.
    pub fn channel_count(&self) -> usize {
        self.channels.iter().flatten().count()
    }

    /// Tags whose data is available and not consumed.
    pub fn available_tags(&self) -> usize {
        self.dab.count_set()
    }

    /// Whether `va` is on a PCM or PAT page of an open channel.
    pub fn owns(&self, va: u64) -> bool {
        pool_page(self.config.pool_base, va, &self.pages).is_some_and(|page| self.pages[page] != PageUse::Free)
    }

    /// Opens a channel: allocates its runs, PAT pages and tags. On any error nothing is kept; a
    /// channel the pool cannot hold is refused with the runs the whole channel takes and the pool
    /// as it was before the attempt.
    pub fn open_channel(&mut self, spec: ChannelSpec) -> Result<ChannelLayout, EngineError> {
        if spec.slots == 0 || spec.message_bytes == 0 {
            return Err(EngineError::Invalid("a channel needs at least one slot and one byte per message"));
        }
        let batch_bytes = u64::from(self.config.warps_per_batch) * u64::from(spec.message_bytes);
        if let Producer::Gpu { gpu, base_va } = spec.producer {
            if gpu == spec.consumer_gpu {
                // A held fault blocks timeslicing of the consumer's channel: a producer in
                // another context on the same GPU could never run (driver notes, section 1).
                return Err(EngineError::Invalid("producer and consumer on the same GPU can deadlock under a hold"));
            }
            // Every slot's source address is computed from here on without a check.
            if u64::from(spec.slots).checked_mul(batch_bytes).and_then(|bytes| base_va.checked_add(bytes)).is_none() {
                return Err(EngineError::Invalid("the producer's buffer runs past the end of the address space"));
            }
        }
        let free = self.free_slots.len() as u32;
        if spec.slots > free {
            return Err(EngineError::SlotsExhausted { requested: spec.slots, free });
        }
        let pages_per_run = pages_for_batch(self.config.warps_per_batch, spec.message_bytes, PAGE_SIZE as u32);
        // The pool as it was before this channel took anything, for the refusal below.
        let (longest_free, free_pages) = (self.pool.longest_free_run(), self.pool.free_pages());
        let mut runs = Vec::new();
        let mut tags = Vec::new();
        let allocated = self.allocate_channel(&spec, pages_per_run, &mut runs, &mut tags);
        if let Err(e) = allocated {
            for run in runs {
                self.pool.free(run).expect("run allocated just now");
            }
            for tag in tags {
                self.tags.free(tag).expect("tag allocated just now");
            }
            debug_assert_eq!((self.pool.longest_free_run(), self.pool.free_pages()), (longest_free, free_pages));
            return Err(match e {
                // The run that failed was asked of a pool this channel had already partly taken:
                // the refusal names every run of the channel, which need not lie next to each
                // other, and the pool as the request found it.
                EngineError::Pool(PoolError::Exhausted { .. }) => EngineError::Pool(PoolError::Exhausted {
                    runs: 2 * spec.slots,
                    pages_per_run,
                    pat_pages: if matches!(spec.producer, Producer::Gpu { .. }) { 2 * spec.slots } else { 0 },
                    longest_free,
                    free: free_pages,
                }),
                e => e,
            });
        }
        let id = self.insert_channel(spec, runs.clone());
        let mut layout = ChannelLayout { id, pages_per_run, batch_bytes, slots: Vec::new() };
        for (index, tag) in tags.into_iter().enumerate() {
            let slot_id = self.free_slots.pop().expect("slot count checked above");
            let pcm = [runs[2 * index], runs[2 * index + 1]];
            let pat = match spec.producer {
                Producer::Host => None,
                Producer::Gpu { .. } => {
                    let pat_run = runs[2 * spec.slots as usize];
                    Some([pat_run.start + 2 * index as u32, pat_run.start + 2 * index as u32 + 1])
                }
            };
            let offset = index as u64 * batch_bytes;
            let (source, producer_gpu) = match spec.producer {
                Producer::Host => (DataSource::Host { offset }, None),
                Producer::Gpu { gpu, base_va } => (DataSource::Gpu { gpu, va: base_va + offset }, Some(gpu)),
            };
            for (side, run) in pcm.iter().enumerate() {
                for page in run.start..run.end() {
                    self.pages[page as usize] = PageUse::Pcm { slot: slot_id, side: side as u8 };
                }
            }
            if let Some(pat) = pat {
                for (side, page) in pat.iter().enumerate() {
                    self.pages[*page as usize] = PageUse::Pat { slot: slot_id, side: side as u8 };
                }
            }
            layout.slots.push(SlotLayout {
                runs: [self.config.page_va(pcm[0].start), self.config.page_va(pcm[1].start)],
                tag,
                pat: pat.map(|p| [self.config.page_va(p[0]), self.config.page_va(p[1])]),
            });
            self.slots[slot_id as usize] = SlotState {
                held_since: NOT_HELD,
                generation: 0,
                timeout: spec.timeout_ns,
                tag,
                consumer_gpu: spec.consumer_gpu,
                producer_gpu: producer_gpu.unwrap_or(spec.consumer_gpu),
            };
            self.routes[slot_id as usize] = Some(SlotRoute {
                channel: id,
                index: index as u32,
                runs: pcm,
                pat,
                source,
                len: batch_bytes,
                in_place: false,
            });
            self.channel_mut(id).expect("inserted above").slot_ids.push(slot_id);
        }
        Ok(layout)
    }

    /// Allocates P and P' for every slot, then one run holding two PAT pages per slot, then
    /// the tags; pushes what it got so the caller can roll back.
    fn allocate_channel(
        &mut self,
        spec: &ChannelSpec,
        pages_per_run: u32,
        runs: &mut Vec<PageRun>,
        tags: &mut Vec<TagId>,
    ) -> Result<(), EngineError> {
        for _ in 0..2 * spec.slots {
            runs.push(self.pool.alloc(pages_per_run)?);
        }
        if matches!(spec.producer, Producer::Gpu { .. }) {
            runs.push(self.pool.alloc(2 * spec.slots)?);
        }
        for _ in 0..spec.slots {
            tags.push(self.tags.alloc()?);
        }
        Ok(())
    }

    fn insert_channel(&mut self, spec: ChannelSpec, runs: Vec<PageRun>) -> ChannelId {
        let channel = Channel { spec, slot_ids: Vec::with_capacity(spec.slots as usize), runs };
        match self.channels.iter().position(Option::is_none) {
            Some(free) => {
                self.channels[free] = Some(channel);
                ChannelId(free as u32)
            }
            None => {
                self.channels.push(Some(channel));
                ChannelId(self.channels.len() as u32 - 1)
            }
        }
    }

    fn channel(&self, id: ChannelId) -> Result<&Channel, EngineError> {
        self.channels.get(id.0 as usize).and_then(Option::as_ref).ok_or(EngineError::UnknownChannel(id))
    }

    fn channel_mut(&mut self, id: ChannelId) -> Result<&mut Channel, EngineError> {
        self.channels.get_mut(id.0 as usize).and_then(Option::as_mut).ok_or(EngineError::UnknownChannel(id))
    }

    /// The spec a channel was opened with.
    pub fn channel_spec(&self, id: ChannelId) -> Result<ChannelSpec, EngineError> {
        Ok(self.channel(id)?.spec)
    }

    /// Closes a channel: held requests are completed with [`ErrorMarker::ChannelClosed`], its
    /// pages and tags go back to the pool.
    pub fn close_channel(&mut self, id: ChannelId, out: &mut Vec<Command>) -> Result<(), EngineError> {
        self.close_with(id, ErrorMarker::ChannelClosed, out)
    }

    /// Closes every channel, completing held requests with [`ErrorMarker::DaemonStopping`].
    pub fn shutdown(&mut self, out: &mut Vec<Command>) {
        for id in 0..self.channels.len() as u32 {
            // Ids of closed channels are simply skipped.
            let _ = self.close_with(ChannelId(id), ErrorMarker::DaemonStopping, out);
        }
    }

    fn close_with(&mut self, id: ChannelId, marker: ErrorMarker, out: &mut Vec<Command>) -> Result<(), EngineError> {
        let channel =
            self.channels.get_mut(id.0 as usize).and_then(Option::take).ok_or(EngineError::UnknownChannel(id))?;
        self.release(channel, marker, out);
        Ok(())
    }

    /// Fails a channel: as [`Engine::close_channel`] (its held requests completed with the
    /// closed marker, its slots and pages freed), but its id stays taken, by a channel with no
    /// slot, until `close_channel`: whoever keeps the id (the daemon's registry, its grants)
    /// must not reach another channel that reuses it.
    pub fn fail_channel(&mut self, id: ChannelId, out: &mut Vec<Command>) -> Result<(), EngineError> {
        let channel = self.channel_mut(id)?;
        let emptied = Channel {
            spec: channel.spec,
            slot_ids: std::mem::take(&mut channel.slot_ids),
            runs: std::mem::take(&mut channel.runs),
        };
        self.release(emptied, ErrorMarker::ChannelClosed, out);
        Ok(())
    }

    /// Completes `channel`'s held requests with `marker` and frees its slots and pages.
    fn release(&mut self, channel: Channel, marker: ErrorMarker, out: &mut Vec<Command>) {
        for slot_id in channel.slot_ids {
            let route = self.routes[slot_id as usize].take().expect("channel slots are live");
            let slot = self.slots[slot_id as usize];
            if self.pfq.remove(slot_id) {
                self.stats.closed_while_held += 1;
                self.activator.fail(wake_of(&slot, &route, &self.config), marker, out);
            }
            self.dab.clear(slot.tag);
            self.tags.free(slot.tag).expect("slot tags are allocated");
            self.free_slots.push(slot_id);
        }
        for run in channel.runs {
            self.pages[run.start as usize..run.end() as usize].fill(PageUse::Free);
            self.pool.free(run).expect("channel runs are allocated");
        }
        self.activator.flush_replays(out);
    }

    /// Feeds one batch of raw fault-buffer entries fetched from `gpu`.
    pub fn handle_faults(&mut self, now: Nanos, gpu: GpuId, entries: &[RawFaultEntry], out: &mut Vec<Command>) {
        self.stats.batches += 1;
        self.stats.largest_batch = self.stats.largest_batch.max(entries.len() as u32);
        self.stats.batch_sizes.record(entries.len() as u64);
        // A four-stage prefetch pipeline over chunks of entries: while chunk k is handled, the
        // tag-indexed state of chunk k + 1 is on its way, the slots of chunk k + 2 and the page
        // map of chunk k + 3, so every miss has a whole chunk's handling to complete. With a
        // million registered pages that state is far out of cache, and handling entries one
        // by one would take its misses one at a time. The stages' lookups are kept, so an
        // entry is classified once.
        let chunk = |k: usize| {
            let rest = entries.get(k * LOOKAHEAD..).unwrap_or_default();
            &rest[..rest.len().min(LOOKAHEAD)]
        };
        let (mut pages, mut uses) = ([[None; LOOKAHEAD]; 2], [[PageUse::Free; LOOKAHEAD]; 3]);
        for k in 0..2 {
            self.prefetch_page_map(chunk(k), &mut pages[k]);
            self.prefetch_slots(&pages[k], &mut uses[k]);
        }
        self.prefetch_page_map(chunk(2), &mut pages[0]);
        self.prefetch_tag_state(&uses[0]);
        for k in 0..entries.len().div_ceil(LOOKAHEAD) {
            self.prefetch_slots(&pages[k % 2], &mut uses[(k + 2) % 3]);
            self.prefetch_page_map(chunk(k + 3), &mut pages[(k + 1) % 2]);
            self.prefetch_tag_state(&uses[(k + 1) % 3]);
            for (raw, &page_use) in chunk(k).iter().zip(&uses[k % 3]) {
                self.handle_fault(now, gpu, raw, page_use, out);
            }
        }
        self.activator.flush_replays(out);
    }

    /// Pipeline stage 1: the pool pages `chunk` faults on, into `pages`; their page-map entries
    /// are prefetched.
    fn prefetch_page_map(&self, chunk: &[RawFaultEntry], pages: &mut [Option<usize>; LOOKAHEAD]) {
        for (i, page) in pages.iter_mut().enumerate() {
            *page = chunk.get(i).and_then(|raw| {
                pool_page(self.config.pool_base, FaultEntry::decode_va(raw, self.config.va_width), &self.pages)
            });
            if let Some(page) = *page {
                prefetch(&self.pages[page]);
            }
        }
    }

    /// Pipeline stage 2: what `pages` are used for, into `uses` (outside the pool counts as
    /// free); the slots owning them are prefetched.
    fn prefetch_slots(&self, pages: &[Option<usize>; LOOKAHEAD], uses: &mut [PageUse; LOOKAHEAD]) {
        for (page, page_use) in pages.iter().zip(uses.iter_mut()) {
            *page_use = page.map_or(PageUse::Free, |page| self.pages[page]);
            if let PageUse::Pcm { slot, .. } | PageUse::Pat { slot, .. } = *page_use {
                prefetch(&self.slots[slot as usize]);
            }
        }
    }

    /// Pipeline stage 3: the PFQ and DAB entries of the slots of `uses` are prefetched.
    fn prefetch_tag_state(&self, uses: &[PageUse; LOOKAHEAD]) {
        for page_use in uses {
            if let PageUse::Pcm { slot: id, .. } | PageUse::Pat { slot: id, .. } = *page_use {
                let tag = self.slots[id as usize].tag;
                self.pfq.prefetch(id, tag);
                self.dab.prefetch(tag);
            }
        }
    }

    /// Handles one entry, whose page the pipeline found to be used as `page_use`.
    fn handle_fault(&mut self, now: Nanos, gpu: GpuId, raw: &RawFaultEntry, page_use: PageUse, out: &mut Vec<Command>) {
        self.stats.entries += 1;
        let entry = FaultEntry::decode(raw, self.config.va_width);
        if !entry.valid || entry.fault_type.is_fatal() {
            self.stats.malformed += 1;
            return;
        }
        match page_use {
            PageUse::Free => self.stats.foreign += 1,
            PageUse::Pcm { slot, side } => self.on_pcm_fault(now, gpu, slot, side, out),
            PageUse::Pat { slot, side } => self.on_pat_fault(now, gpu, slot, side, entry.page(), out),
        }
    }

    fn on_pcm_fault(&mut self, now: Nanos, gpu: GpuId, slot_id: u32, side: u8, out: &mut Vec<Command>) {
        let slot = &mut self.slots[slot_id as usize];
        if gpu != slot.consumer_gpu {
            self.stats.wrong_gpu += 1;
            return;
        }
        if u64::from(side) != slot.generation % 2 {
            self.stats.stale += 1;
            return;
        }
        if slot.held_since != NOT_HELD {
            self.stats.duplicates += 1;
            return;
        }
        self.stats.requests += 1;
        let tag = slot.tag;
        match self.pfq.enqueue(slot_id, &[tag], &self.dab) {
            Ok(Enqueued::Ready) => self.deliver(now, slot_id, out),
            Ok(Enqueued::Pending(_)) => {
                self.stats.held += 1;
                // A request arriving at the very end of time still counts as held.
                slot.held_since = now.min(NOT_HELD - 1);
                let deadline = slot.held_since.saturating_add(slot.timeout);
                let generation = slot.generation;
                // Delivered holds leave their entries behind; once they are half the heap,
                // dropping them keeps it within the capacity reserved at start.
                if self.deadlines.len() >= 2 * self.config.max_slots as usize {
                    let (slots, routes) = (&self.slots, &self.routes);
                    self.deadlines.retain(|&Reverse(entry)| ends_current_hold(slots, routes, entry));
                }
                self.deadlines.push(Reverse((deadline, slot_id, generation)));
            }
            Err(PfqError::AlreadyQueued(_)) => self.stats.duplicates += 1,
            Err(e) => unreachable!("slot ids and tags are in range: {e}"),
        }
    }

    fn on_pat_fault(&mut self, now: Nanos, gpu: GpuId, slot_id: u32, side: u8, va: u64, out: &mut Vec<Command>) {
        let slot = &self.slots[slot_id as usize];
        if slot.producer_gpu != gpu {
            self.stats.wrong_gpu += 1;
            return;
        }
        // The producer's write must complete whatever we make of it, or its warp hangs.
        self.activator.release_pat(gpu, va, out);
        if u64::from(side) != slot.generation % 2 {
            self.stats.stale += 1;
            return;
        }
        if self.make_available(now, slot_id, out) {
            self.stats.pat_publishes += 1;
        } else {
            self.stats.pat_duplicates += 1;
        }
    }

    /// A host producer's data for `slot` of `channel` is in the shared buffer.
    pub fn publish(
        &mut self,
        now: Nanos,
        channel: ChannelId,
        slot: u32,
        out: &mut Vec<Command>,
    ) -> Result<(), EngineError> {
        let slot_id = self.host_slot(channel, slot)?;
        if !self.make_available(now, slot_id, out) {
            return Err(EngineError::AlreadyPublished { channel, slot });
        }
        self.stats.host_publishes += 1;
        self.activator.flush_replays(out);
        Ok(())
    }

    /// A host producer wrote `slot`'s run `side` in place, all but the first 8 bytes of each
    /// page, which it left in the shared buffer's head words: the wake-up writes those alone
    /// ([`Fill::Heads`]) and maps the run.
    ///
    /// Why the heads are not the producer's to write: a generation can end while its producer
    /// is still writing (the timeout, the backend's own bound, a close), and its wake-up then
    /// writes an error marker at the start of each page and maps the run. Stores the producer
    /// makes after that land in pages the consumers read, but never on a marker, so a consumer
    /// reads either its marker or, once the wake-up wrote the heads, the whole batch.
    ///
    /// A publish for the run the current generation does not read came too late: its
    /// generation ended, and the run it wrote may be mapped with a marker. It is dropped with a
    /// [`Command::MissedPublish`], so the producer learns it and writes the other run. One that
    /// matches waits in the DAB like a buffer publish; should the generation end before it is
    /// delivered (only the backend's own bound can end a generation while its data waits:
    /// [`Engine::expired_elsewhere`]), it is dropped the same way.
    pub fn publish_in_place(
        &mut self,
        now: Nanos,
        channel: ChannelId,
        slot: u32,
        side: u8,
        out: &mut Vec<Command>,
    ) -> Result<(), EngineError> {
        let slot_id = self.host_slot(channel, slot)?;
        if u64::from(side) != self.slots[slot_id as usize].generation % 2 {
            self.stats.in_place_missed += 1;
            out.push(Command::MissedPublish { channel, slot });
            return Ok(());
        }
        let route = self.routes[slot_id as usize].as_mut().expect("a channel's slot is live");
        let was = std::mem::replace(&mut route.in_place, true);
        if !self.make_available(now, slot_id, out) {
            // The DAB bit was set already: the pending publish keeps its own kind.
            self.routes[slot_id as usize].as_mut().expect("live").in_place = was;
            return Err(EngineError::AlreadyPublished { channel, slot });
        }
        self.stats.host_publishes += 1;
        self.stats.in_place_publishes += 1;
        self.activator.flush_replays(out);
        Ok(())
    }

    /// The slot id of `slot` of `channel`, a host-producer channel.
    fn host_slot(&self, channel: ChannelId, slot: u32) -> Result<u32, EngineError> {
        let ch = self.channel(channel)?;
        if !matches!(ch.spec.producer, Producer::Host) {
            return Err(EngineError::NotHostProducer(channel));
        }
        ch.slot_ids.get(slot as usize).copied().ok_or(EngineError::SlotOutOfRange {
            channel,
            slot,
            slots: ch.spec.slots,
        })
    }

    /// Sets the slot's DAB bit and wakes its waiters; false if the bit was already set.
    fn make_available(&mut self, now: Nanos, slot_id: u32, out: &mut Vec<Command>) -> bool {
        let tag = self.slots[slot_id as usize].tag;
        if !self.dab.set(tag) {
            return false;
        }
        self.stats.dab_updates += 1;
        let mut woken = std::mem::take(&mut self.woken);
        self.pfq.on_available(tag, &mut woken);
        for waiter in woken.drain(..) {
            self.deliver(now, waiter, out);
        }
        self.woken = woken;
        true
    }

    /// Consumes the slot's tag and completes its current generation with the producer's data.
    #[inline(always)]
    fn deliver(&mut self, now: Nanos, slot_id: u32, out: &mut Vec<Command>) {
        let slot = &mut self.slots[slot_id as usize];
        let route = self.routes[slot_id as usize].as_mut().expect("live slot");
        self.dab.clear(slot.tag);
        let held_since = std::mem::replace(&mut slot.held_since, NOT_HELD);
        let waited = if held_since == NOT_HELD { 0 } else { now.saturating_sub(held_since) };
        self.stats.wake_latency_ns.record(waited);
        let wake = wake_of(slot, route, &self.config);
        if std::mem::take(&mut route.in_place) {
            self.activator.deliver_heads(wake, out);
        } else {
            self.activator.deliver(wake, route.len, route.source, out);
        }
        rearm_previous_pat(slot, route, slot.generation, &self.config, out);
        slot.generation += 1;
        self.stats.delivered += 1;
    }

    /// The earliest deadline of the requests still held, when [`Engine::expire`] next has
    /// work; `None` if nothing is held. Delivered holds leave their entries behind: those on
    /// top are dropped here, so a caller sleeping until this time never wakes for a request
    /// already answered.
    pub fn next_deadline(&mut self) -> Option<Nanos> {
        while let Some(&Reverse(entry)) = self.deadlines.peek() {
            if ends_current_hold(&self.slots, &self.routes, entry) {
                return Some(entry.0);
            }
            self.deadlines.pop();
        }
        None
    }

    /// The backend ended a hold itself (the kernel module's own bound on a hold): the run of
    /// the PCM page at `va` has the timeout marker, the slot's other run is unmapped and the
    /// run mapped, as [`Engine::expire`] would have them. The slot moves on to its next
    /// generation as after a timeout, without a command for the run but its host producer's
    /// [`Command::Expired`]; a page of no live slot changes nothing, nor one of a generation the
    /// slot has left already, whose host producer is only told the run it may write. Returns
    /// whether the slot moved on.
    pub fn expired_elsewhere(&mut self, gpu: GpuId, va: u64, out: &mut Vec<Command>) -> bool {
        self.stats.expired_elsewhere += 1;
        let Some(page) = pool_page(self.config.pool_base, va, &self.pages) else { return false };
        let PageUse::Pcm { slot: slot_id, side } = self.pages[page] else { return false };
        let slot = &mut self.slots[slot_id as usize];
        if gpu != slot.consumer_gpu {
            return false;
        }
        let route = self.routes[slot_id as usize].as_mut().expect("a page in use belongs to a live slot");
        if u64::from(side) != slot.generation % 2 {
            // The slot moved on already: its completion of the expired generation came before
            // this record (the module refused it as stale). The module's completion unmapped
            // the run the slot reads now, which its host producer may write, and a delivery
            // of the refused completion said nothing of it.
            if matches!(route.source, DataSource::Host { .. }) {
                let wake = wake_of(slot, route, &self.config);
                out.push(Command::Expired {
                    channel: route.channel,
                    slot: route.index,
                    companion_va: wake.run_va,
                    missed: false,
                });
            }
            return false;
        }
        let generation = slot.generation;
        // Its deadline entry, if it was held, no longer ends a current hold and is dropped.
        slot.held_since = NOT_HELD;
        slot.generation += 1;
        self.pfq.remove(slot_id);
        self.stats.timed_out += 1;
        // An in-place batch waiting for this generation is in the run that just got the
        // marker: the next generation reads the other run, so the batch can never be its.
        let missed = std::mem::take(&mut route.in_place);
        if missed {
            self.dab.clear(slot.tag);
            self.stats.in_place_missed += 1;
        }
        if matches!(route.source, DataSource::Host { .. }) {
            let wake = wake_of_generation(slot, route, generation, &self.config);
            out.push(Command::Expired {
                channel: route.channel,
                slot: route.index,
                companion_va: wake.companion_va,
                missed,
            });
        }
        rearm_previous_pat(slot, route, generation, &self.config, out);
        true
    }

    /// The backend saw the page at `va` fault on a GPU it cannot hold faults of (one registered
    /// in the application's space after it was attached): the access was serviced without its
    /// data, and the channel owning the page cannot be served. The channel is kept for
    /// [`Engine::take_unservable`], once; a page of no live channel changes nothing.
    pub fn unservable(&mut self, va: u64) {
        let Some(page) = pool_page(self.config.pool_base, va, &self.pages) else { return };
        let (PageUse::Pcm { slot, .. } | PageUse::Pat { slot, .. }) = self.pages[page] else { return };
        let Some(route) = self.routes[slot as usize].as_ref() else { return };
        if !self.unservable.contains(&route.channel) {
            self.unservable.push(route.channel);
        }
    }

    /// A channel that cannot be served ([`Engine::unservable`]), for the caller to fail.
    pub fn take_unservable(&mut self) -> Option<ChannelId> {
        self.unservable.pop()
    }

    /// Completes every request held past its channel's timeout with [`ErrorMarker::Timeout`].
    pub fn expire(&mut self, now: Nanos, out: &mut Vec<Command>) {
        while self.next_deadline().is_some_and(|deadline| deadline <= now) {
            let Some(Reverse((_, slot_id, generation))) = self.deadlines.pop() else { break };
            let route = self.routes[slot_id as usize].as_ref().expect("a held slot is live");
            let slot = &mut self.slots[slot_id as usize];
            slot.held_since = NOT_HELD;
            slot.generation += 1;
            let wake = wake_of_generation(slot, route, generation, &self.config);
            self.pfq.remove(slot_id);
            self.stats.timed_out += 1;
            self.activator.fail(wake, ErrorMarker::Timeout, out);
            // A timed-out generation ends like a delivered one, or the next one's publish
            // would find its PAT page still mapped and never fault.
            rearm_previous_pat(slot, route, generation, &self.config, out);
        }
        self.activator.flush_replays(out);
    }
}

/// Whether a deadline entry belongs to its slot's current hold. A delivered hold leaves its
/// entry behind, and slot ids and generations restart when a closed channel's slot is reused,
/// so only a deadline equal to the current hold's own one may end it.
fn ends_current_hold(
    slots: &[SlotState],
    routes: &[Option<SlotRoute>],
    (deadline, slot_id, generation): (Nanos, u32, u64),
) -> bool {
    let slot = &slots[slot_id as usize];
    routes[slot_id as usize].is_some()
        && slot.held_since != NOT_HELD
        && slot.generation == generation
        && slot.held_since.saturating_add(slot.timeout) == deadline
}

/// For a GPU producer, as generation `generation` of `slot` ends: re-arms the PAT page of the
/// generation before it, which is the next one's, not this generation's own. That page stays
/// mapped until the next generation ends, so a late duplicate of the producer's fault can
/// never map a page that must fault for generation + 2.
fn rearm_previous_pat(
    slot: &SlotState,
    route: &SlotRoute,
    generation: u64,
    config: &EngineConfig,
    out: &mut Vec<Command>,
) {
    if let Some(pat) = route.pat {
        let side = (generation % 2) as usize;
        out.push(Command::RearmPat { gpu: slot.producer_gpu, va: config.page_va(pat[1 - side]) });
    }
}

fn wake_of(slot: &SlotState, route: &SlotRoute, config: &EngineConfig) -> Wake {
    wake_of_generation(slot, route, slot.generation, config)
}

fn wake_of_generation(slot: &SlotState, route: &SlotRoute, generation: u64, config: &EngineConfig) -> Wake {
    let side = (generation % 2) as usize;
    let va = |run: PageRun| config.page_va(run.start);
    Wake {
        gpu: slot.consumer_gpu,
        channel: route.channel,
        slot: route.index,
        run_va: va(route.runs[side]),
        companion_va: va(route.runs[1 - side]),
        pages: route.runs[side].len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activator::Fill;
    use crate::fault::{AccessType, Aperture, FaultType, MmuClientType};

    fn fault(va: u64, access: AccessType) -> RawFaultEntry {
        FaultEntry {
            instance_aperture: Aperture::Video,
            instance_ptr: 0x1000,
            address_aperture: 0,
            va,
            timestamp: 0,
            engine_id: 384,
            fault_type: FaultType::InvalidPte,
            replayable: true,
            client_id: 3,
            access_type: access,
            client_type: MmuClientType::Gpc,
            gpc_id: 1,
            protected_mode: false,
            replayable_fault_enabled: true,
            valid: true,
        }
        .encode()
    }

    /// The completion of a one-page run of GPU 0's: what a single request's delivery or error is.
    fn one_page(channel: ChannelId, slot: u32, run_va: u64, companion_va: u64, fill: Fill) -> Command {
        Command::Complete { gpu: 0, channel, slot, run_va, companion_va, pages: 1, fill }
    }

    fn engine() -> Engine {
        Engine::new(EngineConfig { pool_pages: 64, max_slots: 8, ..EngineConfig::default() }).unwrap()
    }

    fn host_spec(slots: u32) -> ChannelSpec {
        ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes: 256, slots, timeout_ns: 1_000 }
    }

    fn kinds(out: &[Command]) -> Vec<&'static str> {
        out.iter()
            .map(|c| match c {
                Command::Complete { fill: Fill::Data { .. }, .. } => "deliver",
                Command::Complete { fill: Fill::Marker(_), .. } => "error",
                Command::Complete { fill: Fill::Heads, .. } => "heads",
                Command::MissedPublish { .. } => "missed",
                Command::Expired { missed: false, .. } => "expired",
                Command::Expired { missed: true, .. } => "expired-missed",
                Command::ServicePat { .. } => "service-pat",
                Command::RearmPat { .. } => "rearm-pat",
                Command::Replay { .. } => "replay",
            })
            .collect()
    }

    #[test]
    fn held_fault_is_woken_by_publish_with_its_data_then_next_generation_uses_companion() {
        let mut e = engine();
        let layout = e.open_channel(host_spec(2)).unwrap();
        assert_eq!(layout.pages_per_run, 1, "16 warps x 256 B is one page");
        let slot = &layout.slots[1];
        let mut out = Vec::new();
        e.handle_faults(10, 0, &[fault(slot.runs[0], AccessType::Read)], &mut out);
        assert!(out.is_empty(), "data not yet available: the fault is held");
        assert_eq!(e.held(), 1);
        e.publish(30, layout.id, 1, &mut out).unwrap();
        assert_eq!(kinds(&out), ["deliver", "replay"]);
        let data = Fill::Data { len: 4096, source: DataSource::Host { offset: 4096 } };
        assert_eq!(out[0], one_page(layout.id, 1, slot.runs[0], slot.runs[1], data));
        assert_eq!(e.held(), 0);
        assert_eq!(e.stats().wake_latency_ns.max(), 20);
        // Generation 1: a refault on P is stale, the request comes on P'.
        out.clear();
        e.handle_faults(
            40,
            0,
            &[fault(slot.runs[0], AccessType::Read), fault(slot.runs[1], AccessType::Read)],
            &mut out,
        );
        assert_eq!(e.stats().stale, 1);
        assert_eq!(e.held(), 1);
    }

    #[test]
    fn published_before_the_fault_is_delivered_at_once_and_duplicates_are_dropped() {
        let mut e = engine();
        let layout = e.open_channel(host_spec(1)).unwrap();
        let mut out = Vec::new();
        e.publish(0, layout.id, 0, &mut out).unwrap();
        assert!(out.is_empty());
        assert_eq!(
            e.publish(1, layout.id, 0, &mut out),
            Err(EngineError::AlreadyPublished { channel: layout.id, slot: 0 })
        );
        let p = layout.slots[0].runs[0];
        e.handle_faults(5, 0, &[fault(p, AccessType::Read), fault(p, AccessType::Read)], &mut out);
        assert_eq!(kinds(&out), ["deliver", "replay"]);
        assert_eq!(e.stats().delivered, 1);
        assert_eq!(e.stats().stale, 1, "the second packet of the same batch is already stale");
    }

    #[test]
    fn histograms_record_every_delivery_and_batch_but_not_timeouts() {
        let mut e = engine();
        let layout = e.open_channel(host_spec(3)).unwrap();
        let mut out = Vec::new();
        // Slot 0: published first, so delivered without being held: latency 0.
        e.publish(0, layout.id, 0, &mut out).unwrap();
        e.handle_faults(5, 0, &[fault(layout.slots[0].runs[0], AccessType::Read)], &mut out);
        // Slot 1: held from 100 (its duplicate at 150 does not restart the clock) until 1_234.
        let p1 = layout.slots[1].runs[0];
        e.handle_faults(100, 0, &[fault(p1, AccessType::Read), fault(0x1000, AccessType::Read)], &mut out);
        e.handle_faults(150, 0, &[fault(p1, AccessType::Read)], &mut out);
        e.publish(1_234, layout.id, 1, &mut out).unwrap();
        // Slot 2: held, then timed out: counted in timed_out only.
        e.handle_faults(2_000, 0, &[fault(layout.slots[2].runs[0], AccessType::Read)], &mut out);
        e.expire(3_000, &mut out);
        e.handle_faults(3_001, 0, &[], &mut out);
        let s = e.stats();
        assert_eq!((s.delivered, s.timed_out, s.batches), (2, 1, 5));
        assert_eq!(s.wake_latency_ns.count(), s.delivered);
        assert_eq!(s.batch_sizes.count(), s.batches);
        assert_eq!(s.wake_latency_ns.buckets().collect::<Vec<_>>(), [(0, 1), (2047, 1)]);
        assert_eq!(
            (s.wake_latency_ns.min(), s.wake_latency_ns.max(), s.wake_latency_ns.sum()),
            (Some(0), 1_134, 1_134)
        );
        assert_eq!(s.batch_sizes.buckets().collect::<Vec<_>>(), [(0, 1), (1, 3), (3, 1)]);
        assert_eq!((s.batch_sizes.sum(), u64::from(s.largest_batch)), (s.entries, s.batch_sizes.max()));
    }

    #[test]
    fn held_duplicates_and_foreign_and_malformed_entries_are_counted_not_acted_on() {
        let mut e = engine();
        let layout = e.open_channel(host_spec(1)).unwrap();
        let p = layout.slots[0].runs[0];
        let mut fatal = FaultEntry::decode(&fault(p, AccessType::Read), VaWidth::Bits57);
        fatal.fault_type = FaultType::from_raw(1);
        let mut invalid = FaultEntry::decode(&fault(p, AccessType::Read), VaWidth::Bits57);
        invalid.valid = false;
        let mut out = Vec::new();
        let batch = [
            fault(p, AccessType::Read),
            fault(p, AccessType::Read),
            fault(0x1000, AccessType::Read),
            fault(e.config().pool_base + 63 * PAGE_SIZE, AccessType::Read),
            fatal.encode(),
            invalid.encode(),
        ];
        e.handle_faults(0, 0, &batch, &mut out);
        e.handle_faults(0, 1, &[fault(p, AccessType::Read)], &mut out);
        assert!(out.is_empty());
        let s = e.stats();
        assert_eq!((s.requests, s.duplicates, s.foreign, s.malformed, s.wrong_gpu), (1, 1, 2, 2, 1));
        assert_eq!((s.entries, s.batches, s.largest_batch), (7, 2, 6));
    }

    #[test]
    fn timeout_completes_with_error_marker_and_advances_the_generation() {
        let mut e = engine();
        let layout = e.open_channel(host_spec(1)).unwrap();
        let p = layout.slots[0].runs;
        let mut out = Vec::new();
        e.handle_faults(100, 0, &[fault(p[0], AccessType::Read)], &mut out);
        assert_eq!(e.next_deadline(), Some(1_100));
        e.expire(1_099, &mut out);
        assert!(out.is_empty());
        e.expire(1_100, &mut out);
        assert_eq!(kinds(&out), ["error", "replay"]);
        let timeout = Fill::Marker(ErrorMarker::Timeout);
        assert_eq!(out[0], one_page(layout.id, 0, p[0], p[1], timeout));
        assert_eq!((e.held(), e.stats().timed_out, e.stats().expired_elsewhere), (0, 1, 0));
        out.clear();
        e.handle_faults(2_000, 0, &[fault(p[1], AccessType::Read)], &mut out);
        e.publish(2_001, layout.id, 0, &mut out).unwrap();
        let data = Fill::Data { len: 4096, source: DataSource::Host { offset: 0 } };
        assert_eq!(out[0], one_page(layout.id, 0, p[1], p[0], data));
        assert_eq!(e.next_deadline(), None, "the delivered hold's deadline is not waited for");
        out.clear();
        e.expire(10_000, &mut out);
        assert!(out.is_empty(), "a delivered request never times out");
    }

    #[test]
    fn a_hold_the_backend_ended_moves_the_slot_on_and_hands_the_other_run_to_the_producer() {
        let mut e = engine();
        let layout = e.open_channel(host_spec(1)).unwrap();
        let p = layout.slots[0].runs;
        let mut out = Vec::new();
        e.handle_faults(100, 0, &[fault(p[0], AccessType::Read)], &mut out);
        assert_eq!(e.held(), 1);
        assert!(!e.expired_elsewhere(1, p[0], &mut out), "another GPU's expiry");
        assert!(out.is_empty(), "another GPU's page tells nobody anything");
        assert!(!e.expired_elsewhere(0, p[1], &mut out), "the other run: not this generation's");
        let reading = Command::Expired { channel: layout.id, slot: 0, companion_va: p[0], missed: false };
        assert_eq!(out, [reading], "the producer is told the run the slot reads, unmapped");
        out.clear();
        assert!(e.expired_elsewhere(0, p[0] + 4095, &mut out), "any byte of the run");
        let expired = Command::Expired { channel: layout.id, slot: 0, companion_va: p[1], missed: false };
        assert_eq!(out, [expired], "the backend completed the run itself: only its producer is told");
        out.clear();
        assert_eq!((e.held(), e.stats().timed_out, e.next_deadline()), (0, 1, None));
        assert!(!e.expired_elsewhere(0, p[0], &mut out), "a second report of it");
        let told = Command::Expired { channel: layout.id, slot: 0, companion_va: p[1], missed: false };
        assert_eq!(out, [told], "the run the slot reads now, which the module left unmapped");
        out.clear();
        // The warp's next generation faults on the other run: a request, not a stale fault.
        e.handle_faults(2_000, 0, &[fault(p[1], AccessType::Read)], &mut out);
        assert_eq!((e.held(), e.stats().stale), (1, 0));
        e.publish(2_001, layout.id, 0, &mut out).unwrap();
        let data = Fill::Data { len: 4096, source: DataSource::Host { offset: 0 } };
        assert_eq!(out[0], one_page(layout.id, 0, p[1], p[0], data));
        assert!(!e.expired_elsewhere(0, 0xdead_0000, &mut Vec::new()), "a page of no slot");
        // Every report counts as the module's expiry, each a warp stalled for its whole bound;
        // only the one that moved the slot on counts as a timeout.
        assert_eq!((e.stats().expired_elsewhere, e.stats().timed_out), (5, 1));
    }

    #[test]
    fn an_in_place_publish_completes_with_the_heads_and_one_for_the_other_run_is_missed() {
        let mut e = engine();
        let layout = e.open_channel(host_spec(1)).unwrap();
        let p = layout.slots[0].runs;
        let mut out = Vec::new();
        e.handle_faults(10, 0, &[fault(p[0], AccessType::Read)], &mut out);
        e.publish_in_place(20, layout.id, 0, 0, &mut out).unwrap();
        assert_eq!(kinds(&out), ["heads", "replay"]);
        assert_eq!(out[0], one_page(layout.id, 0, p[0], p[1], Fill::Heads));
        out.clear();
        // Generation 1 reads run 1: a batch written into run 0 came too late for anything.
        e.publish_in_place(30, layout.id, 0, 0, &mut out).unwrap();
        assert_eq!(out, [Command::MissedPublish { channel: layout.id, slot: 0 }]);
        out.clear();
        e.handle_faults(40, 0, &[fault(p[1], AccessType::Read)], &mut out);
        assert_eq!((out.len(), e.held()), (0, 1), "the missed publish left nothing available");
        e.publish_in_place(50, layout.id, 0, 1, &mut out).unwrap();
        assert_eq!(out[0], one_page(layout.id, 0, p[1], p[0], Fill::Heads));
        let s = e.stats();
        assert_eq!((s.host_publishes, s.in_place_publishes, s.in_place_missed, s.delivered), (2, 2, 1, 2));
        // A buffer publish next completes with the data, as before.
        out.clear();
        e.publish(60, layout.id, 0, &mut out).unwrap();
        e.handle_faults(70, 0, &[fault(p[0], AccessType::Read)], &mut out);
        assert_eq!(kinds(&out), ["deliver", "replay"]);
    }

    #[test]
    fn an_in_place_batch_waiting_for_a_generation_the_backend_ended_is_dropped() {
        let mut e = engine();
        let layout = e.open_channel(host_spec(1)).unwrap();
        let p = layout.slots[0].runs;
        let mut out = Vec::new();
        // Its fault never reached the engine (the module's ring was full), so the batch waits.
        e.publish_in_place(10, layout.id, 0, 0, &mut out).unwrap();
        assert!(e.expired_elsewhere(0, p[0], &mut out));
        assert_eq!(out, [Command::Expired { channel: layout.id, slot: 0, companion_va: p[1], missed: true }]);
        out.clear();
        // Generation 1's request waits for its own data instead of taking run 0's heads.
        e.handle_faults(20, 0, &[fault(p[1], AccessType::Read)], &mut out);
        assert_eq!((out.len(), e.held(), e.stats().in_place_missed), (0, 1, 1));
        e.publish_in_place(30, layout.id, 0, 1, &mut out).unwrap();
        assert_eq!(out[0], one_page(layout.id, 0, p[1], p[0], Fill::Heads));
    }

    #[test]
    fn delivered_holds_do_not_pile_up_in_the_deadline_heap_and_live_holds_still_time_out() {
        let mut e = engine();
        let a = e.open_channel(host_spec(1)).unwrap();
        let b = e.open_channel(ChannelSpec { timeout_ns: 1_000_000_000, ..host_spec(1) }).unwrap();
        let mut out = Vec::new();
        let mut now = 0;
        // B's holds are all delivered long before their deadlines; A's first stays held.
        e.handle_faults(now, 0, &[fault(a.slots[0].runs[0], AccessType::Read)], &mut out);
        for generation in 0..1_000 {
            now += 10;
            e.handle_faults(now, 0, &[fault(b.slots[0].runs[generation % 2], AccessType::Read)], &mut out);
            e.publish(now, b.id, 0, &mut out).unwrap();
            assert!(matches!(out.last(), Some(Command::Replay { .. })));
            let delivered = out[out.len() - 2];
            assert!(
                matches!(delivered, Command::Complete { channel, slot: 0, .. } if channel == b.id),
                "B's own slot 0, not the engine's slot id: {delivered:?}"
            );
            assert!(e.deadlines.len() <= 2 * e.config.max_slots as usize, "{} deadlines kept", e.deadlines.len());
        }
        assert_eq!(e.stats().delivered, 1_000);
        out.clear();
        e.expire(1_000, &mut out);
        assert_eq!(kinds(&out), ["error", "replay"], "A's hold kept its deadline through the compactions");
        out.clear();
        e.handle_faults(now, 0, &[fault(b.slots[0].runs[0], AccessType::Read)], &mut out);
        e.expire(now + 999_999_999, &mut out);
        assert!(out.is_empty(), "none of B's delivered holds times out");
        e.expire(now + 1_000_000_000, &mut out);
        assert_eq!(kinds(&out), ["error", "replay"], "B's new hold times out at its own deadline");
    }

    #[test]
    fn a_closed_channels_deadline_does_not_time_out_the_next_channel_on_its_slot() {
        let mut e = engine();
        let a = e.open_channel(host_spec(1)).unwrap();
        let mut out = Vec::new();
        e.handle_faults(0, 0, &[fault(a.slots[0].runs[0], AccessType::Read)], &mut out);
        e.publish(10, a.id, 0, &mut out).unwrap();
        e.close_channel(a.id, &mut out).unwrap();
        let b = e.open_channel(host_spec(1)).unwrap();
        assert_eq!(b.slots[0].runs, a.slots[0].runs, "B reuses A's slot and pages");
        out.clear();
        e.handle_faults(900, 0, &[fault(b.slots[0].runs[0], AccessType::Read)], &mut out);
        e.expire(1_000, &mut out);
        assert!(out.is_empty(), "A's deadline at 1_000 must not end B's hold");
        assert_eq!((e.held(), e.stats().timed_out), (1, 0));
        e.expire(1_900, &mut out);
        assert_eq!(kinds(&out), ["error", "replay"]);
        assert_eq!(e.stats().timed_out, 1);
    }

    #[test]
    fn gpu_producer_publishes_through_its_pat_page_and_the_previous_pat_is_rearmed_on_delivery() {
        let mut e = engine();
        let spec = ChannelSpec { producer: Producer::Gpu { gpu: 1, base_va: 0x9000_0000 }, ..host_spec(2) };
        let layout = e.open_channel(spec).unwrap();
        let slot = &layout.slots[1];
        let pat = slot.pat.unwrap();
        let mut out = Vec::new();
        e.handle_faults(0, 0, &[fault(slot.runs[0], AccessType::Read)], &mut out);
        assert_eq!(e.publish(0, layout.id, 1, &mut out), Err(EngineError::NotHostProducer(layout.id)));
        e.handle_faults(0, 0, &[fault(pat[0], AccessType::Write)], &mut out);
        assert_eq!(e.stats().wrong_gpu, 1, "only the producer GPU may write the PAT page");
        e.handle_faults(7, 1, &[fault(pat[0], AccessType::Write)], &mut out);
        assert_eq!(kinds(&out), ["service-pat", "deliver", "rearm-pat", "replay", "replay"]);
        let data = Fill::Data { len: 4096, source: DataSource::Gpu { gpu: 1, va: 0x9000_1000 } };
        assert_eq!(out[1], one_page(layout.id, 1, slot.runs[0], slot.runs[1], data));
        assert_eq!(out[2], Command::RearmPat { gpu: 1, va: pat[1] });
        assert_eq!(e.stats().pat_publishes, 1);

        // Generation 1 times out: it ends like a delivery, re-arming generation 2's page.
        out.clear();
        e.handle_faults(10, 0, &[fault(slot.runs[1], AccessType::Read)], &mut out);
        e.expire(10 + spec.timeout_ns, &mut out);
        assert_eq!(kinds(&out), ["error", "rearm-pat", "replay"]);
        assert_eq!(out[1], Command::RearmPat { gpu: 1, va: pat[0] });
        // Generation 2's publish then faults and delivers.
        out.clear();
        e.handle_faults(20, 0, &[fault(slot.runs[0], AccessType::Read)], &mut out);
        e.handle_faults(21, 1, &[fault(pat[0], AccessType::Write)], &mut out);
        assert_eq!(kinds(&out), ["service-pat", "deliver", "rearm-pat", "replay", "replay"]);
        assert_eq!(out[2], Command::RearmPat { gpu: 1, va: pat[1] });
    }

    #[test]
    fn close_completes_held_faults_and_returns_every_page_and_tag() {
        let mut e = engine();
        let a = e.open_channel(host_spec(3)).unwrap();
        let _b =
            e.open_channel(ChannelSpec { producer: Producer::Gpu { gpu: 1, base_va: 0 }, ..host_spec(2) }).unwrap();
        assert_eq!(e.pool().free_pages(), 64 - 6 - 4 - 4);
        let mut out = Vec::new();
        e.handle_faults(0, 0, &[fault(a.slots[2].runs[0], AccessType::Read)], &mut out);
        e.close_channel(a.id, &mut out).unwrap();
        assert_eq!(kinds(&out), ["error", "replay"]);
        assert!(matches!(out[0], Command::Complete { fill: Fill::Marker(ErrorMarker::ChannelClosed), .. }));
        assert_eq!(e.close_channel(a.id, &mut out), Err(EngineError::UnknownChannel(a.id)));
        out.clear();
        e.handle_faults(0, 0, &[fault(a.slots[0].runs[0], AccessType::Read)], &mut out);
        assert_eq!(e.stats().foreign, 1, "closed pages are no longer WIC's");
        e.shutdown(&mut out);
        assert_eq!((e.pool().free_pages(), e.pool().allocated_runs(), e.channel_count(), e.held()), (64, 0, 0, 0));
        e.expire(u64::MAX, &mut out);
        assert!(out.is_empty(), "no deadline survives its channel");
    }

    #[test]
    fn refused_channels_leave_nothing_allocated() {
        let mut e = engine();
        let too_big = ChannelSpec { message_bytes: 4096 * 3, ..host_spec(8) };
        assert!(matches!(e.open_channel(too_big), Err(EngineError::Pool(PoolError::Exhausted { .. }))));
        assert!(matches!(e.open_channel(host_spec(9)), Err(EngineError::SlotsExhausted { requested: 9, free: 8 })));
        let same_gpu = ChannelSpec { producer: Producer::Gpu { gpu: 0, base_va: 0 }, ..host_spec(1) };
        assert!(matches!(e.open_channel(same_gpu), Err(EngineError::Invalid(_))));
        assert!(matches!(e.open_channel(host_spec(0)), Err(EngineError::Invalid(_))));
        // Slot 1's bytes would start past the end of the address space.
        let wrapping = ChannelSpec { producer: Producer::Gpu { gpu: 1, base_va: u64::MAX - 4096 }, ..host_spec(2) };
        assert!(matches!(e.open_channel(wrapping), Err(EngineError::Invalid(_))));
        assert_eq!((e.pool().free_pages(), e.pool().allocated_runs(), e.channel_count()), (64, 0, 0));
        let all = e.open_channel(host_spec(8)).unwrap();
        assert_eq!(all.slots.len(), 8);
        assert!(EngineError::SlotsExhausted { requested: 9, free: 8 }.to_string().contains('9'));
        let too_many_pages = EngineConfig { pool_pages: (1 << 30) + 1, ..EngineConfig::default() };
        assert!(
            matches!(Engine::new(too_many_pages), Err(EngineError::Pool(PoolError::TooLarge { .. }))),
            "refused, not a panic"
        );
    }

    #[test]
    fn a_channel_the_pool_cannot_hold_is_refused_with_the_pool_as_it_was_before_the_attempt() {
        let mut e = engine();
        let first = e.open_channel(host_spec(1)).unwrap();
        assert_eq!((e.pool().free_pages(), e.pool().longest_free_run()), (62, 62));
        // 31 pages a run: two runs take the 62 free pages, the third finds none left. The refusal
        // describes the request, four runs of 31 pages that need not be next to each other, and
        // the pool it met, not the pool emptied part-way through.
        let big = ChannelSpec { message_bytes: 31 * 4096 / 16, ..host_spec(2) };
        let refused = e.open_channel(big).unwrap_err();
        assert_eq!(
            refused,
            EngineError::Pool(PoolError::Exhausted {
                runs: 4,
                pages_per_run: 31,
                pat_pages: 0,
                longest_free: 62,
                free: 62
            })
        );
        assert_eq!(
            refused.to_string(),
            "PCM pool exhausted: 4 runs of 31 contiguous pages requested (124 pages in all), longest free run is 62 (62 pages free)"
        );
        // Every page and tag taken part-way is back.
        assert_eq!((e.pool().free_pages(), e.pool().longest_free_run(), e.pool().allocated_runs()), (62, 62, 2));
        assert_eq!((e.tags.in_use(), e.channel_count()), (1, 1));

        // Failing on the PAT run, after every PCM run fitted, reads the same: ten runs of 6 pages
        // fit in the 62 free pages, the run of 10 PAT pages after them does not.
        let gpu = ChannelSpec {
            producer: Producer::Gpu { gpu: 1, base_va: 0 },
            message_bytes: 6 * 4096 / 16,
            ..host_spec(5)
        };
        let refused = e.open_channel(gpu).unwrap_err();
        assert_eq!(
            refused,
            EngineError::Pool(PoolError::Exhausted {
                runs: 10,
                pages_per_run: 6,
                pat_pages: 10,
                longest_free: 62,
                free: 62
            })
        );
        assert_eq!(
            refused.to_string(),
            "PCM pool exhausted: 10 runs of 6 contiguous pages and a run of 10 PAT pages requested (70 pages in all), \
             longest free run is 62 (62 pages free)"
        );
        assert_eq!((e.pool().free_pages(), e.pool().allocated_runs(), e.tags.in_use()), (62, 2, 1));
        // The pool is whole: a channel that fits takes the pages right after the first one.
        let fits = e.open_channel(ChannelSpec { message_bytes: 31 * 4096 / 16, ..host_spec(1) }).unwrap();
        assert_eq!(fits.slots[0].runs[0], first.slots[0].runs[1] + PAGE_SIZE);
        assert_eq!(e.pool().free_pages(), 0);

        // A fragmented pool: pages 2..22 and 24..64 free. A channel of four runs of 10 pages
        // opens though no 40 free pages are contiguous; one of four runs of 15 is refused though
        // each run is shorter than the longest free run and 60 pages are free: three runs fit, the
        // fourth does not.
        let mut out = Vec::new();
        e.close_channel(fits.id, &mut out).unwrap();
        let gap = e.open_channel(ChannelSpec { message_bytes: 10 * 4096 / 16, ..host_spec(1) }).unwrap();
        e.open_channel(host_spec(1)).unwrap();
        e.close_channel(gap.id, &mut out).unwrap();
        assert_eq!((e.pool().free_pages(), e.pool().longest_free_run()), (60, 40));
        let refused = e.open_channel(ChannelSpec { message_bytes: 15 * 4096 / 16, ..host_spec(2) }).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "PCM pool exhausted: 4 runs of 15 contiguous pages requested (60 pages in all), longest free run is 40 (60 pages free)"
        );
        assert_eq!((e.pool().free_pages(), e.pool().longest_free_run()), (60, 40));
        let split = e.open_channel(ChannelSpec { message_bytes: 10 * 4096 / 16, ..host_spec(2) }).unwrap();
        assert_eq!(split.slots[0].runs[0], first.slots[0].runs[1] + PAGE_SIZE);
        assert_eq!(e.pool().free_pages(), 20);
    }
}
