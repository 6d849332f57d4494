//! The shim backend as the fast path drives it: channels placed in applications' managed
//! memory through `/dev/wic`, host producers' bytes handed to the module from the daemon's
//! mapping of their regions.

use std::collections::HashSet;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use wic_engine::{ChannelId, ChannelLayout, ChannelSpec, Command, DataSource, FaultSink, Fill, Nanos};
use wic_kernel_io::{DeviceError, HostBytes, PlacedChannel, ShimSession};
use wic_proto::message::{ErrorCode, Stats, Submissions, WireError};
use wic_proto::shm::{ChannelState, ProducerRegion};

use super::backend::{
    end_publish, Added, Backend, BackendTraits, ChannelMap, Counts, Executed, ExecutionLog, HoldBound,
    PlacementRequest, RingPass, Source,
};

/// A channel placed in an application's address space.
pub struct ShimChannel {
    pub producer: Option<ProducerRegion>,
    placed: PlacedChannel,
    /// Each slot's runs, by the engine's addresses: which of them a command names.
    runs: Vec<[u64; 2]>,
}

impl ShimChannel {
    /// Tells the host producer, if any, that the run of `slot` at `companion_va` is unmapped
    /// and may be written in place next; before the delivery is counted, so that a producer
    /// that sees the delivery never writes the run just mapped.
    fn hand_over(&self, slot: u32, companion_va: u64) {
        let (Some(producer), Some(runs)) = (&self.producer, self.runs.get(slot as usize)) else { return };
        producer.set_writable_side(slot, u8::from(companion_va == runs[1]));
    }
}

/// The host producers' bytes as the module reads them: the daemon's mappings of their regions.
struct ProducerBytes<'a>(&'a ChannelMap<ShimChannel>);

impl HostBytes for ProducerBytes<'_> {
    fn data(&self, channel: ChannelId, source: DataSource, len: u64) -> Option<u64> {
        let DataSource::Host { offset } = source else { return None };
        self.0.get(&channel.0)?.producer.as_ref()?.data_address(offset, len)
    }

    fn heads(&self, channel: ChannelId, slot: u32, pages: u32) -> Option<u64> {
        let producer = self.0.get(&channel.0)?.producer.as_ref().filter(|p| p.supports_in_place())?;
        (slot < producer.layout().slots && pages as usize <= producer.layout().pages_per_run())
            .then(|| producer.heads_ptr(slot) as u64)
    }
}

/// How often a range or space the module refused to let go of is asked again.
pub const RELEASE_RETRY: Duration = Duration::from_millis(100);

/// What the module refused to let go of (it keeps it, and the faults held there held, and
/// completes them when it finally lets go): asked again every [`RELEASE_RETRY`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stuck {
    Range(u32),
    Space(u32),
}

/// The session on `/dev/wic` and the channels placed through it.
pub struct ShimGpus {
    backend: ShimSession,
    channels: ChannelMap<ShimChannel>,
    spaces: HashSet<u32>,
    /// Ranges, then spaces, to unregister or detach again.
    stuck: Vec<Stuck>,
    /// When the module was last asked again, in the core's time (its start when never).
    last_retry: Nanos,
    /// The command batches submitted to the module and what they took (`wicctl stats`).
    submissions: Submissions,
}

/// The pages a batch of `commands` maps or unmaps, as the emulator's model counts them for
/// `daemon.per_page_ns` (a completed run's companion unmapped and its run mapped, a PAT page
/// serviced or rearmed), and the bytes the module copies from host producers; None when a
/// producer GPU's data is copied, a DMA the model charges to the link instead.
fn pages_and_host_bytes(commands: &[Command]) -> Option<(u64, u64)> {
    commands.iter().try_fold((0, 0), |(pages, bytes), command| match *command {
        Command::Complete { fill: Fill::Data { source: DataSource::Gpu { .. }, .. }, .. } => None,
        Command::Complete { pages: run, fill, .. } => {
            let copied = match fill {
                Fill::Data { len, .. } => len,
                Fill::Heads => 8 * u64::from(run),
                Fill::Marker(_) => 0,
            };
            Some((pages + 2 * u64::from(run), bytes + copied))
        }
        Command::ServicePat { .. } | Command::RearmPat { .. } => Some((pages + 1, bytes)),
        Command::Replay { .. } | Command::MissedPublish { .. } | Command::Expired { .. } => Some((pages, bytes)),
    })
}

