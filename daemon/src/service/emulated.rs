//! The emulated GPU backend: executes the Activator's commands on the channels' shared regions.
//!
//! Each channel's consumer region stands for the channel's pages in consumer-GPU memory and for
//! the GPU's page table (one state word per page); a replay bumps the replay counter of every
//! channel consuming on that GPU, which is what wakes the warps stalled on it. Its consumers
//! post their faults to the region's fault ring and ring the channel's fault doorbell.
//!
//! On a machine with a GPU, the backend also observes real GPU faults of applications that
//! attach their address space ([`Observer`]).

use std::os::fd::{OwnedFd, RawFd};
use std::path::Path;

use wic_engine::{
    ChannelLayout, ChannelSpec, Command, DataSource, EngineConfig, FaultEntry, FaultSink, Fill, GpuId, Producer,
    RawFaultEntry, VaWidth, PAGE_SIZE,
};
use wic_proto::message::{ErrorCode, Stats, WireError};
use wic_proto::shm::{
    ChannelState, ConsumerLayout, ConsumerRegion, ProducerRegion, FAULT_RING_ENTRIES, PAGE_MAPPED, PAGE_UNMAPPED,
};

use super::backend::{
    end_publish, eventfd, setup_error, Added, Backend, BackendTraits, Bell, ChannelMap, Counts, Executed, ExecutionLog,
    PlacementRequest, RingPass, SharedSide, Source,
};
use super::observe::Observer;
use super::runs::{RunIndex, RunPlace};

/// A channel's regions as the backend sees them.
pub struct EmulatedChannel {
    pub consumer_gpu: GpuId,
    pub consumer: ConsumerRegion,
    pub producer: Option<ProducerRegion>,
    /// The daemon's own read index of the consumer region's fault ring.
    fault_get: u64,
}

impl EmulatedChannel {
    /// A channel consuming on `consumer_gpu`.
    pub fn new(consumer_gpu: GpuId, consumer: ConsumerRegion, producer: Option<ProducerRegion>) -> Self {
        Self { consumer_gpu, consumer, producer, fault_get: 0 }
    }
}

/// The emulated backend's GPUs, stood in for by shared-memory regions that libwic's host
/// consumers fault on (not the discrete-event model of `wic_emu`): the channels' regions and an
/// index from run VA to channel slot.
pub struct SharedMemoryGpus {
    gpus: u16,
    va_width: VaWidth,
    channels: ChannelMap<EmulatedChannel>,
    runs: RunIndex,
    /// Passes over a channel's fault ring that read a whole ring's worth of entries: the
    /// rings wicd found full.
    rings_found_full: u64,
    /// Ring entries whose page is in no run of the ring's channel: dropped before the engine.
    misdirected: u64,
    observer: Observer,
    scratch: Vec<u8>,
    faults: Vec<RawFaultEntry>,
}

impl SharedMemoryGpus {
    /// `gpus` GPUs and no channels yet, for an engine configured as `config`; real GPU faults
    /// are observed through nvidia-uvm's tools node `uvm_tools`.
    pub fn new(gpus: u16, config: &EngineConfig, uvm_tools: &Path) -> Self {
        Self {
            gpus,
            va_width: config.va_width,
            channels: ChannelMap::default(),
            runs: RunIndex::new(config),
            rings_found_full: 0,
            misdirected: 0,
            observer: Observer::new(uvm_tools),
            scratch: Vec::new(),
            faults: Vec::new(),
        }
    }

    /// Adds a channel whose runs start at `runs[slot][side]`.
    pub fn insert(&mut self, channel: u32, regions: EmulatedChannel, runs: impl IntoIterator<Item = [u64; 2]>) {
        self.runs.add(channel, regions.consumer.layout().pages_per_run, runs);
        self.channels.insert(channel, regions);
    }

    /// The run that holds the page at `va`.
    fn place(&self, va: u64) -> Option<RunPlace> {
        self.runs.place(va)
    }

    fn consumer(&self, channel: u32) -> Option<&ConsumerRegion> {
        Some(&self.channels.get(&channel)?.consumer)
    }

