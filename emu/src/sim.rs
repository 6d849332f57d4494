//! The discrete-event model: GPUs made of SMs sharing issue slots among resident warps, the UVM
//! replayable-fault path (fault buffer, bottom half in batches, global replay), managed pages
//! that migrate on faults, producers, and, in `fault` mode, wicd running the real engine.
//!
//! SM issue is processor sharing: every computing warp progresses at
//! `min(warp_ipc, schedulers / (computing + issue_weight x polling))` instructions per cycle, so a
//! polling warp costs co-resident compute. While any warp of an SM is stalled on a fault, that
//! rate is multiplied by the work's progress beside a stalled warp (`Stall::progress` of the
//! phase's memory share): on an H100 the SM's memory accesses that miss L1 make almost no
//! progress during the stall, its arithmetic nearly full progress (`device/bench/stall_cost.cu`).
//! Time is integer nanoseconds; the run is deterministic for a seed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};

use wic_engine::fault::AccessType;
use wic_engine::{
    ChannelLayout, ChannelSpec, Command, DataSource, Engine, EngineConfig, EngineStats, ErrorMarker, FaultEntry, Fill,
    Nanos, Producer, RawFaultEntry, PAGE_SIZE,
};

use crate::calibration::{transfer_ns, Calibration};
use crate::payload::{MessageKey, Rng};
use crate::workload::{Endpoint, Phase, ProduceOrder, Workload};