/// The control plane's view of a module error: what the client did wrong, or an I/O error.
fn wire_error(what: &str, e: DeviceError) -> WireError {
    let code = match &e {
        DeviceError::Call { errno: Errno::EEXIST, .. } => ErrorCode::Busy,
        DeviceError::Call { errno: Errno::ENOSPC, .. } => ErrorCode::Exhausted,
        DeviceError::Call {
            errno: Errno::EINVAL | Errno::EBADF | Errno::ENOTTY | Errno::EFAULT | Errno::EMEDIUMTYPE,
            ..
        } => ErrorCode::Invalid,
        _ => ErrorCode::Io,
    };
    WireError::new(code, format!("{what}: {e}"))
}

impl ShimGpus {
    /// Drives `backend`.
    pub fn new(backend: ShimSession) -> Self {
        Self {
            backend,
            channels: ChannelMap::default(),
            spaces: HashSet::new(),
            stuck: Vec::new(),
            last_retry: 0,
            submissions: Submissions::default(),
        }
    }

    /// Places `layout` at `base` in `space` and returns the layout with the application's
    /// addresses, as its kernels use them. A host producer's bytes are in `region`; a GPU
    /// producer's in the application's managed memory, which the module copies from.
    fn place(
        &mut self,
        layout: &ChannelLayout,
        spec: &ChannelSpec,
        at: PlacementRequest,
        region: Option<ProducerRegion>,
    ) -> Result<ChannelLayout, WireError> {
        if !self.spaces.contains(&at.space) {
            return Err(WireError::new(ErrorCode::Invalid, "the address space is not attached"));
        }
        let placed = self
            .backend
            .place(layout, spec.producer, at.space, at.base_va)
            .map_err(|e| wire_error("placing the channel", e))?;
        let mut seen = layout.clone();
        let process = |va: u64| placed.placement.process_va(va).expect("every run and PAT page is placed");
        for slot in &mut seen.slots {
            slot.runs = slot.runs.map(process);
            slot.pat = slot.pat.map(|pat| pat.map(process));
        }
        let runs = layout.slots.iter().map(|slot| slot.runs).collect();
        self.channels.insert(layout.id.0, ShimChannel { producer: region, placed, runs });
        Ok(seen)
    }
}

impl Backend for ShimGpus {
    /// It holds real GPU faults, in the application's own memory, and the module ends a hold
    /// itself after its `max_hold_ms`.
    fn traits(&self) -> BackendTraits {
        BackendTraits {
            name: "shim",
            holds_gpu_faults: true,
            pages_from_pool: false,
            hold_bound: Some(HoldBound {
                what: "wic_shim's max_hold_ms",
                read_ms: wic_kernel_io::device::module_max_hold_ms,
            }),
        }
    }

    fn check(&self, _spec: &ChannelSpec, placement: Option<PlacementRequest>) -> Result<(), WireError> {
        placement.map(|_| ()).ok_or_else(unplaced)
    }

    fn add(
        &mut self,
        spec: &ChannelSpec,
        layout: &ChannelLayout,
        placement: Option<PlacementRequest>,
    ) -> Result<Added, WireError> {
        let at = placement.ok_or_else(unplaced)?;
        let (mut added, region) = Added::with_producer(spec, layout)?;
        added.layout = self.place(layout, spec, at, region)?;
        Ok(added)
    }

    /// Unregisters the channel's ranges, and asks again later while the module refuses.
    fn remove(&mut self, channel: u32, state: ChannelState) {
        let Some(removed) = self.channels.remove(&channel) else { return };
        if let Err(e) = self.backend.unplace(&removed.placed) {
            tracing::warn!(channel, "unregistering the channel's pages: {e}; asking again every {RELEASE_RETRY:?}");
            self.stuck.extend(e.refused.iter().map(|&(id, _)| Stuck::Range(id)));
        }
        if let Some(producer) = &removed.producer {
            producer.set_state(state);
        }
    }

