//! The service core: the engine, one backend, and what the daemon decides between them:
//! which channels may be created, the order of a channel's destruction, completing again with
//! the timeout marker what could not be filled, the counters and the snapshot.
//!
//! Sans-IO like the engine: time is an argument and every effect goes through the backend, so
//! the same core runs under the fast path's io_uring loop and under the unit tests below, which
//! drive it against the emulated backend with simulated time.

use std::collections::{HashMap, VecDeque};

use wic_engine::{ChannelId, ChannelSpec, Command, Engine, EngineError, ErrorMarker, Fill, GpuId, Nanos, PoolError};
use wic_proto::message::{ErrorCode, Stats, WireError};
use wic_proto::shm::{ChannelState, Publish};

use super::backend::ChannelMap;
use super::backend::{Added, Backend, Bell, ExecutionLog, PlacementRequest, RingPass, Source};

/// Per-channel counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ChannelCounters {
    pub publishes: u64,
    pub deliveries: u64,
    pub timeouts: u64,
    /// The highest overflow count its consumer region showed (emulated backend): the warps'
    /// own count, which the client writes. Kept at its highest so it never goes backwards,
    /// and never added to a daemon-wide total, as nothing bounds it.
    pub client_overflows: u64,
}

/// The core's view for stats and status.
pub struct Snapshot {
    pub stats: Stats,
    pub channels: HashMap<u32, ChannelCounters>,
    pub held: u32,
}

/// Counters the engine does not keep.
#[derive(Default)]
struct Counters {
    replays: u64,
    commands_failed: u64,
    channels: ChannelMap<ChannelCounters>,
    /// Data completions of the last execution whose fill failed.
    unfilled: Vec<Command>,
}

impl ExecutionLog for Counters {
    fn delivered(&mut self, channel: u32) {
        self.channels.entry(channel).or_default().deliveries += 1;
    }

    fn failed(&mut self, channel: u32, marker: ErrorMarker) {
        if marker == ErrorMarker::Timeout {
            self.channels.entry(channel).or_default().timeouts += 1;
        }
    }

    fn unfilled(&mut self, complete: Command) {
        self.unfilled.push(complete);
    }
}

fn engine_error(e: EngineError) -> WireError {
    let code = match e {
        EngineError::Invalid(_) | EngineError::SlotOutOfRange { .. } | EngineError::NotHostProducer(_) => {
            ErrorCode::Invalid
        }
        EngineError::Pool(PoolError::ZeroLength) => ErrorCode::Invalid,
        EngineError::Pool(_) | EngineError::Tags(_) | EngineError::SlotsExhausted { .. } => ErrorCode::Exhausted,
        EngineError::UnknownChannel(_) => ErrorCode::NotFound,
        EngineError::AlreadyPublished { .. } => ErrorCode::Busy,
    };
    WireError::new(code, e.to_string())
}

/// Into `out`: each data completion of `unfilled` again with the timeout marker, which needs
/// no producer bytes, then one replay per GPU concerned. The warps learn that their data did
/// not come instead of staying stalled until their channel closes.
fn marker_retries(unfilled: &[Command], out: &mut Vec<Command>) {
    let mut gpus = Vec::new();
    for &command in unfilled {
        let mut retry = command;
        if let Command::Complete { gpu, fill: fill @ (Fill::Data { .. } | Fill::Heads), .. } = &mut retry {
            *fill = Fill::Marker(ErrorMarker::Timeout);
            if !gpus.contains(gpu) {
                gpus.push(*gpu);
            }
            out.push(retry);
        }
    }
    out.extend(gpus.into_iter().map(|gpu| Command::Replay { gpu }));
}

/// Moves the replays of a batch to its end, one per GPU, in the order the GPUs first needed
/// one. The engine ends each call with the replays it owes, so a batch of several calls (a
/// doorbell's publishes of several slots, a deadline's timeouts beside a publish) interleaves
/// them with completions: each replay is a flush of the GPU's fault buffer and a push, and
/// each one splits the completions around it into separate calls of nvidia-uvm (one
/// acquisition of its locks and one wait for the TLB invalidates each) where consecutive
/// completions of a space share one. Later is safe: a replay only needs to come after the
/// commands that map what its warps wait for, and after a PAT page re-armed before it.
fn coalesce_replays(commands: &mut Vec<Command>, gpus: &mut Vec<GpuId>) {
    gpus.clear();
    commands.retain(|command| match *command {
        Command::Replay { gpu } => {
            if !gpus.contains(&gpu) {
                gpus.push(gpu);
            }
            false
        }
        _ => true,
    });
    commands.extend(gpus.iter().map(|&gpu| Command::Replay { gpu }));
}