/// How consumer warps wait for producer data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The paper's Algorithm 1: thread 0 of each CTA spins on a managed flag.
    Poll,
    /// WIC: each warp touches its PCM page and stalls until wicd serves the fault.
    Fault,
    /// wic.cuh's push on the stock driver: the producer's batch is copied into the consumer
    /// GPU's memory and a ready word set there; warps wait on the word with backoff, neither
    /// faulting nor crossing a link, at an issue cost the model leaves out (measured on H100s:
    /// 0.2% to 1.7% for 8 waiting warps per SM, `device/bench/transport.cu`).
    Push,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Self::Poll => "poll",
            Self::Fault => "fault",
            Self::Push => "push",
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub workload: &'static str,
    pub mode: Mode,
    pub runtime_ns: Nanos,
    /// Share of consumer SM time lost to waiting (no useful issue while warps wait for data).
    pub consumer_overhead: f64,
    /// Share of the time warps waited for data during which their SM did useful work (Fig. 14).
    pub overlap_efficiency: f64,
    /// wicd's busy time as a share of the runtime (Fig. 15, host side).
    pub daemon_share: f64,
    /// Fault packets the GPUs wrote, duplicates included.
    pub gpu_faults: u64,
    pub fault_batches: u64,
    pub replays: u64,
    pub fault_buffer_overflows: u64,
    /// Entries discarded by replay flushes (they refault if still unserved).
    pub flushed_entries: u64,
    /// Messages (one per warp and request) received and checked byte for byte.
    pub messages_checked: u64,
    pub bytes_checked: u64,
    /// Messages whose bytes differed from what the producer wrote.
    pub corrupt_messages: u64,
    /// Messages that carried an error marker instead of data.
    pub error_markers: u64,
    /// Engine counters (fault mode).
    pub engine: Option<EngineStats>,
    /// After the run: every PCM page back in the pool, no held request left.
    pub pool_restored: bool,
    pub pfq_empty: bool,
    pub events: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    PhaseStart,
    SmDone {
        gpu: u16,
        sm: u32,
        version: u64,
    },
    SlotProduced {
        slot: u32,
    },
    FlagVisible {
        slot: u32,
    },
    PublishArrives {
        slot: u32,
    },
    /// push: a slot's batch and ready word are in the consumer GPU's memory.
    ReadyArrives {
        slot: u32,
    },
    BhRun {
        gpu: u16,
    },
    BatchDone {
        gpu: u16,
    },
    /// A replay; `resume_bh` when the bottom half waits for it before its next batch.
    Replay {
        gpu: u16,
        resume_bh: bool,
    },
    Map {
        gpu: u16,
        va: u64,
        pages: u32,
    },
    Unmap {
        gpu: u16,
        va: u64,
        pages: u32,
    },
    DaemonRun,
    DaemonIdle,
    HostPhaseDone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Agent {
    Warp(u32),
    Producer(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WarpState {
    Computing,
    Waiting,
    Polling,
    Done,
}

struct Warp {
    cta: u32,
    lane: u32,
    scale: f64,
    /// Requests made so far.
    requests: u32,
    state: WarpState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PollStage {
    Flag,
    Spinning,
    Data,
}

struct Cta {
    gpu: u16,
    sm: u32,
    first_warp: u32,
    communicates: bool,
    arrived: u32,
    finished: u32,
    poll: PollStage,
}

#[derive(Default)]
struct Sm {
    vtime: f64,
    last: Nanos,
    version: u64,
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    computing: u32,
    polling: u32,
    waiting: u32,
    /// Warps of the SM stalled on a fault (waiting for a replay), in any mode.
    fault_stalled: u32,
    resident_ctas: u32,
    occupied_ns: f64,
    wait_ns: f64,
    overlap_ns: f64,
}

#[derive(Default)]
struct FaultPath {
    buffer: VecDeque<(RawFaultEntry, u64)>,
    bh_active: bool,
    batch: Vec<(RawFaultEntry, u64)>,
    outstanding: HashSet<(u32, u64)>,
    stalled: HashMap<u64, Vec<(Agent, u32)>>,
}

struct Gpu {
    sms: Vec<Sm>,
    faults: FaultPath,
    cta_queue: VecDeque<u32>,
}

/// Where a managed (non-WIC) page lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loc {
    Host,
    Gpu(u16),
}

impl From<Endpoint> for Loc {
    fn from(e: Endpoint) -> Self {
        match e {
            Endpoint::Host => Loc::Host,
            Endpoint::Gpu(g) => Loc::Gpu(g),
        }
    }
}

enum DaemonInput {
    Faults(u16, Vec<RawFaultEntry>),
    Publish(u32),
}

struct Daemon {
    engine: Engine,
    inbox: VecDeque<DaemonInput>,
    awake: bool,
    busy_ns: Nanos,
    commands: Vec<Command>,
    /// Runs whose bytes are in host memory and must cross PCIe when mapped.
    host_resident_runs: HashSet<u64>,
    pcm: HashMap<u64, Vec<u8>>,
    mapped: HashSet<(u16, u64)>,
}

/// Per-phase communication state, kept across iterations.
struct PhaseState {
    phase: Phase,
    channel: Option<ChannelLayout>,
    /// The producer's buffer: `slots x batch_bytes`.
    buffer: Vec<u8>,
    produced: Vec<u64>,
    consumed: Vec<u64>,
    /// Warps of the current generation that have read each slot.
    readers: Vec<u32>,
    flag_visible: Vec<u64>,
    flag_loc: Vec<Loc>,
    data_loc: Vec<Loc>,
    spinning_cta: Vec<Option<u32>>,
    /// push: warps waiting for each slot's next generation.
    ready_waiters: Vec<Vec<u32>>,
}

const FLAG_BASE: u64 = 0x5000_0000_0000;
const DATA_BASE: u64 = 0x6000_0000_0000;
const PHASE_SPAN: u64 = 1 << 36;
/// Pages reserved for one slot's data region in poll mode.
const DATA_PAGES: u64 = 16;
const CHANNEL_TIMEOUT_NS: Nanos = 1_000_000_000;
/// Why a run may stop short: a wait that timed out is the one way into a state the model does
/// not follow.
const TIMEOUT_HINT: &str = " (a consumer's wait probably timed out: the calibration makes the fault path or wicd slower than the channels' 1 s timeout)";
/// Steps (events, and faults raised or re-raised) a run may take without a warp finishing a
/// compute segment or receiving a message, or a producer producing, before it counts as stuck:
/// this many, plus [`STALL_STEPS_PER_WARP`] for each warp of its largest phase. (The built-in
/// calibration's runs, from 64 to 4M consumer threads, take at most about 17 a warp: 550,000
/// steps at a million threads, where the limit is 38 million.)
const STALL_STEPS: u64 = 1 << 22;
const STALL_STEPS_PER_WARP: u64 = 1024;
/// The latest emulated time a run may reach, 2^62 ns: far below where `u64` nanoseconds
/// overflow, so that one more step from a time below it (every step saturates) cannot wrap.
const CLOCK_LIMIT: Nanos = 1 << 62;

/// The slot of a managed page of a phase, and whether it is the data region (else the flag).
fn managed_page(va: u64) -> (usize, bool) {
    let page = (va % PHASE_SPAN) / PAGE_SIZE;
    if va >= DATA_BASE {
        ((page / DATA_PAGES) as usize, true)
    } else {
        (page as usize, false)
    }
}

/// Slots a phase may have: poll mode gives every slot [`DATA_PAGES`] pages of its phase's
/// address span (2^20 slots; a million consumer threads make at most 6144).
pub const MAX_PHASE_SLOTS: u64 = PHASE_SPAN / (DATA_PAGES * PAGE_SIZE);

/// Runs `workload` in `mode` on the model and reports what it measured.
///
/// # Panics
/// If the model cannot hold the workload ([`try_run`] says why instead).
pub fn run(workload: &Workload, mode: Mode, cal: &Calibration, seed: u64) -> RunReport {
    try_run(workload, mode, cal, seed).unwrap_or_else(|e| panic!("{} ({}): {e}", workload.name, mode.name()))
}

/// Runs `workload` in `mode` on the model and reports what it measured, or says why the model
/// cannot hold it (see [`check`]; a refused workload allocates nothing) or why the run stopped:
/// its emulated clock would pass 2^62 ns, it made no progress (pages thrashing between GPUs), or
/// a timed-out wait led where the model does not follow.
pub fn try_run(workload: &Workload, mode: Mode, cal: &Calibration, seed: u64) -> Result<RunReport, String> {
    let config = check(workload)?;
    let mut sim = Sim::new(workload, mode, cal, seed, config)?;
    sim.execute()?;
    Ok(sim.report())
}

/// Slots of the engine a fault-mode run gets at least.
const ENGINE_SLOTS: u32 = 16 * 1024;

/// Whether the model can hold `workload`, and the engine it gets in fault mode: the default
/// pool (16K pages) and 16K slots, grown where the workload's channels, all open for the whole
/// run, need more pages or slots than that, so the default runs' numbers do not change.
pub fn check(workload: &Workload) -> Result<EngineConfig, String> {
    // One slot serves one CTA; every GPU-consumer phase of a workload has the same CTA size.
    let gpu_phases = || workload.phases.iter().filter(|p| p.consumer != Endpoint::Host);
    let warps_per_batch = gpu_phases().map(|p| p.warps_per_cta).max().unwrap_or(16);
    let (mut pages, mut slots) = (0u64, 0u64);
    for (index, phase) in workload.phases.iter().enumerate() {
        let phase_slots = u64::from(phase.ctas) * u64::from(phase.requests_per_warp);
        if phase_slots == 0 || phase.warps_per_cta == 0 || phase.message_bytes == 0 {
            return Err(format!("phase {index} has no CTA, warp, request or message byte"));
        }
        if !(0.0..=1.0).contains(&phase.memory_share) {
            return Err(format!("phase {index}'s memory share {} is not a share (0 to 1)", phase.memory_share));
        }
        if phase_slots > MAX_PHASE_SLOTS {
            return Err(format!(
                "phase {index} has {phase_slots} request slots; the model's address layout holds at most {MAX_PHASE_SLOTS} a phase"
            ));
        }
        let batch_bytes = u64::from(phase.warps_per_cta) * u64::from(phase.message_bytes);
        if batch_bytes > DATA_PAGES * PAGE_SIZE {
            return Err(format!(
                "phase {index} moves {batch_bytes} bytes a slot; the model's address layout holds at most {} a slot",
                DATA_PAGES * PAGE_SIZE
            ));
        }
        if phase.consumer == Endpoint::Host {
            continue;
        }
        let spec = ChannelSpec {
            consumer_gpu: 0,
            producer: match phase.producer {
                Endpoint::Host => Producer::Host,
                Endpoint::Gpu(gpu) => Producer::Gpu { gpu, base_va: 0 },
            },
            message_bytes: phase.message_bytes,
            slots: phase_slots as u32,
            timeout: CHANNEL_TIMEOUT_NS,
        };
        let bytes =
            spec.placement_bytes(warps_per_batch).ok_or_else(|| format!("phase {index} cannot be a channel"))?;
        pages += bytes / PAGE_SIZE;
        slots += phase_slots;
    }
    let default = EngineConfig::default();
    let too_many = |what: &str, n: u64| format!("the workload's channels need {n} {what}, more than an engine holds");
    let pool_pages = u32::try_from(pages).map_err(|_| too_many("pool pages", pages))?.max(default.pool_pages);
    let max_slots = u32::try_from(slots).map_err(|_| too_many("slots", slots))?.max(ENGINE_SLOTS);
    Ok(EngineConfig { pool_pages, max_slots, warps_per_batch, ..default })
}

/// About how many bytes a run of `workload` in `mode` allocates at its peak, an estimate on
/// the high side: the producer buffers and per-slot state of every phase, the warps, CTAs and
/// events of the largest phase and, in fault mode, the PCM contents, the engine's tables and
/// the held faults, plus a quarter for the allocator and 32 MiB for the process. (Measured peak
/// resident sizes of `wicd demo --threads 1`, every workload at 4M consumer threads and the two
/// largest at 16M: 58% to 76% of the larger mode's estimate.)
pub fn memory_estimate(workload: &Workload, mode: Mode) -> u64 {
    // In 128 bits, so that no workload's sizes can overflow; the result saturates.
    let (mut total, mut largest_phase) = (0u128, 0u128);
    for phase in &workload.phases {
        let slots = u128::from(phase.ctas) * u128::from(phase.requests_per_warp);
        let warps = u128::from(phase.ctas) * u128::from(phase.warps_per_cta);
        let batch_bytes = u128::from(phase.warps_per_cta) * u128::from(phase.message_bytes);
        // The buffer, the per-slot vectors and, in poll mode, each slot's managed pages.
        total += slots * (batch_bytes + 64);
        if mode == Mode::Fault && phase.consumer != Endpoint::Host {
            // Two PCM runs a slot with their bytes, map and mapped-page entries, the engine's
            // slot, route, tag, deadline and page tables, and the channel layout.
            let pages = 2 * slots * batch_bytes.div_ceil(u128::from(PAGE_SIZE)).max(1) + 2 * slots;
            total += slots * (2 * (batch_bytes + 96) + 320) + pages * 64;
        }
        // Warps and CTAs, the events scheduled for every slot, warps stalled on their pages.
        largest_phase = largest_phase.max(warps * 96 + slots * 128 + u128::from(phase.ctas) * 64);
    }
    u64::try_from((total + largest_phase) / 4 * 5 + (32 << 20)).unwrap_or(u64::MAX)
}

struct Sim<'a> {
    cal: &'a Calibration,
    workload: &'a Workload,
    mode: Mode,
    seed: u64,
    rng: Rng,
    now: Nanos,
    seq: u64,
    queue: BinaryHeap<Reverse<(Nanos, u64, Event)>>,
    gpus: Vec<Gpu>,
    phases: Vec<PhaseState>,
    iteration: u32,
    phase: usize,
    warps: Vec<Warp>,
    ctas: Vec<Cta>,
    ctas_left: u32,
    slots_left: u32,
    daemon: Option<Daemon>,
    /// Set when the last phase ends.
    runtime: Option<Nanos>,
    /// Why the run cannot go on: a state the model does not follow, which a calibration whose
    /// fault path or daemon is slower than the channels' timeout can bring about.
    stopped: Option<String>,
    /// Events handled and faults raised (or re-raised) so far.
    steps: u64,
    /// `steps` when a warp last finished a compute segment or received a message, or a producer
    /// last produced.
    progress_at: u64,
    /// push: when the host thread is done with its last publish.
    host_publish_free_at: Nanos,
    /// push: per producer GPU, when its link is done with the batches it carries.
    peer_link_free_at: Vec<Nanos>,
    /// Steps past `progress_at` that make the run stuck.
    stall_steps: u64,
    stats: Counters,
}

#[derive(Default)]
struct Counters {
    gpu_faults: u64,
    batches: u64,
    replays: u64,
    overflows: u64,
    flushed: u64,
    messages: u64,
    bytes: u64,
    corrupt: u64,
    markers: u64,
    events: u64,
}

impl<'a> Sim<'a> {
    fn new(
        workload: &'a Workload,
        mode: Mode,
        cal: &'a Calibration,
        seed: u64,
        config: EngineConfig,
    ) -> Result<Self, String> {
        let gpus = (0..workload.gpus())
            .map(|_| Gpu {
                sms: (0..cal.gpu.sms.value).map(|_| Sm::default()).collect(),
                faults: FaultPath::default(),
                cta_queue: VecDeque::new(),
            })
            .collect();
        let daemon = match mode {
            Mode::Fault => Some(Daemon {
                engine: Engine::new(config).map_err(|e| format!("engine: {e}"))?,
                inbox: VecDeque::new(),
                awake: false,
                busy_ns: 0,
                commands: Vec::new(),
                host_resident_runs: HashSet::new(),
                pcm: HashMap::new(),
                mapped: HashSet::new(),
            }),
            Mode::Poll | Mode::Push => None,
        };
        let mut sim = Self {
            cal,
            workload,
            mode,
            seed,
            rng: Rng::new(seed),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            gpus,
            phases: Vec::new(),
            iteration: 0,
            phase: 0,
            warps: Vec::new(),
            ctas: Vec::new(),
            ctas_left: 0,
            slots_left: 0,
            daemon,
            runtime: None,
            stopped: None,
            steps: 0,
            progress_at: 0,
            host_publish_free_at: 0,
            peer_link_free_at: vec![0; usize::from(workload.gpus())],
            stall_steps: workload
                .phases
                .iter()
                .map(|p| u64::from(p.ctas) * u64::from(p.warps_per_cta))
                .max()
                .unwrap_or(0)
                * STALL_STEPS_PER_WARP
                + STALL_STEPS,
            stats: Counters::default(),
        };
        for (index, phase) in workload.phases.iter().enumerate() {
            let state = sim.phase_state(index, phase.clone())?;
            sim.phases.push(state);
        }
        Ok(sim)
    }

    fn phase_state(&mut self, index: usize, phase: Phase) -> Result<PhaseState, String> {
        let slots = (phase.ctas * phase.requests_per_warp) as usize;
        let batch_bytes = u64::from(phase.warps_per_cta) * u64::from(phase.message_bytes);
        let channel = match (self.daemon.as_mut(), phase.consumer) {
            (Some(daemon), Endpoint::Gpu(consumer)) => {
                let producer = match phase.producer {
                    Endpoint::Host => Producer::Host,
                    Endpoint::Gpu(gpu) => Producer::Gpu { gpu, base_va: DATA_BASE + index as u64 * PHASE_SPAN },
                };
                let spec = ChannelSpec {
                    consumer_gpu: consumer,
                    producer,
                    message_bytes: phase.message_bytes,
                    slots: slots as u32,
                    timeout: CHANNEL_TIMEOUT_NS,
                };
                Some(daemon.engine.open_channel(spec).map_err(|e| format!("open channel: {e}"))?)
            }
            _ => None,
        };
        Ok(PhaseState {
            buffer: vec![0; slots * batch_bytes as usize],
            produced: vec![0; slots],
            consumed: vec![0; slots],
            readers: vec![0; slots],
            flag_visible: vec![0; slots],
            flag_loc: vec![Loc::Host; slots],
            data_loc: vec![Loc::Host; slots],
            spinning_cta: vec![None; slots],
            ready_waiters: vec![Vec::new(); slots],
            channel,
            phase,
        })
    }

    /// `delay` from now; times saturate, and [`Sim::execute`] ends a run whose clock passes
    /// [`CLOCK_LIMIT`].
    fn after(&self, delay: Nanos) -> Nanos {
        self.now.saturating_add(delay)
    }

    fn schedule(&mut self, at: Nanos, event: Event) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, event)));
    }

    /// Runs every event in time order. A run ends as an error where its clock would pass
    /// [`CLOCK_LIMIT`] (a calibration that [`Calibration::from_toml`] accepts keeps every step far
    /// below it; this bounds what a `Calibration` built in code can do), where it takes
    /// `stall_steps` steps without progress, or where a handler found a state the model does not
    /// follow (`stopped`).
    fn execute(&mut self) -> Result<(), String> {
        self.schedule(0, Event::PhaseStart);
        while let Some(Reverse((at, _, event))) = self.queue.pop() {
            if at > CLOCK_LIMIT {
                return Err(format!(
                    "the emulated clock would pass {CLOCK_LIMIT} ns (about 146 years) after {} events; the calibration makes the run too slow to model",
                    self.stats.events
                ));
            }
            self.now = at;
            self.stats.events += 1;
            self.steps += 1;
            self.dispatch(event);
            if let Some(why) = self.stopped.take() {
                return Err(format!("the run stopped at {} ns: {why}", self.now));
            }
            if self.steps - self.progress_at > self.stall_steps {
                return Err(format!(
                    "the run is stuck at {} ns: {} events and faults without a warp finishing compute or receiving data or a producer producing (the model does not damp pages thrashing between GPUs, as a replay slower than the other GPU's fault service makes them)",
                    self.now, self.stall_steps
                ));
            }
        }
        if self.runtime.is_none() {
            return Err(format!(
                "the run stopped at {} ns with nothing left to happen before the workload finished{}",
                self.now, TIMEOUT_HINT
            ));
        }
        Ok(())
    }

    fn dispatch(&mut self, event: Event) {
        match event {
            Event::PhaseStart => self.start_phase(),
            Event::SmDone { gpu, sm, version } => self.sm_done(gpu, sm, version),
            Event::SlotProduced { slot } => self.slot_produced(slot),
            Event::FlagVisible { slot } => self.flag_visible(slot),
            Event::PublishArrives { slot } => self.daemon_input(DaemonInput::Publish(slot)),
            Event::ReadyArrives { slot } => self.ready_arrives(slot),
            Event::BhRun { gpu } => self.bh_run(gpu),
            Event::BatchDone { gpu } => self.batch_done(gpu),
            Event::Replay { gpu, resume_bh } => self.replay(gpu, resume_bh),
            Event::Map { gpu, va, pages } | Event::Unmap { gpu, va, pages } => {
                let daemon = self.daemon.as_mut().expect("mappings change on the daemon's commands");
                for page in 0..u64::from(pages) {
                    let key = (gpu, va + page * PAGE_SIZE);
                    if matches!(event, Event::Map { .. }) {
                        daemon.mapped.insert(key);
                    } else {
                        daemon.mapped.remove(&key);
                    }
                }
            }
            Event::DaemonRun => self.daemon_run(),
            Event::DaemonIdle => self.daemon_idle(),
            Event::HostPhaseDone => self.phase_done(),
        }
    }

    fn current(&self) -> &PhaseState {
        &self.phases[self.phase]
    }

    // ---- phases -------------------------------------------------------------------------------

    fn start_phase(&mut self) {
        let phase = self.current().phase.clone();
        if phase.consumer == Endpoint::Host {
            let bytes = u64::from(phase.ctas) * u64::from(phase.message_bytes);
            let at = self.after(self.cal.pcie_ns(bytes).saturating_add(phase.host_compute_ns));
            self.schedule(at, Event::HostPhaseDone);
            return;
        }
        let Endpoint::Gpu(gpu) = phase.consumer else { unreachable!() };
        self.warps.clear();
        self.ctas.clear();
        let mut requested = Vec::new();
        for cta in 0..phase.ctas {
            let independent = (f64::from(cta) + 0.5) / f64::from(phase.ctas) <= phase.independent_ctas;
            let communicates = !independent && self.rng.unit() < phase.request_probability;
            if communicates {
                requested.extend((0..phase.requests_per_warp).map(|r| cta * phase.requests_per_warp + r));
            }
            let first_warp = self.warps.len() as u32;
            for lane in 0..phase.warps_per_cta {
                let scale = 1.0 + phase.jitter * (2.0 * self.rng.unit() - 1.0);
                self.warps.push(Warp { cta, lane, scale, requests: 0, state: WarpState::Computing });
            }
            self.ctas.push(Cta {
                gpu,
                sm: 0,
                first_warp,
                communicates,
                arrived: 0,
                finished: 0,
                poll: PollStage::Flag,
            });
            self.gpus[gpu as usize].cta_queue.push_back(cta);
        }
        self.ctas_left = phase.ctas;
        self.slots_left = requested.len() as u32;
        if phase.order == ProduceOrder::Shuffled {
            self.rng.shuffle(&mut requested);
        }
        for (position, slot) in requested.into_iter().enumerate() {
            let round = position as u64 / u64::from(phase.producer_lanes) + 1;
            let spread = 0.8 + 0.4 * self.rng.unit();
            let at = self.now + phase.producer_start_ns + (round as f64 * phase.produce_ns as f64 * spread) as u64;
            self.schedule(at, Event::SlotProduced { slot });
        }
        let per_sm = (self.cal.gpu.warp_slots_per_sm.value / phase.warps_per_cta).max(1);
        for sm in 0..self.cal.gpu.sms.value {
            for _ in 0..per_sm {
                self.dispatch_cta(gpu, sm);
            }
        }
    }

    fn dispatch_cta(&mut self, gpu: u16, sm: u32) {
        let Some(cta) = self.gpus[gpu as usize].cta_queue.pop_front() else { return };
        self.advance(gpu, sm);
        self.gpus[gpu as usize].sms[sm as usize].resident_ctas += 1;
        let (c1, warps) = (self.current().phase.c1_instr, self.current().phase.warps_per_cta);
        self.ctas[cta as usize].sm = sm;
        let first = self.ctas[cta as usize].first_warp;
        for w in first..first + warps {
            self.start_compute(w, c1);
        }
        self.reschedule(gpu, sm);
    }

    fn maybe_finish_phase(&mut self) {
        if self.ctas_left == 0 && self.slots_left == 0 {
            self.phase_done();
        }
    }

    fn phase_done(&mut self) {
        self.phase += 1;
        if self.phase == self.phases.len() {
            self.phase = 0;
            self.iteration += 1;
        }
        if self.iteration < self.workload.iterations {
            self.schedule(self.now, Event::PhaseStart);
            return;
        }
        self.runtime = Some(self.now);
        if let Some(daemon) = self.daemon.as_mut() {
            let mut out = Vec::new();
            for state in &self.phases {
                if let Some(layout) = &state.channel {
                    daemon.engine.close_channel(layout.id, &mut out).expect("channel is open");
                }
            }
            if !out.is_empty() {
                self.stopped = Some(format!("{} requests were still held at the end{TIMEOUT_HINT}", out.len()));
            }
        }
    }

    // ---- SMs ----------------------------------------------------------------------------------

    fn rate(&self, sm: &Sm) -> f64 {
        let g = &self.cal.gpu;
        let demand = f64::from(sm.computing) + self.cal.poll.issue_weight.value * f64::from(sm.polling);
        let ipc = if demand > 0.0 { g.warp_ipc.value.min(f64::from(g.schedulers_per_sm.value) / demand) } else { 0.0 };
        ipc * g.clock_ghz.value * self.stall_progress(sm)
    }

    /// The computing warps' speed relative to no warp stalled on a fault: below 1 while one is.
    fn stall_progress(&self, sm: &Sm) -> f64 {
        if sm.fault_stalled == 0 {
            return 1.0;
        }
        self.cal.stall.progress(self.current().phase.memory_share)
    }

    fn advance(&mut self, gpu: u16, sm: u32) {
        let rate = self.rate(&self.gpus[gpu as usize].sms[sm as usize]);
        let progress = self.stall_progress(&self.gpus[gpu as usize].sms[sm as usize]);
        let weight = self.cal.poll.issue_weight.value;
        let now = self.now;
        let s = &mut self.gpus[gpu as usize].sms[sm as usize];
        let dt = (now - s.last) as f64;
        s.last = now;
        if s.computing > 0 {
            s.vtime += rate * dt;
        }
        if s.resident_ctas > 0 {
            s.occupied_ns += dt;
        }
        if s.waiting + s.polling > 0 {
            s.wait_ns += dt;
            if s.computing > 0 {
                // Useful work: the computing warps' share of issue, at their speed beside stalls.
                let c = f64::from(s.computing);
                s.overlap_ns += dt * progress * c / (c + weight * f64::from(s.polling));
            }
        }
    }

    fn reschedule(&mut self, gpu: u16, sm: u32) {
        let rate = self.rate(&self.gpus[gpu as usize].sms[sm as usize]);
        let now = self.now;
        let s = &mut self.gpus[gpu as usize].sms[sm as usize];
        s.version += 1;
        let version = s.version;
        if let Some(Reverse((finish, _))) = s.heap.peek() {
            let left = (f64::from_bits(*finish) - s.vtime).max(0.0);
            let at = now.saturating_add((left / rate).ceil() as u64);
            self.schedule(at, Event::SmDone { gpu, sm, version });
        }
    }

    fn start_compute(&mut self, warp: u32, instr: u64) {
        let cta = &self.ctas[self.warps[warp as usize].cta as usize];
        let (gpu, sm) = (cta.gpu, cta.sm);
        let w = &mut self.warps[warp as usize];
        w.state = WarpState::Computing;
        let s = &mut self.gpus[gpu as usize].sms[sm as usize];
        let finish = s.vtime + instr as f64 * w.scale;
        s.heap.push(Reverse((finish.to_bits(), warp)));
        s.computing += 1;
    }

    fn sm_done(&mut self, gpu: u16, sm: u32, version: u64) {
        if self.gpus[gpu as usize].sms[sm as usize].version != version {
            return;
        }
        self.advance(gpu, sm);
        let mut done = Vec::new();
        let s = &mut self.gpus[gpu as usize].sms[sm as usize];
        while let Some(Reverse((finish, warp))) = s.heap.peek().copied() {
            if f64::from_bits(finish) > s.vtime + 1e-3 {
                break;
            }
            s.heap.pop();
            s.computing -= 1;
            done.push(warp);
        }
        for warp in done {
            self.segment_done(warp);
        }
        self.reschedule(gpu, sm);
    }

    fn set_waiting(&mut self, warp: u32, state: WarpState) {
        let cta = &self.ctas[self.warps[warp as usize].cta as usize];
        let s = &mut self.gpus[cta.gpu as usize].sms[cta.sm as usize];
        match self.warps[warp as usize].state {
            WarpState::Waiting => s.waiting -= 1,
            WarpState::Polling => s.polling -= 1,
            WarpState::Computing | WarpState::Done => {}
        }
        match state {
            WarpState::Waiting => s.waiting += 1,
            WarpState::Polling => s.polling += 1,
            WarpState::Computing | WarpState::Done => {}
        }
        self.warps[warp as usize].state = state;
    }

    /// A warp finished a compute segment: request, or exit.
    fn segment_done(&mut self, warp: u32) {
        self.progress_at = self.steps;
        let (cta, requests) = (self.warps[warp as usize].cta, self.warps[warp as usize].requests);
        let phase = &self.current().phase;
        let (per_warp, c2, warps_per_cta) = (phase.requests_per_warp, phase.c2_instr, phase.warps_per_cta);
        if requests < per_warp {
            if !self.ctas[cta as usize].communicates {
                // Warps of a CTA that does not communicate run their dependent work unblocked.
                self.warps[warp as usize].requests = per_warp;
                self.start_compute(warp, c2 * u64::from(per_warp));
                return;
            }
            match self.mode {
                Mode::Fault => self.wic_request(warp),
                Mode::Poll => self.arrive_at_barrier(warp),
                Mode::Push => self.push_request(warp),
            }
            return;
        }
        self.set_waiting(warp, WarpState::Done);
        let c = &mut self.ctas[cta as usize];
        c.finished += 1;
        if c.finished == warps_per_cta {
            let (gpu, sm) = (c.gpu, c.sm);
            self.ctas_left -= 1;
            self.gpus[gpu as usize].sms[sm as usize].resident_ctas -= 1;
            self.dispatch_cta(gpu, sm);
            self.maybe_finish_phase();
        }
    }

    fn slot_of(&self, warp: u32) -> u32 {
        let w = &self.warps[warp as usize];
        w.cta * self.current().phase.requests_per_warp + w.requests
    }

    fn message_key(&self, slot: u32, generation: u64) -> MessageKey {
        MessageKey { seed: self.seed, phase: self.phase as u32, slot, generation }
    }

    /// The warp has its data (or an error marker) at hand: check it and run C2.
    fn receive(&mut self, warp: u32, bytes: &[u8]) {
        self.progress_at = self.steps;
        let slot = self.slot_of(warp);
        let state = &self.phases[self.phase];
        let generation = state.consumed[slot as usize];
        let key = self.message_key(slot, generation);
        let msg = state.phase.message_bytes as usize;
        let offset = self.warps[warp as usize].lane as usize * msg;
        let marker = bytes.get(..8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
        if marker.and_then(ErrorMarker::from_word).is_some() {
            self.stats.markers += 1;
        } else if !bytes.get(offset..offset + msg).is_some_and(|got| key.matches(offset as u64, got)) {
            self.stats.corrupt += 1;
        }
        self.stats.messages += 1;
        self.stats.bytes += msg as u64;
        let c2 = self.current().phase.c2_instr;
        self.warps[warp as usize].requests += 1;
        self.start_compute(warp, c2);
    }

    // ---- fault mode (WIC) ---------------------------------------------------------------------

    fn wic_request(&mut self, warp: u32) {
        let slot = self.slot_of(warp);
        let state = &self.phases[self.phase];
        let generation = state.consumed[slot as usize];
        let layout = state.channel.as_ref().expect("fault mode has channels");
        let va = layout.slots[slot as usize].runs[(generation % 2) as usize];
        let cta = &self.ctas[self.warps[warp as usize].cta as usize];
        let (gpu, sm) = (cta.gpu, cta.sm);
        if self.access(Agent::Warp(warp), gpu, sm, va, AccessType::Read) {
            self.wic_read(warp, va);
        } else if self.warps[warp as usize].state != WarpState::Waiting {
            self.set_waiting(warp, WarpState::Waiting);
        }
    }

    fn wic_read(&mut self, warp: u32, va: u64) {
        let slot = self.slot_of(warp);
        let bytes = self.daemon.as_mut().expect("fault mode").pcm.remove(&va).unwrap_or_default();
        self.receive(warp, &bytes);
        self.daemon.as_mut().expect("fault mode").pcm.insert(va, bytes);
        self.count_reader(slot);
    }

    fn count_reader(&mut self, slot: u32) {
        let warps = self.current().phase.warps_per_cta;
        let state = &mut self.phases[self.phase];
        state.readers[slot as usize] += 1;
        if state.readers[slot as usize] == warps {
            state.readers[slot as usize] = 0;
            state.consumed[slot as usize] += 1;
        }
    }

    // ---- push mode (wic.cuh on the stock driver) --------------------------------------------

    /// The warp wants its slot's next generation: there already, or wait for it (no issue
    /// slot, no fault).
    fn push_request(&mut self, warp: u32) {
        let slot = self.slot_of(warp);
        let state = &mut self.phases[self.phase];
        if state.flag_visible[slot as usize] > state.consumed[slot as usize] {
            self.push_read(warp, slot);
            return;
        }
        state.ready_waiters[slot as usize].push(warp);
        self.set_waiting(warp, WarpState::Waiting);
    }

    fn push_read(&mut self, warp: u32, slot: u32) {
        let state = &self.phases[self.phase];
        let batch = state.phase.warps_per_cta as usize * state.phase.message_bytes as usize;
        let bytes = state.buffer[slot as usize * batch..(slot as usize + 1) * batch].to_vec();
        self.receive(warp, &bytes);
        self.count_reader(slot);
    }

    fn ready_arrives(&mut self, slot: u32) {
        let state = &mut self.phases[self.phase];
        state.flag_visible[slot as usize] += 1;
        let waiters = std::mem::take(&mut state.ready_waiters[slot as usize]);
        for warp in waiters {
            let cta = &self.ctas[self.warps[warp as usize].cta as usize];
            let (gpu, sm) = (cta.gpu, cta.sm);
            self.advance(gpu, sm);
            self.set_waiting(warp, WarpState::Computing);
            self.push_read(warp, slot);
            self.reschedule(gpu, sm);
        }
    }

    // ---- poll mode (Algorithm 1) ----------------------------------------------------------------

    fn arrive_at_barrier(&mut self, warp: u32) {
        self.set_waiting(warp, WarpState::Waiting);
        let cta = self.warps[warp as usize].cta;
        let warps = self.current().phase.warps_per_cta;
        let c = &mut self.ctas[cta as usize];
        c.arrived += 1;
        if c.arrived == warps {
            c.arrived = 0;
            c.poll = PollStage::Flag;
            self.poll_step(cta);
        }
    }

    fn flag_va(&self, slot: u32) -> u64 {
        FLAG_BASE + self.phase as u64 * PHASE_SPAN + u64::from(slot) * PAGE_SIZE
    }

    fn data_va(&self, slot: u32) -> u64 {
        DATA_BASE + self.phase as u64 * PHASE_SPAN + u64::from(slot) * DATA_PAGES * PAGE_SIZE
    }

    /// Thread 0 of the CTA: read the flag until it is set, then read the data.
    fn poll_step(&mut self, cta: u32) {
        let c = &self.ctas[cta as usize];
        let (gpu, sm, poller) = (c.gpu, c.sm, c.first_warp);
        let slot = self.slot_of(poller);
        if c.poll == PollStage::Flag {
            if !self.access(Agent::Warp(poller), gpu, sm, self.flag_va(slot), AccessType::AtomicStrong) {
                return;
            }
            let state = &self.phases[self.phase];
            if state.flag_visible[slot as usize] <= state.consumed[slot as usize] {
                self.ctas[cta as usize].poll = PollStage::Spinning;
                self.phases[self.phase].spinning_cta[slot as usize] = Some(cta);
                self.advance(gpu, sm);
                self.set_waiting(poller, WarpState::Polling);
                self.reschedule(gpu, sm);
                return;
            }
            self.ctas[cta as usize].poll = PollStage::Data;
        }
        if !self.access(Agent::Warp(poller), gpu, sm, self.data_va(slot), AccessType::Read) {
            return;
        }
        let state = &self.phases[self.phase];
        let batch = state.phase.warps_per_cta as usize * state.phase.message_bytes as usize;
        let bytes = state.buffer[slot as usize * batch..(slot as usize + 1) * batch].to_vec();
        self.advance(gpu, sm);
        let first = self.ctas[cta as usize].first_warp;
        for warp in first..first + self.current().phase.warps_per_cta {
            self.set_waiting(warp, WarpState::Computing);
            self.receive(warp, &bytes);
        }
        let state = &mut self.phases[self.phase];
        state.consumed[slot as usize] += 1;
        self.reschedule(gpu, sm);
    }

    fn flag_visible(&mut self, slot: u32) {
        let producer = self.current().phase.producer;
        let state = &mut self.phases[self.phase];
        state.flag_visible[slot as usize] = state.produced[slot as usize];
        state.flag_loc[slot as usize] = producer.into();
        state.data_loc[slot as usize] = producer.into();
        if let Some(cta) = state.spinning_cta[slot as usize].take() {
            let c = &self.ctas[cta as usize];
            let (gpu, sm, poller) = (c.gpu, c.sm, c.first_warp);
            self.advance(gpu, sm);
            self.set_waiting(poller, WarpState::Waiting);
            self.reschedule(gpu, sm);
            self.ctas[cta as usize].poll = PollStage::Flag;
            self.poll_step(cta);
        }
    }

    // ---- producers ----------------------------------------------------------------------------

    fn slot_produced(&mut self, slot: u32) {
        self.progress_at = self.steps;
        let state = &mut self.phases[self.phase];
        let batch = state.phase.warps_per_cta as usize * state.phase.message_bytes as usize;
        let generation = state.produced[slot as usize];
        let key = MessageKey { seed: self.seed, phase: self.phase as u32, slot, generation };
        key.fill(0, &mut state.buffer[slot as usize * batch..(slot as usize + 1) * batch]);
        state.produced[slot as usize] += 1;
        self.slots_left -= 1;
        match (self.mode, state.phase.producer) {
            (Mode::Fault, Endpoint::Host) => {
                self.schedule(self.after(self.cal.daemon.publish_ns.value), Event::PublishArrives { slot });
            }
            (Mode::Fault, Endpoint::Gpu(gpu)) => {
                let layout = state.channel.as_ref().expect("fault mode has channels");
                let pat =
                    layout.slots[slot as usize].pat.expect("GPU producer has PAT pages")[(generation % 2) as usize];
                let sm = slot % self.cal.gpu.sms.value;
                if self.access(Agent::Producer(slot), gpu, sm, pat, AccessType::Write) {
                    // A PAT page is write-protected until its fault is served, unless the re-arm
                    // of an earlier generation has not landed yet: the write would go unnoticed.
                    self.stopped =
                        Some(format!("slot {slot}'s producer found its PAT page still mapped{TIMEOUT_HINT}"));
                }
            }
            (Mode::Push, Endpoint::Host) => {
                // One publish (a copy and a ready word in stream order) by the host thread, which
                // publishes one batch at a time, arrives the measured one-way time of a small
                // message after it began, plus the rest of the batch's copy.
                let push = &self.cal.push;
                let start = self.now.max(self.host_publish_free_at);
                self.host_publish_free_at = start.saturating_add(push.host_publish_ns.value);
                let at = start
                    .saturating_add(push.host_one_way_ns.value)
                    .saturating_add(transfer_ns(batch as u64, self.cal.link.pcie_gbps.value));
                self.schedule(at, Event::ReadyArrives { slot });
            }
            (Mode::Push, Endpoint::Gpu(gpu)) => {
                // The producer kernel's stores over the link, one batch after another at the
                // link's bandwidth, then its fence and the ready word.
                let link = &mut self.peer_link_free_at[gpu as usize];
                let start = self.now.max(*link);
                *link = start.saturating_add(transfer_ns(batch as u64, self.cal.link.nvlink_gbps.value));
                let at = link.saturating_add(self.cal.push.peer_one_way_ns.value);
                self.schedule(at, Event::ReadyArrives { slot });
            }
            (Mode::Poll, Endpoint::Host) => {
                // The CPU's flag write faults if the page sits on the GPU (it does after a poll).
                let on_gpu = state.flag_loc[slot as usize] != Loc::Host;
                let cost = if on_gpu {
                    self.cal.fault.cpu_fault_ns.value.saturating_add(self.cal.pcie_ns(batch as u64))
                } else {
                    0
                };
                self.schedule(self.after(cost), Event::FlagVisible { slot });
            }
            (Mode::Poll, Endpoint::Gpu(gpu)) => {
                let sm = slot % self.cal.gpu.sms.value;
                let flag = self.flag_va(slot);
                if self.access(Agent::Producer(slot), gpu, sm, flag, AccessType::AtomicStrong) {
                    self.flag_visible(slot);
                }
            }
        }
        self.maybe_finish_phase();
    }

    // ---- the UVM fault path -------------------------------------------------------------------

    /// Whether `gpu` can access `va` now; if not, the agent stalls and a fault packet is raised
    /// unless its SM already has one outstanding for that page.
    fn access(&mut self, agent: Agent, gpu: u16, sm: u32, va: u64, access: AccessType) -> bool {
        if self.accessible(gpu, va) {
            return true;
        }
        if let Agent::Warp(_) = agent {
            self.advance(gpu, sm);
            self.gpus[gpu as usize].sms[sm as usize].fault_stalled += 1;
            self.reschedule(gpu, sm);
        }
        self.gpus[gpu as usize].faults.stalled.entry(va).or_default().push((agent, sm));
        self.raise(gpu, sm, va, access);
        false
    }

    fn accessible(&self, gpu: u16, va: u64) -> bool {
        if let Some(daemon) = &self.daemon {
            if daemon.engine.owns(va) {
                return daemon.mapped.contains(&(gpu, va));
            }
        }
        *self.managed_loc(va) == Loc::Gpu(gpu)
    }

    fn managed_loc(&self, va: u64) -> &Loc {
        let state = &self.phases[self.phase];
        match managed_page(va) {
            (slot, true) => &state.data_loc[slot],
            (slot, false) => &state.flag_loc[slot],
        }
    }

    fn set_managed_loc(&mut self, va: u64, loc: Loc) {
        let state = &mut self.phases[self.phase];
        match managed_page(va) {
            (slot, true) => state.data_loc[slot] = loc,
            (slot, false) => state.flag_loc[slot] = loc,
        }
    }

    fn raise(&mut self, gpu: u16, sm: u32, va: u64, access: AccessType) {
        self.steps += 1;
        let path = &mut self.gpus[gpu as usize].faults;
        if !path.outstanding.insert((sm, va)) {
            return;
        }
        if path.buffer.len() >= self.cal.fault.buffer_entries.value as usize {
            // The uTLB keeps the request; it is raised again at the next replay.
            path.outstanding.remove(&(sm, va));
            self.stats.overflows += 1;
            return;
        }
        let sms = self.cal.gpu.sms.value;
        let entry = FaultEntry::replayable_gpc(
            va,
            access,
            self.now,
            0x10_0000 * (u64::from(gpu) + 1),
            (sm * 8 / sms) as u8,
            (sm % 19) as u8,
        );
        path.buffer.push_back((entry.encode(), va));
        self.stats.gpu_faults += 1;
        if !path.bh_active {
            path.bh_active = true;
            self.schedule(self.after(self.cal.fault.interrupt_to_bh_ns.value), Event::BhRun { gpu });
        }
    }

    fn bh_run(&mut self, gpu: u16) {
        let max = self.cal.fault.batch_max.value as usize;
        let path = &mut self.gpus[gpu as usize].faults;
        let n = path.buffer.len().min(max);
        path.batch = path.buffer.drain(..n).collect();
        let f = &self.cal.fault;
        let mut cost = f.batch_fixed_ns.value.saturating_add(f.per_fault_ns.value.saturating_mul(n as u64));
        let mut migrated = HashSet::new();
        for (_, va) in &self.gpus[gpu as usize].faults.batch {
            if !self.wic_owned(*va) && migrated.insert(*va) {
                cost = cost.saturating_add(self.migration_ns(gpu, *va));
            }
        }
        self.stats.batches += 1;
        self.schedule(self.after(cost), Event::BatchDone { gpu });
    }

    fn wic_owned(&self, va: u64) -> bool {
        self.daemon.as_ref().is_some_and(|d| d.engine.owns(va))
    }

    /// Time to migrate a managed page (a flag page, or a whole data region) to `gpu`.
    fn migration_ns(&self, gpu: u16, va: u64) -> u64 {
        let phase = &self.current().phase;
        let bytes = match managed_page(va) {
            (_, true) => u64::from(phase.warps_per_cta) * u64::from(phase.message_bytes),
            (_, false) => PAGE_SIZE,
        };
        match *self.managed_loc(va) {
            Loc::Host => self.cal.pcie_ns(bytes),
            Loc::Gpu(g) if g == gpu => 0,
            Loc::Gpu(_) => self.cal.nvlink_ns(bytes),
        }
    }

    fn batch_done(&mut self, gpu: u16) {
        let batch = std::mem::take(&mut self.gpus[gpu as usize].faults.batch);
        let mut held = Vec::new();
        let mut serviced = false;
        for (raw, va) in &batch {
            if self.wic_owned(*va) {
                held.push(*raw);
            } else {
                serviced = true;
                self.set_managed_loc(*va, Loc::Gpu(gpu));
            }
        }
        if !held.is_empty() {
            self.daemon_input(DaemonInput::Faults(gpu, held));
        }
        // The hook skips the replay of a batch that holds only WIC faults (no refault storm).
        if serviced {
            self.schedule(self.after(self.cal.fault.replay_ns.value), Event::Replay { gpu, resume_bh: true });
        } else {
            self.continue_bh(gpu);
        }
    }

    fn continue_bh(&mut self, gpu: u16) {
        let path = &mut self.gpus[gpu as usize].faults;
        if path.buffer.is_empty() {
            path.bh_active = false;
        } else {
            self.schedule(self.now, Event::BhRun { gpu });
        }
    }

    /// A replay is global: every stalled request retries; those still unmapped fault again.
    /// The driver's default policy (BATCH_FLUSH) first discards what the buffer holds, since
    /// every unserved request raises a fresh entry after the replay anyway.
    fn replay(&mut self, gpu: u16, resume_bh: bool) {
        self.stats.replays += 1;
        let path = &mut self.gpus[gpu as usize].faults;
        self.stats.flushed += path.buffer.len() as u64;
        path.buffer.clear();
        path.outstanding.clear();
        let stalled = std::mem::take(&mut path.stalled);
        let mut pages: Vec<_> = stalled.into_iter().collect();
        pages.sort_unstable_by_key(|(va, _)| *va);
        for (va, agents) in pages {
            if !self.accessible(gpu, va) {
                for (_, sm) in &agents {
                    self.raise(gpu, *sm, va, AccessType::Read);
                }
                self.gpus[gpu as usize].faults.stalled.insert(va, agents);
                continue;
            }
            for (agent, _) in agents {
                self.resume(agent, va);
            }
        }
        if resume_bh {
            self.continue_bh(gpu);
        }
    }

    fn resume(&mut self, agent: Agent, va: u64) {
        match agent {
            Agent::Producer(slot) => {
                if self.mode == Mode::Poll {
                    self.flag_visible(slot);
                }
            }
            Agent::Warp(warp) => {
                let cta = &self.ctas[self.warps[warp as usize].cta as usize];
                let (gpu, sm, id) = (cta.gpu, cta.sm, self.warps[warp as usize].cta);
                self.advance(gpu, sm);
                self.gpus[gpu as usize].sms[sm as usize].fault_stalled -= 1;
                match self.mode {
                    Mode::Fault => {
                        self.set_waiting(warp, WarpState::Computing);
                        self.wic_read(warp, va);
                    }
                    Mode::Poll => self.poll_step(id),
                    Mode::Push => unreachable!("push waiters never fault"),
                }
                self.reschedule(gpu, sm);
            }
        }
    }

    // ---- wicd ---------------------------------------------------------------------------------

    fn daemon_input(&mut self, input: DaemonInput) {
        let daemon = self.daemon.as_mut().expect("fault mode");
        daemon.inbox.push_back(input);
        if !daemon.awake {
            daemon.awake = true;
            self.schedule(self.after(self.cal.daemon.wakeup_ns.value), Event::DaemonRun);
        }
    }

    /// wicd drains its inbox through the engine and executes the commands one after another.
    fn daemon_run(&mut self) {
        let cal = self.cal;
        let mut t = self.now;
        let phase = self.phase;
        let daemon = self.daemon.as_mut().expect("fault mode");
        let mut out = std::mem::take(&mut daemon.commands);
        while let Some(input) = daemon.inbox.pop_front() {
            match input {
                DaemonInput::Faults(gpu, entries) => {
                    t = t.saturating_add(cal.daemon.engine_per_entry_ns.value.saturating_mul(entries.len() as u64));
                    daemon.engine.handle_faults(t, gpu, &entries, &mut out);
                }
                DaemonInput::Publish(slot) => {
                    t = t.saturating_add(cal.daemon.engine_per_entry_ns.value);
                    let id = self.phases[phase].channel.as_ref().expect("fault mode").id;
                    if let Err(e) = daemon.engine.publish(t, id, slot, &mut out) {
                        self.stopped = Some(format!("publish: {e}{TIMEOUT_HINT}"));
                    }
                }
            }
        }
        daemon.engine.expire(t, &mut out);
        if !out.is_empty() {
            t = self.submit(&mut out, t);
        }
        let daemon = self.daemon.as_mut().expect("fault mode");
        daemon.commands = out;
        daemon.busy_ns += t - self.now;
        self.schedule(t, Event::DaemonIdle);
    }

    fn daemon_idle(&mut self) {
        let daemon = self.daemon.as_mut().expect("fault mode");
        if daemon.inbox.is_empty() {
            daemon.awake = false;
        } else {
            self.schedule(self.now, Event::DaemonRun);
        }
    }

    /// Executes one engine step's commands as one batched submission starting at `at`; returns
    /// when it completes. Copies over one link pipeline (one latency per link per submission);
    /// mapping changes land in order when the submission completes, replays after that.
    fn submit(&mut self, commands: &mut Vec<Command>, at: Nanos) -> Nanos {
        let cal = self.cal;
        let state = &self.phases[self.phase];
        let daemon = self.daemon.as_mut().expect("fault mode");
        let (mut host_copy, mut pcie, mut nvlink, mut pages) = (0u64, 0u64, 0u64, 0u64);
        let mut landing = Vec::new();
        for command in commands.drain(..) {
            match command {
                Command::Complete { gpu, run_va: va, companion_va, pages: n, fill, .. } => {
                    let run = daemon.pcm.entry(va).or_default();
                    run.clear();
                    match fill {
                        Fill::Data { len, source } => {
                            let (from, on_host) = match source {
                                DataSource::Host { offset } => (offset, true),
                                DataSource::Gpu { va: src, .. } => (src % PHASE_SPAN, false),
                            };
                            run.extend_from_slice(&state.buffer[from as usize..(from + len) as usize]);
                            if on_host {
                                host_copy += len;
                                daemon.host_resident_runs.insert(va);
                            } else {
                                nvlink += len;
                                daemon.host_resident_runs.remove(&va);
                            }
                        }
                        Fill::Marker(marker) => {
                            run.resize((u64::from(n) * PAGE_SIZE) as usize, 0);
                            run[..8].copy_from_slice(&marker.word().to_le_bytes());
                            daemon.host_resident_runs.insert(va);
                        }
                    }
                    // The companion's unmap, then the run's map: two page-table updates.
                    pages += 2 * u64::from(n);
                    landing.push(Event::Unmap { gpu, va: companion_va, pages: n });
                    if daemon.host_resident_runs.contains(&va) {
                        pcie += u64::from(n) * PAGE_SIZE;
                    }
                    landing.push(Event::Map { gpu, va, pages: n });
                }
                Command::ServicePat { gpu, va } => {
                    pages += 1;
                    landing.push(Event::Map { gpu, va, pages: 1 });
                }
                Command::RearmPat { gpu, va } => {
                    pages += 1;
                    landing.push(Event::Unmap { gpu, va, pages: 1 });
                }
                Command::Replay { gpu } => landing.push(Event::Replay { gpu, resume_bh: false }),
            }
        }
        let link = |bytes: u64, f: fn(&Calibration, u64) -> u64| if bytes > 0 { f(cal, bytes) } else { 0 };
        let done = [
            cal.daemon.submission_ns.value,
            cal.daemon.per_page_ns.value.saturating_mul(pages),
            cal.memcpy_ns(host_copy),
            link(pcie, Calibration::pcie_ns),
            link(nvlink, Calibration::nvlink_ns),
        ]
        .into_iter()
        .fold(at, u64::saturating_add);
        for event in landing {
            let when = if matches!(event, Event::Replay { .. }) {
                done.saturating_add(cal.fault.replay_ns.value)
            } else {
                done
            };
            self.schedule(when, event);
        }
        done
    }

    fn report(&self) -> RunReport {
        let sms = self.gpus.iter().flat_map(|g| &g.sms);
        let (occupied, wait, overlap) =
            sms.fold((0.0, 0.0, 0.0), |(o, w, v), s| (o + s.occupied_ns, w + s.wait_ns, v + s.overlap_ns));
        let daemon = self.daemon.as_ref();
        let runtime = self.runtime.unwrap_or(self.now);
        RunReport {
            workload: self.workload.name,
            mode: self.mode,
            runtime_ns: runtime,
            consumer_overhead: if occupied > 0.0 { (wait - overlap) / occupied } else { 0.0 },
            overlap_efficiency: if wait > 0.0 { overlap / wait } else { 1.0 },
            daemon_share: daemon.map_or(0.0, |d| d.busy_ns as f64 / runtime.max(1) as f64),
            gpu_faults: self.stats.gpu_faults,
            fault_batches: self.stats.batches,
            replays: self.stats.replays,
            fault_buffer_overflows: self.stats.overflows,
            flushed_entries: self.stats.flushed,
            messages_checked: self.stats.messages,
            bytes_checked: self.stats.bytes,
            corrupt_messages: self.stats.corrupt,
            error_markers: self.stats.markers,
            engine: daemon.map(|d| d.engine.stats().clone()),
            pool_restored: daemon.is_none_or(|d| d.engine.pool().free_pages() == d.engine.pool().capacity()),
            pfq_empty: daemon.is_none_or(|d| d.engine.held() == 0),
            events: self.stats.events,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{all, by_name};

    #[test]
    fn the_engine_keeps_its_default_size_unless_a_workload_needs_more() {
        let default = EngineConfig::default();
        for w in all().into_iter().chain(all().into_iter().map(|w| w.with_threads(16 * 1024))) {
            let config = check(&w).unwrap();
            assert_eq!((config.pool_pages, config.max_slots), (default.pool_pages, ENGINE_SLOTS), "{}", w.name);
        }
        // At a million threads G_GEM's channel takes 6144 slots x (2 runs + 2 PAT pages): more than
        // the default 16K pages, so it used to be refused (a panic in the demo's sweep).
        let gem = by_name("G_GEM").unwrap().with_threads(1 << 20);
        assert_eq!(check(&gem).unwrap().pool_pages, 6144 * 4);
        let report = try_run(&gem, Mode::Fault, &Calibration::built_in(), 1).unwrap();
        assert!(report.messages_checked > 0 && report.corrupt_messages == 0 && report.pool_restored);
    }

    #[test]
    fn a_workload_past_the_models_layout_is_refused_before_anything_is_allocated() {
        // 512M threads: 2^20 CTAs of three requests each; each run needs gigabytes when it starts.
        let gem = by_name("G_GEM").unwrap().with_threads(512 << 20);
        let reason = check(&gem).unwrap_err();
        assert!(reason.contains("3145728 request slots") && reason.contains("1048576"), "{reason}");
        for mode in [Mode::Poll, Mode::Fault] {
            assert_eq!(try_run(&gem, mode, &Calibration::built_in(), 1).unwrap_err(), reason);
        }
        let mut empty = by_name("C_CG").unwrap();
        empty.phases[0].ctas = 0;
        assert!(check(&empty).unwrap_err().contains("phase 0"));
    }

    #[test]
    fn the_memory_estimate_grows_with_the_workload_and_fault_mode_needs_more() {
        for w in all() {
            let (small, large) = (w.clone().with_threads(1 << 20), w.with_threads(16 << 20));
            let poll = memory_estimate(&large, Mode::Poll);
            assert!(
                memory_estimate(&large, Mode::Fault) > poll && poll > memory_estimate(&small, Mode::Poll),
                "{}",
                large.name
            );
        }
        // C_SRS, the largest, at the 16M threads `wicd demo --scale` allows: measured 1.54 GiB.
        let srs = memory_estimate(&by_name("C_SRS").unwrap().with_threads(16 << 20), Mode::Fault);
        assert!((1_650_000_000..2_500_000_000).contains(&srs), "{srs}");
        let mut huge = by_name("C_SRS").unwrap();
        (huge.phases[0].ctas, huge.phases[0].message_bytes) = (u32::MAX, u32::MAX);
        assert_eq!(memory_estimate(&huge, Mode::Fault), u64::MAX, "saturates");
    }
}

#[cfg(test)]
mod calibration_tests {
    use super::*;
    use crate::calibration::{
        CLOCK_GHZ, FAULT_ENTRIES, GBPS, ISSUE_WEIGHT, LATENCY_NS, PROGRESS, SCHEDULERS_PER_SM, SMS, WARP_IPC,
        WARP_SLOTS_PER_SM,
    };
    use crate::workload::{all, by_name};

    /// The slowest GPU, fault path and links a calibration file may describe (`slow`), or the
    /// fastest.
    fn extreme(slow: bool) -> Calibration {
        let end = |r: &std::ops::RangeInclusive<u32>, low: bool| if low { *r.start() } else { *r.end() };
        let endf = |r: &std::ops::RangeInclusive<f64>, low: bool| if low { *r.start() } else { *r.end() };
        let mut cal = Calibration::built_in();
        cal.gpu.sms.value = end(&SMS, slow);
        cal.gpu.warp_slots_per_sm.value = end(&WARP_SLOTS_PER_SM, slow);
        cal.gpu.schedulers_per_sm.value = end(&SCHEDULERS_PER_SM, slow);
        cal.gpu.clock_ghz.value = endf(&CLOCK_GHZ, slow);
        cal.gpu.warp_ipc.value = endf(&WARP_IPC, slow);
        cal.fault.buffer_entries.value = end(&FAULT_ENTRIES, slow);
        cal.fault.batch_max.value = end(&FAULT_ENTRIES, slow);
        for (_, latency) in cal.latencies_mut() {
            *latency = if slow { *LATENCY_NS.end() } else { *LATENCY_NS.start() };
        }
        for rate in [&mut cal.link.pcie_gbps.value, &mut cal.link.nvlink_gbps.value, &mut cal.host.memcpy_gbps.value] {
            *rate = endf(&GBPS, slow);
        }
        cal.poll.issue_weight.value = endf(&ISSUE_WEIGHT, !slow);
        cal.stall.compute_progress.value = endf(&PROGRESS, slow);
        cal.stall.memory_progress.value = endf(&PROGRESS, slow);
        cal
    }

    /// Every workload both ways at the ends of every calibration range, at 16K consumer threads:
    /// each run finishes, none panics (overflow checks are on in tests), and every message
    /// arrives intact.
    #[test]
    fn every_workload_runs_at_the_ends_of_every_calibration_range() {
        for slow in [true, false] {
            let cal = extreme(slow);
            for w in all().into_iter().map(|w| w.with_threads(16 << 10)) {
                for mode in [Mode::Poll, Mode::Push, Mode::Fault] {
                    let report =
                        try_run(&w, mode, &cal, 1).unwrap_or_else(|e| panic!("{} {}: {e}", w.name, mode.name()));
                    assert!(
                        report.messages_checked > 0 && report.corrupt_messages == 0,
                        "{} {}: {report:?}",
                        w.name,
                        mode.name()
                    );
                    assert!(report.pool_restored && report.pfq_empty, "{} {}", w.name, mode.name());
                }
            }
        }
    }

    /// A `Calibration` built in code is not checked: a latency of `u64::MAX` used to overflow the
    /// clock (a panic with overflow checks, a wrapped time without). The run ends as an error.
    #[test]
    fn a_clock_past_the_limit_ends_the_run_as_an_error() {
        let w = crate::workload::by_name("C_CG").unwrap().with_threads(64);
        for index in 0..12 {
            let mut cal = Calibration::built_in();
            *cal.latencies_mut()[index].1 = u64::MAX;
            for mode in [Mode::Poll, Mode::Fault] {
                match try_run(&w, mode, &cal, 1) {
                    Ok(report) => assert!(report.runtime_ns <= CLOCK_LIMIT, "latency {index} {}", mode.name()),
                    Err(e) => assert!(e.contains("the emulated clock would pass 4611686018427387904 ns"), "{e}"),
                }
            }
        }
        let mut cal = Calibration::built_in();
        cal.fault.interrupt_to_bh_ns.value = u64::MAX;
        assert!(try_run(&w, Mode::Fault, &cal, 1).is_err(), "every fault goes through the bottom half");
        cal.gpu.clock_ghz.value = 1e-300;
        assert!(try_run(&w, Mode::Poll, &cal, 1).is_err(), "compute that takes forever");
    }

    /// device/bench/stall_cost.cu's measurement on an H100 (committed with the calibration it
    /// gave): the median progress, beside fault-stalled warps, of the work kinds in `works`.
    fn measured_progress(works: &[&str]) -> f64 {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../device/bench/results/stall-cost-h100-2026-11-26.jsonl");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut progress: Vec<f64> = text
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("a JSON line"))
            .filter(|r| {
                r["measurement"] == "stall_cost"
                    && r["pages"] == "host_resident"
                    && r.get("stalls_on").is_none()
                    && works.iter().any(|w| r["work"] == *w)
            })
            .map(|r| r["progress_while_stalled"].as_f64().expect("a number"))
            .collect();
        assert!(!progress.is_empty(), "no {works:?} in {path}");
        progress.sort_by(f64::total_cmp);
        let n = progress.len();
        if n % 2 == 1 {
            progress[n / 2]
        } else {
            (progress[n / 2 - 1] + progress[n / 2]) / 2.0
        }
    }

    /// The measurement the stall model is built from, run through the model: one SM, 8 warps
    /// of work (a CTA that never waits) beside 8 warps stalled on a fault (a CTA whose data
    /// comes late), for work of no memory share (the benchmark's eight FMA chains) and of all
    /// memory (its L2, DRAM and TLB-missing loads). The work's speed while the others are
    /// stalled (the overlap efficiency: useful work per waiting time) is the measured one, and
    /// the built-in constants are the measurement's medians.
    #[test]
    fn work_beside_fault_stalled_warps_goes_at_the_measured_speed() {
        let compute = measured_progress(&["fma_ilp"]);
        let memory = measured_progress(&["l2_loads", "dram_loads", "tlb_misses"]);
        let built_in = Calibration::built_in();
        assert!((built_in.stall.compute_progress.value - compute).abs() < 5e-4, "{compute}");
        assert!((built_in.stall.memory_progress.value - memory).abs() < 5e-4, "{memory}");
        for (memory_share, measured) in [(0.0, compute), (1.0, memory)] {
            let mut cal = Calibration::built_in();
            cal.gpu.sms.value = 1;
            cal.gpu.warp_slots_per_sm.value = 16;
            let phase = Phase {
                producer: Endpoint::Host,
                consumer: Endpoint::Gpu(0),
                ctas: 2,
                warps_per_cta: 8,
                requests_per_warp: 1,
                c1_instr: 1_000,
                c2_instr: 10_000_000,
                memory_share,
                jitter: 0.0,
                independent_ctas: 0.5,
                request_probability: 1.0,
                message_bytes: 256,
                order: ProduceOrder::Sequential,
                produce_ns: 50_000,
                producer_lanes: 1,
                producer_start_ns: 0,
                host_compute_ns: 0,
            };
            let w = Workload {
                name: "stall_cost",
                title: "work beside fault-stalled warps",
                pattern: "-",
                model: "-",
                iterations: 1,
                phases: vec![phase],
            };
            let report = try_run(&w, Mode::Fault, &cal, 1).expect("the run ends");
            let modelled = report.overlap_efficiency;
            assert!((modelled / measured - 1.0).abs() < 0.02, "memory share {memory_share}: {modelled} vs {measured}");
        }
    }

    /// push delivers every message intact without a fault, and its waits are as long as the
    /// measured one-way time makes them: host producers on PCIe, GPU producers on NVLink.
    #[test]
    fn push_waits_for_the_measured_one_way_time_and_never_faults() {
        for name in ["C_CG", "G_STN"] {
            let w = by_name(name).unwrap().with_threads(4096);
            let cal = Calibration::built_in();
            let report = try_run(&w, Mode::Push, &cal, 1).expect("push runs");
            assert!(report.messages_checked > 0 && report.corrupt_messages == 0, "{name}: {report:?}");
            assert_eq!(report.gpu_faults, 0, "{name}");
            let mut slower = cal.clone();
            slower.push.host_one_way_ns.value *= 100;
            slower.push.peer_one_way_ns.value *= 100;
            let slow = try_run(&w, Mode::Push, &slower, 1).expect("push runs");
            assert!(slow.runtime_ns > report.runtime_ns, "{name}: {} vs {}", slow.runtime_ns, report.runtime_ns);
        }
    }

    /// Calibrations a file may hold can still lead the model where it cannot follow; the run
    /// says so. A fault path slower than the channels' 1 s timeout used to panic (a GPU producer
    /// found its PAT page still mapped after a timed-out wait); a replay slower than the other
    /// GPU's fault service made a flag page shared by two GPUs migrate back and forth forever.
    #[test]
    fn a_run_the_model_cannot_follow_ends_as_an_error_not_a_panic_or_a_hang() {
        let bfs = by_name("G_BFS").unwrap();
        // As the case was found: before a stalled warp slowed the others of its SM.
        let mut slow_faults = Calibration::built_in();
        slow_faults.stall.compute_progress.value = 1.0;
        slow_faults.stall.memory_progress.value = 1.0;
        for (_, latency) in slow_faults.latencies_mut().into_iter().take(5) {
            *latency = 1_000_000_000;
        }
        let e = try_run(&bfs, Mode::Fault, &slow_faults, 1).unwrap_err();
        assert!(e.contains("producer found its PAT page still mapped") && e.contains("1 s timeout"), "{e}");

        let mut slow_replay = Calibration::built_in();
        slow_replay.fault.replay_ns.value = 1_000_000;
        let e = try_run(&bfs.with_threads(1024), Mode::Poll, &slow_replay, 1).unwrap_err();
        assert!(
            e.starts_with("the run is stuck at ") && e.contains(" events and faults without a warp finishing"),
            "{e}"
        );
    }
}