    fn has(&self, channel: u32) -> bool {
        self.channels.contains_key(&channel)
    }

    fn channel_ids(&self) -> Vec<u32> {
        self.channels.keys().copied().collect()
    }

    fn producer(&self, channel: u32) -> Option<&ProducerRegion> {
        self.channels.get(&channel)?.producer.as_ref()
    }

    /// Runs `commands` as one batch.
    fn execute(&mut self, commands: &[Command], log: &mut impl ExecutionLog) -> Executed {
        let channels = &self.channels;
        let mut done = Executed::default();
        let mut all_carried_out = true;
        let outcome = |command: &Command, result: Result<i32, wic_kernel_io::CommandError>| {
            let carried_out = result == Ok(0);
            all_carried_out &= carried_out;
            // The module's own expiry (max_hold_ms) completed that generation with the timeout
            // marker before this completion came: nothing to retry. wicd hears of it from the
            // expiry's record, or, when the ring had no room for that, from its own timeout.
            let expired = result == Ok(-(Errno::ESTALE as i32));
            if expired {
                tracing::info!("{command:?}: the module had completed that generation itself (max_hold_ms)");
            } else if !carried_out {
                done.failed += 1;
                tracing::warn!("{command:?} failed: {}", describe(result));
            }
            // Its companion is unmapped: before the delivery is counted. An expired run's record
            // says so instead (the module may have completed the page alone, leaving it mapped).
            if let (true, Command::Complete { channel, slot, companion_va, .. }) = (carried_out, command) {
                if let Some(placed) = channels.get(&channel.0) {
                    placed.hand_over(*slot, *companion_va);
                }
            }
            match *command {
                Command::Complete { channel, slot, fill: fill @ (Fill::Data { .. } | Fill::Heads), .. } => {
                    if !carried_out && !expired {
                        log.unfilled(*command);
                    }
                    let Some(producer) = channels.get(&channel.0).and_then(|c| c.producer.as_ref()) else {
                        return;
                    };
                    end_publish(producer, slot, fill, carried_out);
                    if carried_out {
                        log.delivered(channel.0);
                    }
                }
                Command::MissedPublish { channel, slot } => {
                    if let Some(producer) = channels.get(&channel.0).and_then(|c| c.producer.as_ref()) {
                        producer.mark_missed(slot);
                    }
                }
                Command::Expired { channel, slot, companion_va, missed } => {
                    let Some(placed) = channels.get(&channel.0) else { return };
                    placed.hand_over(slot, companion_va);
                    if let (true, Some(producer)) = (missed, &placed.producer) {
                        producer.mark_missed(slot);
                    }
                }
                _ if !carried_out => {}
                Command::Complete { channel, fill: Fill::Marker(marker), .. } if channels.contains_key(&channel.0) => {
                    log.failed(channel.0, marker);
                }
                Command::Replay { .. } => done.replays += 1,
                _ => {}
            }
        };
        let submitted = Instant::now();
        let result = self.backend.execute(commands, ProducerBytes(channels), outcome);
        let took = submitted.elapsed().as_nanos().try_into().unwrap_or(u64::MAX);
        if let Err(e) = result {
            // Each of its commands was counted failed, and its producers told, as it came back.
            tracing::error!("submitting {} commands to the module: {e}", commands.len());
        } else if all_carried_out {
            // A batch with a failed or expired command took another path than the model's.
            if let Some((pages, bytes)) = pages_and_host_bytes(commands) {
                self.submissions.record(pages, bytes, took);
            }
        }
        done
    }
    /// The shim's consumers are GPU kernels: their faults come through the module's ring.
    fn take_channel_faults(&mut self, _channel: u32, _sink: &mut impl FaultSink) -> RingPass {
        RingPass::Emptied
    }

    fn source_fd(&mut self, source: Source) -> Option<RawFd> {
        match source {
            Source::RecordRing => Some(self.backend.device().fd().as_raw_fd()),
            Source::Space(_) => None,
        }
    }

    fn take_source(&mut self, source: Source, sink: &mut impl FaultSink) {
        if source == Source::RecordRing {
            self.backend.take_faults(sink);
        }
    }

