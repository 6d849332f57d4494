//! The shim backend: the engine's port to `/dev/wic`. Held faults come out of the record ring,
//! are translated to engine addresses and handed to the engine's owner; the engine's commands are
//! translated back and submitted in one batch, through io_uring or ioctl; through io_uring, the
//! commands of different applications (address spaces) run at once, in one lane each.

use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use wic_engine::{ChannelLayout, Command, EngineConfig, FaultSink, GpuId, Producer, RawFaultEntry, PAGE_SIZE};
use wic_kabi::{self as kabi, WicCommand};

use crate::commands::{CommandError, HostBytes, Placement, Translator};
use crate::device::{Device, DeviceError};
use crate::ring::RecordRing;
use crate::uring::UringSubmitter;

/// How command batches reach the module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submission {
    /// One `IORING_OP_URING_CMD` per chunk, one system call per batch.
    Uring,
    /// One `WIC_IOC_SUBMIT` ioctl per chunk.
    Ioctl,
}

/// A placed channel: where its pages are and the ranges registered for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedChannel {
    pub placement: Placement,
    pub ranges: Vec<u32>,
}

/// The ranges of a channel the module refused to unregister, with why: it keeps them
/// registered, and the faults held there held.
#[derive(Debug)]
pub struct UnplaceError {
    pub refused: Vec<(u32, DeviceError)>,
}

impl std::fmt::Display for UnplaceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (id, e)) in self.refused.iter().enumerate() {
            write!(f, "{}range {id} stays registered: {e}", if i > 0 { "; " } else { "" })?;
        }
        Ok(())
    }
}

impl std::error::Error for UnplaceError {}

/// What one execution did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KernelOutcome {
    /// Kernel commands that succeeded.
    pub succeeded: usize,
    /// Kernel commands the module refused (each logged by the caller from `failures`).
    pub failed: usize,
    /// Engine commands that could not be translated.
    pub untranslatable: usize,
}

/// A batch that names several address spaces regrouped into lanes, one per space, which run at
/// once, phase after phase ([`BatchPath::plan_lanes`]).
#[derive(Debug, Default)]
struct Lanes {
    /// The batch's commands, lane after lane; a replay once in each lane it serves.
    commands: Vec<WicCommand>,
    /// The index in the batch of each of `commands`.
    positions: Vec<u32>,
    /// Each lane's commands in `commands`, phase after phase.
    lanes: Vec<Range<usize>>,
    /// Each phase's lanes in `lanes`.
    phases: Vec<Range<usize>>,
    /// Scratch of [`Lanes::add_phase`], kept so that planning allocates nothing once warm: the
    /// phase's spaces, the GPUs a lane has commands on since their last replay in it, and which
    /// of the phase's replays a lane took.
    spaces: Vec<u32>,
    owed: Vec<u32>,
    taken: Vec<bool>,
}

impl Lanes {
    fn clear(&mut self) {
        self.commands.clear();
        self.positions.clear();
        self.lanes.clear();
        self.phases.clear();
    }

    fn push(&mut self, command: WicCommand, position: usize) {
        self.commands.push(command);
        self.positions.push(position as u32);
    }

    /// Adds a phase of `commands`, the batch's from `start` on: one lane per address space, in
    /// the order the spaces first come, with that space's commands in the batch's order and,
    /// after them, each replay of a GPU they have commands on (a replay is the whole GPU's: each
    /// lane that needs it replays once its own commands ran); the replays no lane needs go in
    /// a lane of their own.
    fn add_phase(&mut self, commands: &[WicCommand], start: usize) {
        let replay = |c: &WicCommand| c.opcode == kabi::WIC_CMD_REPLAY;
        let first_lane = self.lanes.len();
        self.spaces.clear();
        for command in commands.iter().filter(|c| !replay(c)) {
            if !self.spaces.contains(&command.space_id) {
                self.spaces.push(command.space_id);
            }
        }
        self.taken.clear();
        self.taken.resize(commands.len(), false);
        for k in 0..self.spaces.len() {
            let space = self.spaces[k];
            self.owed.clear();
            let lane_start = self.commands.len();
            for (i, command) in commands.iter().enumerate() {
                if !replay(command) {
                    if command.space_id == space {
                        if !self.owed.contains(&command.gpu_id) {
                            self.owed.push(command.gpu_id);
                        }
                        self.push(*command, start + i);
                    }
                } else if let Some(at) = self.owed.iter().position(|&gpu| gpu == command.gpu_id) {
                    self.owed.swap_remove(at);
                    self.taken[i] = true;
                    self.push(*command, start + i);
                }
            }
            self.lanes.push(lane_start..self.commands.len());
        }
        let lane_start = self.commands.len();
        for (i, command) in commands.iter().enumerate() {
            if replay(command) && !self.taken[i] {
                self.push(*command, start + i);
            }
        }
        if self.commands.len() > lane_start {
            self.lanes.push(lane_start..self.commands.len());
        }
        if self.lanes.len() > first_lane {
            self.phases.push(first_lane..self.lanes.len());
        }
    }
}

