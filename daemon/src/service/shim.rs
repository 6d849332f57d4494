//! The shim backend as the fast path drives it: channels placed in applications' managed
//! memory through `/dev/wic`, host producers' bytes handed to the module from the daemon's
//! mapping of their regions.

use std::collections::HashSet;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use wic_engine::{ChannelId, ChannelLayout, Command, DataSource, Engine, Fill, Nanos, Producer};
use wic_kmod::{DeviceError, PlacedChannel, ShimBackend};
use wic_proto::message::{ErrorCode, WireError};
use wic_proto::shm::ProducerRegion;

use super::gpus::{ChannelMap, Executed, ExecutionLog};

/// A channel placed in an application's address space.
pub struct ShimChannel {
    pub producer: Option<ProducerRegion>,
    placed: PlacedChannel,
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
    backend: ShimBackend,
    channels: ChannelMap<ShimChannel>,
    spaces: HashSet<u32>,
    /// Ranges, then spaces, to unregister or detach again.
    stuck: Vec<Stuck>,
    last_retry: Instant,
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
    pub fn new(backend: ShimBackend) -> Self {
        Self {
            backend,
            channels: ChannelMap::default(),
            spaces: HashSet::new(),
            stuck: Vec::new(),
            last_retry: Instant::now(),
        }
    }

    /// The descriptor to poll for fault records.
    pub fn ring_fd(&mut self) -> RawFd {
        self.backend.device().fd().as_raw_fd()
    }

    /// Attaches an application's address space given its UVM file; the module keeps its own
    /// reference, so `uvm` may be closed afterwards.
    pub fn attach(&mut self, uvm: OwnedFd) -> Result<u32, WireError> {
        let space = self.backend.device().attach(uvm.as_fd()).map_err(|e| match e {
            DeviceError::Call { errno: Errno::EOPNOTSUPP, .. } => WireError::new(
                ErrorCode::Unsupported,
                "a GPU registered in the address space cannot cancel faults per VA (Pascal or older): wic cannot hold its faults",
            ),
            e => wire_error("attaching the address space", e),
        })?;
        self.spaces.insert(space);
        Ok(space)
    }

    /// Detaches a space whose channels are gone; asked again later while the module refuses.
    pub fn detach(&mut self, space: u32) {
        if self.spaces.remove(&space) {
            if let Err(e) = self.backend.device().detach(space) {
                tracing::warn!(space, "detaching the address space: {e}; asking again every {RELEASE_RETRY:?}");
                self.stuck.push(Stuck::Space(space));
            }
        }
    }

    /// Whether something the module refused to let go of waits to be asked again.
    pub fn has_stuck(&self) -> bool {
        !self.stuck.is_empty()
    }

    /// Asks the module again, at most every [`RELEASE_RETRY`], to let go of the ranges and
    /// spaces it refused (while it was suspended, short of memory, or a marker's write failed):
    /// until then their pages stay wic pages, and a fault there, such as the application's once
    /// it reuses the memory, would be held with no channel to complete it. Ranges first: a
    /// space's detach closes its ranges too, after which their unregister finds nothing.
    pub fn retry_stuck(&mut self) {
        if self.stuck.is_empty() || self.last_retry.elapsed() < RELEASE_RETRY {
            return;
        }
        self.last_retry = Instant::now();
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

    /// Places `layout` at `base` in `space` and returns the layout with the application's
    /// addresses, as its kernels use them. A host producer's bytes are in `region`; a GPU
    /// producer's in the application's managed memory, which the module copies from.
    pub fn add(
        &mut self,
        layout: &ChannelLayout,
        producer: Producer,
        space: u32,
        base: u64,
        region: Option<ProducerRegion>,
    ) -> Result<ChannelLayout, WireError> {
        if !self.spaces.contains(&space) {
            return Err(WireError::new(ErrorCode::Invalid, "the address space is not attached"));
        }
        let placed =
            self.backend.place(layout, producer, space, base).map_err(|e| wire_error("placing the channel", e))?;
        let mut seen = layout.clone();
        let process = |va: u64| placed.placement.process_va(va).expect("every run and PAT page is placed");
        for slot in &mut seen.slots {
            slot.runs = slot.runs.map(process);
            slot.pat = slot.pat.map(|pat| pat.map(process));
        }
        self.channels.insert(layout.id.0, ShimChannel { producer: region, placed });
        Ok(seen)
    }

    /// Removes a channel after its final commands ran: its ranges are unregistered, and
    /// asked again later while the module refuses.
    pub fn remove(&mut self, channel: u32) -> Option<ShimChannel> {
        let removed = self.channels.remove(&channel)?;
        if let Err(e) = self.backend.unplace(&removed.placed) {
            tracing::warn!(channel, "unregistering the channel's pages: {e}; asking again every {RELEASE_RETRY:?}");
            self.stuck.extend(e.refused.iter().map(|&(id, _)| Stuck::Range(id)));
        }
        Some(removed)
    }

    /// A channel.
    pub fn channel(&self, channel: u32) -> Option<&ShimChannel> {
        self.channels.get(&channel)
    }

    /// Every channel id.
    pub fn channel_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.channels.keys().copied()
    }

    /// Reads the fault ring into the engine.
    pub fn take_faults(&mut self, engine: &mut Engine, now: Nanos, out: &mut Vec<Command>) -> usize {
        self.backend.take_faults(engine, now, out)
    }

    /// Faults the module could not record (ring or held table full): held unrecorded until the
    /// session ends.
    pub fn overflows(&mut self) -> u64 {
        self.backend.device().ring().dropped()
    }

    /// Records read that no placed channel has.
    pub fn stray_records(&self) -> u64 {
        self.backend.stray_records()
    }

    /// Torn or out-of-range ring state seen.
    pub fn ring_anomalies(&mut self) -> u64 {
        let anomalies = self.backend.device().ring().anomalies();
        anomalies.torn + anomalies.bad_head
    }

    /// Runs `commands` as one batch.
    pub fn execute(&mut self, commands: &[Command], log: &mut impl ExecutionLog) -> Executed {
        let channels = &self.channels;
        let host_data = |channel: ChannelId, source: DataSource, len: u64| {
            let DataSource::Host { offset } = source else { return None };
            channels.get(&channel.0)?.producer.as_ref()?.data_address(offset, len)
        };
        let mut done = Executed::default();
        let outcome = |command: &Command, result: Result<i32, wic_kmod::CommandError>| {
            let carried_out = result == Ok(0);
            if !carried_out {
                done.failed += 1;
                tracing::warn!("{command:?} failed: {}", describe(result));
            }
            match *command {
                Command::Complete { channel, slot, fill: Fill::Data { .. }, .. } => {
                    if !carried_out {
                        log.unfilled(*command);
                    }
                    let Some(placed) = channels.get(&channel.0) else { return };
                    // The engine consumed the generation either way: the producer may publish
                    // the next.
                    if let Some(producer) = &placed.producer {
                        producer.mark_delivered(slot);
                    }
                    if carried_out {
                        log.delivered(channel.0);
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
        if let Err(e) = self.backend.execute(commands, host_data, outcome) {
            tracing::error!("submitting {} commands to the module: {e}", commands.len());
            done.failed += commands.len() as u64;
        }
        done
    }
}

fn describe(result: Result<i32, wic_kmod::CommandError>) -> String {
    match result {
        Ok(errno) => Errno::from_raw(-errno).desc().to_string(),
        Err(e) => e.to_string(),
    }
}
