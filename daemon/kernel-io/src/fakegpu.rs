//! The test module `wic_fakegpu.ko` (shim/test/wic_fakegpu.h): it stands in for nvidia-uvm,
//! plays an application's UVM file, injects raw faults and logs what the shim asked of the
//! GPU. Used by the kernel tests; checked against its header like the real ABI.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;

use wic_engine::RawFaultEntry;

use wic_kabi::StructLayout;
use wic_types::c_struct;

/// `WIC_FAKEGPU_DEVICE`.
pub const DEVICE: &str = "/dev/wic_fakegpu";
/// `WIC_FAKEGPU_NR_GPUS`: fake GPU ids are nvidia-uvm's, 1 to this (0 is the CPU's id).
pub const NR_GPUS: u32 = 256;
/// `WIC_FAKEGPU_GPU_NONE`.
pub const GPU_NONE: u32 = u32::MAX;
/// `WIC_FAKEGPU_PAGE_SHIFT`.
pub const PAGE_SHIFT: u32 = 12;
/// `WIC_FAKEGPU_PAGE_SIZE`.
pub const PAGE_SIZE: u32 = 1 << PAGE_SHIFT;
/// `WIC_FAKEGPU_FAULT_ENTRY_SIZE`.
pub const FAULT_ENTRY_SIZE: u32 = 32;
/// `WIC_FAKEGPU_VA_BITS`.
pub const VA_BITS: u32 = 57;
/// `WIC_FAKEGPU_MAX_INJECT`.
pub const MAX_INJECT: u32 = 4096;
/// `WIC_FAKEGPU_LOG_EVENTS`.
pub const LOG_EVENTS: u32 = 65536;
/// `WIC_FAKEGPU_MAX_PAGES`.
pub const MAX_PAGES: u32 = 1 << 22;
/// `WIC_FAKEGPU_MAX_MANAGED`.
pub const MAX_MANAGED: u32 = 64;
/// `WIC_FAKEGPU_MAX_REMOTE`.
pub const MAX_REMOTE: u32 = 64;
/// `WIC_FAKEGPU_MAX_STORE`: bytes of one [`FakeGpu::gpu_store`].
pub const MAX_STORE: u32 = 1 << 20;
/// `WIC_FAKEGPU_MAX_GPU_PAGES`: pages resident in fake GPU memory per space.
pub const MAX_GPU_PAGES: u32 = 4096;
/// `WIC_FAKEGPU_HW_BUFFER`: entries of a fake GPU's fault buffer.
pub const HW_BUFFER: u32 = 16;
/// `WIC_FAKEGPU_HW_BATCH`: faults one batch of the fake bottom half fetches.
pub const HW_BATCH: u32 = 4;
/// `WIC_FAKEGPU_HW_MAX_BATCHES`: batches one run of the fake bottom half services.
pub const HW_MAX_BATCHES: u32 = 8;
/// `WIC_FAKEGPU_HW_MAX_RUNS`: runs one [`FakeGpu::bottom_half`] makes at most.
pub const HW_MAX_RUNS: u32 = 64;
/// `WIC_FAKEGPU_MAX_WARPS`: warps stalled on all fake GPUs.
pub const MAX_WARPS: u32 = 4096;
/// `WIC_FAKEGPU_MAX_SWITCH_MS`: the longest context-switch timeout.
pub const MAX_SWITCH_MS: u32 = 60_000;
/// `WIC_FAKEGPU_EVENT_WRITE`.
pub const EVENT_WRITE: u32 = 1;
/// `WIC_FAKEGPU_EVENT_MAP`.
pub const EVENT_MAP: u32 = 2;
/// `WIC_FAKEGPU_EVENT_MAP_WRITABLE`.
pub const EVENT_MAP_WRITABLE: u32 = 3;
/// `WIC_FAKEGPU_EVENT_UNMAP`.
pub const EVENT_UNMAP: u32 = 4;
/// `WIC_FAKEGPU_EVENT_REVOKE_WRITE`.
pub const EVENT_REVOKE_WRITE: u32 = 5;
/// `WIC_FAKEGPU_EVENT_REPLAY`.
pub const EVENT_REPLAY: u32 = 6;
/// `WIC_FAKEGPU_EVENT_SERVICED`.
pub const EVENT_SERVICED: u32 = 7;
/// `WIC_FAKEGPU_EVENT_STALLED`.
pub const EVENT_STALLED: u32 = 8;
/// `WIC_FAKEGPU_EVENT_COPY`: a completion's fill copied from a source; its GPU is the one whose memory held the first
/// source byte ([`GPU_NONE`]: the CPU's).
pub const EVENT_COPY: u32 = 9;
/// `WIC_FAKEGPU_EVENT_RESUMED`: a stalled warp resumed at a replay.
pub const EVENT_RESUMED: u32 = 10;
/// `WIC_FAKEGPU_EVENT_DROPPED`: a fault dropped by a full fault buffer.
pub const EVENT_DROPPED: u32 = 11;
/// `WIC_FAKEGPU_EVENT_COMPLETE`: `uvm_wic_complete()`, its `length` the number of completions.
pub const EVENT_COMPLETE: u32 = 12;
/// `WIC_FAKEGPU_EVENT_SWITCHED`: a context switch done; its `length` the nanoseconds it waited.
pub const EVENT_SWITCHED: u32 = 13;
/// `WIC_FAKEGPU_EVENT_CHANNEL_RESET`: a stalled warp killed by a channel reset.
pub const EVENT_CHANNEL_RESET: u32 = 14;
/// `WIC_FAKEGPU_VERDICT_PASS`.
pub const VERDICT_PASS: u8 = 0;
/// `WIC_FAKEGPU_VERDICT_HOLD`.
pub const VERDICT_HOLD: u8 = 1;
/// `WIC_FAKEGPU_PAGE_MAPPED`.
pub const PAGE_MAPPED: u32 = 1;
/// `WIC_FAKEGPU_PAGE_WRITABLE`.
pub const PAGE_WRITABLE: u32 = 2;
/// `WIC_FAKEGPU_PAGE_UNREACHABLE`: resident only on a GPU without peer access to this one.
pub const PAGE_UNREACHABLE: u32 = 4;
/// `WIC_FAKEGPU_PAGE_STALLED`: a warp of this space is stalled on the page.
pub const PAGE_STALLED: u32 = 8;
/// `WIC_FAKEGPU_PAGE_NOWHERE`: resident nowhere, never touched.
pub const PAGE_NOWHERE: u32 = 16;
/// `WIC_FAKEGPU_FAIL_STALL`.
pub const FAIL_STALL: u32 = 1;
/// `WIC_FAKEGPU_MAX_ERRNO`.
pub const MAX_ERRNO: u32 = 4095;
/// `WIC_FAKEGPU_IOC_MAGIC`.
pub const IOC_MAGIC: u8 = b'F';