/// The user-space path of a fault batch, without the device: ring records are translated to
/// engine addresses and handed to a [`FaultSink`] (the engine's), and the engine's commands are translated into one
/// batch of kernel commands. The backend wraps it around `/dev/wic`; benchmarks run it on a
/// ring in ordinary memory.
#[derive(Debug)]
pub struct BatchPath {
    translator: Translator,
    width: wic_engine::VaWidth,
    /// The batch's entries at their engine addresses, in ring order, and the GPU of each.
    entries: Vec<RawFaultEntry>,
    gpus: Vec<GpuId>,
    /// For a batch from several GPUs: (GPU, ring position) of each entry, and the entries
    /// grouped by GPU in ring order.
    order: Vec<(GpuId, u32)>,
    grouped: Vec<RawFaultEntry>,
    /// The holds the module ended itself, read with the batch: (entries read before it, GPU,
    /// engine address).
    expired: Vec<(usize, GpuId, u64)>,
    batch: Vec<WicCommand>,
    /// The index of the engine command each kernel command of `batch` was translated from.
    origin: Vec<u32>,
    /// `batch` as lanes, when it names several GPUs ([`BatchPath::plan_lanes`]).
    lanes: Lanes,
    /// Records of pages no placed channel has (stale, or a closed channel's).
    pub stray_records: u64,
}

impl BatchPath {
    /// An empty path for an engine configured as `config`.
    pub fn new(config: &EngineConfig) -> Self {
        Self {
            translator: Translator::new(config),
            width: config.va_width,
            entries: Vec::new(),
            gpus: Vec::new(),
            order: Vec::new(),
            grouped: Vec::new(),
            expired: Vec::new(),
            batch: Vec::new(),
            origin: Vec::new(),
            lanes: Lanes::default(),
            stray_records: 0,
        }
    }

    /// Makes a placed channel's pages known in both directions; `range_ids` are the module's
    /// ids of its registered ranges (PCM, then PAT if any), which its records carry.
    pub fn add(&mut self, placement: &Placement, range_ids: &[u32]) {
        self.translator.add(placement, range_ids);
    }

    /// Forgets a channel's pages.
    pub fn remove(&mut self, placement: &Placement) {
        self.translator.remove(placement);
    }

    /// Reads `ring` and hands every held fault to `sink`, GPU by GPU, and every hold the
    /// module ended itself ([`kabi::WIC_RECORD_EXPIRED`]) where it comes in the ring, after
    /// the faults before it; a page read on a GPU the module cannot hold faults of
    /// ([`kabi::WIC_RECORD_UNSUPPORTED_GPU`]) goes to `sink` at once. Returns how many records
    /// were read.
    pub fn take_faults(&mut self, ring: &mut RecordRing, sink: &mut impl FaultSink) -> usize {
        let Self { translator, width, entries, gpus, expired, stray_records, .. } = self;
        entries.clear();
        gpus.clear();
        expired.clear();
        // Each record becomes an engine entry as it is copied out of the ring.
        let read = ring.read_with(usize::MAX, |_, record| {
            let entry = RawFaultEntry(record.entry);
            let (Ok(gpu), Some(va)) = (
                GpuId::try_from(record.gpu_id),
                translator.engine_va(record.space_id, record.range_id, &entry, *width),
            ) else {
                *stray_records += 1;
                return;
            };
            if record.flags & kabi::WIC_RECORD_EXPIRED != 0 {
                expired.push((entries.len(), gpu, va));
                return;
            }
            if record.flags & kabi::WIC_RECORD_UNSUPPORTED_GPU != 0 {
                sink.unservable(va);
                return;
            }
            // Patched where it lies: a patched copy passed by value would be reread with
            // wide loads right after its narrow stores, which the CPU cannot forward.
            entries.push(entry);
            if let Some(entry) = entries.last_mut() {
                entry.set_va(va);
            }
            gpus.push(gpu);
        });
        let mut from = 0;
        for i in 0..self.expired.len() {
            let (at, gpu, va) = self.expired[i];
            self.feed(sink, from..at);
            sink.expired(gpu, va);
            from = at;
        }
        self.feed(sink, from..self.entries.len());
        read
    }

    /// Hands the entries of `range` to `sink`.
    #[inline]
    fn feed(&mut self, sink: &mut impl FaultSink, range: Range<usize>) {
        let gpus = &self.gpus[range.clone()];
        // A batch almost always comes from one GPU.
        match gpus.first() {
            None => {}
            Some(&gpu) if gpus.iter().all(|&other| other == gpu) => sink.faults(gpu, &self.entries[range]),
            Some(_) => self.take_from_several_gpus(sink, range),
        }
    }

    /// Hands the entries of `range`, which came from several GPUs, to `sink` GPU by GPU,
    /// each GPU's in ring order. Sorted in place, not with a stable sort: that allocates its
    /// scratch space on every call, and the fault path allocates nothing.
    #[cold]
    fn take_from_several_gpus(&mut self, sink: &mut impl FaultSink, range: Range<usize>) {
        self.order.clear();
        self.order
            .extend(self.gpus[range.clone()].iter().zip(range.start as u32..).map(|(&gpu, position)| (gpu, position)));
        self.order.sort_unstable();
        self.grouped.clear();
        self.grouped.extend(self.order.iter().map(|&(_, position)| self.entries[position as usize]));
        let mut start = 0;
        for group in self.order.chunk_by(|a, b| a.0 == b.0) {
            sink.faults(group[0].0, &self.grouped[start..start + group.len()]);
            start += group.len();
        }
    }