    /// Writes the head words of the producer's in-place batch at the start of each page of the
    /// run (the producer wrote the rest through its own mapping of the consumer region); false
    /// if the channel has no host producer region with them.
    fn write_heads(&mut self, place: RunPlace, pages: u32) -> bool {
        let Some(channel) = self.channels.get(&place.channel) else { return false };
        let Some(producer) = channel.producer.as_ref().filter(|p| p.supports_in_place()) else {
            tracing::error!("channel {}: heads for a channel without a host producer region", place.channel);
            return false;
        };
        let mut heads = vec![0u64; pages as usize];
        producer.read_heads(place.slot, &mut heads);
        let first = channel.consumer.layout().run_page(place.slot, place.side);
        for (page, head) in (first..).zip(heads) {
            channel.consumer.write_pages(page, &head.to_ne_bytes());
        }
        true
    }

    /// Tells `place`'s producer that the slot's other run, just unmapped, may be written in
    /// place next.
    fn hand_over(&self, place: RunPlace) {
        if let Some(producer) = self.channels.get(&place.channel).and_then(|c| c.producer.as_ref()) {
            producer.set_writable_side(place.slot, 1 - place.side as u8);
        }
    }

    /// Copies the producer's bytes into the run; false if there are none this backend can copy.
    fn write_data(&mut self, place: RunPlace, len: u64, source: DataSource) -> bool {
        let DataSource::Host { offset } = source else {
            tracing::error!("emulated backend cannot copy from a GPU producer");
            return false;
        };
        let Some(channel) = self.channels.get(&place.channel) else { return false };
        let Some(producer) = &channel.producer else {
            tracing::error!("channel {}: data for a channel without a host producer region", place.channel);
            return false;
        };
        let capacity = channel.consumer.layout().pages_per_run as u64 * PAGE_SIZE;
        self.scratch.resize(len.min(capacity) as usize, 0);
        producer.read_data(offset, &mut self.scratch);
        channel.consumer.write_pages(channel.consumer.layout().run_page(place.slot, place.side), &self.scratch);
        true
    }

    /// Counts `place`'s publish delivered, once the run is mapped (an in-place one) or
    /// filled, and lets its producer publish again.
    fn delivered(&self, place: RunPlace, log: &mut impl ExecutionLog) {
        if let Some(producer) = self.producer(place.channel) {
            producer.mark_delivered(place.slot);
        }
        log.delivered(place.channel);
    }

    /// One pass over `channel`'s fault ring, at most [`FAULT_RING_ENTRIES`] entries: the
    /// client can keep refilling its ring as fast as wicd reads it, so the core gives each
    /// channel its turns in round robin, another one after a pass that read a whole ring's
    /// worth ([`RingPass::Full`]).
    fn take_turn(&mut self, channel: u32, sink: &mut impl FaultSink) -> RingPass {
        let Some(regions) = self.channels.get_mut(&channel) else { return RingPass::Emptied };
        let gpu = regions.consumer_gpu;
        self.faults.clear();
        regions.consumer.take_faults(&mut regions.fault_get, &mut self.faults);
        // The read index the warps check is published only after a pass: one that reads a
        // whole ring's worth of entries found the ring full, and warps faulting meanwhile were
        // turned away. Counted from entries read, not from a word the client writes, a client
        // can add at most one per ring's worth of entries it posts.
        let pass = if self.faults.len() == FAULT_RING_ENTRIES as usize {
            self.rings_found_full = self.rings_found_full.saturating_add(1);
            RingPass::Full
        } else {
            RingPass::Emptied
        };
        // A client writes only its own channel's ring: entries naming another channel's pages
        // are dropped, so no process can complete or steal another's requests.
        let before = self.faults.len();
        let (runs, width) = (&self.runs, self.va_width);
        self.faults.retain(|raw| {
            let va = FaultEntry::decode(raw, width).page();
            runs.place(va).is_some_and(|place| place.channel == channel)
        });
        self.misdirected += (before - self.faults.len()) as u64;
        if !self.faults.is_empty() {
            sink.faults(gpu, &self.faults);
        }
        pass
    }
}

impl Backend for SharedMemoryGpus {
    /// Its GPUs are shared memory: no warp of a real GPU waits on it; its pages are the pool's.
    fn traits(&self) -> BackendTraits {
        BackendTraits { name: "emulated", holds_gpu_faults: false, pages_from_pool: true, hold_bound: None }
    }