c_struct! {
    /// `struct wic_fakegpu_event`: one thing the shim asked of the fake GPU.
    pub struct Event = "wic_fakegpu_event" {
        pub kind: u32,
        pub gpu_id: u32,
        pub va: u64,
        pub length: u64,
        pub data0: u64,
        pub ns: u64,
    }
}

c_struct! {
    /// `struct wic_fakegpu_inject`.
    pub struct Inject = "wic_fakegpu_inject" {
        pub gpu_id: u32,
        pub count: u32,
        pub entries: u64,
        pub verdicts: u64,
        pub injected_ns: u64,
    }
}

c_struct! {
    /// `struct wic_fakegpu_events`.
    pub struct Events = "wic_fakegpu_events" {
        pub buffer: u64,
        pub capacity: u32,
        pub count: u32,
        pub overflow: u64,
        pub timeout_ms: u32,
        pub reserved: u32,
    }
}

c_struct! {
    /// `struct wic_fakegpu_page_state`.
    pub struct PageState = "wic_fakegpu_page_state" {
        pub gpu_id: u32,
        pub flags: u32,
        pub va: u64,
    }
}

c_struct! {
    /// `struct wic_fakegpu_fail`: the next helper calls of a space that fail or stall.
    pub struct Fail = "wic_fakegpu_fail" {
        pub writes: u32,
        pub maps: u32,
        pub error: u32,
        pub flags: u32,
    }
}

c_struct! {
    /// `struct wic_fakegpu_managed`: a range declared managed memory.
    pub struct Managed = "wic_fakegpu_managed" {
        pub start: u64,
        pub length: u64,
    }
}