    /// Translates `commands` into the kernel batch it returns; each command that cannot be
    /// translated goes to `outcome` with why, and is counted in `untranslatable`.
    // Kept out of its callers: inlined next to the engine's loop it only adds register
    // pressure (about 3% of a 256-entry batch in wic-bench).
    #[inline(never)]
    pub fn translate(
        &mut self,
        commands: &[Command],
        host: impl HostBytes,
        outcome: &mut impl FnMut(&Command, Result<i32, CommandError>),
        untranslatable: &mut usize,
    ) -> &mut Vec<WicCommand> {
        self.batch.clear();
        self.origin.clear();
        for (index, command) in commands.iter().enumerate() {
            match self.translator.to_kernel(command, &host) {
                Ok(Some(kernel)) => {
                    self.batch.push(kernel);
                    self.origin.push(index as u32);
                }
                // The daemon's own: reported with the batch's results, in the engine's order.
                Ok(None) => {}
                Err(e) => {
                    *untranslatable += 1;
                    outcome(command, Err(e));
                }
            }
        }
        &mut self.batch
    }

    /// Plans the translated batch as lanes, one per address space, when it names several
    /// spaces; false, and nothing planned, when it names one: it runs as it is.
    ///
    /// Lanes are by address space, not by GPU, because that is what nvidia-uvm runs at once:
    /// the hook fills a space's pages one call at a time, under the space's staging lock, for
    /// the whole of a completion (its fill, unmaps, maps and the wait for their TLB
    /// invalidates), while the calls of different spaces (different applications) share no
    /// lock but brief ones. A space's commands stay in one lane, in their order; a replay, which
    /// is the whole GPU's, goes into each lane that has commands on that GPU before it, after
    /// them. One ordering crosses lanes: a GPU producer's PAT page re-armed
    /// (`WIC_CMD_REARM_PAT`) must be so before a replay that comes after it, or the consumers
    /// that replay wakes could let the producer publish again onto a page still writable,
    /// which never faults. Such a replay starts a new phase, which runs once every lane of the
    /// one before has ended.
    pub fn plan_lanes(&mut self) -> bool {
        let batch = &self.batch;
        let mut spaces = batch.iter().filter(|c| c.opcode != kabi::WIC_CMD_REPLAY).map(|c| c.space_id);
        let Some(first) = spaces.next() else { return false };
        if spaces.all(|space| space == first) {
            return false;
        }
        let lanes = &mut self.lanes;
        lanes.clear();
        let (mut start, mut rearmed) = (0, false);
        for (i, command) in batch.iter().enumerate() {
            match command.opcode {
                kabi::WIC_CMD_REPLAY if rearmed => {
                    lanes.add_phase(&batch[start..i], start);
                    (start, rearmed) = (i, false);
                }
                kabi::WIC_CMD_REARM_PAT => rearmed = true,
                _ => {}
            }
        }
        lanes.add_phase(&batch[start..], start);
        true
    }

    /// Runs the planned lanes through `submit` (the lanes of one phase at once), phase after
    /// phase, and gives each command of the batch its result: a replay run in several lanes
    /// keeps a refusal. `submit` says a refusal in the results of the commands it concerns;
    /// its error (io_uring's own failure) ends the batch there. Returns how many of the batch's
    /// commands succeeded.
    fn submit_lanes(
        &mut self,
        mut submit: impl FnMut(&mut [WicCommand], &[Range<usize>]) -> std::io::Result<usize>,
    ) -> std::io::Result<usize> {
        let Lanes { commands, positions, lanes, phases, .. } = &mut self.lanes;
        let mut refused = None;
        for phase in phases.iter() {
            if let Err(e) = submit(commands, &lanes[phase.clone()]) {
                refused = Some(e);
                break;
            }
        }
        for (command, &position) in commands.iter().zip(positions.iter()) {
            let result = &mut self.batch[position as usize].result;
            if *result == 0 {
                *result = command.result;
            }
        }
        match refused {
            Some(e) => Err(e),
            None => Ok(self.batch.iter().filter(|c| c.result == 0).count()),
        }
    }

    /// After the batch: in the engine's order, every translated command with the module's
    /// result, or [`CommandError::NotSubmitted`] when the batch never `ran`, and the daemon's
    /// own commands, which the caller's `outcome` carries out. The order matters: what a
    /// command tells a host producer (the run it may write next) must come after what the
    /// commands before it told.
    fn report(
        &self,
        commands: &[Command],
        ran: bool,
        done: &mut KernelOutcome,
        outcome: &mut impl FnMut(&Command, Result<i32, CommandError>),
    ) {
        let mut kernel = self.batch.iter().zip(&self.origin).peekable();
        for (index, command) in commands.iter().enumerate() {
            if let Some((result, _)) = kernel.next_if(|(_, &origin)| origin as usize == index) {
                if !ran {
                    outcome(command, Err(CommandError::NotSubmitted));
                    continue;
                }
                if result.result != 0 {
                    done.failed += 1;
                }
                outcome(command, Ok(result.result));
            } else if matches!(command, Command::MissedPublish { .. } | Command::Expired { .. }) {
                outcome(command, Ok(0));
            }
        }
    }
}