/// The engine and a backend.
pub struct Core<B> {
    engine: Engine,
    backend: B,
    counters: Counters,
    commands: Vec<Command>,
    /// Channels the core failed, not yet taken ([`Core::take_failed`]).
    failed: Vec<u32>,
    /// Channels owed another turn at their fault rings ([`Core::take_owed`]), in the order
    /// their turns come: each once, and only while it exists.
    owed: VecDeque<u32>,
    /// Scratch of [`coalesce_replays`].
    replay_gpus: Vec<GpuId>,
}

impl<B: Backend> Core<B> {
    /// Drives `backend` with `engine`.
    pub fn new(engine: Engine, backend: B) -> Self {
        Self {
            engine,
            backend,
            counters: Counters::default(),
            commands: Vec::new(),
            failed: Vec::new(),
            owed: VecDeque::new(),
            replay_gpus: Vec::new(),
        }
    }

    /// The backend, for what needs no decision (attaching spaces, descriptors to poll).
    pub fn backend(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Whether `channel` exists.
    pub fn has(&self, channel: u32) -> bool {
        self.backend.has(channel)
    }

    /// When the core must next run: the engine's next deadline, or the backend's next retry.
    pub fn next_deadline(&mut self, now: Nanos) -> Option<Nanos> {
        let retry = self.backend.retry_in(now).map(|wait| now.saturating_add(wait));
        match (self.engine.next_deadline(), retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Creates a channel; the caller waits on the bells it returns, or, if it cannot,
    /// [`Core::abandon`]s the channel.
    pub fn create(&mut self, spec: ChannelSpec, placement: Option<PlacementRequest>) -> Result<Added, WireError> {
        self.backend.check(&spec, placement)?;
        let layout = self.engine.open_channel(spec).map_err(engine_error)?;
        match self.backend.add(&spec, &layout, placement) {
            Ok(created) => {
                self.counters.channels.insert(layout.id.0, ChannelCounters::default());
                Ok(created)
            }
            Err(e) => {
                self.abandon(layout.id.0);
                Err(e)
            }
        }
    }

    /// Closes a channel whose creation could not be finished; nothing held it yet.
    pub fn abandon(&mut self, channel: u32) {
        let mut discard = Vec::new();
        if self.engine.close_channel(ChannelId(channel), &mut discard).is_ok() {
            self.forget(channel, ChannelState::Closed);
        }
    }

    /// Destroys a channel: its held faults are completed with the closed marker before its
    /// pages go.
    pub fn destroy(&mut self, channel: u32) -> Result<(), WireError> {
        self.engine.close_channel(ChannelId(channel), &mut self.commands).map_err(engine_error)?;
        self.execute();
        self.forget(channel, ChannelState::Closed);
        Ok(())
    }

    fn forget(&mut self, channel: u32, state: ChannelState) {
        self.backend.remove(channel, state);
        self.counters.channels.remove(&channel);
        self.owed.retain(|&owed| owed != channel);
    }

    /// Publishes `slot` on behalf of its host producer (the control request; producers
    /// normally publish through their region and doorbell).
    pub fn publish(&mut self, now: Nanos, channel: u32, slot: u32) -> Result<(), WireError> {
        let spec = self.engine.channel_spec(ChannelId(channel)).map_err(engine_error)?;
        if slot >= spec.slots {
            return Err(WireError::new(
                ErrorCode::NotFound,
                format!("channel {channel} has {} slots, no slot {slot}", spec.slots),
            ));
        }
        let producer = self
            .backend
            .producer(channel)
            .ok_or_else(|| WireError::new(ErrorCode::Invalid, format!("channel {channel} has no host producer")))?;
        // The same step as libwic's fast path, then the same scan a doorbell triggers.
        if !producer.publish(slot) {
            return Err(WireError::new(
                ErrorCode::Busy,
                format!("channel {channel} slot {slot}: previous data not yet delivered"),
            ));
        }
        self.rung(now, channel, Bell::Published);
        Ok(())
    }

    /// `channel`'s doorbell `bell` rang.
    pub fn rung(&mut self, now: Nanos, channel: u32, bell: Bell) {
        match bell {
            // A channel already owed a turn gets no extra one by ringing.
            Bell::Faults if self.owed.contains(&channel) => return,
            Bell::Faults => self.take_turn(now, channel),
            Bell::Published => {
                let Some(producer) = self.backend.producer(channel) else { return };
                let mut published = 0;
                let (engine, commands) = (&mut self.engine, &mut self.commands);
                producer.take_published(|slot| {
                    let result = match producer.take_publish(slot) {
                        Publish::Buffer => engine.publish(now, ChannelId(channel), slot, commands),
                        Publish::InPlace { side } => {
                            engine.publish_in_place(now, ChannelId(channel), slot, side, commands)
                        }
                    };
                    match result {
                        Ok(()) => published += 1,
                        Err(e) => tracing::debug!("channel {channel}: publish of slot {slot} ignored: {e}"),
                    }
                });
                self.counters.channels.entry(channel).or_default().publishes += published;
            }
        }
        self.execute();
    }

    /// `source` is readable.
    pub fn ready(&mut self, now: Nanos, source: Source) {
        self.backend.take_source(source, &mut self.engine.intake(now, &mut self.commands));
        self.execute();
    }

    /// One turn of `channel` at its fault ring: one pass, at most a ring's worth of entries.
    ///
    /// The client writes its ring and can keep refilling it as fast as wicd reads it. Reading
    /// until it is empty would then never end, and every other channel, control request and
    /// the watchdog's snapshot would wait. So a pass that read a whole ring's worth, which may
    /// have left entries behind, owes the channel another turn, after the channels owed one
    /// already: on the next iteration of the fast path's loop, after control requests and
    /// other doorbells; meanwhile the loop does not sleep ([`Core::owes_turns`]).
    fn take_turn(&mut self, now: Nanos, channel: u32) {
        let pass = self.backend.take_channel_faults(channel, &mut self.engine.intake(now, &mut self.commands));
        if pass == RingPass::Full && !self.owed.contains(&channel) {
            self.owed.push_back(channel);
        }
    }

    /// Gives each channel owed a turn at its faults its next one, in the order they were
    /// owed; a channel whose ring is still not empty is owed again, for the next call.
    pub fn take_owed(&mut self, now: Nanos) {
        for _ in 0..self.owed.len() {
            let Some(channel) = self.owed.pop_front() else { break };
            self.take_turn(now, channel);
            self.execute();
        }
    }

    /// Whether channels are owed a turn, so the caller must not sleep.
    pub fn owes_turns(&self) -> bool {
        !self.owed.is_empty()
    }

    /// Times out what is due at `now`, and lets the backend retry what it must.
    pub fn tick(&mut self, now: Nanos) {
        self.engine.expire(now, &mut self.commands);
        self.execute();
        self.backend.retry(now);
    }

    /// A channel the core failed: its held faults completed with the closed marker, its pages
    /// given back and its regions closed, as [`Core::destroy`] leaves them, but its id kept
    /// until its owner destroys it. The caller stops listening to its doorbells.
    pub fn take_failed(&mut self) -> Option<u32> {
        self.failed.pop()
    }

    fn execute(&mut self) {
        self.run_commands();
        self.fail_unservable();
        if self.counters.unfilled.is_empty() {
            return;
        }
        // Once: a marker completion that fails too is not retried (`marker_retries` takes
        // data completions only); the module completes it when the channel closes.
        let mut unfilled = std::mem::take(&mut self.counters.unfilled);
        tracing::warn!(
            "{} completions could not write their data: completing them with the timeout marker",
            unfilled.len()
        );
        marker_retries(&unfilled, &mut self.commands);
        self.run_commands();
        unfilled.clear();
        self.counters.unfilled = unfilled;
    }

    /// Fails the channels a GPU the backend cannot hold faults of read without their data (one
    /// registered in the application's address space after it was attached): their warps
    /// cannot be served, so their applications are told by the channel's closing, and the
    /// daemon's log says why.
    fn fail_unservable(&mut self) {
        while let Some(channel) = self.engine.take_unservable() {
            if self.engine.fail_channel(channel, &mut self.commands).is_err() {
                continue;
            }
            tracing::error!(
                channel = channel.0,
                "a GPU that cannot hold faults (pre-Volta, or a MIG partition of a driver before 560) read a \
                 page of the channel without its data: the channel is closed"
            );
            self.run_commands();
            self.forget(channel.0, ChannelState::Closed);
            self.failed.push(channel.0);
        }
    }

    /// Runs the pending commands on the backend and counts what they did.
    fn run_commands(&mut self) {
        if self.commands.is_empty() {
            return;
        }
        coalesce_replays(&mut self.commands, &mut self.replay_gpus);
        let done = self.backend.execute(&self.commands, &mut self.counters);
        self.counters.replays += done.replays;
        self.counters.commands_failed += done.failed;
        self.commands.clear();
    }

    /// Completes every held fault with the stopping marker and drops every channel, whose
    /// regions show the daemon stopping; returns the channels dropped.
    pub fn shutdown(&mut self, now: Nanos) -> Vec<u32> {
        let channels = self.backend.channel_ids();
        // Faults posted but not read yet are held as well: read first, they get the stopping
        // marker like the rest, not the closed marker their channel's removal would give. One
        // pass each reads all a ring holds; a warp posting after it sees the stopping state.
        let mut intake = self.engine.intake(now, &mut self.commands);
        self.backend.take_source(Source::RecordRing, &mut intake);
        for &channel in &channels {
            self.backend.take_channel_faults(channel, &mut intake);
        }
        self.engine.shutdown(&mut self.commands);
        self.execute();
        for &channel in &channels {
            self.forget(channel, ChannelState::Stopping);
        }
        channels
    }

    /// The counters, the engine's and the backend's.
    pub fn snapshot(&mut self) -> Snapshot {
        let channels = &mut self.counters.channels;
        let counts = self.backend.counts(&mut |id, overflows| {
            let counters = channels.entry(id).or_default();
            counters.client_overflows = counters.client_overflows.max(overflows);
        });
        let s = self.engine.stats();
        let pool = self.engine.pool();
        let mut stats = Stats {
            faults_captured: s.entries + counts.unrouted,
            faults_held: s.held,
            faults_completed: s.delivered,
            faults_timed_out: s.timed_out,
            faults_cancelled: s.closed_while_held,
            faults_ignored: s.malformed
                + s.foreign
                + s.wrong_gpu
                + s.duplicates
                + s.stale
                + counts.unrouted
                + counts.anomalies,
            pfq_depth: self.engine.held(),
            dab_updates: s.dab_updates,
            pat_faults: s.pat_publishes + s.pat_duplicates,
            host_publishes: s.host_publishes,
            pool_pages: pool.capacity(),
            pool_pages_used: pool.capacity() - pool.free_pages(),
            pool_longest_free_run: pool.longest_free_run(),
            wake_latency_ns: super::wire_histogram(&s.wake_latency_ns),
            batch_sizes: super::wire_histogram(&s.batch_sizes),
            fault_buffer_overflows: counts.overflows,
            replays: self.counters.replays,
            commands_failed: self.counters.commands_failed,
            faults_expired_in_module: s.expired_elsewhere,
            channels: self.engine.channel_count() as u32,
            clients: 0,
            ..Stats::default()
        };
        self.backend.report(&mut stats);
        Snapshot {
            stats,
            channels: self.counters.channels.iter().map(|(id, counters)| (*id, *counters)).collect(),
            held: self.engine.held(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::service::emulated::SharedMemoryGpus;
    use wic_engine::fault::AccessType;
    use wic_engine::{ChannelLayout, DataSource, EngineConfig, FaultEntry, Producer, RawFaultEntry};
    use wic_proto::shm::{ConsumerLayout, ConsumerRegion, ProducerLayout, ProducerRegion, PAGE_MAPPED};

    /// The core on the emulated backend and one application's side of its channels, with
    /// simulated time: each step is an event the fast path would hand the core.
    struct Pair {
        core: Core<SharedMemoryGpus>,
        now: Nanos,
    }

    /// A channel as its application sees it: its layout and shared regions.
    struct Client {
        layout: ChannelLayout,
        consumer: ConsumerRegion,
        producer: ProducerRegion,
        gpu: u16,
    }

    impl Pair {
        fn new(gpus: u16) -> Self {
            let engine = Engine::new(EngineConfig { pool_pages: 256, ..EngineConfig::default() }).unwrap();
            let backend = SharedMemoryGpus::new(gpus, engine.config(), Path::new("/nonexistent"));
            Self { core: Core::new(engine, backend), now: 0 }
        }

        fn spec(gpu: u16, slots: u32, timeout: Nanos) -> ChannelSpec {
            ChannelSpec { consumer_gpu: gpu, producer: Producer::Host, message_bytes: 64, slots, timeout_ns: timeout }
        }

        fn open(&mut self, spec: ChannelSpec) -> Client {
            let added = self.core.create(spec, None).unwrap();
            let layout = added.layout;
            let consumer_layout = ConsumerLayout { slots: spec.slots, pages_per_run: layout.pages_per_run };
            let consumer = ConsumerRegion::open(&added.fds.consumer.unwrap().region, consumer_layout).unwrap();
            let producer_layout = ProducerLayout { slots: spec.slots, batch_bytes: layout.batch_bytes };
            let producer = ProducerRegion::open(&added.fds.producer.unwrap().region, producer_layout).unwrap();
            assert_eq!(added.bells.len(), 2, "a fault and a publish doorbell");
            Client { layout, consumer, producer, gpu: spec.consumer_gpu }
        }

        /// A warp of `client` faults on `va`, and the channel's fault doorbell rings.
        fn fault_at(&mut self, client: &Client, va: u64) {
            client.consumer.post_fault(&fault(va, client.gpu)).unwrap();
            self.core.rung(self.now, client.layout.id.0, Bell::Faults);
        }

        /// The producer publishes `data` in `slot`, and the publish doorbell rings.
        fn publish(&mut self, client: &Client, slot: u32, data: &[u8]) {
            client.producer.write_slot(slot, data);
            assert!(client.producer.publish(slot));
            self.core.rung(self.now, client.layout.id.0, Bell::Published);
        }

        fn advance_to(&mut self, now: Nanos) {
            self.now = now;
            self.core.tick(now);
        }
    }

    fn fault(va: u64, gpu: u16) -> RawFaultEntry {
        FaultEntry::replayable_gpc(va, AccessType::Read, 0, 0x10_0000 * (u64::from(gpu) + 1), 0, 0).encode()
    }

    impl Client {
        fn run_va(&self, slot: u32, side: usize) -> u64 {
            self.layout.slots[slot as usize].runs[side]
        }

        fn mapped(&self, slot: u32, side: usize) -> bool {
            let page = self.consumer.layout().run_page(slot, side);
            self.consumer.page_state(page).load(Ordering::Acquire) == PAGE_MAPPED
        }

        /// The first word of `slot`'s run on `side`, and the run's first `len` bytes.
        fn run(&self, slot: u32, side: usize, len: usize) -> (Option<ErrorMarker>, Vec<u8>) {
            let mut bytes = vec![0; len.max(8)];
            self.consumer.read_pages(self.consumer.layout().run_page(slot, side), &mut bytes);
            let word = u64::from_le_bytes(bytes[..8].try_into().unwrap());
            bytes.truncate(len);
            (ErrorMarker::from_word(word), bytes)
        }
    }

    #[test]
    fn a_published_batch_reaches_the_warp_that_faulted_on_its_run() {
        let mut pair = Pair::new(1);
        let client = pair.open(Pair::spec(0, 2, 1_000_000));
        pair.fault_at(&client, client.run_va(1, 0));
        assert_eq!(pair.core.snapshot().held, 1, "no data yet: the fault is held");
        assert!(!client.mapped(1, 0));
        let replays = client.consumer.replay_seq().load(Ordering::Acquire);

        pair.now = 10;
        pair.publish(&client, 1, b"the batch");
        assert!(client.mapped(1, 0));
        assert_eq!(client.run(1, 0, 9), (None, b"the batch".to_vec()));
        assert_eq!(client.consumer.replay_seq().load(Ordering::Acquire), replays + 1, "one replay wakes the warp");
        assert_eq!(client.producer.delivered(1).load(Ordering::Acquire), 1, "the slot may be published again");
        let snapshot = pair.core.snapshot();
        let counters = snapshot.channels[&client.layout.id.0];
        assert_eq!((counters.publishes, counters.deliveries, counters.timeouts), (1, 1, 0));
        assert_eq!((snapshot.held, snapshot.stats.faults_completed, snapshot.stats.replays), (0, 1, 1));
    }

    #[test]
    fn the_publishes_of_one_doorbell_wake_their_warps_with_one_replay_after_every_completion() {
        let mut pair = Pair::new(1);
        let client = pair.open(Pair::spec(0, 3, 1_000_000));
        for slot in 0..3 {
            pair.fault_at(&client, client.run_va(slot, 0));
        }
        let replays = client.consumer.replay_seq().load(Ordering::Acquire);
        // Three slots published before wicd reads the doorbell once.
        for slot in 0..3 {
            client.producer.write_slot(slot, &[slot as u8 + 1; 64]);
            assert!(client.producer.publish(slot));
        }
        pair.core.rung(pair.now, client.layout.id.0, Bell::Published);
        for slot in 0..3 {
            assert!(client.mapped(slot, 0));
            assert_eq!(client.run(slot, 0, 64), (None, vec![slot as u8 + 1; 64]));
        }
        assert_eq!(
            client.consumer.replay_seq().load(Ordering::Acquire),
            replays + 1,
            "one replay, not one per publish"
        );
        assert_eq!(pair.core.snapshot().stats.replays, 1);
    }

    #[test]
    fn replays_go_to_the_end_of_a_batch_once_per_gpu_in_the_order_first_needed() {
        let complete = |gpu, slot| Command::Complete {
            gpu,
            channel: ChannelId(1),
            slot,
            run_va: 0x1000 * u64::from(slot),
            companion_va: 0,
            pages: 1,
            fill: Fill::Marker(ErrorMarker::Timeout),
        };
        let rearm = Command::RearmPat { gpu: 2, va: 0x9000 };
        let mut commands = vec![
            complete(1, 0),
            Command::Replay { gpu: 1 },
            complete(0, 1),
            rearm,
            Command::Replay { gpu: 0 },
            complete(1, 2),
            Command::Replay { gpu: 1 },
        ];
        coalesce_replays(&mut commands, &mut Vec::new());
        assert_eq!(
            commands,
            [
                complete(1, 0),
                complete(0, 1),
                rearm,
                complete(1, 2),
                Command::Replay { gpu: 1 },
                Command::Replay { gpu: 0 }
            ]
        );
    }

    #[test]
    fn a_fault_without_data_times_out_at_its_deadline_and_not_before() {
        let mut pair = Pair::new(1);
        let client = pair.open(Pair::spec(0, 1, 5_000));
        pair.now = 100;
        pair.fault_at(&client, client.run_va(0, 0));
        let deadline = pair.core.next_deadline(pair.now).expect("a held fault has a deadline");
        assert_eq!(deadline, 5_100);
        pair.advance_to(deadline - 1);
        assert_eq!(pair.core.snapshot().held, 1);
        pair.advance_to(deadline);
        assert!(client.mapped(0, 0));
        assert_eq!(client.run(0, 0, 0).0, Some(ErrorMarker::Timeout));
        let snapshot = pair.core.snapshot();
        assert_eq!((snapshot.held, snapshot.stats.faults_timed_out), (0, 1));
        assert_eq!(snapshot.channels[&client.layout.id.0].timeouts, 1);
        assert_eq!(pair.core.next_deadline(pair.now), None);
    }

    #[test]
    fn destroying_a_channel_completes_its_held_faults_with_the_closed_marker_before_its_pages_go() {
        let mut pair = Pair::new(1);
        let client = pair.open(Pair::spec(0, 1, 1_000_000));
        pair.fault_at(&client, client.run_va(0, 0));
        let id = client.layout.id.0;
        pair.core.destroy(id).unwrap();
        assert!(client.mapped(0, 0), "the warp was woken");
        assert_eq!(client.run(0, 0, 0).0, Some(ErrorMarker::ChannelClosed));
        assert_eq!(client.consumer.state(), ChannelState::Closed);
        assert_eq!(client.producer.state(), ChannelState::Closed);
        assert!(!pair.core.has(id));
        let snapshot = pair.core.snapshot();
        assert!(snapshot.channels.is_empty());
        assert_eq!((snapshot.stats.channels, snapshot.stats.faults_cancelled), (0, 1));
        assert_eq!(snapshot.stats.pool_pages_used, 0, "its pages went back to the pool");
        assert_eq!(pair.core.destroy(id).unwrap_err().code, ErrorCode::NotFound);
    }

    #[test]
    fn a_channel_a_gpu_without_holds_read_is_closed_with_its_held_faults_and_handed_to_the_caller() {
        let mut pair = Pair::new(1);
        let client = pair.open(Pair::spec(0, 2, 1_000_000));
        let other = pair.open(Pair::spec(0, 1, 1_000_000));
        pair.fault_at(&client, client.run_va(0, 0));
        // What the shim backend hands the engine for a record of an unsupported GPU.
        pair.core.engine.unservable(client.run_va(1, 0));
        pair.advance_to(1);
        let id = client.layout.id.0;
        assert_eq!(pair.core.take_failed(), Some(id));
        assert_eq!(pair.core.take_failed(), None);
        assert_eq!(client.run(0, 0, 0).0, Some(ErrorMarker::ChannelClosed), "its held fault was completed");
        assert_eq!(client.consumer.state(), ChannelState::Closed);
        assert!(!pair.core.has(id));
        assert!(pair.core.has(other.layout.id.0), "other channels go on");
        // Its id is not given to another channel until its owner destroys it.
        let next = pair.open(Pair::spec(0, 1, 1_000_000));
        assert_ne!(next.layout.id.0, id);
        pair.core.destroy(id).unwrap();
        assert_eq!(pair.core.snapshot().stats.channels, 2);
        assert_eq!(pair.open(Pair::spec(0, 1, 1_000_000)).layout.id.0, id, "destroyed, its id is free again");
    }

    #[test]
    fn shutdown_reads_faults_posted_but_not_rung_and_gives_every_one_the_stopping_marker() {
        let mut pair = Pair::new(2);
        let rung = pair.open(Pair::spec(0, 1, 1_000_000));
        let silent = pair.open(Pair::spec(1, 1, 1_000_000));
        pair.fault_at(&rung, rung.run_va(0, 0));
        // Posted, but the doorbell has not been read yet.
        silent.consumer.post_fault(&fault(silent.run_va(0, 0), 1)).unwrap();
        let mut dropped = pair.core.shutdown(pair.now);
        dropped.sort_unstable();
        assert_eq!(dropped, [rung.layout.id.0, silent.layout.id.0]);
        for client in [&rung, &silent] {
            assert_eq!(client.run(0, 0, 0).0, Some(ErrorMarker::DaemonStopping));
            assert!(client.mapped(0, 0));
            assert_eq!(client.consumer.state(), ChannelState::Stopping);
            assert_eq!(client.producer.state(), ChannelState::Stopping);
        }
    }

    #[test]
    fn channels_the_backend_cannot_serve_are_refused_and_leave_nothing_behind() {
        let mut pair = Pair::new(2);
        let refusals = [
            (Pair::spec(2, 1, 1_000), None, ErrorCode::Invalid),
            (Pair::spec(0, 1, 1_000), Some(PlacementRequest { space: 1, base_va: 0x10_0000 }), ErrorCode::Unsupported),
            (
                ChannelSpec { producer: Producer::Gpu { gpu: 1, base_va: 0x10_0000 }, ..Pair::spec(0, 1, 1_000) },
                None,
                ErrorCode::Unsupported,
            ),
            (Pair::spec(0, 0, 1_000), None, ErrorCode::Invalid),
        ];
        for (spec, placement, code) in refusals {
            let refused = pair.core.create(spec, placement).err().expect("refused");
            assert_eq!(refused.code, code, "{spec:?} at {placement:?}: {}", refused.message);
        }
        let snapshot = pair.core.snapshot();
        assert_eq!((snapshot.stats.channels, snapshot.stats.pool_pages_used), (0, 0));
        assert!(snapshot.channels.is_empty());
        assert!(pair.core.backend().channel_ids().is_empty());
    }

    #[test]
    fn a_fault_naming_another_channels_page_is_dropped_and_counted() {
        let mut pair = Pair::new(1);
        let victim = pair.open(Pair::spec(0, 1, 1_000_000));
        let intruder = pair.open(Pair::spec(0, 1, 1_000_000));
        pair.publish(&victim, 0, b"not yours");
        pair.fault_at(&intruder, victim.run_va(0, 0));
        assert!(!victim.mapped(0, 0), "the victim's data stays where it is");
        let snapshot = pair.core.snapshot();
        assert_eq!((snapshot.held, snapshot.stats.faults_ignored), (0, 1));
        assert_eq!(snapshot.channels[&victim.layout.id.0].deliveries, 0);
    }

    /// Fills `client`'s fault ring with faults on its first run; how many it took.
    fn fill_ring(client: &Client) -> u64 {
        let entry = fault(client.run_va(0, 0), client.gpu);
        let mut posted = 0;
        while client.consumer.post_fault(&entry).is_ok() {
            posted += 1;
        }
        posted
    }

    /// Ring entries the core has read so far, routed or not.
    fn captured(pair: &mut Pair) -> u64 {
        pair.core.snapshot().stats.faults_captured
    }

    #[test]
    fn a_full_fault_ring_owes_its_channel_another_turn_after_the_others() {
        let mut pair = Pair::new(1);
        let busy = pair.open(Pair::spec(0, 1, 1_000_000));
        let posted = fill_ring(&busy);
        pair.core.rung(pair.now, busy.layout.id.0, Bell::Faults);
        assert_eq!(captured(&mut pair), posted);
        assert!(pair.core.owes_turns(), "a whole ring's worth was read: more may wait, the loop must not sleep");
        pair.core.take_owed(pair.now);
        assert!(!pair.core.owes_turns(), "the next pass found the ring empty");
        let snapshot = pair.core.snapshot();
        assert_eq!(snapshot.stats.fault_buffer_overflows, 1, "the ring was found full once");
        assert_eq!(snapshot.held, 1, "{posted} entries for one run hold one fault");
    }

    #[test]
    fn channels_refilling_their_rings_endlessly_take_turns_and_starve_no_one() {
        let mut pair = Pair::new(1);
        let first = pair.open(Pair::spec(0, 1, 1_000_000));
        let second = pair.open(Pair::spec(0, 1, 1_000_000));
        let quiet = pair.open(Pair::spec(0, 1, 1_000_000));
        let ring = fill_ring(&first);
        pair.core.rung(pair.now, first.layout.id.0, Bell::Faults);
        assert_eq!(fill_ring(&first), ring, "the pass read the whole ring");
        // Ringing again while owed a turn gives it no extra one.
        pair.core.rung(pair.now, first.layout.id.0, Bell::Faults);
        assert_eq!(captured(&mut pair), ring);
        assert_eq!(fill_ring(&second), ring);
        pair.core.rung(pair.now, second.layout.id.0, Bell::Faults);
        assert_eq!(captured(&mut pair), 2 * ring);

        // Another channel's doorbell and a control request are served at once, owed turns or not.
        pair.fault_at(&quiet, quiet.run_va(0, 0));
        assert_eq!(captured(&mut pair), 2 * ring + 1);
        pair.core.publish(pair.now, quiet.layout.id.0, 0).unwrap();
        assert!(quiet.mapped(0, 0), "its warp was served while the others were owed turns");
        assert!(pair.core.owes_turns());

        // One turn each per round, in the order they were owed: the first, refilled, is owed
        // again after the second; the second, not refilled, is done.
        pair.core.take_owed(pair.now);
        assert_eq!(captured(&mut pair), 3 * ring + 1);
        assert!(pair.core.owes_turns());
        for round in 1..=3 {
            assert_eq!(fill_ring(&first), ring);
            pair.core.take_owed(pair.now);
            assert_eq!(captured(&mut pair), (3 + round) * ring + 1, "one turn per round, round {round}");
            assert!(pair.core.owes_turns(), "the loop does not sleep while a turn is owed");
        }
        pair.core.take_owed(pair.now);
        assert!(!pair.core.owes_turns(), "its ring was found empty at last");
        assert_eq!(captured(&mut pair), 6 * ring + 1);
    }

    #[test]
    fn a_channel_that_goes_while_owed_a_turn_is_owed_nothing() {
        let mut pair = Pair::new(1);
        let busy = pair.open(Pair::spec(0, 1, 1_000_000));
        let id = busy.layout.id.0;
        fill_ring(&busy);
        pair.core.rung(pair.now, id, Bell::Faults);
        assert!(pair.core.owes_turns());
        pair.core.destroy(id).unwrap();
        assert!(!pair.core.owes_turns(), "the loop may sleep again");
        // A new channel given its id is not owed the old one's turn: its doorbell is read.
        let next = pair.open(Pair::spec(0, 1, 1_000_000));
        assert_eq!(next.layout.id.0, id);
        let before = captured(&mut pair);
        pair.fault_at(&next, next.run_va(0, 0));
        assert_eq!(captured(&mut pair), before + 1);
        assert!(!pair.core.owes_turns());
    }

    #[test]
    fn unfilled_data_completions_are_completed_again_with_the_timeout_marker_then_replayed() {
        let complete = |gpu, slot, fill| Command::Complete {
            gpu,
            channel: ChannelId(3),
            slot,
            run_va: 0x1000 * u64::from(slot),
            companion_va: 0,
            pages: 1,
            fill,
        };
        let data = Fill::Data { len: 64, source: DataSource::Host { offset: 0 } };
        let timeout = Fill::Marker(ErrorMarker::Timeout);
        let unfilled = [
            complete(0, 1, data),
            complete(1, 2, data),
            complete(0, 3, data),
            complete(0, 4, Fill::Marker(ErrorMarker::ChannelClosed)),
        ];
        let mut out = Vec::new();
        marker_retries(&unfilled, &mut out);
        let expected = [
            complete(0, 1, timeout),
            complete(1, 2, timeout),
            complete(0, 3, timeout),
            Command::Replay { gpu: 0 },
            Command::Replay { gpu: 1 },
        ];
        assert_eq!(out, expected, "a marker completion is never retried");
    }

    #[test]
    fn shutdown_reads_the_ring_of_a_channel_owed_a_turn() {
        let mut pair = Pair::new(1);
        let busy = pair.open(Pair::spec(0, 2, 1_000_000));
        let entry = fault(busy.run_va(0, 0), 0);
        while busy.consumer.post_fault(&entry).is_ok() {}
        pair.core.rung(pair.now, busy.layout.id.0, Bell::Faults);
        assert!(pair.core.owes_turns());
        // Posted after the full pass, before the owed turn came.
        busy.consumer.post_fault(&fault(busy.run_va(1, 0), 0)).unwrap();
        pair.core.shutdown(pair.now);
        for slot in [0, 1] {
            assert_eq!(busy.run(slot, 0, 0).0, Some(ErrorMarker::DaemonStopping), "slot {slot}");
        }
    }
}