c_struct! {
    /// `struct wic_fakegpu_gpu_store`: a fake GPU's kernel storing bytes into managed memory.
    pub struct GpuStore = "wic_fakegpu_gpu_store" {
        pub gpu_id: u32,
        pub reserved: u32,
        pub va: u64,
        pub buffer: u64,
        pub length: u64,
    }
}

c_struct! {
    /// `struct wic_fakegpu_warps`: warps stalling on faults, or a GPU's bottom half.
    pub struct Warps = "wic_fakegpu_warps" {
        pub gpu_id: u32,
        pub count: u32,
        pub entries: u64,
        pub stalled: u32,
        pub dropped: u32,
        pub replays: u32,
        pub reserved: u32,
    }
}

c_struct! {
    /// `struct wic_fakegpu_preempt`: another context's time slice on a GPU.
    pub struct Preempt = "wic_fakegpu_preempt" {
        pub gpu_id: u32,
        pub timeout_ms: u32,
        pub waited_ns: u64,
        pub killed: u32,
        pub reserved: u32,
    }
}

/// `WIC_FAKEGPU_IOC_INJECT`.
pub const IOC_INJECT: u32 = nix::request_code_readwrite!(IOC_MAGIC, 1, std::mem::size_of::<Inject>()) as u32;
/// `WIC_FAKEGPU_IOC_EVENTS`.
pub const IOC_EVENTS: u32 = nix::request_code_readwrite!(IOC_MAGIC, 2, std::mem::size_of::<Events>()) as u32;
/// `WIC_FAKEGPU_IOC_PAGE_STATE`.
pub const IOC_PAGE_STATE: u32 = nix::request_code_readwrite!(IOC_MAGIC, 3, std::mem::size_of::<PageState>()) as u32;
/// `WIC_FAKEGPU_IOC_RESET`.
pub const IOC_RESET: u32 = nix::request_code_none!(IOC_MAGIC, 4) as u32;
/// `WIC_FAKEGPU_IOC_FAIL`.
pub const IOC_FAIL: u32 = nix::request_code_write!(IOC_MAGIC, 5, std::mem::size_of::<Fail>()) as u32;
/// `WIC_FAKEGPU_IOC_MANAGE`.
pub const IOC_MANAGE: u32 = nix::request_code_write!(IOC_MAGIC, 6, std::mem::size_of::<Managed>()) as u32;
/// `WIC_FAKEGPU_IOC_RESIDE`.
pub const IOC_RESIDE: u32 = nix::request_code_write!(IOC_MAGIC, 7, std::mem::size_of::<PageState>()) as u32;
/// `WIC_FAKEGPU_IOC_GPU_STORE`.
pub const IOC_GPU_STORE: u32 = nix::request_code_write!(IOC_MAGIC, 8, std::mem::size_of::<GpuStore>()) as u32;
/// `WIC_FAKEGPU_IOC_WARPS`.
pub const IOC_WARPS: u32 = nix::request_code_readwrite!(IOC_MAGIC, 9, std::mem::size_of::<Warps>()) as u32;
/// `WIC_FAKEGPU_IOC_PRE_VOLTA`.
pub const IOC_PRE_VOLTA: u32 = nix::request_code_write!(IOC_MAGIC, 11, std::mem::size_of::<u32>()) as u32;
/// `WIC_FAKEGPU_IOC_BOTTOM_HALF`.
pub const IOC_BOTTOM_HALF: u32 = nix::request_code_readwrite!(IOC_MAGIC, 10, std::mem::size_of::<Warps>()) as u32;
/// `WIC_FAKEGPU_IOC_PREEMPT`.
pub const IOC_PREEMPT: u32 = nix::request_code_readwrite!(IOC_MAGIC, 12, std::mem::size_of::<Preempt>()) as u32;
/// `WIC_FAKEGPU_IOC_EXIT`.
pub const IOC_EXIT: u32 = nix::request_code_readwrite!(IOC_MAGIC, 13, std::mem::size_of::<Preempt>()) as u32;
/// `WIC_FAKEGPU_IOC_FILLED`: the bytes completions' fills wrote into the space.
pub const IOC_FILLED: u32 = nix::request_code_read!(IOC_MAGIC, 14, std::mem::size_of::<u64>()) as u32;