/// A session's command path on `/dev/wic`: the device, its record ring and the submitter of
/// command batches. wicd's shim backend (`service::shim` in wicd) drives one; this is not a
/// backend itself.
pub struct ShimSession {
    device: Device,
    uring: Option<UringSubmitter>,
    path: BatchPath,
    /// Whether a batch that names several address spaces runs in lanes, one per space, at once.
    parallel: bool,
}

impl ShimSession {
    /// Opens a session on `path` for an engine configured as `config`.
    pub fn open(
        path: &Path,
        busy_wait: Duration,
        submission: Submission,
        config: &EngineConfig,
    ) -> Result<Self, DeviceError> {
        let device = Device::open(path, busy_wait)?;
        let uring = match submission {
            Submission::Uring => Some(
                UringSubmitter::new(device.limits().max_commands)
                    .map_err(|error| DeviceError::Uring { what: "io_uring set-up", error })?,
            ),
            Submission::Ioctl => None,
        };
        Ok(Self { device, uring, path: BatchPath::new(config), parallel: true })
    }

    /// Whether a batch that names several address spaces runs in lanes, one per space, at once (io_uring
    /// only; on by default), or as one chain.
    pub fn set_parallel(&mut self, parallel: bool) {
        self.parallel = parallel;
    }

    /// The session.
    pub fn device(&mut self) -> &mut Device {
        &mut self.device
    }

