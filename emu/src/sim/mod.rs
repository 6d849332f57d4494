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

mod consumers;
mod fault_path;
mod producers;
mod sm;
mod wicd;

pub use sm::Neighbour;

/// How consumer warps wait for producer data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The paper's Algorithm 1 (wic.cuh's alg1 is its form made correct): thread 0 of each CTA
    /// spins on a managed flag, whose page migrates between producer and consumer.
    Alg1,
    /// WIC: each warp touches its PCM page and stalls until wicd serves the fault. A host
    /// producer writes its batch in place, straight into the run the slot's generation reads
    /// (CPU-resident, unmapped on the consumer GPU while the fault is held), all but the first 8
    /// bytes of each page, which it leaves in wicd's shared buffer; wicd's completion writes
    /// those head words alone and maps the run (`Engine::publish_in_place`, `Fill::Heads`).
    /// A GPU producer's batches go as in [`Mode::FaultCopy`].
    Fault,
    /// WIC with wicd copying each host producer's batch into the run on its one thread, at the
    /// measured single-thread memcpy rate (`host.memcpy_gbps`): the path before in place, and
    /// the one left to a producer that cannot write the run (another process). GPU producers:
    /// their PAT writes fault, and nvidia-uvm copies the batch over the link.
    FaultCopy,
    /// WIC with nvidia-uvm's copy engine filling the run instead of wicd's CPU copy: a host
    /// producer's batch crosses PCIe (`link.pcie_gbps`, one `link.pcie_latency_ns` a
    /// submission) as a DMA that does not occupy wicd's thread, into GPU-resident pages, so the
    /// consumers read local memory, not across PCIe. No copy-engine set-up latency has been
    /// measured, so none is charged, and the DMA overlaps the submission's page-table work:
    /// the model's figures for it are a lower bound. GPU producers as in [`Mode::FaultCopy`].
    FaultCopyEngine,
    /// wic.cuh's push on the stock driver: the producer's batch is copied into the consumer
    /// GPU's memory and a ready word set there; warps wait on the word with backoff, neither
    /// faulting nor crossing a link, at an issue cost the model leaves out (measured on H100s:
    /// 0.2% to 1.7% for 8 waiting warps per SM, `device/bench/transport.cu`).
    Push,
    /// wic.cuh's poll: the data goes where push puts it, but the ready word stays with the
    /// producer (pinned host memory, or the producer GPU's memory) and each waiting warp spins
    /// on it across the link. Warps spinning on host memory slow what crosses PCIe: the one way
    /// and the host's publish grow with their number, as measured (`calibration::Poll`).
    Poll,
    /// No waiting: every message is in the consumer GPU's memory before its kernel starts, and
    /// results go nowhere; the lower bound that device/apps' `nowait` runs measure.
    NoWait,
}

impl Mode {
    /// Every mode the model runs: the one list of them. The tables each run a subset, named
    /// below, in the order of their columns.
    pub const ALL: [Mode; 7] =
        [Self::NoWait, Self::Push, Self::Poll, Self::Alg1, Self::Fault, Self::FaultCopy, Self::FaultCopyEngine];

    /// A comparison's (`compare`, `wicd demo`'s table, wic-report's application tables and
    /// plane), in the order of `Comparison`'s fields: the naive baseline, what the stock driver
    /// runs today, and WIC, its host producers writing in place. The other ways of WIC's are
    /// run beside it only where a table asks (`compare::try_compare_with`).
    pub const COMPARED: [Mode; 3] = [Self::Alg1, Self::Push, Self::Fault];

    /// What device/apps' programs run that the model runs too, the validation's rows: the
    /// modes the stock driver runs, so every mode but WIC's (the stock driver cannot hold a
    /// fault).
    pub const STOCK_DRIVER: [Mode; 4] = [Self::NoWait, Self::Push, Self::Poll, Self::Alg1];

    /// The co-run's (`corun`), the modes `device/bench/corun.cu`'s rows are set beside: the
    /// stock driver's three ways of waiting (no `NoWait`: nothing waits) and WIC as a
    /// comparison runs it, in place.
    pub const CORUN: [Mode; 4] = [Self::Push, Self::Poll, Self::Alg1, Self::Fault];