nix::ioctl_readwrite_bad!(ioc_inject, IOC_INJECT, Inject);
nix::ioctl_readwrite_bad!(ioc_events, IOC_EVENTS, Events);
nix::ioctl_readwrite_bad!(ioc_page_state, IOC_PAGE_STATE, PageState);
// With an explicit zero argument: the module refuses a non-zero one.
nix::ioctl_write_int_bad!(ioc_reset, IOC_RESET);
nix::ioctl_write_ptr_bad!(ioc_fail, IOC_FAIL, Fail);
nix::ioctl_write_ptr_bad!(ioc_manage, IOC_MANAGE, Managed);
nix::ioctl_write_ptr_bad!(ioc_reside, IOC_RESIDE, PageState);
nix::ioctl_write_ptr_bad!(ioc_gpu_store, IOC_GPU_STORE, GpuStore);
nix::ioctl_readwrite_bad!(ioc_warps, IOC_WARPS, Warps);
nix::ioctl_readwrite_bad!(ioc_bottom_half, IOC_BOTTOM_HALF, Warps);
nix::ioctl_write_ptr_bad!(ioc_pre_volta, IOC_PRE_VOLTA, u32);
nix::ioctl_readwrite_bad!(ioc_preempt, IOC_PREEMPT, Preempt);
nix::ioctl_readwrite_bad!(ioc_exit, IOC_EXIT, Preempt);
nix::ioctl_read_bad!(ioc_filled, IOC_FILLED, u64);

/// Every constant of the header with its value, for the ABI test.
pub fn constants() -> Vec<(&'static str, i128)> {
    vec![
        ("WIC_FAKEGPU_NR_GPUS", NR_GPUS.into()),
        ("WIC_FAKEGPU_GPU_NONE", GPU_NONE.into()),
        ("WIC_FAKEGPU_PAGE_SHIFT", PAGE_SHIFT.into()),
        ("WIC_FAKEGPU_PAGE_SIZE", PAGE_SIZE.into()),
        ("WIC_FAKEGPU_FAULT_ENTRY_SIZE", FAULT_ENTRY_SIZE.into()),
        ("WIC_FAKEGPU_VA_BITS", VA_BITS.into()),
        ("WIC_FAKEGPU_MAX_INJECT", MAX_INJECT.into()),
        ("WIC_FAKEGPU_LOG_EVENTS", LOG_EVENTS.into()),
        ("WIC_FAKEGPU_MAX_PAGES", MAX_PAGES.into()),
        ("WIC_FAKEGPU_MAX_MANAGED", MAX_MANAGED.into()),
        ("WIC_FAKEGPU_MAX_REMOTE", MAX_REMOTE.into()),
        ("WIC_FAKEGPU_MAX_STORE", MAX_STORE.into()),
        ("WIC_FAKEGPU_MAX_GPU_PAGES", MAX_GPU_PAGES.into()),
        ("WIC_FAKEGPU_HW_BUFFER", HW_BUFFER.into()),
        ("WIC_FAKEGPU_HW_BATCH", HW_BATCH.into()),
        ("WIC_FAKEGPU_HW_MAX_BATCHES", HW_MAX_BATCHES.into()),
        ("WIC_FAKEGPU_HW_MAX_RUNS", HW_MAX_RUNS.into()),
        ("WIC_FAKEGPU_MAX_WARPS", MAX_WARPS.into()),
        ("WIC_FAKEGPU_EVENT_WRITE", EVENT_WRITE.into()),
        ("WIC_FAKEGPU_EVENT_MAP", EVENT_MAP.into()),
        ("WIC_FAKEGPU_EVENT_MAP_WRITABLE", EVENT_MAP_WRITABLE.into()),
        ("WIC_FAKEGPU_EVENT_UNMAP", EVENT_UNMAP.into()),
        ("WIC_FAKEGPU_EVENT_REVOKE_WRITE", EVENT_REVOKE_WRITE.into()),
        ("WIC_FAKEGPU_EVENT_REPLAY", EVENT_REPLAY.into()),
        ("WIC_FAKEGPU_EVENT_SERVICED", EVENT_SERVICED.into()),
        ("WIC_FAKEGPU_EVENT_STALLED", EVENT_STALLED.into()),
        ("WIC_FAKEGPU_EVENT_COPY", EVENT_COPY.into()),
        ("WIC_FAKEGPU_EVENT_RESUMED", EVENT_RESUMED.into()),
        ("WIC_FAKEGPU_EVENT_DROPPED", EVENT_DROPPED.into()),
        ("WIC_FAKEGPU_EVENT_COMPLETE", EVENT_COMPLETE.into()),
        ("WIC_FAKEGPU_EVENT_SWITCHED", EVENT_SWITCHED.into()),
        ("WIC_FAKEGPU_EVENT_CHANNEL_RESET", EVENT_CHANNEL_RESET.into()),
        ("WIC_FAKEGPU_MAX_SWITCH_MS", MAX_SWITCH_MS.into()),
        ("WIC_FAKEGPU_VERDICT_PASS", VERDICT_PASS.into()),
        ("WIC_FAKEGPU_VERDICT_HOLD", VERDICT_HOLD.into()),
        ("WIC_FAKEGPU_PAGE_MAPPED", PAGE_MAPPED.into()),
        ("WIC_FAKEGPU_PAGE_WRITABLE", PAGE_WRITABLE.into()),
        ("WIC_FAKEGPU_PAGE_UNREACHABLE", PAGE_UNREACHABLE.into()),
        ("WIC_FAKEGPU_PAGE_NOWHERE", PAGE_NOWHERE.into()),
        ("WIC_FAKEGPU_PAGE_STALLED", PAGE_STALLED.into()),
        ("WIC_FAKEGPU_FAIL_STALL", FAIL_STALL.into()),
        ("WIC_FAKEGPU_MAX_ERRNO", MAX_ERRNO.into()),
        ("WIC_FAKEGPU_IOC_MAGIC", IOC_MAGIC.into()),
        ("WIC_FAKEGPU_IOC_INJECT", IOC_INJECT.into()),
        ("WIC_FAKEGPU_IOC_EVENTS", IOC_EVENTS.into()),
        ("WIC_FAKEGPU_IOC_PAGE_STATE", IOC_PAGE_STATE.into()),
        ("WIC_FAKEGPU_IOC_RESET", IOC_RESET.into()),
        ("WIC_FAKEGPU_IOC_FAIL", IOC_FAIL.into()),
        ("WIC_FAKEGPU_IOC_MANAGE", IOC_MANAGE.into()),
        ("WIC_FAKEGPU_IOC_RESIDE", IOC_RESIDE.into()),
        ("WIC_FAKEGPU_IOC_GPU_STORE", IOC_GPU_STORE.into()),
        ("WIC_FAKEGPU_IOC_WARPS", IOC_WARPS.into()),
        ("WIC_FAKEGPU_IOC_BOTTOM_HALF", IOC_BOTTOM_HALF.into()),
        ("WIC_FAKEGPU_IOC_PRE_VOLTA", IOC_PRE_VOLTA.into()),
        ("WIC_FAKEGPU_IOC_PREEMPT", IOC_PREEMPT.into()),
        ("WIC_FAKEGPU_IOC_EXIT", IOC_EXIT.into()),
        ("WIC_FAKEGPU_IOC_FILLED", IOC_FILLED.into()),
    ]
}