    /// Places a channel at `base` in an attached space and registers its ranges: PCM, then for
    /// a GPU `producer` PAT and the pages holding the producer's bytes for every slot, which
    /// the module copies from.
    pub fn place(
        &mut self,
        layout: &ChannelLayout,
        producer: Producer,
        space_id: u32,
        base: u64,
    ) -> Result<PlacedChannel, DeviceError> {
        let placement = Placement::new(layout, space_id, base);
        // The runs' size lets the module's own expiry complete a whole run, as the engine would.
        let mut wanted = vec![(kabi::WIC_RANGE_PCM, base, placement.pcm_bytes, layout.pages_per_run)];
        if placement.pat_bytes > 0 {
            wanted.push((kabi::WIC_RANGE_PAT, base + placement.pcm_bytes, placement.pat_bytes, 0));
        }
        if let Producer::Gpu { base_va: start, .. } = producer {
            let length = layout.slots.len() as u64 * layout.batch_bytes;
            let first = start & !(PAGE_SIZE - 1);
            // Saturated, an end past 2^64 - 1 stays in the top page, which no process maps:
            // the module refuses the range (EFAULT).
            let end = start.saturating_add(length).saturating_add(PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
            wanted.push((kabi::WIC_RANGE_SOURCE, first, end - first, 0));
        }
        let mut ranges = Vec::with_capacity(wanted.len());
        for (kind, start, length, run_pages) in wanted {
            match self.device.register(space_id, kind, start, length, run_pages) {
                Ok(id) => ranges.push(id),
                Err(e) => {
                    for id in ranges {
                        let _ = self.device.unregister(id);
                    }
                    return Err(e);
                }
            }
        }
        self.path.add(&placement, &ranges);
        Ok(PlacedChannel { placement, ranges })
    }

    /// Removes a channel: its ranges are unregistered (the module completes any fault still
    /// held on them with the channel-closed marker). Every range is tried; those the module
    /// refused stay registered, their faults held, until an unregister of them succeeds.
    pub fn unplace(&mut self, channel: &PlacedChannel) -> Result<(), UnplaceError> {
        self.path.remove(&channel.placement);
        let refused: Vec<_> =
            channel.ranges.iter().filter_map(|&id| self.device.unregister(id).err().map(|e| (id, e))).collect();
        if refused.is_empty() {
            Ok(())
        } else {
            Err(UnplaceError { refused })
        }
    }

    /// Reads the ring and hands every held fault to `sink`, GPU by GPU. Returns how many
    /// records were read.
    pub fn take_faults(&mut self, sink: &mut impl FaultSink) -> usize {
        self.path.take_faults(self.device.ring(), sink)
    }

    /// Records of pages no placed channel has (stale, or a closed channel's).
    pub fn stray_records(&self) -> u64 {
        self.path.stray_records
    }

    /// Runs the engine's `commands` as one batch. `host` gives the daemon's address of
    /// host producer bytes (see [`Translator::to_kernel`]); `outcome` receives every command
    /// with the module's result (0 or a negative errno) or why it was not translated.
    pub fn execute(
        &mut self,
        commands: &[Command],
        host: impl HostBytes,
        mut outcome: impl FnMut(&Command, Result<i32, CommandError>),
    ) -> Result<KernelOutcome, DeviceError> {
        let mut done = KernelOutcome::default();
        let empty = self.path.translate(commands, host, &mut outcome, &mut done.untranslatable).is_empty();
        let io_uring_error = |error| DeviceError::Uring { what: "io_uring submission", error };
        let submitted = match &mut self.uring {
            _ if empty => Ok(0),
            // One lane per address space, run at once (the module runs batches of several submitters
            // together); with ioctl, one call at a time, the batch runs as it is.
            Some(uring) if self.parallel && self.path.plan_lanes() => {
                let fd = self.device.fd();
                self.path
                    .submit_lanes(|commands, lanes| uring.submit_lanes(fd, commands, lanes))
                    .map_err(io_uring_error)
            }
            Some(uring) => uring.submit(self.device.fd(), &mut self.path.batch).map_err(io_uring_error),
            None => self.device.submit(&mut self.path.batch),
        };
        // The daemon's own commands are carried out whatever became of the batch.
        self.path.report(commands, submitted.is_ok(), &mut done, &mut outcome);
        done.succeeded = submitted?;
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{MemoryRing, Record};
    use wic_engine::fault::AccessType;
    use wic_engine::{ChannelSpec, Engine, EngineConfig, FaultEntry, Producer};

    /// The ring's `seq`-th record: a read fault at `va` on `gpu_id`, in range 1 of space 1.
    fn read_fault(seq: usize, gpu_id: u32, va: u64) -> Record {
        Record {
            seq: seq as u64,
            space_id: 1,
            gpu_id,
            range_id: 1,
            pat: false,
            expired: false,
            unsupported_gpu: false,
            held_ns: 0,
            entry: FaultEntry::replayable_gpc(va, AccessType::Read, 0, 0x1000, 0, 0).encode(),
        }
    }

    #[test]
    fn records_reach_the_engine_gpu_by_gpu_in_ring_order() {
        let mut engine = Engine::new(EngineConfig::default()).unwrap();
        let mut path = BatchPath::new(engine.config());
        let mut placed = Vec::new();
        for gpu in [0, 1] {
            let spec = ChannelSpec {
                consumer_gpu: gpu,
                producer: Producer::Host,
                message_bytes: 256,
                slots: 3,
                timeout_ns: 1_000,
            };
            let layout = engine.open_channel(spec).unwrap();
            let placement = Placement::new(&layout, 1, 0x7000_0000_0000 + u64::from(gpu) * 0x100_0000);
            path.add(&placement, &[1]);
            placed.push((layout, placement));
        }
        let mut out = Vec::new();
        for (layout, _) in &placed {
            for slot in 0..3 {
                engine.publish(0, layout.id, slot, &mut out).unwrap();
            }
        }
        // Interleaved GPUs, slots out of order within each.
        let order = [(1, 2), (0, 1), (1, 0), (0, 2), (1, 1), (0, 0)];
        let mut memory = MemoryRing::new(16);
        // SAFETY: `memory` owns the ring's bytes, is not moved, and outlives the reader.
        let mut ring = unsafe { RecordRing::new(memory.base(), memory.bytes()) }.unwrap();
        for (seq, &(gpu, slot)) in order.iter().enumerate() {
            let (layout, placement) = &placed[gpu];
            let va = placement.process_va(layout.slots[slot].runs[0]).unwrap();
            memory.write(seq as u64, &read_fault(seq, gpu as u32, va));
        }
        memory.publish(order.len() as u64);
        out.clear();
        assert_eq!(path.take_faults(&mut ring, &mut engine.intake(1, &mut out)), order.len());
        let written: Vec<u64> = out
            .iter()
            .filter_map(|c| if let Command::Complete { run_va, .. } = c { Some(*run_va) } else { None })
            .collect();
        let expected: Vec<u64> = [(0, 1), (0, 2), (0, 0), (1, 2), (1, 0), (1, 1)]
            .iter()
            .map(|&(gpu, slot)| placed[gpu].0.slots[slot].runs[0])
            .collect();
        assert_eq!(written, expected);
        assert_eq!(path.stray_records, 0);
    }

    #[test]
    fn a_page_read_on_a_gpu_the_module_cannot_hold_marks_its_channel_unservable_once() {
        let mut engine = Engine::new(EngineConfig::default()).unwrap();
        let spec =
            ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes: 256, slots: 2, timeout_ns: 1_000 };
        let layout = engine.open_channel(spec).unwrap();
        let placement = Placement::new(&layout, 1, 0x7000_0000_0000);
        let mut path = BatchPath::new(engine.config());
        path.add(&placement, &[1]);
        let runs = [layout.slots[0].runs[0], layout.slots[1].runs[1], layout.slots[0].runs[0]];
        let mut memory = MemoryRing::new(16);
        // SAFETY: `memory` owns the ring's bytes, is not moved, and outlives the reader.
        let mut ring = unsafe { RecordRing::new(memory.base(), memory.bytes()) }.unwrap();
        // Two pages of the channel read on an unsupported GPU, then a held fault.
        for (seq, (&run, unsupported_gpu)) in runs.iter().zip([true, true, false]).enumerate() {
            let va = placement.process_va(run).unwrap();
            memory.write(seq as u64, &Record { unsupported_gpu, ..read_fault(seq, 0, va) });
        }
        memory.publish(runs.len() as u64);
        let mut out = Vec::new();
        assert_eq!(path.take_faults(&mut ring, &mut engine.intake(1, &mut out)), runs.len());
        assert_eq!(engine.take_unservable(), Some(layout.id));
        assert_eq!(engine.take_unservable(), None, "one channel is failed once");
        assert_eq!(engine.held(), 1, "the held fault is a request as usual");
    }

    #[test]
    fn a_hold_the_module_ended_moves_its_slot_on_between_the_faults_around_it() {
        let mut engine = Engine::new(EngineConfig::default()).unwrap();
        let spec =
            ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes: 256, slots: 1, timeout_ns: 1_000 };
        let layout = engine.open_channel(spec).unwrap();
        let placement = Placement::new(&layout, 1, 0x7000_0000_0000);
        let mut path = BatchPath::new(engine.config());
        path.add(&placement, &[1]);
        let [p, p_next] = layout.slots[0].runs.map(|run| placement.process_va(run).unwrap());
        // Generation 0's fault on P, the module's expiry of it, then generation 1's fault on
        // P', all in one read: P' must be a request, not a stale fault of a generation ahead.
        let records = [(p, false), (p, true), (p_next, false)];
        let mut memory = MemoryRing::new(16);
        // SAFETY: `memory` owns the ring's bytes, is not moved, and outlives the reader.
        let mut ring = unsafe { RecordRing::new(memory.base(), memory.bytes()) }.unwrap();
        for (seq, &(va, expired)) in records.iter().enumerate() {
            memory.write(seq as u64, &Record { expired, ..read_fault(seq, 0, va) });
        }
        memory.publish(records.len() as u64);
        let mut out = Vec::new();
        assert_eq!(path.take_faults(&mut ring, &mut engine.intake(1, &mut out)), records.len());
        let stats = engine.stats();
        assert_eq!((engine.held(), stats.timed_out, stats.stale), (1, 1, 0));
        assert!(out.iter().all(|c| !matches!(c, Command::Complete { .. })), "the module completed the run: {out:?}");
        engine.publish(2, layout.id, 0, &mut out).unwrap();
        assert!(out
            .iter()
            .any(|c| matches!(c, Command::Complete { run_va, .. } if *run_va == layout.slots[0].runs[1])));
    }

