//! Observing real GPU faults on the stock driver: an application's address space, attached
//! through nvidia-uvm-tools, whose faults on watched pages are counted and timed.
//!
//! This is how wicd sees, on a machine with an NVIDIA GPU but without the patched driver, what
//! the `fault` transport costs there: the stock driver services those faults itself (it cannot
//! hold them), and the tools event queue reports each fault and the replay that ends its batch.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use wic_engine::Histogram;
use wic_kernel_io::uvmtools::{flush_events, Event, EventTracker, FaultStats, UvmToolsError};
use wic_proto::message::{ErrorCode, Stats, WireError};

/// Entries of each observed space's event queue (72 bytes each: 4.5 MiB, pinned by the driver).
const QUEUE_ENTRIES: u32 = 1 << 16;

/// Least time between two flushes of the driver's late events. A flush is an ioctl into
/// nvidia-uvm per observed space, run on the fast path for every `status`, `stats` or
/// `channels` request: any client asking in a loop would otherwise make wicd spend its time
/// there. Events flushed are read at the next report anyway.
const FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// One observed address space.
struct Observed {
    tracker: EventTracker,
    stats: FaultStats,
    /// The application's nvidia-uvm file, to flush the driver's late events.
    uvm: OwnedFd,
}

/// What observed spaces that are gone had counted, so the totals never go backwards.
#[derive(Default)]
struct Retired {
    watched: u64,
    other: u64,
    replays: u64,
    unpaired: u64,
    dropped: u64,
    latency_cpu: Histogram,
    latency_gpu: Histogram,
}

/// Every observed space.
pub struct Observer {
    tools: PathBuf,
    spaces: HashMap<u32, Observed>,
    next_space: u32,
    retired: Retired,
    events: Vec<Event>,
    flushed_at: Option<std::time::Instant>,
}

fn tools_error(e: UvmToolsError) -> WireError {
    let code = if e.is_not_va_space() { ErrorCode::Invalid } else { ErrorCode::Io };
    WireError::new(code, format!("observing the address space: {e}"))
}

impl Observer {
    /// Observes through the tools node at `tools`.
    pub fn new(tools: &Path) -> Self {
        Self {
            tools: tools.to_path_buf(),
            spaces: HashMap::new(),
            next_space: 1,
            retired: Retired::default(),
            events: Vec::new(),
            flushed_at: None,
        }
    }

    /// Attaches an event tracker to the address space of `uvm`, an application's initialized
    /// nvidia-uvm file; returns the space id.
    pub fn attach(&mut self, uvm: OwnedFd) -> Result<u32, WireError> {
        if !self.tools.exists() {
            return Err(WireError::new(
                ErrorCode::Unsupported,
                format!(
                    "the emulated backend has no GPU address spaces, and {} is absent: no GPU faults to observe",
                    self.tools.display()
                ),
            ));
        }
        let tracker = EventTracker::attach(uvm.as_fd(), &self.tools, QUEUE_ENTRIES).map_err(tools_error)?;
        let space = self.next_space;
        self.next_space += 1;
        self.spaces.insert(space, Observed { tracker, stats: FaultStats::new(None), uvm });
        Ok(space)
    }

    /// The descriptor to poll for `space`'s events.
    pub fn fd(&self, space: u32) -> Option<RawFd> {
        self.spaces.get(&space).map(|o| o.tracker.fd().as_raw_fd())
    }

    /// Watches `start..end` of `space`.
    pub fn watch(&mut self, space: u32, start: u64, end: u64) -> Result<(), WireError> {
        if start >= end {
            return Err(WireError::new(ErrorCode::Invalid, "an empty range"));
        }
        let observed =
            self.spaces.get_mut(&space).ok_or_else(|| WireError::new(ErrorCode::NotFound, "no observed space"))?;
        if !observed.stats.watch(start..end) {
            return Err(WireError::new(
                ErrorCode::Exhausted,
                format!("a space watches at most {} disjoint ranges; watch fewer, larger ones", FaultStats::MAX_RANGES),
            ));
        }
        Ok(())
    }

    /// Reads `space`'s waiting events into its statistics.
    pub fn drain(&mut self, space: u32) {
        let Some(observed) = self.spaces.get_mut(&space) else { return };
        self.events.clear();
        observed.tracker.poll_events(&mut self.events);
        observed.stats.record_all(&self.events);
    }

    /// Stops observing `space`, keeping what it counted.
    pub fn detach(&mut self, space: u32) -> bool {
        self.drain(space);
        let Some(observed) = self.spaces.remove(&space) else { return false };
        self.retire(&observed);
        true
    }

    fn retire(&mut self, observed: &Observed) {
        let (stats, r) = (&observed.stats, &mut self.retired);
        r.watched += stats.watched_faults();
        r.other += stats.other_faults();
        r.replays += stats.replays();
        r.unpaired += stats.unpaired();
        r.dropped += observed.tracker.dropped();
        r.latency_cpu.merge(stats.latency_cpu());
        r.latency_gpu.merge(stats.latency_gpu());
    }

    /// Flushes the driver's late events (replays are queued once they complete; at most every
    /// [`FLUSH_INTERVAL`]), reads every space's queue, and fills the `uvm_*` fields of `stats`.
    pub fn report(&mut self, stats: &mut Stats) {
        let now = std::time::Instant::now();
        let flush = self.flushed_at.is_none_or(|at| now.duration_since(at) >= FLUSH_INTERVAL);
        if flush && !self.spaces.is_empty() {
            self.flushed_at = Some(now);
        }
        let spaces: Vec<u32> = self.spaces.keys().copied().collect();
        for space in spaces {
            if let Some(observed) = self.spaces.get(&space).filter(|_| flush) {
                if let Err(e) = flush_events(observed.uvm.as_fd()) {
                    tracing::debug!(space, "flushing nvidia-uvm-tools events: {e}");
                }
            }
            self.drain(space);
        }
        let r = &self.retired;
        let (mut cpu, mut gpu) = (r.latency_cpu.clone(), r.latency_gpu.clone());
        stats.uvm_spaces = self.spaces.len() as u32;
        stats.uvm_faults_watched = r.watched;
        stats.uvm_faults_other = r.other;
        stats.uvm_replays = r.replays;
        stats.uvm_faults_unpaired = r.unpaired;
        stats.uvm_events_dropped = r.dropped;
        for observed in self.spaces.values() {
            let s = &observed.stats;
            stats.uvm_faults_watched += s.watched_faults();
            stats.uvm_faults_other += s.other_faults();
            stats.uvm_replays += s.replays();
            stats.uvm_faults_unpaired += s.unpaired();
            stats.uvm_events_dropped += observed.tracker.dropped();
            cpu.merge(s.latency_cpu());
            gpu.merge(s.latency_gpu());
        }
        stats.uvm_fault_latency_ns = super::wire_histogram(&cpu);
        stats.uvm_fault_gpu_latency_ns = super::wire_histogram(&gpu);
    }
}
