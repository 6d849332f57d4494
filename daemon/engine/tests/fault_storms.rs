//! Fault injection against the engine, checked step by step with a reference model of a slot's
//! life (generation, published, held since): more requests outstanding than one 256-entry fault
//! batch, a duplicate storm after every global replay (each stalled warp faults again), stale
//! packets from before a wake-up, faults from a GPU that is not the consumer, timeouts, publishes
//! in any order and twice, in place or from the buffer, in-place ones for the wrong run, and
//! channels closed with requests held. Whatever the interleaving, every generation of a slot
//! completes exactly once (with its data, an in-place batch's heads, the timeout marker or the
//! closed marker), every in-place publish for a run the slot's generation does not read is
//! dropped as missed, nothing stays held, and every page returns to the pool.

use std::collections::HashMap;

use proptest::prelude::*;
use wic_engine::fault::AccessType;
use wic_engine::{
    ChannelId, ChannelLayout, ChannelSpec, Command, DataSource, Engine, EngineConfig, EngineError, ErrorMarker,
    FaultEntry, Fill, PoolError, Producer, RawFaultEntry,
};

const WARPS: u32 = 16;
/// Entries in one batch of a GPU's fault buffer.
const FAULT_BATCH: usize = 256;
const POOL_PAGES: u32 = 16 * 1024;

/// What one step of a run does.
#[derive(Debug, Clone)]
enum Step {
    /// Warps fault: (slot, warp, on the stale side, from the wrong GPU).
    Faults(Vec<(usize, u32, bool, bool)>),
    Publish(usize),
    /// The slot's producer publishes a batch written in place: into the run its current
    /// generation reads, or (true) into the other one.
    PublishInPlace(usize, bool),
    /// Time passes by this many ns and held requests past their deadline expire.
    Advance(u64),
}

/// How a slot generation ended: with data, or with a marker (ordered by its word, so that
/// completions sort).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Completion {
    Data,
    Heads,
    Marker(ErrorMarker),
}

impl Completion {
    fn word(self) -> u64 {
        match self {
            Self::Data => 0,
            Self::Heads => 1,
            Self::Marker(marker) => marker.word(),
        }
    }
}

#[derive(Debug, Clone, Default)]
struct SlotModel {
    generation: u64,
    published: bool,
    /// The pending publish was made in place.
    in_place: bool,
    held_since: Option<u64>,
}

/// One slot as the test sees it: its channel, index and pages.
struct SlotRef {
    channel: ChannelId,
    index: u32,
    runs: [u64; 2],
    batch_bytes: u64,
    pages_per_run: u32,
    timeout: u64,
}

struct Harness {
    engine: Engine,
    slots: Vec<SlotRef>,
    model: Vec<SlotModel>,
    /// Run address -> (slot, side), to read the engine's commands back.
    runs: HashMap<u64, (usize, usize)>,
    now: u64,
    out: Vec<Command>,
    /// The model's completions of the current call, compared with the engine's.
    expected: Vec<(usize, u64, Completion)>,
    /// The slots whose in-place publish of the current call the model drops as missed.
    expected_missed: Vec<usize>,
    replay_pending: bool,
    max_held: u32,
}

fn fault(va: u64) -> RawFaultEntry {
    FaultEntry::replayable_gpc(va, AccessType::Read, 0, 0x1000, 0, 0).encode()
}

impl Harness {
    /// Opens one host-producer channel per (slots, message bytes, timeout); one the pool cannot
    /// hold any more is refused and leaves the pool as it was.
    fn new(channels: &[(u32, u32, u64)]) -> Self {
        let config =
            EngineConfig { pool_pages: POOL_PAGES, max_slots: 2048, warps_per_batch: WARPS, ..EngineConfig::default() };
        let mut engine = Engine::new(config).unwrap();
        let mut slots = Vec::new();
        let mut runs = HashMap::new();
        for &(count, message_bytes, timeout) in channels {
            let spec = ChannelSpec {
                consumer_gpu: 0,
                producer: Producer::Host,
                message_bytes,
                slots: count,
                timeout_ns: timeout,
            };
            let free = engine.pool().free_pages();
            let layout: ChannelLayout = match engine.open_channel(spec) {
                Ok(layout) => layout,
                Err(EngineError::Pool(PoolError::Exhausted { .. })) => {
                    assert_eq!(engine.pool().free_pages(), free, "a refused channel keeps no page");
                    continue;
                }
                Err(e) => panic!("{spec:?} refused: {e}"),
            };
            for (index, slot) in layout.slots.iter().enumerate() {
                runs.insert(slot.runs[0], (slots.len(), 0));
                runs.insert(slot.runs[1], (slots.len(), 1));
                slots.push(SlotRef {
                    channel: layout.id,
                    index: index as u32,
                    runs: slot.runs,
                    batch_bytes: layout.batch_bytes,
                    pages_per_run: layout.pages_per_run,
                    timeout,
                });
            }
        }
        let model = vec![SlotModel::default(); slots.len()];
        Self {
            engine,
            slots,
            model,
            runs,
            now: 0,
            out: Vec::new(),
            expected: Vec::new(),
            expected_missed: Vec::new(),
            replay_pending: false,
            max_held: 0,
        }
    }