/// Every struct of the header.
pub fn structs() -> Vec<StructLayout> {
    vec![
        StructLayout::of::<Event>(Event::C_NAME, Event::FIELDS),
        StructLayout::of::<Inject>(Inject::C_NAME, Inject::FIELDS),
        StructLayout::of::<Events>(Events::C_NAME, Events::FIELDS),
        StructLayout::of::<PageState>(PageState::C_NAME, PageState::FIELDS),
        StructLayout::of::<Fail>(Fail::C_NAME, Fail::FIELDS),
        StructLayout::of::<Managed>(Managed::C_NAME, Managed::FIELDS),
        StructLayout::of::<GpuStore>(GpuStore::C_NAME, GpuStore::FIELDS),
        StructLayout::of::<Warps>(Warps::C_NAME, Warps::FIELDS),
        StructLayout::of::<Preempt>(Preempt::C_NAME, Preempt::FIELDS),
    ]
}

fn check(result: nix::Result<libc::c_int>) -> io::Result<libc::c_int> {
    result.map_err(io::Error::from)
}

/// An open fake VA space: the application's "UVM file".
pub struct FakeGpu {
    file: File,
}

impl FakeGpu {
    /// Opens [`DEVICE`]; the space belongs to the calling process's address space.
    pub fn open() -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(DEVICE)?;
        Ok(Self { file })
    }

    /// The file, to hand to the shim's `WIC_IOC_ATTACH`.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Injects `entries` as faults of `gpu`; returns each verdict and the time just before
    /// the first was classified (CLOCK_MONOTONIC ns).
    pub fn inject(&self, gpu: u32, entries: &[RawFaultEntry]) -> io::Result<(Vec<u8>, u64)> {
        let mut verdicts = vec![0u8; entries.len()];
        let mut arg = Inject {
            gpu_id: gpu,
            count: entries.len() as u32,
            entries: entries.as_ptr() as u64,
            verdicts: verdicts.as_mut_ptr() as u64,
            injected_ns: 0,
        };
        // SAFETY: checked ABI; `entries` and `verdicts` hold `count` elements each for the call.
        check(unsafe { ioc_inject(self.file.as_raw_fd(), &mut arg) })?;
        Ok((verdicts, arg.injected_ns))
    }

    /// Moves up to `capacity` logged events out, waiting up to `timeout_ms` for the first.
    pub fn events(&self, capacity: usize, timeout_ms: u32) -> io::Result<(Vec<Event>, u64)> {
        let mut events = vec![Event::default(); capacity];
        let mut arg =
            Events { buffer: events.as_mut_ptr() as u64, capacity: capacity as u32, timeout_ms, ..Default::default() };
        // SAFETY: checked ABI; `events` holds `capacity` elements for the call.
        check(unsafe { ioc_events(self.file.as_raw_fd(), &mut arg) })?;
        events.truncate(arg.count as usize);
        Ok((events, arg.overflow))
    }

    /// The fake page table's flags for `va` on `gpu`.
    pub fn page_state(&self, gpu: u32, va: u64) -> io::Result<u32> {
        let mut arg = PageState { gpu_id: gpu, flags: 0, va };
        // SAFETY: checked ABI; `arg` is valid for reads and writes.
        check(unsafe { ioc_page_state(self.file.as_raw_fd(), &mut arg) })?;
        Ok(arg.flags)
    }

    /// Declares `length` bytes from `start` managed memory (what cudaMallocManaged does):
    /// only such ranges can be registered with the shim.
    pub fn manage(&self, start: u64, length: u64) -> io::Result<()> {
        let arg = Managed { start, length };
        // SAFETY: checked ABI; the module reads `arg`.
        check(unsafe { ioc_manage(self.file.as_raw_fd(), &arg) }).map(drop)
    }

    /// Makes page `va` resident out of `gpu`'s reach (on a GPU without peer access to it), so
    /// that mapping it there fails with EXDEV, or with `unreachable` false reachable again.
    pub fn reside(&self, gpu: u32, va: u64, unreachable: bool) -> io::Result<()> {
        let arg = PageState { gpu_id: gpu, flags: if unreachable { PAGE_UNREACHABLE } else { 0 }, va };
        // SAFETY: checked ABI; the module reads `arg`.
        check(unsafe { ioc_reside(self.file.as_raw_fd(), &arg) }).map(drop)
    }

    /// Makes page `va` resident nowhere, as a managed page nothing touched yet: a read-only map
    /// of it fails with ENODATA, a writable map or a fill populates it (zeroed).
    pub fn untouched(&self, va: u64) -> io::Result<()> {
        let arg = PageState { gpu_id: 1, flags: PAGE_NOWHERE, va };
        // SAFETY: checked ABI; the module reads `arg`.
        check(unsafe { ioc_reside(self.file.as_raw_fd(), &arg) }).map(drop)
    }

    /// A kernel of `gpu` stores `bytes` at `va` of managed memory: the pages become resident
    /// in that GPU's memory, and the process's own copy of them is left stale.
    pub fn gpu_store(&self, gpu: u32, va: u64, bytes: &[u8]) -> io::Result<()> {
        let arg = GpuStore { gpu_id: gpu, reserved: 0, va, buffer: bytes.as_ptr() as u64, length: bytes.len() as u64 };
        // SAFETY: checked ABI; the module reads `arg` and `length` bytes from `buffer`.
        check(unsafe { ioc_gpu_store(self.file.as_raw_fd(), &arg) }).map(drop)
    }

    /// Warps of `gpu` stall on `entries`' pages, one per entry, and write them into its fault
    /// buffer (dropped once it is full); the bottom half does not run yet.
    pub fn warps(&self, gpu: u32, entries: &[RawFaultEntry]) -> io::Result<Warps> {
        let mut arg =
            Warps { gpu_id: gpu, count: entries.len() as u32, entries: entries.as_ptr() as u64, ..Default::default() };
        // SAFETY: checked ABI; `entries` holds `count` elements for the call.
        check(unsafe { ioc_warps(self.file.as_raw_fd(), &mut arg) })?;
        Ok(arg)
    }

    /// Registers a pre-Volta GPU `gpu` (Pascal) in this space: the space cannot be attached,
    /// the helpers refuse the GPU and its faults are never held.
    pub fn pre_volta(&self, gpu: u32) -> io::Result<()> {
        // SAFETY: checked ABI; the module reads one u32.
        check(unsafe { ioc_pre_volta(self.file.as_raw_fd(), &gpu) }).map(drop)
    }

    /// Runs `gpu`'s bottom half until its fault buffer is empty; what it did.
    pub fn bottom_half(&self, gpu: u32) -> io::Result<Warps> {
        self.bottom_half_racing(gpu, &[])
    }

    /// Runs `gpu`'s bottom half as [`FakeGpu::bottom_half`] does, while warps of this space
    /// stall on `late` in the race of its first fetch: between nvidia-uvm's last read of the
    /// buffer's OVERFLOW bit and its clear, so that a fault they drop is never seen.
    pub fn bottom_half_racing(&self, gpu: u32, late: &[RawFaultEntry]) -> io::Result<Warps> {
        let entries = if late.is_empty() { 0 } else { late.as_ptr() as u64 };
        let mut arg = Warps { gpu_id: gpu, count: late.len() as u32, entries, ..Default::default() };
        // SAFETY: checked ABI; `late` holds `count` elements for the call.
        check(unsafe { ioc_bottom_half(self.file.as_raw_fd(), &mut arg) })?;
        Ok(arg)
    }

    /// Another context's time slice on `gpu`: waits until no warp is stalled there (the switch
    /// is done) or `timeout` passed (RM resets the channel and the stalled warps are killed:
    /// `killed` says how many).
    pub fn preempt(&self, gpu: u32, timeout: std::time::Duration) -> io::Result<Preempt> {
        let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        let mut arg = Preempt { gpu_id: gpu, timeout_ms, ..Default::default() };
        // SAFETY: checked ABI; `arg` is valid for reads and writes.
        check(unsafe { ioc_preempt(self.file.as_raw_fd(), &mut arg) })?;
        Ok(arg)
    }

    /// This space's process goes away, as nvidia-uvm's `uvm_va_space_mm_shutdown()` handles it:
    /// the hook's `uvm_wic_space_shutdown()`, then its channel on `gpu` stops, a switch as in
    /// [`FakeGpu::preempt`] with the same answer. The space's helper calls fail with ESRCH after.
    pub fn exit(&self, gpu: u32, timeout: std::time::Duration) -> io::Result<Preempt> {
        let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        let mut arg = Preempt { gpu_id: gpu, timeout_ms, ..Default::default() };
        // SAFETY: checked ABI; `arg` is valid for reads and writes.
        check(unsafe { ioc_exit(self.file.as_raw_fd(), &mut arg) })?;
        Ok(arg)
    }

    /// The bytes completions' fills wrote into this space since it was opened: data and copies
    /// whole, 8 per page of a marker or of a heads completion's words. Never reset: read it
    /// before and after.
    pub fn filled(&self) -> io::Result<u64> {
        let mut filled = 0u64;
        // SAFETY: checked ABI; the module writes one u64 into `filled`.
        check(unsafe { ioc_filled(self.file.as_raw_fd(), &mut filled) })?;
        Ok(filled)
    }

    /// Empties the event log, unmaps this space's pages, makes them reachable again, forgets
    /// what fake GPUs stored and cancels its armed failures.
    pub fn reset(&self) -> io::Result<()> {
        // SAFETY: checked ABI; no argument.
        check(unsafe { ioc_reset(self.file.as_raw_fd(), 0) }).map(drop)
    }

    /// Makes the next `fail.writes` fills (writes and copies) and `fail.maps` `uvm_wic_map()` calls on
    /// this space fail with `fail.error` (or stall first, with [`FAIL_STALL`]), replacing what
    /// was armed before and letting every stalled call go on.
    pub fn fail(&self, fail: Fail) -> io::Result<()> {
        // SAFETY: checked ABI; the module reads `fail`.
        check(unsafe { ioc_fail(self.file.as_raw_fd(), &fail) }).map(drop)
    }
}