    fn check(&self, spec: &ChannelSpec, placement: Option<PlacementRequest>) -> Result<(), WireError> {
        if spec.consumer_gpu >= self.gpus {
            return Err(WireError::new(
                ErrorCode::Invalid,
                format!(
                    "consumer GPU {} does not exist: the emulated backend has {} GPUs",
                    spec.consumer_gpu, self.gpus
                ),
            ));
        }
        if placement.is_some() {
            return Err(WireError::new(
                ErrorCode::Unsupported,
                "the emulated backend places channels itself: drop base_va",
            ));
        }
        if let Producer::Gpu { .. } = spec.producer {
            // The emulator models GPU producers itself (wicd demo); this backend has no GPU
            // memory to copy a producer's bytes from.
            return Err(WireError::new(ErrorCode::Unsupported, "the emulated backend serves host producers only"));
        }
        Ok(())
    }

    fn add(
        &mut self,
        spec: &ChannelSpec,
        layout: &ChannelLayout,
        _placement: Option<PlacementRequest>,
    ) -> Result<Added, WireError> {
        let (mut added, region) = Added::with_producer(spec, layout)?;
        let consumer_layout = ConsumerLayout { slots: spec.slots, pages_per_run: layout.pages_per_run };
        let (consumer, consumer_fd) = ConsumerRegion::create(consumer_layout).map_err(setup_error)?;
        let fault_bell = OwnedFd::from(eventfd().map_err(|e| setup_error(e.into()))?);
        added.fds.consumer =
            Some(SharedSide { region: consumer_fd, doorbell: fault_bell.try_clone().map_err(setup_error)? });
        added.bells.push((fault_bell, Bell::Faults));
        let channel = EmulatedChannel::new(spec.consumer_gpu, consumer, region);
        self.insert(layout.id.0, channel, layout.slots.iter().map(|s| s.runs));
        Ok(added)
    }

