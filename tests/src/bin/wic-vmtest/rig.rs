//! What every scenario sets up: an application (a fake UVM space and its memory) and a daemon
//! (the shim backend and the engine), in one process or two.

use std::num::NonZeroUsize;
use std::path::Path;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};
use wic_engine::fault::AccessType;
use wic_engine::{
    ChannelId, ChannelLayout, ChannelSpec, Command, DataSource, Engine, EngineConfig, FaultEntry, Producer,
    RawFaultEntry,
};
use wic_kernel_io::fakegpu::{Event, FakeGpu};
use wic_kernel_io::{PlacedChannel, ShimSession, Submission};

pub const DEVICE: &str = "/dev/wic";

/// The GPU the scenarios' warps run on: nvidia-uvm's id of the first GPU (0 is the CPU).
pub const GPU: u32 = 1;

/// A scenario that drives the module directly, with no engine (the daemon it plays never runs a
/// command): the application's space, its memory, the session, the space attached and a PCM
/// range of `pages` pages at the memory's start registered without runs; the fake GPU's log
/// emptied.
pub struct Direct {
    pub fake: FakeGpu,
    pub memory: Memory,
    pub device: wic_kernel_io::Device,
    pub space: u32,
}

impl Direct {
    pub fn open(pages: u64) -> Result<Self, String> {
        let fake = FakeGpu::open().map_err(|e| format!("open {}: {e}", wic_kernel_io::fakegpu::DEVICE))?;
        let memory = Memory::new(&fake, 1 << 20)?;
        let device = wic_kernel_io::Device::open(Path::new(DEVICE), Duration::from_secs(5))
            .map_err(|e| format!("open {DEVICE}: {e}"))?;
        let space = device.attach(fake.fd()).map_err(|e| format!("attach: {e}"))?;
        device
            .register(space, wic_kabi::WIC_RANGE_PCM, memory.base(), pages * 4096, 0)
            .map_err(|e| format!("register: {e}"))?;
        fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
        Ok(Self { fake, memory, device, space })
    }
}

/// The application's memory: where channels are placed, readable to check what arrived.
pub struct Memory {
    base: NonNull<libc::c_void>,
    len: usize,
    used: usize,
}

impl Memory {
    /// `len` bytes of managed memory of `fake`'s space, as cudaMallocManaged would allocate
    /// them: the shim registers ranges only in managed memory.
    pub fn new(fake: &FakeGpu, len: usize) -> Result<Self, String> {
        let size = NonZeroUsize::new(len).ok_or("empty memory")?;
        // SAFETY: a fresh private anonymous mapping owned by this value, unmapped in Drop.
        let base = unsafe {
            mmap_anonymous(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_POPULATE,
            )
        }
        .map_err(|e| format!("mmap: {e}"))?;
        let memory = Self { base, len, used: 0 };
        memory.manage(fake)?;
        Ok(memory)
    }

    /// Declares all of it managed memory of `fake`'s space too (another space of this process).
    pub fn manage(&self, fake: &FakeGpu) -> Result<(), String> {
        fake.manage(self.base(), self.len as u64).map_err(|e| format!("declaring the memory managed: {e}"))
    }

    pub fn base(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// Reserves `bytes` (page multiple) and returns their address.
    pub fn take(&mut self, bytes: u64) -> Result<u64, String> {
        let at = self.used;
        let end = at + bytes as usize;
        if end > self.len {
            return Err(format!("application memory exhausted: {end} of {} bytes", self.len));
        }
        self.used = end;
        Ok(self.base() + at as u64)
    }

    /// A copy of `len` bytes at address `va`.
    pub fn read(&self, va: u64, len: usize) -> Vec<u8> {
        let offset = (va - self.base()) as usize;
        assert!(offset + len <= self.len, "read outside the application memory");
        let mut out = vec![0u8; len];
        for (i, byte) in out.iter_mut().enumerate() {
            // SAFETY: inside the mapping (checked above); the kernel wrote it through the mm, so
            // volatile reads see its bytes.
            *byte = unsafe { std::ptr::read_volatile(self.base.as_ptr().cast::<u8>().add(offset + i)) };
        }
        out
    }
}

// SAFETY: the mapping is plain memory owned by the value: its `&self` methods only read it
// (volatile reads, of bytes the kernel writes), and it is unmapped once, in Drop.
unsafe impl Sync for Memory {}
// SAFETY: as above; nothing ties the mapping to the thread that made it.
unsafe impl Send for Memory {}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, not used after this.
        let _ = unsafe { munmap(self.base, self.len) };
    }
}

/// A daemon: the shim backend and the engine, with the host producers' data.
pub struct Daemon {
    pub backend: ShimSession,
    pub engine: Engine,
    pub commands: Vec<Command>,
    pub host_data: Vec<u8>,
    start: Instant,
}

impl Daemon {
    pub fn open(submission: Submission) -> Result<Self, String> {
        let config = EngineConfig { pool_pages: 16 * 1024, max_slots: 1024, ..EngineConfig::default() };
        let backend = ShimSession::open(Path::new(DEVICE), Duration::from_secs(5), submission, &config)
            .map_err(|e| format!("open {DEVICE}: {e}"))?;
        let engine = Engine::new(config).map_err(|e| format!("engine: {e}"))?;
        Ok(Self { backend, engine, commands: Vec::new(), host_data: vec![0; 1 << 25], start: Instant::now() })
    }