    #[test]
    fn records_of_unknown_gpus_or_unplaced_pages_are_counted_and_the_rest_delivered() {
        let mut engine = Engine::new(EngineConfig::default()).unwrap();
        let spec =
            ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes: 256, slots: 2, timeout_ns: 1_000 };
        let layout = engine.open_channel(spec).unwrap();
        let placement = Placement::new(&layout, 1, 0x7000_0000_0000);
        let mut path = BatchPath::new(engine.config());
        path.add(&placement, &[1]);
        let mut out = Vec::new();
        for slot in 0..2 {
            engine.publish(0, layout.id, slot, &mut out).unwrap();
        }
        let va = |slot: usize| placement.process_va(layout.slots[slot].runs[0]).unwrap();
        // (GPU, space, address): a GPU id no GpuId holds, a space nothing is placed in, and an
        // address outside the placement, around the two good records.
        let records = [(0, 1, va(0)), (1 << 16, 1, va(1)), (0, 2, va(1)), (0, 1, 0x6000_0000_0000), (0, 1, va(1))];
        let mut memory = MemoryRing::new(16);
        // SAFETY: `memory` owns the ring's bytes, is not moved, and outlives the reader.
        let mut ring = unsafe { RecordRing::new(memory.base(), memory.bytes()) }.unwrap();
        for (seq, &(gpu_id, space_id, va)) in records.iter().enumerate() {
            memory.write(seq as u64, &Record { space_id, ..read_fault(seq, gpu_id, va) });
        }
        memory.publish(records.len() as u64);
        out.clear();
        assert_eq!(path.take_faults(&mut ring, &mut engine.intake(1, &mut out)), records.len());
        assert_eq!(path.stray_records, 3);
        let delivered: Vec<u64> = out
            .iter()
            .filter_map(|c| if let Command::Complete { run_va, .. } = c { Some(*run_va) } else { None })
            .collect();
        assert_eq!(delivered, [layout.slots[0].runs[0], layout.slots[1].runs[0]]);
    }

    #[test]
    fn results_go_back_to_their_engine_commands_past_the_untranslatable() {
        let mut engine = Engine::new(EngineConfig::default()).unwrap();
        let spec =
            ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes: 256, slots: 2, timeout_ns: 1_000 };
        let layout = engine.open_channel(spec).unwrap();
        let mut path = BatchPath::new(engine.config());
        path.add(&Placement::new(&layout, 1, 0x7000_0000_0000), &[1]);
        let fill = wic_engine::Fill::Marker(wic_engine::ErrorMarker::Timeout);
        let complete = |run_va, companion_va| Command::Complete {
            gpu: 0,
            channel: layout.id,
            slot: 0,
            run_va,
            companion_va,
            pages: 1,
            fill,
        };
        let [slot0, slot1] = [0, 1].map(|slot| layout.slots[slot].runs);
        let unplaced = complete(0x10, slot0[1]);
        // The daemon's own commands among the kernel's: reported in the engine's order.
        let expired = Command::Expired { channel: layout.id, slot: 1, companion_va: slot1[0], missed: false };
        let missed = Command::MissedPublish { channel: layout.id, slot: 0 };
        let commands = [
            expired,
            complete(slot0[0], slot0[1]),
            unplaced,
            complete(slot1[0], slot1[1]),
            missed,
            Command::Replay { gpu: 0 },
        ];
        let (mut untranslatable, mut refused) = (0, Vec::new());
        let batch = path.translate(&commands, |_, _, _| None, &mut |c, e| refused.push((*c, e)), &mut untranslatable);
        assert_eq!(batch.len(), 3, "one kernel command per translated engine command");
        // The module refuses the second completion.
        batch[1].result = -22;
        let (mut done, mut results) = (KernelOutcome::default(), Vec::new());
        path.report(&commands, true, &mut done, &mut |c, r| results.push((*c, r)));
        assert_eq!(
            results,
            [(expired, Ok(0)), (commands[1], Ok(0)), (commands[3], Ok(-22)), (missed, Ok(0)), (commands[5], Ok(0))]
        );
        assert_eq!(refused, [(unplaced, Err(CommandError::Unplaced { va: 0x10 }))]);
        assert_eq!((done.failed, untranslatable), (1, 1));
        // A batch the module never ran: its commands are said not to have run (the
        // untranslatable one was said already), the daemon's own are still carried out.
        let (mut done, mut results) = (KernelOutcome::default(), Vec::new());
        path.report(&commands, false, &mut done, &mut |c, r| results.push((*c, r)));
        let not_run = Err(CommandError::NotSubmitted);
        assert_eq!(
            results,
            [
                (expired, Ok(0)),
                (commands[1], not_run.clone()),
                (commands[3], not_run.clone()),
                (missed, Ok(0)),
                (commands[5], not_run)
            ]
        );
    }

    /// A kernel command of `opcode` in `space_id` on `gpu_id`, told apart by `va`.
    fn kernel(opcode: u32, space_id: u32, gpu_id: u32, va: u64) -> WicCommand {
        WicCommand { opcode, space_id, gpu_id, va, ..WicCommand::default() }
    }

    /// A replay of `gpu_id` (no space), told apart by `va`.
    fn replay(gpu_id: u32, va: u64) -> WicCommand {
        kernel(kabi::WIC_CMD_REPLAY, 0, gpu_id, va)
    }

    /// The planned lanes, phase by phase, as the `va`s of their commands, once checked that each
    /// is the batch's command at its position and that every command of the batch is planned.
    fn planned(path: &BatchPath) -> Vec<Vec<Vec<u64>>> {
        let lanes = &path.lanes;
        for (command, &position) in lanes.commands.iter().zip(&lanes.positions) {
            assert_eq!(*command, path.batch[position as usize], "a lane's command is the batch's at its position");
        }
        for (i, command) in path.batch.iter().enumerate() {
            let copies = lanes.positions.iter().filter(|&&p| p as usize == i).count();
            if command.opcode == kabi::WIC_CMD_REPLAY {
                assert!(copies >= 1, "replay {i} never runs");
            } else {
                assert_eq!(copies, 1, "command {i} runs {copies} times");
            }
        }
        lanes
            .phases
            .iter()
            .map(|phase| {
                lanes.lanes[phase.clone()]
                    .iter()
                    .map(|l| lanes.commands[l.clone()].iter().map(|c| c.va).collect())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_batch_of_one_address_space_runs_as_it_is() {
        use kabi::WIC_CMD_COMPLETE as COMPLETE;
        let mut path = BatchPath::new(&EngineConfig::default());
        assert!(!path.plan_lanes(), "an empty batch");
        // Two GPUs, one application: the hook fills its pages one call at a time anyway.
        path.batch = vec![kernel(COMPLETE, 1, 3, 1), kernel(COMPLETE, 1, 4, 2), replay(3, 0), replay(4, 0)];
        assert!(!path.plan_lanes());
    }

    #[test]
    fn each_space_gets_a_lane_in_order_with_the_replays_of_its_gpus_after_its_commands() {
        use kabi::WIC_CMD_COMPLETE as COMPLETE;
        let mut path = BatchPath::new(&EngineConfig::default());
        path.batch = vec![
            kernel(COMPLETE, 1, 1, 10),
            kernel(COMPLETE, 2, 2, 20),
            kernel(COMPLETE, 1, 1, 11),
            kernel(COMPLETE, 2, 1, 21),
            replay(1, 90),
            replay(2, 91),
            // A second step, of space 2 alone; and a replay nobody's commands need.
            kernel(COMPLETE, 2, 2, 22),
            replay(2, 92),
            replay(5, 93),
        ];
        assert!(path.plan_lanes());
        assert_eq!(
            planned(&path),
            [vec![vec![10, 11, 90], vec![20, 21, 90, 91, 22, 92], vec![93]]],
            "one phase: GPU 1's replay in both lanes, each after its own commands"
        );
    }

    #[test]
    fn a_replay_after_a_pat_page_was_rearmed_waits_for_every_lane() {
        use kabi::{WIC_CMD_COMPLETE as COMPLETE, WIC_CMD_COMPLETE_COPY as COPY, WIC_CMD_REARM_PAT as REARM};
        let mut path = BatchPath::new(&EngineConfig::default());
        // Space 1's consumer (GPU 1) copies from its producer (GPU 2), whose next PAT page is
        // re-armed; space 2 completes a run on GPU 1 too.
        path.batch = vec![
            kernel(kabi::WIC_CMD_SERVICE_PAT, 1, 2, 30),
            kernel(COPY, 1, 1, 10),
            kernel(COMPLETE, 2, 1, 20),
            kernel(REARM, 1, 2, 31),
            replay(2, 32),
            replay(1, 11),
        ];
        assert!(path.plan_lanes());
        assert_eq!(planned(&path), [vec![vec![30, 10, 31], vec![20]], vec![vec![32, 11]]]);
    }

    #[test]
    fn the_results_of_the_lanes_go_back_to_the_batch() {
        use kabi::WIC_CMD_COMPLETE as COMPLETE;
        let mut path = BatchPath::new(&EngineConfig::default());
        path.batch = vec![kernel(COMPLETE, 1, 1, 10), kernel(COMPLETE, 2, 1, 20), replay(1, 11)];
        assert!(path.plan_lanes());
        let mut phases = 0;
        let succeeded = path
            .submit_lanes(|commands, lanes| {
                phases += 1;
                assert_eq!(lanes.len(), 2, "both spaces' lanes at once");
                // The second lane's completion and its copy of the replay are refused.
                for command in &mut commands[lanes[1].clone()] {
                    command.result = -(command.va as i32);
                }
                Ok(lanes[0].len())
            })
            .unwrap();
        assert_eq!((phases, succeeded), (1, 1));
        assert_eq!(path.batch.iter().map(|c| c.result).collect::<Vec<_>>(), [0, -20, -11], "a replay keeps a refusal");
        // A refused phase ends the batch there: a second phase, for a replay after a PAT page
        // was re-armed, never runs.
        path.batch.push(kernel(kabi::WIC_CMD_REARM_PAT, 2, 2, 22));
        path.batch.push(replay(1, 12));
        assert!(path.plan_lanes());
        assert_eq!(path.lanes.phases.len(), 2);
        let mut phases = 0;
        let refused = path.submit_lanes(|_, _| {
            phases += 1;
            Err(std::io::Error::from_raw_os_error(libc::EINVAL))
        });
        assert_eq!((phases, refused.unwrap_err().raw_os_error()), (1, Some(libc::EINVAL)));
    }

    proptest::proptest! {
        /// Whatever the batch: each command runs once (a replay at least once); each space's in
        /// the batch's order; a command on a GPU that a replay follows in the batch has its GPU
        /// replayed after it runs; and a replay runs after every PAT page re-armed before it.
        #[test]
        fn lanes_keep_each_spaces_order_and_replay_after_what_needs_it(
            commands in proptest::collection::vec((0u32..4, 1u32..4, 1u32..4), 2..40)
        ) {
            let opcodes =
                [kabi::WIC_CMD_COMPLETE, kabi::WIC_CMD_SERVICE_PAT, kabi::WIC_CMD_REARM_PAT, kabi::WIC_CMD_REPLAY];
            let mut path = BatchPath::new(&EngineConfig::default());
            path.batch = commands
                .iter()
                .enumerate()
                .map(|(i, &(op, space, gpu))| match opcodes[op as usize] {
                    kabi::WIC_CMD_REPLAY => replay(gpu, i as u64),
                    opcode => kernel(opcode, space, gpu, i as u64),
                })
                .collect();
            if !path.plan_lanes() {
                let mut spaces = path.batch.iter().filter(|c| c.opcode != kabi::WIC_CMD_REPLAY).map(|c| c.space_id);
                let first = spaces.next();
                proptest::prop_assert!(spaces.all(|s| Some(s) == first));
                return Ok(());
            }
            // Where each copy of each batch command runs: (phase, lane, place in the lane).
            let planned = planned(&path);
            let mut runs: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); path.batch.len()];
            for (phase, lanes) in planned.iter().enumerate() {
                for (lane, vas) in lanes.iter().enumerate() {
                    for (k, &va) in vas.iter().enumerate() {
                        runs[va as usize].push((phase, lane, k));
                    }
                }
            }
            let replays = |c: &WicCommand| c.opcode == kabi::WIC_CMD_REPLAY;
            let after = |a: (usize, usize, usize), r: (usize, usize, usize)| a.0 < r.0 || (a.0 == r.0 && a.1 == r.1 && a.2 < r.2);
            for (i, a) in path.batch.iter().enumerate().filter(|(_, a)| !replays(a)) {
                let later: Vec<usize> =
                    (i + 1..path.batch.len()).filter(|&j| replays(&path.batch[j]) && path.batch[j].gpu_id == a.gpu_id).collect();
                proptest::prop_assert!(
                    later.is_empty() || later.iter().any(|&j| runs[j].iter().any(|&r| after(runs[i][0], r))),
                    "command {} is followed by replays {:?} of its GPU, none of which runs after it", i, later
                );
            }
            for (i, a) in path.batch.iter().enumerate() {
                for (j, b) in path.batch.iter().enumerate().skip(i + 1) {
                    let (ra, rb) = (runs[i][0], &runs[j]);
                    if !replays(a) && !replays(b) && a.space_id == b.space_id {
                        proptest::prop_assert!(after(ra, rb[0]), "space {}'s commands {} and {} out of order", a.space_id, i, j);
                    }
                    if a.opcode == kabi::WIC_CMD_REARM_PAT && replays(b) {
                        proptest::prop_assert!(rb.iter().all(|r| ra.0 < r.0), "replay {} may run before re-arm {}", j, i);
                    }
                }
            }
        }
    }
}