    fn remove(&mut self, channel: u32, state: ChannelState) {
        self.runs.remove(channel);
        let Some(removed) = self.channels.remove(&channel) else { return };
        removed.consumer.set_state(state);
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

    /// Runs `commands` in order.
    fn execute(&mut self, commands: &[Command], log: &mut impl ExecutionLog) -> Executed {
        let mut done = Executed::default();
        for command in commands {
            match *command {
                Command::Complete { run_va, pages, fill, .. } => {
                    // One lookup serves the whole completion: the companion is the slot's
                    // other run.
                    let Some(place) = self.place(run_va) else {
                        tracing::error!("emulated backend got {command:?} for a run of no channel");
                        done.failed += 1;
                        continue;
                    };
                    let filled = match fill {
                        Fill::Data { len, source } => self.write_data(place, len, source),
                        Fill::Heads => self.write_heads(place, pages),
                        Fill::Marker(marker) => {
                            if let Some(region) = self.consumer(place.channel) {
                                let first = region.layout().run_page(place.slot, place.side);
                                for page in first..first + pages as usize {
                                    region.write_pages(page, &marker.word().to_le_bytes());
                                }
                                log.failed(place.channel, marker);
                            }
                            true
                        }
                    };
                    // As in the module: a run whose fill failed is not mapped. The engine consumed
                    // the generation either way: its producer may publish again, told that an
                    // in-place batch missed it.
                    if !filled {
                        done.failed += 1;
                        log.unfilled(*command);
                        if let Some(producer) = self.producer(place.channel) {
                            end_publish(producer, place.slot, fill, false);
                        }
                        continue;
                    }
                    if let Some(region) = self.consumer(place.channel) {
                        let layout = region.layout();
                        region.set_pages(layout.run_page(place.slot, 1 - place.side), pages as usize, PAGE_UNMAPPED);
                        region.set_pages(layout.run_page(place.slot, place.side), pages as usize, PAGE_MAPPED);
                    }
                    // The companion is unmapped: said before the publish counts delivered, so a
                    // producer that sees the delivery writes that run next, never this one.
                    self.hand_over(place);
                    if matches!(fill, Fill::Data { .. } | Fill::Heads) {
                        self.delivered(place, log);
                    }
                }
                Command::MissedPublish { channel, slot } => {
                    if let Some(producer) = self.producer(channel.0) {
                        producer.mark_missed(slot);
                    }
                }
                // This backend has no bound of its own on a hold.
                Command::Expired { .. } => {
                    tracing::error!("emulated backend got {command:?}, which it never causes");
                    done.failed += 1;
                }
                Command::ServicePat { .. } | Command::RearmPat { .. } => {
                    // Channels with GPU producers are refused at creation by this backend.
                    tracing::error!("emulated backend got {command:?} without a GPU producer");
                    done.failed += 1;
                }
                Command::Replay { gpu } => {
                    for channel in self.channels.values().filter(|c| c.consumer_gpu == gpu) {
                        channel.consumer.replay();
                    }
                    done.replays += 1;
                }
            }
        }
        done
    }

    fn take_channel_faults(&mut self, channel: u32, sink: &mut impl FaultSink) -> RingPass {
        self.take_turn(channel, sink)
    }

    fn source_fd(&mut self, source: Source) -> Option<RawFd> {
        match source {
            Source::RecordRing => None,
            Source::Space(space) => self.observer.fd(space),
        }
    }

    fn take_source(&mut self, source: Source, _sink: &mut impl FaultSink) {
        if let Source::Space(space) = source {
            self.observer.drain(space);
        }
    }

    fn attach_space(&mut self, uvm: OwnedFd) -> Result<u32, WireError> {
        self.observer.attach(uvm)
    }

    fn detach_space(&mut self, space: u32) {
        self.observer.detach(space);
    }

    fn watch(&mut self, space: u32, start: u64, end: u64) -> Result<(), WireError> {
        self.observer.watch(space, start, end)
    }

    fn counts(&mut self, overflows: &mut dyn FnMut(u32, u64)) -> Counts {
        for (&id, channel) in &self.channels {
            overflows(id, channel.consumer.overflows());
        }
        // Only what wicd saw itself: the region's overflow word is the client's to write.
        Counts { overflows: self.rings_found_full, unrouted: self.misdirected, anomalies: 0 }
    }

    fn report(&mut self, stats: &mut Stats) {
        self.observer.report(stats);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wic_engine::{ChannelSpec, Engine, ErrorMarker, Producer};
    use wic_proto::shm::ConsumerLayout;

    #[derive(Default)]
    struct Log {
        delivered: u32,
        failed: u32,
        unfilled: Vec<Command>,
    }

    impl ExecutionLog for Log {
        fn delivered(&mut self, _: u32) {
            self.delivered += 1;
        }

        fn failed(&mut self, _: u32, _: ErrorMarker) {
            self.failed += 1;
        }

        fn unfilled(&mut self, complete: Command) {
            self.unfilled.push(complete);
        }
    }

    #[test]
    fn a_completion_that_cannot_be_filled_is_counted_failed_and_leaves_its_run_unmapped() {
        let mut engine = Engine::new(EngineConfig::default()).unwrap();
        let spec =
            ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes: 64, slots: 1, timeout_ns: 1_000 };
        let layout = engine.open_channel(spec).unwrap();
        let (consumer, _fd) =
            ConsumerRegion::create(ConsumerLayout { slots: 1, pages_per_run: layout.pages_per_run }).unwrap();
        let mut gpus = SharedMemoryGpus::new(1, engine.config(), Path::new("/nonexistent"));
        // No producer region: there are no bytes to copy.
        gpus.insert(layout.id.0, EmulatedChannel::new(0, consumer, None), layout.slots.iter().map(|s| s.runs));
        let [run, companion] = layout.slots[0].runs;
        let complete = |run_va, fill| Command::Complete {
            gpu: 0,
            channel: layout.id,
            slot: 0,
            run_va,
            companion_va: companion,
            pages: 1,
            fill,
        };
        let data = Fill::Data { len: 64, source: DataSource::Host { offset: 0 } };
        let mapped = |gpus: &SharedMemoryGpus| {
            gpus.consumer(layout.id.0).unwrap().page_state(0).load(std::sync::atomic::Ordering::Acquire) == PAGE_MAPPED
        };
        let mut log = Log::default();

        let done = gpus.execute(&[complete(run, data), complete(run + 64 * PAGE_SIZE, data)], &mut log);
        assert_eq!((done.failed, log.delivered), (2, 0), "no producer bytes, then a run of no channel");
        assert_eq!(log.unfilled, [complete(run, data)], "only the channel's run can be completed again");
        assert!(!mapped(&gpus), "a run whose fill failed is not mapped");

        let done = gpus.execute(&[complete(run, Fill::Marker(ErrorMarker::Timeout))], &mut log);
        assert_eq!((done.failed, log.failed), (0, 1));
        assert!(mapped(&gpus), "a marker needs no producer bytes");
    }
}