    pub fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Opens a channel and places it in `memory` of the attached `space`.
    pub fn channel(
        &mut self,
        spec: ChannelSpec,
        space: u32,
        memory: &mut Memory,
    ) -> Result<(ChannelLayout, PlacedChannel), String> {
        let bytes = spec
            .placement_bytes(self.engine.config().warps_per_batch)
            .ok_or_else(|| format!("{spec:?} has no placement"))?;
        self.channel_at(spec, space, memory.take(bytes)?)
    }

    /// Opens a channel and places it at `base` of the attached `space`.
    pub fn channel_at(
        &mut self,
        spec: ChannelSpec,
        space: u32,
        base: u64,
    ) -> Result<(ChannelLayout, PlacedChannel), String> {
        let layout = self.engine.open_channel(spec).map_err(|e| format!("open channel: {e}"))?;
        let placed =
            self.backend.place(&layout, spec.producer, space, base).map_err(|e| format!("place channel: {e}"))?;
        Ok((layout, placed))
    }

    /// Reads the ring into the engine; returns the records read.
    pub fn take_faults(&mut self) -> usize {
        let now = self.now();
        self.backend.take_faults(&mut self.engine.intake(now, &mut self.commands))
    }

    /// Runs the queued commands; an error names the first one refused.
    pub fn execute(&mut self) -> Result<(), String> {
        let base = self.host_data.as_ptr() as u64;
        let len = self.host_data.len() as u64;
        let host = |_: ChannelId, source: DataSource, bytes: u64| match source {
            DataSource::Host { offset } if offset + bytes <= len => Some(base + offset),
            _ => None,
        };
        let mut refused = Vec::new();
        let commands = std::mem::take(&mut self.commands);
        let result = self.backend.execute(&commands, host, |command, result| {
            if result != Ok(0) {
                refused.push(format!("{command:?}: {result:?}"));
            }
        });
        result.map_err(|e| format!("submission: {e}"))?;
        match refused.first() {
            Some(first) => Err(format!("{} commands refused, first {first}", refused.len())),
            None => Ok(()),
        }
    }
}

/// A host-producer channel spec.
pub fn host_spec(slots: u32, message_bytes: u32) -> ChannelSpec {
    ChannelSpec { consumer_gpu: GPU as u16, producer: Producer::Host, message_bytes, slots, timeout_ns: 10_000_000_000 }
}

/// The raw entry a warp of `gpu` writes when it reads (or writes) `va`.
pub fn fault(va: u64, access: AccessType) -> RawFaultEntry {
    FaultEntry::replayable_gpc(va, access, 0, 0x1000, 0, 0).encode()
}

/// Waits until `want` events satisfying `pred` were logged (others are kept too); returns
/// every event seen.
pub fn wait_events(
    fake: &FakeGpu,
    timeout: Duration,
    mut done: impl FnMut(&[Event]) -> bool,
) -> Result<Vec<Event>, String> {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    while !done(&seen) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("timed out waiting for fake-GPU events; saw {seen:?}"));
        }
        let (events, overflow) =
            fake.events(4096, left.as_millis().max(1) as u32).map_err(|e| format!("events: {e}"))?;
        if overflow != 0 {
            return Err(format!("{overflow} fake-GPU events lost"));
        }
        seen.extend(events);
    }
    Ok(seen)
}

/// The first word of the page at `va`: a marker, or the data's first bytes.
pub fn marker(memory: &Memory, va: u64) -> u64 {
    u64::from_le_bytes(memory.read(va, 8).try_into().expect("8 bytes"))
}

/// A warp of `GPU` stalls on `va`, a wic page, and the bottom half holds its fault; its record
/// is read and left alone (the daemon never completes it).
pub fn stall_held(fake: &FakeGpu, device: &mut wic_kernel_io::Device, va: u64) -> Result<(), String> {
    fake.warps(GPU, &[fault(va, AccessType::Read)]).map_err(|e| format!("warps: {e}"))?;
    let run = fake.bottom_half(GPU).map_err(|e| format!("bottom half: {e}"))?;
    ensure(run.stalled == 1 && run.replays == 0, || format!("the warp's fault was not held: {run:?}"))?;
    let mut records = Vec::new();
    device.ring().read(&mut records, 16);
    ensure(records.len() == 1, || format!("{} records for one held fault", records.len()))
}

/// `WIC_IOC_SUBMIT` of `commands` on the session `fd`, for a thread that cannot borrow its
/// `Device` (another holds it); the caller keeps the session open for the call.
pub fn submit_on(fd: std::os::fd::RawFd, commands: &mut [wic_kabi::WicCommand]) -> nix::Result<libc::c_int> {
    let mut arg = wic_kabi::WicSubmit {
        commands: commands.as_mut_ptr() as u64,
        count: commands.len() as u32,
        ..Default::default()
    };
    // SAFETY: checked ABI; `commands` is valid for reads and writes for the call.
    unsafe { wic_kernel_io::device::raw::ioc_submit(fd, &mut arg) }
}

/// Sets the module's `max_hold_ms` parameter.
pub fn set_max_hold_ms(ms: u32) -> Result<(), String> {
    let param = wic_kernel_io::device::MAX_HOLD_MS_PARAM;
    std::fs::write(param, format!("{ms}\n")).map_err(|e| format!("write {ms} to {param}: {e}"))
}

/// Empties the fake GPU's event log, which is one for all its files, of what came before: a
/// check then waits for its own events, and a log nobody reads never fills.
pub fn drain_log(fake: &FakeGpu) -> Result<(), String> {
    while !fake.events(4096, 0).map_err(|e| format!("events: {e}"))?.0.is_empty() {}
    Ok(())
}

/// Fails with `what` unless `cond`.
pub fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}