    fn complete(&mut self, slot: usize, how: Completion) {
        let model = &mut self.model[slot];
        self.expected.push((slot, model.generation, how));
        model.generation += 1;
        model.held_since = None;
        if matches!(how, Completion::Data | Completion::Heads) {
            model.published = false;
            model.in_place = false;
        }
    }

    /// What the pending publish of `slot` completes with.
    fn published_fill(&self, slot: usize) -> Completion {
        if self.model[slot].in_place {
            Completion::Heads
        } else {
            Completion::Data
        }
    }

    /// A warp of `slot` faults on its current run (or the stale one).
    fn model_fault(&mut self, slot: usize, stale: bool, wrong_gpu: bool) {
        let model = &self.model[slot];
        if stale || wrong_gpu || model.held_since.is_some() {
            return;
        }
        if model.published {
            self.complete(slot, self.published_fill(slot));
        } else {
            self.model[slot].held_since = Some(self.now);
        }
    }

    fn fault_va(&self, slot: usize, warp: u32, stale: bool) -> u64 {
        let s = &self.slots[slot];
        let side = (self.model[slot].generation % 2) as usize ^ usize::from(stale);
        s.runs[side] + u64::from(warp % s.pages_per_run) * 4096
    }

    fn step(&mut self, step: &Step) -> Result<(), TestCaseError> {
        self.expected.clear();
        self.expected_missed.clear();
        self.out.clear();
        match step {
            Step::Faults(picks) => {
                let mut batch: Vec<(u16, RawFaultEntry)> = Vec::new();
                if self.replay_pending {
                    // After a global replay every warp still stalled faults again.
                    for slot in (0..self.slots.len()).filter(|&s| self.model[s].held_since.is_some()) {
                        for warp in [0, WARPS - 1] {
                            batch.push((0, fault(self.fault_va(slot, warp, false))));
                        }
                    }
                }
                for &(slot, warp, stale, wrong_gpu) in picks {
                    let slot = slot % self.slots.len();
                    batch.push((u16::from(wrong_gpu), fault(self.fault_va(slot, warp, stale))));
                    self.model_fault(slot, stale, wrong_gpu);
                }
                // The GPU hands its buffer over in batches of at most 256 entries, per GPU.
                for gpu in [0, 1] {
                    let entries: Vec<RawFaultEntry> =
                        batch.iter().filter(|(g, _)| *g == gpu).map(|(_, e)| *e).collect();
                    for chunk in entries.chunks(FAULT_BATCH) {
                        self.engine.handle_faults(self.now, gpu, chunk, &mut self.out);
                    }
                }
            }
            Step::Publish(slot) => {
                let slot = slot % self.slots.len();
                let s = &self.slots[slot];
                let result = self.engine.publish(self.now, s.channel, s.index, &mut self.out);
                if self.model[slot].published {
                    prop_assert_eq!(result, Err(EngineError::AlreadyPublished { channel: s.channel, slot: s.index }));
                } else {
                    prop_assert_eq!(result, Ok(()));
                    self.model[slot].published = true;
                    if self.model[slot].held_since.is_some() {
                        self.complete(slot, Completion::Data);
                    }
                }
            }
            Step::PublishInPlace(slot, other_run) => {
                let slot = slot % self.slots.len();
                let s = &self.slots[slot];
                let side = (self.model[slot].generation % 2) as u8 ^ u8::from(*other_run);
                let result = self.engine.publish_in_place(self.now, s.channel, s.index, side, &mut self.out);
                if *other_run {
                    prop_assert_eq!(result, Ok(()));
                    self.expected_missed.push(slot);
                } else if self.model[slot].published {
                    prop_assert_eq!(result, Err(EngineError::AlreadyPublished { channel: s.channel, slot: s.index }));
                } else {
                    prop_assert_eq!(result, Ok(()));
                    self.model[slot].published = true;
                    self.model[slot].in_place = true;
                    if self.model[slot].held_since.is_some() {
                        self.complete(slot, Completion::Heads);
                    }
                }
            }
            Step::Advance(ns) => {
                self.now += ns;
                for slot in 0..self.slots.len() {
                    if let Some(since) = self.model[slot].held_since {
                        if since.saturating_add(self.slots[slot].timeout) <= self.now {
                            self.complete(slot, Completion::Marker(ErrorMarker::Timeout));
                        }
                    }
                }
                self.engine.expire(self.now, &mut self.out);
            }
        }
        self.check_commands()
    }