    /// The ways a host producer's batch reaches its run under WIC (`host_fill`), in its table's
    /// order: wicd copying, the copy engine, in place.
    pub const HOST_FILLS: [Mode; 3] = [Self::FaultCopy, Self::FaultCopyEngine, Self::Fault];

    /// Its name, the transport's (wic.cuh's and device/apps' `MODE` argument, where they have
    /// it): the word tables, errors and the GPU runs' result lines use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Alg1 => "alg1",
            Self::Fault => "fault",
            Self::FaultCopy => "fault-copy",
            Self::FaultCopyEngine => "fault-ce",
            Self::Push => "push",
            Self::Poll => "poll",
            Self::NoWait => "nowait",
        }
    }

    /// Whether warps wait on held faults, wicd serving them: WIC, however the runs are filled.
    pub fn is_wic(self) -> bool {
        matches!(self, Self::Fault | Self::FaultCopy | Self::FaultCopyEngine)
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
    /// wicd's busy time (WIC modes; 0 otherwise).
    pub daemon_busy_ns: Nanos,
    /// Mean time from a batch's production (a host producer's publish call, a producer kernel's
    /// write) to each warp's receiving its message from it; a warp that asks after its message
    /// is there counts its own lateness too.
    pub mean_delivery_ns: f64,
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
    /// Messages consumer warps sent back (exchanges, `Phase::sends_back`).
    pub sends: u64,
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
    /// A host producer's publish reaches wicd; `in_place`: the run side it wrote in place.
    PublishArrives {
        slot: u32,
        in_place: Option<u8>,
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
    /// A warp's own message to the producer GPU is out (exchanges, `Phase::sends_back`).
    SendDone {
        warp: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Agent {
    Warp(u32),
    Producer(u32),
    /// A consumer warp whose own message (exchanges, `Phase::sends_back`) is a write to a PAT
    /// page of the reverse channel, held until wicd services it.
    Sender(u32),
    /// The other GPU's consumer of the reverse channel, which waits there already: the model
    /// runs its faults and completions, not its warps.
    Mirror,
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
    /// Messages of its own sent back so far (`Phase::sends_back`).
    sent: u32,
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
    /// Per neighbour (`Sim::neighbours`), its work done on this SM: time at its speed here.
    neighbour_work: Vec<f64>,
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
    /// A slot whose producer wrote run `side` in place.
    PublishInPlace(u32, u8),
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
    /// Sends waiting for the other GPU to have their slot's previous generation, by the
    /// (GPU, run) whose mapping there says it has (`Sim::send_write`).
    waiting_sends: HashMap<(u16, u64), Vec<Send>>,
}

/// A warp's send in an exchange under WIC: the reverse channel's slot and generation, and
/// whether the warp is the first of its block to send it.
#[derive(Debug, Clone, Copy)]
struct Send {
    warp: u32,
    slot: usize,
    generation: u64,
    first: bool,
}

/// Per-phase communication state, kept across iterations.
struct PhaseState {
    phase: Phase,
    channel: Option<ChannelLayout>,
    /// Fault mode, an exchange: the channel of the consumer GPU's own messages to the producer
    /// GPU, a GPU producer's (PAT pages) like the forward one.
    reverse: Option<ChannelLayout>,
    /// Warps that sent on each slot of the reverse channel so far.
    reverse_sent: Vec<u64>,
    /// The producer's buffer: `slots x batch_bytes`.
    buffer: Vec<u8>,
    produced: Vec<u64>,
    /// When each slot's latest batch was produced.
    produced_at: Vec<Nanos>,
    consumed: Vec<u64>,
    /// Warps of the current generation that have read each slot.
    readers: Vec<u32>,
    flag_visible: Vec<u64>,
    flag_loc: Vec<Loc>,
    data_loc: Vec<Loc>,
    spinning_cta: Vec<Option<u32>>,
    /// push and poll: warps waiting for each slot's next generation.
    ready_waiters: Vec<Vec<u32>>,
    /// A host producer's publish being filled: the slots made so far, and how many it takes.
    publish_group: Vec<u32>,
    publish_size: u32,
}

const FLAG_BASE: u64 = 0x5000_0000_0000;
const DATA_BASE: u64 = 0x6000_0000_0000;
const PHASE_SPAN: u64 = 1 << 36;
/// Pages reserved for one slot's data region in alg1 mode, at least: a batch of more takes
/// as many as it fills ([`data_stride`]).
const DATA_PAGES: u64 = 16;
/// The bytes at the start of each page of an in-place run that the producer leaves in wicd's
/// shared buffer and wicd's completion writes (`Fill::Heads`).
const HEAD_BYTES: usize = 8;
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

/// The slot of a managed page of `phase`, and whether it is the data region (else the flag).
fn managed_page(phase: &Phase, va: u64) -> (usize, bool) {
    let page = (va % PHASE_SPAN) / PAGE_SIZE;
    if va >= DATA_BASE {
        ((page / data_stride(phase)) as usize, true)
    } else {
        (page as usize, false)
    }
}

/// Pages between two slots' data regions in alg1 mode: [`DATA_PAGES`], or the pages of a
/// larger batch.
fn data_stride(phase: &Phase) -> u64 {
    (u64::from(phase.warps_per_cta) * u64::from(phase.message_bytes)).div_ceil(PAGE_SIZE).max(DATA_PAGES)
}

/// Slots a phase may have whose batches are at most [`DATA_PAGES`] pages: alg1 mode gives
/// every slot that many pages of its phase's address span (2^20 slots; a million consumer
/// threads make at most 6144). A phase of larger batches may have fewer.
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

/// Runs `workload` as [`try_run`] does, with `neighbours`, kernels sharing every SM of GPU 0
/// with it, and reports besides each neighbour's throughput relative to alone over the run:
/// its speed at each moment (the issue slots it shares with the run's computing and polling
/// warps, and its progress while a warp of the SM is stalled on a fault or spins on host
/// memory: the rules the run's own warps go by) averaged over the SMs and the run's time. The
/// neighbours do not slow the run itself: the model has no way for them to.
pub fn try_run_beside(
    workload: &Workload,
    mode: Mode,
    cal: &Calibration,
    seed: u64,
    neighbours: &[Neighbour],
) -> Result<(RunReport, Vec<f64>), String> {
    let config = check(workload)?;
    let mut sim = Sim::new(workload, mode, cal, seed, config)?;
    sim.neighbours = neighbours.to_vec();
    sim.execute()?;
    let runtime = sim.runtime.unwrap_or(sim.now);
    let sms = &sim.gpus[0].sms;
    let throughput = (0..neighbours.len())
        .map(|i| {
            let work: f64 = sms
                .iter()
                .map(|s| {
                    // From the SM's last change to the run's end, at the speed of its state then.
                    let tail = runtime.saturating_sub(s.last) as f64 * sim.neighbour_speed(s, &neighbours[i]);
                    s.neighbour_work.get(i).copied().unwrap_or(0.0) + tail
                })
                .sum();
            work / (runtime.max(1) as f64 * sms.len() as f64)
        })
        .collect();
    Ok((sim.report(), throughput))
}

/// Slots of the engine a fault-mode run gets at least.
const ENGINE_SLOTS: u32 = 16 * 1024;

/// Whether the model can hold `workload`, and the engine it gets in fault mode: the default
/// pool (16K pages) and 16K slots, grown where the workload's channels, all open for the whole
/// run, need more pages or slots than that, so the default runs' numbers do not change.
pub fn check(workload: &Workload) -> Result<EngineConfig, String> {
    // One slot serves one CTA; the engine's batch is the largest CTA's.
    let gpu_phases = || workload.phases.iter().filter(|p| p.consumer != Endpoint::Host);
    let warps_per_batch = gpu_phases().map(|p| p.warps_per_cta).max().unwrap_or(16);
    let (mut pages, mut slots) = (0u64, 0u64);
    for (index, phase) in workload.phases.iter().enumerate() {
        let phase_slots = u64::from(phase.ctas) * u64::from(phase.requests_per_warp);
        if phase_slots == 0 || phase.warps_per_cta == 0 || phase.message_bytes == 0 || phase.publish_slots == 0 {
            return Err(format!("phase {index} has no CTA, warp, request, message byte or slot per publish"));
        }
        if !(0.0..=1.0).contains(&phase.memory_share) {
            return Err(format!("phase {index}'s memory share {} is not a share (0 to 1)", phase.memory_share));
        }
        let most = PHASE_SPAN / (data_stride(phase) * PAGE_SIZE);
        if phase_slots > most {
            return Err(format!(
                "phase {index} has {phase_slots} request slots; the model's address layout holds at most {most} a phase"
            ));
        }
        if phase.sends_back
            && !matches!((phase.producer, phase.consumer), (Endpoint::Gpu(p), Endpoint::Gpu(c)) if p != c)
        {
            return Err(format!("phase {index} sends back, which only an exchange between two GPUs does"));
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
            timeout_ns: CHANNEL_TIMEOUT_NS,
        };
        let bytes =
            spec.placement_bytes(warps_per_batch).ok_or_else(|| format!("phase {index} cannot be a channel"))?;
        // An exchange's reverse channel (fault mode) is the same size.
        let channels = if phase.sends_back { 2 } else { 1 };
        pages += channels * (bytes / PAGE_SIZE);
        slots += channels * phase_slots;
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
        if mode.is_wic() && phase.consumer != Endpoint::Host {
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
    /// push and poll: when the host thread is done with its last publish...
    host_publish_free_at: Nanos,
    /// ...and PCIe with the copies of the publishes so far.
    host_link_free_at: Nanos,
    /// push and poll: per producer GPU, when its link is done with the batches it carries.
    peer_link_free_at: Vec<Nanos>,
    /// Steps past `progress_at` that make the run stuck.
    stall_steps: u64,
    stats: Counters,
    /// Kernels on every SM beside the run's, whose speed the run tracks (`try_run_beside`).
    neighbours: Vec<Neighbour>,
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
    /// Summed over the messages received: from their batch's production to their receipt.
    delivery_ns: f64,
    corrupt: u64,
    markers: u64,
    sends: u64,
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
            Mode::Fault | Mode::FaultCopy | Mode::FaultCopyEngine => Some(Daemon {
                engine: Engine::new(config).map_err(|e| format!("engine: {e}"))?,
                inbox: VecDeque::new(),
                awake: false,
                busy_ns: 0,
                commands: Vec::new(),
                host_resident_runs: HashSet::new(),
                pcm: HashMap::new(),
                mapped: HashSet::new(),
                waiting_sends: HashMap::new(),
            }),
            Mode::Alg1 | Mode::Push | Mode::Poll | Mode::NoWait => None,
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
            host_link_free_at: 0,
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
            neighbours: Vec::new(),
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
                    timeout_ns: CHANNEL_TIMEOUT_NS,
                };
                Some(daemon.engine.open_channel(spec).map_err(|e| format!("open channel: {e}"))?)
            }
            _ => None,
        };
        let reverse = match (self.daemon.as_mut(), phase.consumer, phase.producer) {
            (Some(daemon), Endpoint::Gpu(consumer), Endpoint::Gpu(producer)) if phase.sends_back => {
                let spec = ChannelSpec {
                    consumer_gpu: producer,
                    // Its bytes are the consumer GPU's; the model fills the runs from the same
                    // region as the forward channel's, as their stand-in.
                    producer: Producer::Gpu { gpu: consumer, base_va: DATA_BASE + index as u64 * PHASE_SPAN },
                    message_bytes: phase.message_bytes,
                    slots: slots as u32,
                    timeout_ns: CHANNEL_TIMEOUT_NS,
                };
                Some(daemon.engine.open_channel(spec).map_err(|e| format!("open the reverse channel: {e}"))?)
            }
            _ => None,
        };
        Ok(PhaseState {
            reverse,
            reverse_sent: vec![0; slots],
            buffer: vec![0; slots * batch_bytes as usize],
            produced: vec![0; slots],
            produced_at: vec![0; slots],
            consumed: vec![0; slots],
            readers: vec![0; slots],
            flag_visible: vec![0; slots],
            flag_loc: vec![Loc::Host; slots],
            data_loc: vec![Loc::Host; slots],
            spinning_cta: vec![None; slots],
            ready_waiters: vec![Vec::new(); slots],
            publish_group: Vec::new(),
            publish_size: 0,
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

    /// Runs every event in time order until the workload is done. A run ends as an error where its clock would pass
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
            if self.runtime.is_some() {
                // The workload is done and its channels closed: what is still queued (stale
                // fault entries, their replays) happens after the run and would find the
                // channels' pages back in the pool.
                break;
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
            Event::PublishArrives { slot, in_place: None } => self.daemon_input(DaemonInput::Publish(slot)),
            Event::PublishArrives { slot, in_place: Some(side) } => {
                self.daemon_input(DaemonInput::PublishInPlace(slot, side))
            }
            Event::ReadyArrives { slot } => self.ready_arrives(slot),
            Event::BhRun { gpu } => self.bh_run(gpu),
            Event::BatchDone { gpu } => self.batch_done(gpu),
            Event::Replay { gpu, resume_bh } => self.replay(gpu, resume_bh),
            Event::Map { gpu, va, pages } | Event::Unmap { gpu, va, pages } => {
                let daemon = self.daemon.as_mut().expect("mappings change on the daemon's commands");
                let mut released = Vec::new();
                for page in 0..u64::from(pages) {
                    let key = (gpu, va + page * PAGE_SIZE);
                    if matches!(event, Event::Map { .. }) {
                        daemon.mapped.insert(key);
                        released.extend(daemon.waiting_sends.remove(&key).unwrap_or_default());
                    } else {
                        daemon.mapped.remove(&key);
                    }
                }
                for send in released {
                    self.send_write(send);
                }
            }
            Event::DaemonRun => self.daemon_run(),
            Event::DaemonIdle => self.daemon_idle(),
            Event::HostPhaseDone => self.phase_done(),
            Event::SendDone { warp } => self.send_done(warp),
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
            let cost = self.cal.pcie_ns(bytes).saturating_add(phase.host_compute_ns);
            let at = self.after(if self.mode == Mode::NoWait { 0 } else { cost });
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
                self.warps.push(Warp { cta, lane, scale, requests: 0, sent: 0, state: WarpState::Computing });
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
        match phase.order {
            ProduceOrder::Sequential => {}
            ProduceOrder::Shuffled => self.rng.shuffle(&mut requested),
            ProduceOrder::RequestMajor => {
                requested.sort_by_key(|&slot| (slot % phase.requests_per_warp, slot / phase.requests_per_warp))
            }
        }
        for (position, slot) in requested.into_iter().enumerate() {
            if self.mode == Mode::NoWait {
                // Everything is in place before the kernel starts.
                self.slot_produced(slot);
                continue;
            }
            let round = position as u64 / u64::from(phase.producer_lanes) + 1;
            let spread = 1.0 + phase.produce_spread * (2.0 * self.rng.unit() - 1.0);
            let at = self.now + phase.producer_start_ns + (round as f64 * phase.produce_ns as f64 * spread) as u64;
            self.schedule(at, Event::SlotProduced { slot });
        }
        // The block scheduler spreads CTAs over the SMs, one to each in turn.
        let per_sm = (self.cal.gpu.warp_slots_per_sm.value / phase.warps_per_cta).max(1);
        for _ in 0..per_sm {
            for sm in 0..self.cal.gpu.sms.value {
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
            // The other GPU's last faults on the reverse channels may still be on their way:
            // the model runs only this side's warps to their end.
            for layout in self.phases.iter().filter_map(|state| state.reverse.as_ref()) {
                daemon.engine.close_channel(layout.id, &mut out).expect("channel is open");
            }
        }
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
            daemon_busy_ns: daemon.map_or(0, |d| d.busy_ns),
            mean_delivery_ns: self.stats.delivery_ns / self.stats.messages.max(1) as f64,
            gpu_faults: self.stats.gpu_faults,
            fault_batches: self.stats.batches,
            replays: self.stats.replays,
            fault_buffer_overflows: self.stats.overflows,
            flushed_entries: self.stats.flushed,
            messages_checked: self.stats.messages,
            bytes_checked: self.stats.bytes,
            corrupt_messages: self.stats.corrupt,
            sends: self.stats.sends,
            error_markers: self.stats.markers,
            engine: daemon.map(|d| d.engine.stats().clone()),
            pool_restored: daemon.is_none_or(|d| d.engine.pool().free_pages() == d.engine.pool().capacity()),
            pfq_empty: daemon.is_none_or(|d| d.engine.held() == 0),
            events: self.stats.events,
        }
    }
}

#[cfg(test)]
mod tests;