    /// The module keeps its own reference to the space, so `uvm` may be closed afterwards.
    fn attach_space(&mut self, uvm: OwnedFd) -> Result<u32, WireError> {
        let space = self.backend.device().attach(uvm.as_fd()).map_err(|e| match e {
            DeviceError::Call { errno: Errno::EOPNOTSUPP, .. } => WireError::new(
                ErrorCode::Unsupported,
                "a GPU registered in the address space is one whose faults wic cannot hold: it cannot cancel faults per VA (Pascal or older), or it is a MIG partition under driver 550, which attributes every fault to the first partition",
            ),
            DeviceError::Call { errno: Errno::EPERM, .. } => WireError::new(
                ErrorCode::Unsupported,
                "the GPUs run in Confidential Computing mode, where nvidia-uvm cannot write a held page's data: wic cannot hold faults there",
            ),
            e => wire_error("attaching the address space", e),
        })?;
        self.spaces.insert(space);
        Ok(space)
    }

    /// Asked again later while the module refuses.
    fn detach_space(&mut self, space: u32) {
        if self.spaces.remove(&space) {
            if let Err(e) = self.backend.device().detach(space) {
                tracing::warn!(space, "detaching the address space: {e}; asking again every {RELEASE_RETRY:?}");
                self.stuck.push(Stuck::Space(space));
            }
        }
    }

    fn watch(&mut self, _space: u32, _start: u64, _end: u64) -> Result<(), WireError> {
        Err(WireError::new(
            ErrorCode::Unsupported,
            "the shim backend holds the faults of its channels itself: nothing to watch",
        ))
    }

    /// What is left of [`RELEASE_RETRY`] since the last time the module was asked again.
    fn retry_in(&self, now: Nanos) -> Option<Nanos> {
        let due = self.last_retry.saturating_add(RELEASE_RETRY.as_nanos() as Nanos);
        (!self.stuck.is_empty()).then(|| due.saturating_sub(now))
    }

    /// Asks the module again, at most every [`RELEASE_RETRY`], to let go of the ranges and
    /// spaces it refused (while it was suspended, short of memory, or a marker's write failed):
    /// until then their pages stay wic pages, and a fault there, such as the application's once
    /// it reuses the memory, would be held with no channel to complete it. Ranges first: a
    /// space's detach closes its ranges too, after which their unregister finds nothing.
    fn retry(&mut self, now: Nanos) {
        if self.stuck.is_empty() || now.saturating_sub(self.last_retry) < RELEASE_RETRY.as_nanos() as Nanos {
            return;
        }
        self.last_retry = now;
        let device = self.backend.device();
        self.stuck.sort_by_key(|stuck| matches!(stuck, Stuck::Space(_)));
        self.stuck.retain(|&stuck| {
            let result = match stuck {
                Stuck::Range(id) => device.unregister(id),
                Stuck::Space(id) => device.detach(id),
            };
            match result {
                Ok(()) | Err(DeviceError::Call { errno: Errno::ENOENT, .. }) => {
                    tracing::info!("{stuck:?} let go of at last");
                    false
                }
                Err(e) => {
                    tracing::debug!("{stuck:?} still refused: {e}");
                    true
                }
            }
        });
    }
    fn report(&mut self, stats: &mut Stats) {
        stats.submissions = self.submissions.clone();
    }

    fn counts(&mut self, _overflows: &mut dyn FnMut(u32, u64)) -> Counts {
        let ring = self.backend.device().ring();
        let anomalies = ring.anomalies();
        Counts {
            // Faults the module could not record (ring or held table full): held unrecorded
            // until the session ends.
            overflows: ring.dropped(),
            // Records read that no placed channel has.
            unrouted: self.backend.stray_records(),
            anomalies: anomalies.torn + anomalies.bad_head,
        }
    }
}

fn unplaced() -> WireError {
    WireError::new(
        ErrorCode::Invalid,
        "the shim backend places channels in the application's managed memory: attach_space, then give base_va",
    )
}

fn describe(result: Result<i32, wic_kernel_io::CommandError>) -> String {
    match result {
        Ok(errno) => Errno::from_raw(-errno).desc().to_string(),
        Err(e) => e.to_string(),
    }
}