    /// The engine's commands of the last call complete exactly the generations the model
    /// completed, each with the right pages and data; every completion is followed by a replay
    /// and no replay comes without one (each fault batch replays on its own).
    fn check_commands(&mut self) -> Result<(), TestCaseError> {
        let mut seen = Vec::new();
        let mut missed = Vec::new();
        let mut wakes = Vec::new();
        let mut replay_owed = false;
        for command in &self.out {
            match *command {
                Command::Complete { gpu, channel, slot: index, run_va, companion_va, pages, fill } => {
                    let (slot, side) = self.runs[&run_va];
                    let s = &self.slots[slot];
                    prop_assert_eq!((gpu, channel, index, pages), (0, s.channel, s.index, s.pages_per_run));
                    let how = match fill {
                        Fill::Data { len, source } => {
                            prop_assert_eq!(len, s.batch_bytes);
                            prop_assert_eq!(source, DataSource::Host { offset: u64::from(s.index) * s.batch_bytes });
                            Completion::Data
                        }
                        Fill::Marker(marker) => Completion::Marker(marker),
                        Fill::Heads => Completion::Heads,
                    };
                    seen.push((slot, side, how));
                    wakes.push((run_va, companion_va));
                    replay_owed = true;
                }
                Command::Replay { gpu } => {
                    prop_assert_eq!(gpu, 0);
                    prop_assert!(replay_owed, "a replay with nothing completed before it");
                    replay_owed = false;
                }
                Command::MissedPublish { channel, slot: index } => {
                    let slot = self.slots.iter().position(|s| (s.channel, s.index) == (channel, index));
                    missed.push(slot.expect("a slot of the test's channels"));
                }
                ref other => prop_assert!(false, "a host channel got {:?}", other),
            }
        }
        prop_assert!(!replay_owed, "completions without a replay after them");
        prop_assert_eq!(&missed, &self.expected_missed, "in-place publishes dropped as missed");
        let mut expected: Vec<(usize, usize, Completion)> =
            self.expected.iter().map(|&(slot, generation, how)| (slot, (generation % 2) as usize, how)).collect();
        expected.sort_by_key(|&(slot, side, how)| (slot, side, how.word()));
        seen.sort_by_key(|&(slot, side, how)| (slot, side, how.word()));
        prop_assert_eq!(&seen, &expected, "completions (slot, side, how)");
        // Each completion maps its run and unmaps the companion.
        let mut expected_wakes: Vec<(u64, u64)> = expected
            .iter()
            .map(|&(slot, side, _)| (self.slots[slot].runs[side], self.slots[slot].runs[1 - side]))
            .collect();
        expected_wakes.sort();
        wakes.sort();
        prop_assert_eq!(wakes, expected_wakes);
        self.replay_pending = !expected.is_empty();
        let held = self.model.iter().filter(|m| m.held_since.is_some()).count() as u32;
        prop_assert_eq!(self.engine.held(), held);
        let next_deadline =
            self.model.iter().zip(&self.slots).filter_map(|(m, s)| Some(m.held_since?.saturating_add(s.timeout))).min();
        prop_assert_eq!(self.engine.next_deadline(), next_deadline, "the earliest deadline of a held request");
        prop_assert_eq!(self.engine.available_tags(), self.model.iter().filter(|m| m.published).count());
        self.max_held = self.max_held.max(held);
        Ok(())
    }

    /// Closes every channel: held requests get the closed marker; the pool is whole again.
    fn close_all(&mut self) -> Result<(), TestCaseError> {
        let mut channels: Vec<ChannelId> = self.slots.iter().map(|s| s.channel).collect();
        channels.dedup();
        let held = self.model.iter().filter(|m| m.held_since.is_some()).count();
        let mut out = Vec::new();
        for id in channels {
            self.engine.close_channel(id, &mut out).unwrap();
        }
        let markers = out
            .iter()
            .filter(|c| matches!(c, Command::Complete { fill: Fill::Marker(ErrorMarker::ChannelClosed), .. }))
            .count();
        prop_assert_eq!(markers, held);
        prop_assert_eq!(self.engine.held(), 0);
        prop_assert_eq!(self.engine.pool().free_pages(), POOL_PAGES);
        prop_assert_eq!(self.engine.available_tags(), 0);
        let s = self.engine.stats();
        prop_assert_eq!(s.delivered + s.timed_out + s.closed_while_held, s.requests, "every request completed once");
        Ok(())
    }
}

fn channels() -> impl Strategy<Value = Vec<(u32, u32, u64)>> {
    let channel = (
        1u32..96,
        prop::sample::select(vec![64u32, 256, 4096, 16384]),
        prop::sample::select(vec![500u64, 50_000, u64::MAX / 4]),
    );
    prop::collection::vec(channel, 1..8)
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let pick = (0usize..10_000, 0u32..WARPS, prop::bool::weighted(0.1), prop::bool::weighted(0.05));
    let step = prop_oneof![
        4 => prop::collection::vec(pick, 1..300).prop_map(Step::Faults),
        2 => (0usize..10_000).prop_map(Step::Publish),
        2 => (0usize..10_000, prop::bool::weighted(0.25)).prop_map(|(slot, other)| Step::PublishInPlace(slot, other)),
        1 => (1u64..2_000).prop_map(Step::Advance),
    ];
    prop::collection::vec(step, 1..120)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_generation_completes_exactly_once_under_storms_timeouts_and_closes(channels in channels(), steps in steps()) {
        let mut h = Harness::new(&channels);
        for step in &steps {
            h.step(step)?;
        }
        h.close_all()?;
    }
}

/// Every slot of 1,024 faults before any data exists: four fault batches' worth of requests
/// outstanding at once, a duplicate storm after each wake-up, then the data in a scrambled order.
#[test]
fn a_thousand_outstanding_requests_survive_storms_and_deliver_once_each() {
    let mut h = Harness::new(&[(512, 1024, u64::MAX / 4), (512, 256, u64::MAX / 4)]);
    assert_eq!(h.slots.len(), 1024);
    let all: Vec<(usize, u32, bool, bool)> =
        (0..h.slots.len()).map(|slot| (slot, slot as u32 % WARPS, false, false)).collect();
    h.step(&Step::Faults(all)).unwrap();
    assert_eq!(h.engine.held(), 1024);
    // 7 is coprime with 1024: every slot is published once, in a scrambled order, each
    // publish followed by the storm its replay provokes.
    for i in 0..h.slots.len() {
        h.step(&Step::Publish(i * 7 % 1024)).unwrap();
        h.step(&Step::Faults(Vec::new())).unwrap();
    }
    assert_eq!(h.max_held, 1024);
    assert_eq!(h.engine.stats().delivered, 1024);
    assert!(h.engine.stats().duplicates > 1024 * 100, "the storms reached the engine: {:?}", h.engine.stats());
    h.close_all().unwrap();
}

/// A slot's tag has one producer. On a GPU producer's channel the host cannot publish (refused,
/// nothing set); the producer's PAT write publishes once, and its duplicates after replays
/// neither publish again nor deliver twice.
#[test]
fn a_gpu_producers_tag_is_published_once_whoever_else_tries() {
    let config = EngineConfig { pool_pages: 256, max_slots: 8, warps_per_batch: WARPS, ..EngineConfig::default() };
    let mut engine = Engine::new(config).unwrap();
    let spec = ChannelSpec {
        consumer_gpu: 0,
        producer: Producer::Gpu { gpu: 1, base_va: 0x9000_0000 },
        message_bytes: 256,
        slots: 1,
        timeout_ns: u64::MAX / 4,
    };
    let layout = engine.open_channel(spec).unwrap();
    let slot = &layout.slots[0];
    let pat = slot.pat.unwrap();
    let write = |va| FaultEntry::replayable_gpc(va, AccessType::Write, 0, 0x2000, 0, 0).encode();
    let mut out = Vec::new();
    engine.handle_faults(0, 0, &[fault(slot.runs[0])], &mut out);
    assert_eq!(engine.publish(1, layout.id, 0, &mut out), Err(EngineError::NotHostProducer(layout.id)));
    assert_eq!(
        (engine.available_tags(), engine.stats().host_publishes, engine.held()),
        (0, 0, 1),
        "the host's attempt set nothing"
    );
    for round in 0..4 {
        engine.handle_faults(2 + round, 1, &[write(pat[0]), write(pat[0])], &mut out);
    }
    let data = out.iter().filter(|c| matches!(c, Command::Complete { fill: Fill::Data { .. }, .. })).count();
    let s = engine.stats();
    assert_eq!((data, s.delivered, s.pat_publishes), (1, 1, 1));
    assert_eq!(s.pat_duplicates + s.stale, 7, "every later PAT write is a duplicate or stale");
    assert_eq!((engine.available_tags(), engine.held()), (0, 0));
}
