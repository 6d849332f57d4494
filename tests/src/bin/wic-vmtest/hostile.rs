//! Hostile input for `/dev/wic`: bad arguments, bad sequences and bad addresses, through
//! ioctl, io_uring and mmap. Every refusal must carry the errno that `ffi/include/wic_abi.h`
//! documents and `wic_shim.ko` returns, refused commands must leave no trace on the (fake) GPU,
//! and the module must still serve a normal session afterwards.
//!
//! Runs as root with `wic_fakegpu.ko` and `wic_shim.ko` loaded and no other session open. The
//! calls are raw ioctls on the device file, so that values and sequences the safe
//! [`wic_kernel_io::Device`] API never sends can be sent.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::ptr;
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};
use nix::errno::Errno;
use wic_engine::fault::AccessType;
use wic_kabi::{self as kabi, WicAttach, WicCommand, WicFaultRecord, WicRange, WicRingHeader, WicSubmit, WicVersion};
use wic_kernel_io::fakegpu::{self, FakeGpu};
use wic_kernel_io::Device;

use crate::rig::fault;

const DEVICE: &str = "/dev/wic";
const PAGE: u64 = kabi::WIC_PAGE_SIZE;
/// The GPU commands name: nvidia-uvm's id of the first GPU.
const GPU: u32 = crate::rig::GPU;
const PAGE_BYTES: usize = kabi::WIC_PAGE_SIZE as usize;
const PCM: u32 = kabi::WIC_RANGE_PCM;
const PAT: u32 = kabi::WIC_RANGE_PAT;
const SOURCE: u32 = kabi::WIC_RANGE_SOURCE;
/// An address in the kernel's direct map: never a user address.
const KERNEL_ADDR: u64 = 0xffff_8880_0000_0000;
/// An address in the first page, below `vm.mmap_min_addr`: never mapped.
const LOW_ADDR: u64 = 8;
/// Pages of the region most ranges live in.
const REGION_PAGES: usize = 64;
/// Pages of the range long enough for a completion of more than `WIC_MAX_WRITE_BYTES` (257
/// pages) and its companion run.
const LONG_PAGES: usize = 2 * 257;

use wic_kernel_io::device::raw::{ioc_attach, ioc_detach, ioc_register, ioc_submit, ioc_unregister, ioc_version};

/// `_IO('W', 0x7f)`: a number the module does not know.
const IOC_UNKNOWN: u32 = nix::request_code_none!(kabi::WIC_IOC_MAGIC, 0x7f) as u32;
/// `WIC_IOC_SUBMIT`'s number with a 24-byte size: not `WIC_IOC_SUBMIT`.
const IOC_SUBMIT_WRONG_SIZE: u32 = nix::request_code_readwrite!(kabi::WIC_IOC_MAGIC, 0x05, 24) as u32;
/// `WIC_IOC_SUBMIT`'s number and size with another magic.
const IOC_OTHER_MAGIC: u32 = nix::request_code_readwrite!(b'Q', 0x05, std::mem::size_of::<WicSubmit>()) as u32;
/// An io_uring `cmd_op` that is not `WIC_IOC_SUBMIT`.
const URING_UNKNOWN_OP: u32 = 0x1234;

pub fn run() -> Result<(), String> {
    let mut c = Checker::default();
    let fake = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
    let mut ring = IoUring::new(8).map_err(|e| format!("io_uring setup: {e}"))?;

    device_mode(&mut c)?;
    let session = exclusive_open(&mut c)?;
    let fd = session.as_raw_fd();
    let limits = negotiate(&mut c, fd, &fake, &mut ring)?;
    unknown_and_unmapped(&mut c, fd)?;
    let s1 = attach_cases(&mut c, fd, &fake, &limits)?;
    let mut st = register_cases(&mut c, fd, &fake, s1)?;
    unregister_detach_cases(&mut c, fd, &st)?;
    batch_cases(&mut c, fd, &fake)?;
    command_cases(&mut c, fd, &fake, &mut ring, &mut st)?;
    range_limit(&mut c, fd, &fake, &limits, &st)?;
    ring_cases(&mut c, fd, &limits)?;
    teardown(&mut c, fd, &st)?;

    drop(ring);
    drop(session);
    healthy_after(&mut c, &fake)?;
    println!("hostile: {} cases passed", c.passed);
    Ok(())
}

/// Counts the cases that passed; each check fails with what was expected and what came.
#[derive(Default)]
struct Checker {
    passed: usize,
}

impl Checker {
    fn pass(&mut self) {
        self.passed += 1;
    }

    /// The call must fail with `want`.
    fn refused<T: std::fmt::Debug>(&mut self, what: &str, got: Result<T, Errno>, want: Errno) -> Result<(), String> {
        match got {
            Err(errno) if errno == want => {
                self.pass();
                Ok(())
            }
            Err(errno) => Err(format!("{what}: expected {want:?}, got {errno:?}")),
            Ok(value) => Err(format!("{what}: expected {want:?}, got Ok ({value:?})")),
        }
    }

    /// The call must succeed.
    fn accepted<T>(&mut self, what: &str, got: Result<T, Errno>) -> Result<T, String> {
        match got {
            Ok(value) => {
                self.pass();
                Ok(value)
            }
            Err(errno) => Err(format!("{what}: expected Ok, got {errno:?}")),
        }
    }

    /// `got` must equal `want`.
    fn equal<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, got: T, want: T) -> Result<(), String> {
        if got != want {
            return Err(format!("{what}: expected {want:?}, got {got:?}"));
        }
        self.pass();
        Ok(())
    }

    /// A count, a command's result or a CQE result (negative: an errno) must equal `want`.
    fn status(&mut self, what: &str, got: i32, want: i32) -> Result<(), String> {
        if got != want {
            return Err(format!("{what}: expected {}, got {}", show(want), show(got)));
        }
        self.pass();
        Ok(())
    }

    fn ensure(&mut self, what: &str, ok: bool, detail: impl FnOnce() -> String) -> Result<(), String> {
        if !ok {
            return Err(format!("{what}: {}", detail()));
        }
        self.pass();
        Ok(())
    }
}

/// 0, a count, or `-EINVAL` for a negative errno.
fn show(value: i32) -> String {
    if value >= 0 {
        return value.to_string();
    }
    match Errno::from_raw(value.wrapping_neg()) {
        Errno::UnknownErrno => value.to_string(),
        errno => format!("-{errno:?}"),
    }
}

/// A command result or CQE result for `errno`.
fn neg(errno: Errno) -> i32 {
    -(errno as i32)
}

fn io_errno(e: std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(0))
}

fn open_device() -> Result<File, Errno> {
    OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(DEVICE).map_err(io_errno)
}

// --- Raw calls -------------------------------------------------------------------------------

/// An ioctl whose argument is `addr`, an address where the kernel can reach no memory of ours.
fn ioctl_at(fd: RawFd, request: u32, addr: u64) -> Result<i32, Errno> {
    // SAFETY: `addr` is 0, an address in the never-mapped first page or a kernel address: the
    // module's user copies fault (or an unknown request ignores it) and touch nothing of ours.
    Errno::result(unsafe { libc::ioctl(fd, request as libc::Ioctl, addr as usize) })
}

fn version(fd: RawFd, v: &mut WicVersion) -> Result<i32, Errno> {
    // SAFETY: checked ABI; `v` is valid for reads and writes for the call.
    unsafe { ioc_version(fd, v) }
}

/// `WIC_IOC_ATTACH` of `uvm_fd` with `space_id` preset; the space id it gave.
fn attach(fd: RawFd, uvm_fd: RawFd, space_id: u32) -> Result<u32, Errno> {
    let mut arg = WicAttach { uvm_fd, space_id };
    // SAFETY: checked ABI; `arg` is valid for reads and writes for the call.
    unsafe { ioc_attach(fd, &mut arg) }?;
    Ok(arg.space_id)
}

fn detach(fd: RawFd, space_id: u32) -> Result<i32, Errno> {
    // SAFETY: checked ABI; the module reads one u32.
    unsafe { ioc_detach(fd, &space_id) }
}

fn register_raw(fd: RawFd, range: &mut WicRange) -> Result<i32, Errno> {
    // SAFETY: checked ABI; `range` is valid for reads and writes for the call.
    unsafe { ioc_register(fd, range) }
}

/// `WIC_IOC_REGISTER` of a well-formed request; the range id it gave.
fn register(fd: RawFd, space_id: u32, kind: u32, start: u64, length: u64) -> Result<u32, Errno> {
    let mut range = WicRange { space_id, kind, start, length, range_id: 0, run_pages: 0 };
    register_raw(fd, &mut range)?;
    Ok(range.range_id)
}

fn unregister(fd: RawFd, range_id: u32) -> Result<i32, Errno> {
    // SAFETY: checked ABI; the module reads one u32.
    unsafe { ioc_unregister(fd, &range_id) }
}

/// The commands a submission names.
enum Cmds<'a> {
    /// Commands of ours, borrowed mutably for the call.
    Live(&'a mut [WicCommand]),
    /// An address where the kernel must fail or may only write memory no Rust reference
    /// covers: 0, a kernel address, a read-only page, or a [`Mapping`] read only through raw
    /// pointers.
    Raw(u64),
}

impl Cmds<'_> {
    fn payload(&mut self, count: u32, flags: u32) -> WicSubmit {
        let commands = match self {
            Cmds::Live(commands) => {
                assert!(count as usize <= commands.len(), "the module would read past the commands");
                commands.as_mut_ptr() as u64
            }
            Cmds::Raw(addr) => *addr,
        };
        WicSubmit { commands, count, flags }
    }
}

fn submit(fd: RawFd, mut cmds: Cmds<'_>, count: u32, flags: u32) -> Result<i32, Errno> {
    let mut arg = cmds.payload(count, flags);
    // SAFETY: checked ABI; `arg` is valid for reads and writes, and the commands it names are
    // either borrowed mutably for the call (at least `count` of them) or `Cmds::Raw`.
    unsafe { ioc_submit(fd, &mut arg) }
}

/// One `IORING_OP_URING_CMD` on the session: `cmd_op` and a `struct wic_submit` as payload.
/// Returns the CQE's result.
fn uring_submit(
    ring: &mut IoUring,
    fd: RawFd,
    cmd_op: u32,
    mut cmds: Cmds<'_>,
    count: u32,
    flags: u32,
) -> Result<i32, String> {
    let sub = cmds.payload(count, flags);
    let mut payload = [0u8; 16];
    payload[..8].copy_from_slice(&sub.commands.to_ne_bytes());
    payload[8..12].copy_from_slice(&sub.count.to_ne_bytes());
    payload[12..].copy_from_slice(&sub.flags.to_ne_bytes());
    let entry = opcode::UringCmd16::new(types::Fd(fd), cmd_op).cmd(payload).build().user_data(0x5749_4321);
    // SAFETY: the entry carries its payload by value; the commands it names stay borrowed (or
    // are `Cmds::Raw`) until its completion is reaped below, before this function returns.
    unsafe { ring.submission().push(&entry) }.map_err(|_| "io_uring: submission queue full".to_string())?;
    ring.submit_and_wait(1).map_err(|e| format!("io_uring_enter: {e}"))?;
    let cqe = ring.completion().next().ok_or("io_uring: no completion after waiting for one")?;
    if cqe.user_data() != 0x5749_4321 {
        return Err(format!("io_uring: a completion for {:#x}, not ours", cqe.user_data()));
    }
    Ok(cqe.result())
}

fn command(opcode: u32, space_id: u32, va: u64, pages: u32) -> WicCommand {
    WicCommand { opcode, space_id, gpu_id: GPU, pages, va, ..Default::default() }
}

fn replay(gpu_id: u32) -> WicCommand {
    WicCommand { opcode: kabi::WIC_CMD_REPLAY, gpu_id, ..Default::default() }
}

/// The fake GPU's log since the last look (at most 4096 events).
/// What the module had nvidia-uvm do to the GPUs and pages, without the markers of its
/// `uvm_wic_complete()` calls.
fn gpu_events(fake: &FakeGpu) -> Result<Vec<fakegpu::Event>, String> {
    let (events, _) = fake.events(4096, 0).map_err(|e| format!("fake GPU event log: {e}"))?;
    Ok(events.into_iter().filter(|e| e.kind != fakegpu::EVENT_COMPLETE).collect())
}

/// Memory this test maps; unmapped on drop, except the pages punched out already. Read only
/// through raw pointers: the module writes into it.
#[derive(Debug)]
struct Mapping {
    addr: *mut u8,
    pages: usize,
    holes: Vec<usize>,
}

impl Mapping {
    fn anonymous(pages: usize) -> Result<Self, String> {
        // SAFETY: a new private anonymous mapping at an address the kernel picks: it aliases
        // nothing.
        let addr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                pages * PAGE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(format!("mmap of {pages} anonymous pages: {}", Errno::last()));
        }
        Ok(Self { addr: addr.cast(), pages, holes: Vec::new() })
    }

    /// Address space alone: `pages` pages no access may touch, reserving no memory, which the
    /// module may register but never writes into.
    fn reserved(pages: usize) -> Result<Self, String> {
        // SAFETY: a new private anonymous mapping at an address the kernel picks: it aliases
        // nothing.
        let addr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                pages * PAGE_BYTES,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(format!("mmap of {pages} reserved pages: {}", Errno::last()));
        }
        Ok(Self { addr: addr.cast(), pages, holes: Vec::new() })
    }

    /// A shared mapping of the session's file.
    fn device(fd: RawFd, len: usize, offset: i64) -> Result<Self, Errno> {
        // SAFETY: a new shared mapping at an address the kernel picks: it aliases nothing.
        let addr = unsafe {
            libc::mmap(ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, offset)
        };
        if addr == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        Ok(Self { addr: addr.cast(), pages: len.div_ceil(PAGE_BYTES), holes: Vec::new() })
    }

    /// Declares pages `first..first + pages` managed memory of `fake`'s space (what
    /// cudaMallocManaged makes): only those can be registered.
    fn manage(&self, fake: &FakeGpu, first: usize, pages: usize) -> Result<(), String> {
        assert!(first + pages <= self.pages);
        fake.manage(self.page(first), pages as u64 * PAGE).map_err(|e| format!("declaring memory managed: {e}"))
    }

    fn page(&self, i: usize) -> u64 {
        assert!(i < self.pages);
        self.addr as u64 + i as u64 * PAGE
    }

    /// Unmaps page `i`, leaving a hole.
    fn punch(&mut self, i: usize) -> Result<(), String> {
        assert!(i < self.pages && !self.holes.contains(&i));
        // SAFETY: one page of this mapping, which nothing refers to and nothing touches again.
        if unsafe { libc::munmap(self.addr.wrapping_add(i * PAGE_BYTES).cast(), PAGE_BYTES) } != 0 {
            return Err(format!("munmap of page {i}: {}", Errno::last()));
        }
        self.holes.push(i);
        Ok(())
    }

    /// Copies `len` bytes at `offset`.
    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        assert!(offset + len <= self.pages * PAGE_BYTES);
        assert!((offset / PAGE_BYTES..(offset + len).div_ceil(PAGE_BYTES)).all(|p| !self.holes.contains(&p)));
        let mut out = vec![0u8; len];
        // SAFETY: mapped and readable (checked above); the module writes these bytes only
        // during calls that have returned, and no Rust reference covers them.
        unsafe { ptr::copy_nonoverlapping(self.addr.wrapping_add(offset), out.as_mut_ptr(), len) };
        out
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let mut start = 0;
        for i in 0..=self.pages {
            if i == self.pages || self.holes.contains(&i) {
                if i > start {
                    // SAFETY: pages [start, i) of this mapping, still mapped (not punched) and
                    // used by nothing after this.
                    unsafe {
                        libc::munmap(self.addr.wrapping_add(start * PAGE_BYTES).cast(), (i - start) * PAGE_BYTES)
                    };
                }
                start = i + 1;
            }
        }
    }
}

// --- Scenarios -------------------------------------------------------------------------------

/// One session at a time: a second open is refused until the first closes.
/// `/dev/wic` is root's alone (the udev rule adds group wic on a real system): another user
/// cannot even open it.
fn device_mode(c: &mut Checker) -> Result<(), String> {
    let meta = std::fs::metadata(DEVICE).map_err(|e| format!("stat {DEVICE}: {e}"))?;
    let mode = meta.mode() & 0o7777;
    if !meta.file_type().is_char_device() || mode != 0o600 || meta.uid() != 0 {
        return Err(format!(
            "{DEVICE} is mode {mode:o}, uid {}, char device {}: expected 600 root",
            meta.uid(),
            meta.file_type().is_char_device()
        ));
    }
    c.pass();
    const NOBODY: u32 = 65534;
    let out = std::process::Command::new("/bin/busybox")
        .args(["sh", "-c", &format!("exec 3<>{DEVICE}")])
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .map_err(|e| format!("run a shell as nobody: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || !stderr.contains("Permission denied") {
        return Err(format!("nobody opening {DEVICE}: {}, {stderr:?}", out.status));
    }
    c.pass();
    Ok(())
}

fn exclusive_open(c: &mut Checker) -> Result<File, String> {
    // A previous scenario's session may still be closing: wait for it as wicd does.
    let deadline = Instant::now() + Duration::from_secs(5);
    let first = loop {
        match open_device() {
            Ok(file) => break file,
            Err(Errno::EBUSY) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(errno) => return Err(format!("open {DEVICE}: {errno:?}")),
        }
    };
    c.pass();
    c.refused("second open while a session is open", open_device(), Errno::EBUSY)?;
    c.refused("third open while a session is open", open_device(), Errno::EBUSY)?;
    drop(first);
    c.accepted("open after the first session closed", open_device())
}

/// Everything before `WIC_IOC_VERSION` is `EPROTO`; a wrong version is refused with the
/// module's values filled in; the right one opens the session.
fn negotiate(c: &mut Checker, fd: RawFd, fake: &FakeGpu, ring: &mut IoUring) -> Result<WicVersion, String> {
    let fake_fd = fake.fd().as_raw_fd();
    let scratch = Mapping::anonymous(1)?;
    let mut range =
        WicRange { space_id: 1, kind: PCM, start: scratch.page(0), length: PAGE, range_id: 0, run_pages: 0 };
    let before = |c: &mut Checker, when: &str, range: &mut WicRange| -> Result<(), String> {
        c.refused(&format!("ATTACH {when}"), attach(fd, fake_fd, 0), Errno::EPROTO)?;
        c.refused(&format!("DETACH {when}"), detach(fd, 1), Errno::EPROTO)?;
        c.refused(&format!("REGISTER {when}"), register_raw(fd, range), Errno::EPROTO)?;
        c.refused(&format!("UNREGISTER {when}"), unregister(fd, 1), Errno::EPROTO)?;
        let mut cmds = [replay(GPU)];
        c.refused(&format!("SUBMIT {when}"), submit(fd, Cmds::Live(&mut cmds), 1, 0), Errno::EPROTO)?;
        c.refused(&format!("mmap of the ring {when}"), Mapping::device(fd, PAGE_BYTES, 0), Errno::EPROTO)?;
        Ok(())
    };
    before(c, "before VERSION", &mut range)?;
    c.refused("unknown ioctl before VERSION", ioctl_at(fd, IOC_UNKNOWN, 0), Errno::EPROTO)?;
    let mut cmds = [replay(GPU)];
    let cqe = uring_submit(ring, fd, kabi::WIC_IOC_SUBMIT, Cmds::Live(&mut cmds), 1, 0)?;
    c.status("io_uring SUBMIT before VERSION", cqe, neg(Errno::EPROTO))?;
    c.refused("VERSION with an unmapped argument", ioctl_at(fd, kabi::WIC_IOC_VERSION, LOW_ADDR), Errno::EFAULT)?;
    c.refused("VERSION with a kernel address", ioctl_at(fd, kabi::WIC_IOC_VERSION, KERNEL_ADDR), Errno::EFAULT)?;

    let mut wrong = WicVersion { abi_version: 99, ..Default::default() };
    c.refused("VERSION 99", version(fd, &mut wrong), Errno::EPROTONOSUPPORT)?;
    c.equal("VERSION 99: the module's version filled in", wrong.abi_version, kabi::WIC_ABI_VERSION)?;
    c.equal(
        "VERSION 99: the module's limits filled in (spaces, ranges, held, commands)",
        (wrong.max_spaces, wrong.max_ranges, wrong.max_held, wrong.max_commands),
        (kabi::WIC_MAX_SPACES, kabi::WIC_MAX_RANGES, kabi::WIC_MAX_HELD, kabi::WIC_MAX_COMMANDS),
    )?;
    let mut zero = WicVersion::default();
    c.refused("VERSION 0", version(fd, &mut zero), Errno::EPROTONOSUPPORT)?;
    before(c, "after a refused VERSION", &mut range)?;

    let mut limits = WicVersion { abi_version: kabi::WIC_ABI_VERSION, ..Default::default() };
    c.accepted("VERSION 1", version(fd, &mut limits))?;
    let entries = limits.ring_entries;
    c.ensure("VERSION 1: ring_entries", entries.is_power_of_two() && (256..=65536).contains(&entries), || {
        format!("{entries} is not a power of two from 256 to 65536")
    })?;
    c.equal(
        "VERSION 1: limits (spaces, ranges, held, commands)",
        (limits.max_spaces, limits.max_ranges, limits.max_held, limits.max_commands),
        (kabi::WIC_MAX_SPACES, kabi::WIC_MAX_RANGES, kabi::WIC_MAX_HELD, kabi::WIC_MAX_COMMANDS),
    )?;
    let mut again = WicVersion { abi_version: kabi::WIC_ABI_VERSION, ..Default::default() };
    c.accepted("VERSION 1 a second time", version(fd, &mut again))?;
    c.equal("VERSION 1 a second time: the same answer", again, limits)?;

    let mut pollfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd for the duration of the call.
    let ready = unsafe { libc::poll(&mut pollfd, 1, 0) };
    c.equal("poll of a session without records", (ready, pollfd.revents), (0, 0))?;
    Ok(limits)
}

/// Unknown request numbers, and arguments at addresses the module must not read or write.
fn unknown_and_unmapped(c: &mut Checker, fd: RawFd) -> Result<(), String> {
    c.refused("unknown ioctl _IO('W', 0x7f)", ioctl_at(fd, IOC_UNKNOWN, 0), Errno::ENOTTY)?;
    c.refused("WIC_IOC_SUBMIT's number with a wrong size", ioctl_at(fd, IOC_SUBMIT_WRONG_SIZE, 0), Errno::ENOTTY)?;
    c.refused("WIC_IOC_SUBMIT's number with another magic", ioctl_at(fd, IOC_OTHER_MAGIC, 0), Errno::ENOTTY)?;
    let requests = [
        ("ATTACH", kabi::WIC_IOC_ATTACH),
        ("DETACH", kabi::WIC_IOC_DETACH),
        ("REGISTER", kabi::WIC_IOC_REGISTER),
        ("UNREGISTER", kabi::WIC_IOC_UNREGISTER),
        ("SUBMIT", kabi::WIC_IOC_SUBMIT),
    ];
    for (name, request) in requests {
        c.refused(&format!("{name} with argument address 0"), ioctl_at(fd, request, 0), Errno::EFAULT)?;
        c.refused(
            &format!("{name} with a kernel address as argument"),
            ioctl_at(fd, request, KERNEL_ADDR),
            Errno::EFAULT,
        )?;
    }
    Ok(())
}

/// `WIC_IOC_ATTACH`: bad descriptors, a preset id, the same file twice, the space limit.
/// Returns the fake GPU's space id.
fn attach_cases(c: &mut Checker, fd: RawFd, fake: &FakeGpu, limits: &WicVersion) -> Result<u32, String> {
    let fake_fd = fake.fd().as_raw_fd();
    c.refused("ATTACH uvm_fd -1", attach(fd, -1, 0), Errno::EBADF)?;
    c.refused("ATTACH of a descriptor number not open", attach(fd, i32::MAX, 0), Errno::EBADF)?;
    let null = File::open("/dev/null").map_err(|e| format!("open /dev/null: {e}"))?;
    c.refused("ATTACH of /dev/null (not a UVM file)", attach(fd, null.as_raw_fd(), 0), Errno::EBADF)?;
    c.refused("ATTACH of the session's own /dev/wic descriptor", attach(fd, fd, 0), Errno::EBADF)?;
    let path_only = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(fakegpu::DEVICE)
        .map_err(|e| format!("open {} with O_PATH: {e}", fakegpu::DEVICE))?;
    c.refused(
        "ATTACH of an O_PATH descriptor of the fake GPU device",
        attach(fd, path_only.as_raw_fd(), 0),
        Errno::EBADF,
    )?;
    c.refused("ATTACH with space_id preset nonzero", attach(fd, fake_fd, 7), Errno::EINVAL)?;
    c.refused("ATTACH with space_id preset u32::MAX", attach(fd, fake_fd, u32::MAX), Errno::EINVAL)?;

    let s1 = c.accepted("ATTACH of the fake GPU file", attach(fd, fake_fd, 0))?;
    c.ensure("ATTACH: the space id", s1 != 0 && s1 <= limits.max_spaces, || format!("got {s1}"))?;
    c.refused("ATTACH of the same file again", attach(fd, fake_fd, 0), Errno::EEXIST)?;
    let dup = fake.fd().try_clone_to_owned().map_err(|e| format!("dup of the fake GPU file: {e}"))?;
    c.refused("ATTACH of a duplicate of the same file", attach(fd, dup.as_raw_fd(), 0), Errno::EEXIST)?;

    // The space limit: fill every slot, one more is refused, then give them back.
    let mut others = Vec::new();
    let mut ids = Vec::new();
    for n in 1..limits.max_spaces {
        let other = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
        let id = attach(fd, other.fd().as_raw_fd(), 0).map_err(|errno| {
            format!("ATTACH of space {} of {}: expected Ok, got {errno:?}", n + 1, limits.max_spaces)
        })?;
        ids.push(id);
        others.push(other);
    }
    let mut all: Vec<u32> = ids.iter().copied().chain([s1]).collect();
    all.sort_unstable();
    all.dedup();
    c.ensure(
        "ATTACH up to WIC_MAX_SPACES: distinct ids from 1",
        all.len() == limits.max_spaces as usize && all[0] == 1 && *all.last().unwrap() == limits.max_spaces,
        || format!("ids {all:?}"),
    )?;
    let one_more = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
    c.refused("ATTACH beyond WIC_MAX_SPACES", attach(fd, one_more.fd().as_raw_fd(), 0), Errno::ENOSPC)?;
    for id in &ids {
        detach(fd, *id).map_err(|errno| format!("DETACH of space {id}: expected Ok, got {errno:?}"))?;
    }
    c.pass();
    c.refused("DETACH of a space detached already", detach(fd, ids[0]), Errno::ENOENT)?;
    let id = c.accepted("ATTACH after the spaces were given back", attach(fd, one_more.fd().as_raw_fd(), 0))?;
    c.accepted("DETACH it", detach(fd, id))?;
    Ok(s1)
}

/// What the range cases leave for the rest.
struct State {
    space: u32,
    /// A detached space's id.
    stale_space: u32,
    /// 64 pages, page 32 punched out.
    region: Mapping,
    /// `LONG_PAGES` pages, one PCM range.
    long: Mapping,
    /// PCM, pages 4..8 of the region.
    range_a: u32,
    /// PCM, page 8.
    range_b: u32,
    /// PAT, page 3.
    range_p: u32,
    /// PCM, all of `long`.
    range_long: u32,
}

impl State {
    /// Ranges registered while the range limit is tested: a, b, p and long.
    const LIVE_RANGES: u32 = 4;
}

/// `WIC_IOC_REGISTER`: malformed requests, unknown spaces, memory the process lacks, overlaps.
fn register_cases(c: &mut Checker, fd: RawFd, fake: &FakeGpu, s1: u32) -> Result<State, String> {
    let mut region = Mapping::anonymous(REGION_PAGES)?;
    region.manage(fake, 0, REGION_PAGES)?;
    region.punch(32)?;
    let a = region.page(4);
    let good = WicRange { space_id: s1, kind: PCM, start: a, length: 4 * PAGE, range_id: 0, run_pages: 0 };
    let unattached = if s1 == 63 { 62 } else { 63 };
    let cases = [
        ("REGISTER unaligned start", WicRange { start: a + 8, ..good }, Errno::EINVAL),
        ("REGISTER unaligned length", WicRange { length: 4 * PAGE + 1, ..good }, Errno::EINVAL),
        ("REGISTER zero length", WicRange { length: 0, ..good }, Errno::EINVAL),
        (
            "REGISTER length above WIC_MAX_RANGE_BYTES",
            WicRange { length: kabi::WIC_MAX_RANGE_BYTES + PAGE, ..good },
            Errno::EINVAL,
        ),
        ("REGISTER length 2^64 - 4096", WicRange { length: !(PAGE - 1), ..good }, Errno::EINVAL),
        (
            "REGISTER start+length overflowing u64",
            WicRange { start: u64::MAX - PAGE + 1, length: 2 * PAGE, ..good },
            Errno::EINVAL,
        ),
        ("REGISTER start+length == 2^64", WicRange { start: u64::MAX - PAGE + 1, length: PAGE, ..good }, Errno::EINVAL),
        ("REGISTER kind 0", WicRange { kind: 0, ..good }, Errno::EINVAL),
        ("REGISTER unknown kind 4", WicRange { kind: 4, ..good }, Errno::EINVAL),
        ("REGISTER kind u32::MAX", WicRange { kind: u32::MAX, ..good }, Errno::EINVAL),
        (
            "REGISTER run_pages not dividing the range into pairs of runs",
            WicRange { run_pages: 3, ..good },
            Errno::EINVAL,
        ),
        (
            "REGISTER run_pages on a PAT range",
            WicRange { kind: PAT, run_pages: 1, length: 2 * PAGE, ..good },
            Errno::EINVAL,
        ),
        ("REGISTER run_pages past WIC_MAX_RANGE_BYTES", WicRange { run_pages: u32::MAX, ..good }, Errno::EINVAL),
        ("REGISTER range_id preset != 0", WicRange { range_id: 5, ..good }, Errno::EINVAL),
        ("REGISTER space id 0", WicRange { space_id: 0, ..good }, Errno::ENOENT),
        ("REGISTER space id 63, never attached", WicRange { space_id: unattached, ..good }, Errno::ENOENT),
        ("REGISTER space id 65", WicRange { space_id: kabi::WIC_MAX_SPACES + 1, ..good }, Errno::ENOENT),
        ("REGISTER space id u32::MAX", WicRange { space_id: u32::MAX, ..good }, Errno::ENOENT),
        (
            "REGISTER a range with an unmapped page in the middle",
            WicRange { start: region.page(0), length: REGION_PAGES as u64 * PAGE, ..good },
            Errno::EFAULT,
        ),
        ("REGISTER the unmapped page", WicRange { start: region.page(32), length: PAGE, ..good }, Errno::EFAULT),
        (
            "REGISTER a range ending in the unmapped page",
            WicRange { start: region.page(31), length: 2 * PAGE, ..good },
            Errno::EFAULT,
        ),
        ("REGISTER address 0x1000 (not mapped)", WicRange { start: 0x1000, length: PAGE, ..good }, Errno::EFAULT),
        ("REGISTER a kernel address", WicRange { start: KERNEL_ADDR, length: PAGE, ..good }, Errno::EFAULT),
        (
            "REGISTER a kernel address, WIC_MAX_RANGE_BYTES long",
            WicRange { start: KERNEL_ADDR, length: kabi::WIC_MAX_RANGE_BYTES, ..good },
            Errno::EFAULT,
        ),
        (
            "REGISTER at the top of the user address space",
            WicRange { start: 0x7fff_ffff_f000, length: 2 * PAGE, ..good },
            Errno::EFAULT,
        ),
    ];
    for (what, mut range, want) in cases {
        let sent = range;
        c.refused(what, register_raw(fd, &mut range), want)?;
        c.equal(&format!("{what}: the request left as it was"), range, sent)?;
    }

    // Mapped memory that is not managed (malloc, mmap: HMM memory for nvidia-uvm), whose faults
    // nvidia-uvm cannot complete, in whole or in part.
    let plain = Mapping::anonymous(4)?;
    plain.manage(fake, 0, 2)?;
    let half = [
        ("REGISTER memory that is not managed", plain.page(2), 2 * PAGE),
        ("REGISTER a range whose second half is not managed", plain.page(0), 4 * PAGE),
        ("REGISTER a range from the end of managed memory", plain.page(1), 2 * PAGE),
    ];
    for (what, start, length) in half {
        let mut range = WicRange { start, length, ..good };
        c.refused(what, register_raw(fd, &mut range), Errno::EMEDIUMTYPE)?;
        c.equal(&format!("{what}: the request left as it was"), range, WicRange { start, length, ..good })?;
    }

    let mut first = good;
    c.accepted("REGISTER a valid range", register_raw(fd, &mut first))?;
    let range_a = first.range_id;
    c.ensure("REGISTER: the range id", range_a != 0 && first == WicRange { range_id: range_a, ..good }, || {
        format!("got {first:?}")
    })?;
    let overlaps = [
        ("REGISTER the same range again", 4, 4, PCM),
        ("REGISTER the same range again as PAT", 4, 4, PAT),
        ("REGISTER a range overlapping its start", 2, 4, PCM),
        ("REGISTER a range overlapping its end", 6, 4, PCM),
        ("REGISTER a range containing it", 0, 12, PCM),
        ("REGISTER a page inside it", 5, 1, PAT),
        ("REGISTER its last page", 7, 1, PCM),
    ];
    for (what, page, pages, kind) in overlaps {
        c.refused(what, register(fd, s1, kind, region.page(page), pages * PAGE), Errno::EEXIST)?;
    }
    let range_b = c.accepted("REGISTER the adjacent page after it", register(fd, s1, PCM, region.page(8), PAGE))?;
    let range_p =
        c.accepted("REGISTER the adjacent page before it, as PAT", register(fd, s1, PAT, region.page(3), PAGE))?;
    c.ensure(
        "REGISTER: fresh ids",
        [range_a, range_b, range_p].iter().all(|id| *id != 0)
            && range_a != range_b
            && range_b != range_p
            && range_a != range_p,
        || format!("ids {range_a}, {range_b}, {range_p}"),
    )?;
    c.refused("REGISTER across two adjacent ranges", register(fd, s1, PCM, region.page(7), 2 * PAGE), Errno::EEXIST)?;
    c.refused(
        "REGISTER a range overlapping the PAT page",
        register(fd, s1, PCM, region.page(2), 2 * PAGE),
        Errno::EEXIST,
    )?;
    let long = Mapping::anonymous(LONG_PAGES)?;
    long.manage(fake, 0, LONG_PAGES)?;
    let range_long =
        c.accepted("REGISTER a 514-page range", register(fd, s1, PCM, long.page(0), LONG_PAGES as u64 * PAGE))?;

    // A second space may register what the first has; detaching it takes its ranges along.
    let other = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
    region.manage(&other, 0, REGION_PAGES)?;
    let s2 = c.accepted("ATTACH a second fake GPU file", attach(fd, other.fd().as_raw_fd(), 0))?;
    c.ensure("ATTACH: a second space id", s2 != 0 && s2 != s1, || format!("got {s2} (first {s1})"))?;
    let theirs =
        c.accepted("REGISTER in a second space a range the first space has", register(fd, s2, PCM, a, 4 * PAGE))?;
    c.accepted("DETACH of a space with a registered range", detach(fd, s2))?;
    c.refused("UNREGISTER a range of a detached space", unregister(fd, theirs), Errno::ENOENT)?;
    c.refused("REGISTER in a detached space", register(fd, s2, PCM, region.page(20), PAGE), Errno::ENOENT)?;
    c.refused("DETACH of a detached space", detach(fd, s2), Errno::ENOENT)?;
    drop(other);

    Ok(State { space: s1, stale_space: s2, region, long, range_a, range_b, range_p, range_long })
}

/// `WIC_IOC_UNREGISTER` and `WIC_IOC_DETACH` of ids never issued.
fn unregister_detach_cases(c: &mut Checker, fd: RawFd, st: &State) -> Result<(), String> {
    c.refused("UNREGISTER id 0", unregister(fd, 0), Errno::ENOENT)?;
    c.refused("UNREGISTER a never-issued id", unregister(fd, u32::MAX), Errno::ENOENT)?;
    let after = st.range_long.max(st.range_p) + 1000;
    c.refused("UNREGISTER an id not issued yet", unregister(fd, after), Errno::ENOENT)?;
    c.refused("DETACH space id 0", detach(fd, 0), Errno::ENOENT)?;
    let unattached = if st.space == 63 { 62 } else { 63 };
    c.refused("DETACH an unknown space id", detach(fd, unattached), Errno::ENOENT)?;
    c.refused("DETACH space id 65", detach(fd, kabi::WIC_MAX_SPACES + 1), Errno::ENOENT)?;
    c.refused("DETACH space id u32::MAX", detach(fd, u32::MAX), Errno::ENOENT)?;
    Ok(())
}

/// `WIC_IOC_SUBMIT` batches refused as a whole: nothing may reach the GPU.
fn batch_cases(c: &mut Checker, fd: RawFd, fake: &FakeGpu) -> Result<(), String> {
    fake.reset().map_err(|e| format!("fake GPU reset: {e}"))?;
    let mut one = [replay(GPU)];
    c.refused("SUBMIT count 0", submit(fd, Cmds::Live(&mut one), 0, 0), Errno::EINVAL)?;
    let mut many = vec![replay(GPU); kabi::WIC_MAX_COMMANDS as usize + 1];
    c.refused(
        "SUBMIT count WIC_MAX_COMMANDS + 1",
        submit(fd, Cmds::Live(&mut many), kabi::WIC_MAX_COMMANDS + 1, 0),
        Errno::EINVAL,
    )?;
    c.refused("SUBMIT count u32::MAX", submit(fd, Cmds::Raw(0), u32::MAX, 0), Errno::EINVAL)?;
    c.refused("SUBMIT flags 1", submit(fd, Cmds::Live(&mut one), 1, 1), Errno::EINVAL)?;
    c.refused("SUBMIT flags 0x80000000", submit(fd, Cmds::Live(&mut one), 1, 0x8000_0000), Errno::EINVAL)?;
    c.refused("SUBMIT commands pointer 0, count 1", submit(fd, Cmds::Raw(0), 1, 0), Errno::EFAULT)?;
    c.refused("SUBMIT commands at a kernel address", submit(fd, Cmds::Raw(KERNEL_ADDR), 1, 0), Errno::EFAULT)?;
    c.equal("SUBMIT refused: the commands' results untouched", one[0].result, 0)?;
    let events = gpu_events(fake)?;
    c.ensure("refused batches reach the GPU", events.is_empty(), || format!("{} events: {events:?}", events.len()))?;

    // Commands the module can read but not write back: the first one runs before the result
    // cannot be stored, and the call reports EFAULT.
    let read_only = Mapping::anonymous(1)?;
    // SAFETY: the start of a fresh writable page of ours, aligned for a command; nothing else
    // refers to it.
    unsafe { ptr::write(read_only.addr.cast::<WicCommand>(), replay(GPU)) };
    // SAFETY: a protection change of our own page, which no reference points into.
    if unsafe { libc::mprotect(read_only.addr.cast(), PAGE_BYTES, libc::PROT_READ) } != 0 {
        return Err(format!("mprotect: {}", Errno::last()));
    }
    c.refused("SUBMIT of commands in read-only memory", submit(fd, Cmds::Raw(read_only.page(0)), 1, 0), Errno::EFAULT)?;

    // A batch whose second command lies in unmapped memory: the first runs, the call returns 1.
    let mut edge = Mapping::anonymous(2)?;
    edge.punch(1)?;
    let at = edge.page(0) + PAGE - std::mem::size_of::<WicCommand>() as u64;
    // SAFETY: the last command-sized, aligned slot of a writable page of ours that nothing
    // else refers to; the module writes only the result field in it.
    unsafe { ptr::write(at as *mut WicCommand, replay(GPU)) };
    c.equal("SUBMIT of 2 commands, the second unmapped: the count", submit(fd, Cmds::Raw(at), 2, 0), Ok(1))?;
    let result =
        edge.read(PAGE_BYTES - std::mem::size_of::<WicCommand>() + std::mem::offset_of!(WicCommand, result), 4);
    c.status(
        "SUBMIT of 2 commands, the second unmapped: the first's result",
        i32::from_ne_bytes(result.try_into().unwrap()),
        0,
    )?;
    Ok(())
}

/// Per-command results, by ioctl and io_uring, and mixed batches.
fn command_cases(c: &mut Checker, fd: RawFd, fake: &FakeGpu, ring: &mut IoUring, st: &mut State) -> Result<(), String> {
    let s1 = st.space;
    let a = st.region.page(4);
    let p = st.region.page(3);
    let data: Vec<u8> = (0..2 * PAGE_BYTES).map(|i| (i as u8) ^ 0x5a).collect();
    // A valid completion of page 4 with the timeout marker, its companion page 5: the command
    // the general checks below break one field of at a time.
    let complete = WicCommand {
        arg: kabi::WIC_MARKER_TIMEOUT,
        companion: st.region.page(5),
        ..command(kabi::WIC_CMD_COMPLETE, s1, a, 1)
    };
    let with_data = WicCommand { length: 16, arg: data.as_ptr() as u64, ..complete };
    let service = command(kabi::WIC_CMD_SERVICE_PAT, s1, p, 1);
    let max_pages = (kabi::WIC_MAX_RANGE_BYTES / PAGE) as u32;
    let einval = neg(Errno::EINVAL);
    // A GPU producer's batches, pages 10 and 11: what a COMPLETE_COPY may read.
    let source = c.accepted("REGISTER a source range", register(fd, s1, SOURCE, st.region.page(10), 2 * PAGE))?;
    let copy = WicCommand { opcode: kabi::WIC_CMD_COMPLETE_COPY, length: 16, arg: st.region.page(10), ..complete };
    // A run its host producer wrote in place: one 8-byte head word per page, nothing more.
    let words = [0x0123_4567_89ab_cdefu64; 2];
    let heads = WicCommand { opcode: kabi::WIC_CMD_COMPLETE_HEADS, length: 8, arg: words.as_ptr() as u64, ..complete };
    // A heads completion has at most WIC_MAX_WRITE_BYTES / 8 pages, whatever its ranges hold:
    // a run and companion one page longer each, address space alone (never touched).
    let most = (kabi::WIC_MAX_WRITE_BYTES / 8) as usize;
    let vast = Mapping::reserved(2 * (most + 1))?;
    vast.manage(fake, 0, 2 * (most + 1))?;
    let vast_range = c.accepted(
        "REGISTER a PCM range of 2 x (WIC_MAX_WRITE_BYTES / 8 + 1) pages",
        register(fd, s1, PCM, vast.page(0), 2 * (most as u64 + 1) * PAGE),
    )?;
    let heads_of = |pages: usize| WicCommand {
        va: vast.page(0),
        companion: vast.page(most + 1),
        pages: pages as u32,
        length: 8 * pages as u64,
        ..heads
    };
    let table: Vec<(&str, WicCommand, i32)> = vec![
        ("opcode 0", WicCommand { opcode: 0, ..complete }, einval),
        ("opcode 1 (unused: a completion's data write alone)", WicCommand { opcode: 1, ..with_data }, einval),
        ("opcode 2 (unused: a completion's marker write alone)", WicCommand { opcode: 2, ..complete }, einval),
        ("opcode 3 (unused: a completion's unmap alone)", WicCommand { opcode: 3, ..command(3, s1, a, 1) }, einval),
        ("opcode 4 (unused: a completion's map alone)", WicCommand { opcode: 4, ..command(4, s1, a, 1) }, einval),
        ("unknown opcode 99", WicCommand { opcode: 99, ..complete }, einval),
        ("opcode 11, one past COMPLETE_HEADS", WicCommand { opcode: 11, ..complete }, einval),
        ("opcode u32::MAX", WicCommand { opcode: u32::MAX, ..complete }, einval),
        ("reserved != 0", WicCommand { reserved: 1, ..complete }, einval),
        ("REPLAY with reserved != 0", WicCommand { reserved: 1, ..replay(GPU) }, einval),
        ("result preset nonzero", WicCommand { result: 5, ..complete }, einval),
        ("REPLAY with result preset nonzero", WicCommand { result: -1, ..replay(GPU) }, einval),
        ("REPLAY with length != 0", WicCommand { length: 8, ..replay(GPU) }, einval),
        ("REPLAY with arg != 0", WicCommand { arg: 1, ..replay(GPU) }, einval),
        ("gpu_id 0, the CPU's id", WicCommand { gpu_id: 0, ..complete }, neg(Errno::ENODEV)),
        ("gpu_id 257", WicCommand { gpu_id: kabi::WIC_MAX_GPU_ID + 1, ..complete }, neg(Errno::ENODEV)),
        ("gpu_id u32::MAX", WicCommand { gpu_id: u32::MAX, ..complete }, neg(Errno::ENODEV)),
        ("REPLAY gpu_id 0, the CPU's id", replay(0), neg(Errno::ENODEV)),
        ("REPLAY gpu_id 257", replay(kabi::WIC_MAX_GPU_ID + 1), neg(Errno::ENODEV)),
        ("stale space id", WicCommand { space_id: st.stale_space, ..complete }, neg(Errno::ENOENT)),
        ("space id 0", WicCommand { space_id: 0, ..complete }, neg(Errno::ENOENT)),
        ("space id 65", WicCommand { space_id: kabi::WIC_MAX_SPACES + 1, ..complete }, neg(Errno::ENOENT)),
        ("va outside every range", WicCommand { va: st.region.page(40), ..complete }, neg(Errno::ERANGE)),
        ("va 0", WicCommand { va: 0, ..complete }, neg(Errno::ERANGE)),
        ("unaligned va", WicCommand { va: a + 8, ..complete }, einval),
        ("pages 0", WicCommand { pages: 0, ..complete }, einval),
        ("pages u32::MAX", WicCommand { pages: u32::MAX, ..complete }, einval),
        ("pages WIC_MAX_RANGE_BYTES / 4096 + 1", WicCommand { pages: max_pages + 1, ..complete }, einval),
        (
            "pages WIC_MAX_RANGE_BYTES / 4096, past the range",
            WicCommand { pages: max_pages, companion: a - u64::from(max_pages) * PAGE, ..complete },
            neg(Errno::ERANGE),
        ),
        ("va + pages overflowing u64", WicCommand { va: u64::MAX - PAGE + 1, pages: 2, ..complete }, einval),
        (
            "pages across two adjacent ranges",
            WicCommand { va: st.region.page(7), pages: 2, ..complete },
            neg(Errno::ERANGE),
        ),
        (
            "COMPLETE with data longer than WIC_MAX_WRITE_BYTES",
            WicCommand {
                va: st.long.page(0),
                companion: st.long.page(257),
                pages: 257,
                length: u64::from(kabi::WIC_MAX_WRITE_BYTES) + 1,
                ..with_data
            },
            einval,
        ),
        ("COMPLETE with data from address 8", WicCommand { arg: LOW_ADDR, ..with_data }, neg(Errno::EFAULT)),
        ("COMPLETE of marker 0", WicCommand { arg: 0, ..complete }, einval),
        (
            "COMPLETE of the marker magic alone (not a marker)",
            WicCommand { arg: kabi::WIC_MARKER_MAGIC, ..complete },
            einval,
        ),
        (
            "COMPLETE of the marker magic with code 5 (not a marker)",
            WicCommand { arg: kabi::WIC_MARKER_MAGIC | 5, ..complete },
            einval,
        ),
        ("SERVICE_PAT on a PCM range", WicCommand { va: a, ..service }, neg(Errno::ERANGE)),
        (
            "REARM_PAT on a PCM range",
            WicCommand { opcode: kabi::WIC_CMD_REARM_PAT, va: a, ..service },
            neg(Errno::ERANGE),
        ),
        ("COMPLETE with data on a PAT range", WicCommand { va: p, ..with_data }, neg(Errno::ERANGE)),
        ("SERVICE_PAT of 2 pages", WicCommand { pages: 2, ..service }, einval),
        ("SERVICE_PAT with length != 0", WicCommand { length: 1, ..service }, einval),
        ("SERVICE_PAT with arg != 0", WicCommand { arg: kabi::WIC_MARKER_TIMEOUT, ..service }, einval),
        ("SERVICE_PAT with companion != 0", WicCommand { companion: st.region.page(5), ..service }, einval),
        ("REARM_PAT with length != 0", WicCommand { opcode: kabi::WIC_CMD_REARM_PAT, length: 8, ..service }, einval),
        ("REPLAY with companion != 0", WicCommand { companion: PAGE, ..replay(GPU) }, einval),
        ("COMPLETE with an unaligned companion", WicCommand { companion: st.region.page(5) + 8, ..complete }, einval),
        ("COMPLETE with its own run as companion", WicCommand { companion: a, ..complete }, einval),
        ("COMPLETE with a companion overlapping its run", WicCommand { pages: 2, ..complete }, einval),
        (
            "COMPLETE with a companion overflowing u64",
            WicCommand { companion: u64::MAX - PAGE + 1, pages: 2, ..complete },
            einval,
        ),
        ("COMPLETE with the companion on a PAT page", WicCommand { companion: p, ..complete }, neg(Errno::ERANGE)),
        (
            "COMPLETE with the companion outside every range",
            WicCommand { companion: st.region.page(40), ..complete },
            neg(Errno::ERANGE),
        ),
        (
            "COMPLETE with the companion across two adjacent ranges",
            WicCommand { pages: 2, companion: st.region.page(7), ..complete },
            neg(Errno::ERANGE),
        ),
        ("COMPLETE on a PAT page", WicCommand { va: p, ..complete }, neg(Errno::ERANGE)),
        ("COMPLETE of 0x1234 (not a marker)", WicCommand { arg: 0x1234, ..complete }, einval),
        (
            "COMPLETE with data longer than its run",
            WicCommand { length: PAGE + 1, arg: data.as_ptr() as u64, ..complete },
            einval,
        ),
        (
            "COMPLETE with data from a kernel address",
            WicCommand { length: 16, arg: KERNEL_ADDR, ..complete },
            neg(Errno::EFAULT),
        ),
        (
            "COMPLETE_COPY without length",
            WicCommand { opcode: kabi::WIC_CMD_COMPLETE_COPY, arg: a, ..complete },
            einval,
        ),
        (
            "COMPLETE_COPY from a PCM page",
            WicCommand { opcode: kabi::WIC_CMD_COMPLETE_COPY, length: 16, arg: a, ..complete },
            neg(Errno::ERANGE),
        ),
        (
            "COMPLETE_COPY from outside every range",
            WicCommand { opcode: kabi::WIC_CMD_COMPLETE_COPY, length: 16, arg: st.region.page(40), ..complete },
            neg(Errno::ERANGE),
        ),
        (
            "COMPLETE_COPY from its source range past the range's end",
            WicCommand { arg: st.region.page(12) - 8, ..copy },
            neg(Errno::ERANGE),
        ),
        (
            "COMPLETE_COPY from its source range wrapping past 2^64",
            WicCommand { arg: u64::MAX - 7, ..copy },
            neg(Errno::ERANGE),
        ),
        (
            "COMPLETE_COPY into its source range",
            WicCommand { va: st.region.page(10), companion: st.region.page(4), ..copy },
            neg(Errno::ERANGE),
        ),
        (
            "COMPLETE on a source range",
            WicCommand { va: st.region.page(10), companion: st.region.page(4), ..complete },
            neg(Errno::ERANGE),
        ),
        ("COMPLETE_COPY longer than its run", WicCommand { length: PAGE + 1, ..copy }, einval),
        ("COMPLETE_HEADS without length", WicCommand { length: 0, ..heads }, einval),
        // From address 8: a length let through to the copy would fail with EFAULT, not EINVAL.
        ("COMPLETE_HEADS of 1 page with length 7", WicCommand { length: 7, arg: LOW_ADDR, ..heads }, einval),
        ("COMPLETE_HEADS of 1 page with length 16", WicCommand { length: 16, arg: LOW_ADDR, ..heads }, einval),
        (
            "COMPLETE_HEADS of 2 pages with length 8",
            WicCommand { pages: 2, companion: st.region.page(6), arg: LOW_ADDR, ..heads },
            einval,
        ),
        (
            "COMPLETE_HEADS with length 16 outside every range (the range is checked first)",
            WicCommand { va: st.region.page(40), length: 16, ..heads },
            neg(Errno::ERANGE),
        ),
        ("COMPLETE_HEADS of WIC_MAX_WRITE_BYTES / 8 + 1 pages, length 8 x pages", heads_of(most + 1), einval),
        (
            "COMPLETE_HEADS of WIC_MAX_WRITE_BYTES / 8 pages, its heads from address 8 (checks passed)",
            WicCommand { arg: LOW_ADDR, ..heads_of(most) },
            neg(Errno::EFAULT),
        ),
        ("COMPLETE_HEADS with its own run as companion", WicCommand { companion: a, ..heads }, einval),
        ("COMPLETE_HEADS with a companion overlapping its run", WicCommand { pages: 2, length: 16, ..heads }, einval),
        (
            "COMPLETE_HEADS with an unaligned companion",
            WicCommand { companion: st.region.page(5) + 8, ..heads },
            einval,
        ),
        ("COMPLETE_HEADS with the companion on a PAT page", WicCommand { companion: p, ..heads }, neg(Errno::ERANGE)),
        ("COMPLETE_HEADS on a PAT page", WicCommand { va: p, ..heads }, neg(Errno::ERANGE)),
        ("COMPLETE_HEADS with its heads from address 8", WicCommand { arg: LOW_ADDR, ..heads }, neg(Errno::EFAULT)),
        (
            "COMPLETE_HEADS with its heads at a kernel address",
            WicCommand { arg: KERNEL_ADDR, ..heads },
            neg(Errno::EFAULT),
        ),
        ("a REPLAY of GPU 1 (valid)", replay(GPU), 0),
    ];

    // One command per SUBMIT.
    for (what, cmd, want) in &table {
        let mut cmds = [*cmd];
        let count = submit(fd, Cmds::Live(&mut cmds), 1, 0)
            .map_err(|errno| format!("SUBMIT {what}: the batch refused with {errno:?}"))?;
        c.status(&format!("SUBMIT {what}"), cmds[0].result, *want)?;
        c.status(&format!("SUBMIT {what}: the count"), count, i32::from(*want == 0))?;
    }

    // All of them in one batch, by ioctl then by io_uring: the same answers, and only the
    // valid REPLAY reaches the GPU.
    let valid = table.iter().filter(|(_, _, want)| *want == 0).count() as i32;
    let mut by_ioctl: Vec<WicCommand> = table.iter().map(|(_, cmd, _)| *cmd).collect();
    let len = by_ioctl.len() as u32;
    fake.reset().map_err(|e| format!("fake GPU reset: {e}"))?;
    c.equal(
        "SUBMIT of every bad command and one valid: the count",
        submit(fd, Cmds::Live(&mut by_ioctl), len, 0),
        Ok(valid),
    )?;
    for ((what, _, want), got) in table.iter().zip(&by_ioctl) {
        c.status(&format!("SUBMIT {what}, in a batch"), got.result, *want)?;
    }
    let events = gpu_events(fake)?;
    c.ensure(
        "rejected commands reach the GPU",
        events.len() == 1 && events[0].kind == fakegpu::EVENT_REPLAY && events[0].gpu_id == GPU,
        || format!("expected one REPLAY of GPU {GPU}, got {events:?}"),
    )?;
    let mut by_uring: Vec<WicCommand> = table.iter().map(|(_, cmd, _)| *cmd).collect();
    let cqe = uring_submit(ring, fd, kabi::WIC_IOC_SUBMIT, Cmds::Live(&mut by_uring), len, 0)?;
    c.status("io_uring SUBMIT of every bad command and one valid: the CQE", cqe, valid)?;
    for (((what, _, _), got), ioctl) in table.iter().zip(&by_uring).zip(&by_ioctl) {
        c.status(&format!("io_uring SUBMIT {what}, as by ioctl"), got.result, ioctl.result)?;
    }
    // A fault on a source page is the producer's own write: never held.
    let (verdicts, _) =
        fake.inject(GPU, &[fault(st.region.page(10), AccessType::Write)]).map_err(|e| format!("inject: {e}"))?;
    c.ensure("a fault on a source range is held", verdicts == [fakegpu::VERDICT_PASS], || {
        format!("verdict {verdicts:?}")
    })?;
    c.accepted("UNREGISTER the source range", unregister(fd, source))?;
    c.accepted("UNREGISTER the heads' vast range", unregister(fd, vast_range))?;
    drop(vast);

    // Batch refusals through io_uring, as through ioctl.
    let mut one = [replay(GPU)];
    c.status(
        "io_uring SUBMIT count 0",
        uring_submit(ring, fd, kabi::WIC_IOC_SUBMIT, Cmds::Live(&mut one), 0, 0)?,
        einval,
    )?;
    let mut many = vec![replay(GPU); kabi::WIC_MAX_COMMANDS as usize + 1];
    let cqe = uring_submit(ring, fd, kabi::WIC_IOC_SUBMIT, Cmds::Live(&mut many), kabi::WIC_MAX_COMMANDS + 1, 0)?;
    c.status("io_uring SUBMIT count WIC_MAX_COMMANDS + 1", cqe, einval)?;
    c.status(
        "io_uring SUBMIT flags 1",
        uring_submit(ring, fd, kabi::WIC_IOC_SUBMIT, Cmds::Live(&mut one), 1, 1)?,
        einval,
    )?;
    c.status(
        "io_uring SUBMIT commands pointer 0",
        uring_submit(ring, fd, kabi::WIC_IOC_SUBMIT, Cmds::Raw(0), 1, 0)?,
        neg(Errno::EFAULT),
    )?;
    c.status(
        "io_uring SUBMIT commands at a kernel address",
        uring_submit(ring, fd, kabi::WIC_IOC_SUBMIT, Cmds::Raw(KERNEL_ADDR), 1, 0)?,
        neg(Errno::EFAULT),
    )?;
    c.status(
        "io_uring cmd_op 0x1234",
        uring_submit(ring, fd, URING_UNKNOWN_OP, Cmds::Live(&mut one), 1, 0)?,
        neg(Errno::ENOTTY),
    )?;
    c.status(
        "io_uring SUBMIT of a valid REPLAY",
        uring_submit(ring, fd, kabi::WIC_IOC_SUBMIT, Cmds::Live(&mut one), 1, 0)?,
        1,
    )?;
    c.status("io_uring SUBMIT of a valid REPLAY: its result", one[0].result, 0)?;

    // Mixed batches: 3 bad and 2 good commands, the good ones take effect (the second good one
    // completes the first's companion, with the first as its own).
    let mixed = |page: usize, bytes: &[u8], word: u64| {
        let (run, companion) = (st.region.page(page), st.region.page(page + 1));
        [
            WicCommand { opcode: 0, ..complete },
            WicCommand { va: run, companion, arg: bytes.as_ptr() as u64, length: bytes.len() as u64, ..complete },
            WicCommand { gpu_id: 0, ..complete },
            WicCommand { va: companion, companion: run, arg: word, ..complete },
            WicCommand { va: st.region.page(40), ..complete },
        ]
    };
    let want = [einval, 0, neg(Errno::ENODEV), 0, neg(Errno::ERANGE)];
    let mut batch = mixed(4, &data[..16], kabi::WIC_MARKER_TIMEOUT);
    c.equal("SUBMIT of 3 bad and 2 good commands: the count", submit(fd, Cmds::Live(&mut batch), 5, 0), Ok(2))?;
    c.equal("SUBMIT of 3 bad and 2 good commands: the results", batch.map(|cmd| cmd.result), want)?;
    c.equal(
        "SUBMIT of 3 bad and 2 good commands: the data written",
        st.region.read(4 * PAGE_BYTES, 16),
        data[..16].to_vec(),
    )?;
    c.equal(
        "SUBMIT of 3 bad and 2 good commands: the marker written",
        st.region.read(5 * PAGE_BYTES, 8),
        kabi::WIC_MARKER_TIMEOUT.to_ne_bytes().to_vec(),
    )?;
    let mut batch = mixed(6, &data[16..48], kabi::WIC_MARKER_CHANNEL_CLOSED);
    let cqe = uring_submit(ring, fd, kabi::WIC_IOC_SUBMIT, Cmds::Live(&mut batch), 5, 0)?;
    c.status("io_uring SUBMIT of 3 bad and 2 good commands: the CQE", cqe, 2)?;
    c.equal("io_uring SUBMIT of 3 bad and 2 good commands: the results", batch.map(|cmd| cmd.result), want)?;
    c.equal(
        "io_uring SUBMIT of 3 bad and 2 good commands: the data written",
        st.region.read(6 * PAGE_BYTES, 32),
        data[16..48].to_vec(),
    )?;
    c.equal(
        "io_uring SUBMIT of 3 bad and 2 good commands: the marker written",
        st.region.read(7 * PAGE_BYTES, 8),
        kabi::WIC_MARKER_CHANNEL_CLOSED.to_ne_bytes().to_vec(),
    )?;

    // A whole wake-up in one command: the data, the companion's unmap, the run's map.
    fake.reset().map_err(|e| format!("fake GPU reset: {e}"))?;
    let mut cmds = [WicCommand { arg: data[64..].as_ptr() as u64, ..with_data }];
    c.equal("SUBMIT COMPLETE with data: the count", submit(fd, Cmds::Live(&mut cmds), 1, 0), Ok(1))?;
    c.equal("SUBMIT COMPLETE with data: the data written", st.region.read(4 * PAGE_BYTES, 16), data[64..80].to_vec())?;
    let steps: Vec<(u32, u64)> = gpu_events(fake)?.iter().map(|e| (e.kind, e.va)).collect();
    let expected = [(fakegpu::EVENT_WRITE, a), (fakegpu::EVENT_UNMAP, st.region.page(5)), (fakegpu::EVENT_MAP, a)];
    c.equal("SUBMIT COMPLETE with data: write, unmap of the companion, map of the run", steps, expected.to_vec())?;

    // A registered page the process unmapped afterwards: the write fails, the module stays, and
    // a completion whose fill failed neither unmaps its companion nor maps its run.
    let gone = c.accepted("REGISTER a page to unmap later", register(fd, s1, PCM, st.region.page(48), PAGE))?;
    st.region.punch(48)?;
    fake.reset().map_err(|e| format!("fake GPU reset: {e}"))?;
    let mut cmds = [WicCommand { va: st.region.page(48), ..complete }];
    c.equal(
        "SUBMIT COMPLETE to a registered page the process unmapped: the count",
        submit(fd, Cmds::Live(&mut cmds), 1, 0),
        Ok(0),
    )?;
    c.status("SUBMIT COMPLETE to a registered page the process unmapped", cmds[0].result, neg(Errno::EFAULT))?;
    let events = gpu_events(fake)?;
    c.ensure("a COMPLETE whose fill failed reaches the GPU", events.is_empty(), || {
        format!("expected no GPU events, got {events:?}")
    })?;
    c.accepted("UNREGISTER the unmapped page's range", unregister(fd, gone))?;
    Ok(())
}

/// `WIC_MAX_RANGES` ranges per session, `ENOSPC` beyond, and room again after unregistering.
fn range_limit(c: &mut Checker, fd: RawFd, fake: &FakeGpu, limits: &WicVersion, st: &State) -> Result<(), String> {
    let max = limits.max_ranges;
    let live = State::LIVE_RANGES;
    let room = Mapping::anonymous(2 * max as usize)?;
    room.manage(fake, 0, 2 * max as usize)?;
    let mut ids = Vec::new();
    for n in 0..max - live {
        let id = register(fd, st.space, PCM, room.page(2 * n as usize), PAGE)
            .map_err(|errno| format!("REGISTER range {} of {max}: expected Ok, got {errno:?}", live + n + 1))?;
        ids.push(id);
    }
    c.pass();
    let spare = room.page(2 * max as usize - 1);
    c.refused("REGISTER beyond WIC_MAX_RANGES", register(fd, st.space, PCM, spare, PAGE), Errno::ENOSPC)?;
    c.refused("REGISTER beyond WIC_MAX_RANGES, as PAT", register(fd, st.space, PAT, spare, PAGE), Errno::ENOSPC)?;
    for id in &ids {
        unregister(fd, *id).map_err(|errno| format!("UNREGISTER of range {id}: expected Ok, got {errno:?}"))?;
    }
    c.pass();
    c.refused("UNREGISTER a range unregistered already", unregister(fd, ids[0]), Errno::ENOENT)?;
    let again = c.accepted("REGISTER after the ranges were given back", register(fd, st.space, PCM, spare, PAGE))?;
    c.accepted("UNREGISTER it", unregister(fd, again))?;
    Ok(())
}

/// mmap of the fault ring: only offset 0 and the exact length.
fn ring_cases(c: &mut Checker, fd: RawFd, limits: &WicVersion) -> Result<(), String> {
    let len = usize::try_from(kabi::ring_bytes(limits.ring_entries))
        .map_err(|_| "the ring is larger than the address space".to_string())?
        .next_multiple_of(PAGE_BYTES);
    c.refused("mmap of the ring at offset 4096", Mapping::device(fd, len, PAGE as i64), Errno::EINVAL)?;
    c.refused("mmap of one page", Mapping::device(fd, PAGE_BYTES, 0), Errno::EINVAL)?;
    c.refused("mmap of the ring less one page", Mapping::device(fd, len - PAGE_BYTES, 0), Errno::EINVAL)?;
    c.refused("mmap of the ring and one page more", Mapping::device(fd, len + PAGE_BYTES, 0), Errno::EINVAL)?;
    let ring = c.accepted("mmap of the ring", Mapping::device(fd, len, 0))?;
    // SAFETY: the ring's first page is mapped and readable; the header is plain integers,
    // read as one volatile copy.
    let header = unsafe { ptr::read_volatile(ring.addr.cast::<WicRingHeader>()) };
    c.equal("ring header magic", header.magic, kabi::WIC_RING_MAGIC)?;
    c.equal(
        "ring header (version, entries, record size)",
        (header.abi_version, header.entries, header.record_size),
        (kabi::WIC_ABI_VERSION, limits.ring_entries, std::mem::size_of::<WicFaultRecord>() as u32),
    )?;
    // SAFETY: asks to grow the ring mapping in place (no MREMAP_MAYMOVE); on success nothing
    // moves, and the test fails without touching the new part.
    let grown = unsafe { libc::mremap(ring.addr.cast(), len, len + PAGE_BYTES, 0) };
    let grown = if grown == libc::MAP_FAILED { Err(Errno::last()) } else { Ok(grown) };
    c.refused("mremap growing the ring", grown, Errno::EFAULT)?;
    let second = c.accepted("a second mapping of the ring", Mapping::device(fd, len, 0))?;
    // SAFETY: as above, for the second mapping.
    let magic = unsafe { ptr::read_volatile(second.addr.cast::<u32>()) };
    c.equal("the second mapping's magic", magic, kabi::WIC_RING_MAGIC)?;
    c.refused("open while a session is open and its ring mapped", open_device(), Errno::EBUSY)?;
    Ok(())
}

/// Unregistering and detaching what is left, then what they removed.
fn teardown(c: &mut Checker, fd: RawFd, st: &State) -> Result<(), String> {
    c.accepted("UNREGISTER a live range", unregister(fd, st.range_b))?;
    c.refused("UNREGISTER it again", unregister(fd, st.range_b), Errno::ENOENT)?;
    c.accepted("DETACH of the space with ranges still registered", detach(fd, st.space))?;
    for (what, id) in [("PCM", st.range_a), ("PAT", st.range_p), ("long", st.range_long)] {
        c.refused(&format!("UNREGISTER a {what} range its space's DETACH removed"), unregister(fd, id), Errno::ENOENT)?;
    }
    c.refused("DETACH of it again", detach(fd, st.space), Errno::ENOENT)?;
    let complete = command(kabi::WIC_CMD_COMPLETE, st.space, st.region.page(4), 1);
    let mut cmds = [WicCommand { arg: kabi::WIC_MARKER_TIMEOUT, companion: st.region.page(5), ..complete }];
    c.equal("SUBMIT to a detached space: the count", submit(fd, Cmds::Live(&mut cmds), 1, 0), Ok(0))?;
    c.status("SUBMIT to a detached space", cmds[0].result, neg(Errno::ENOENT))?;
    Ok(())
}

/// After all of it, the module serves a normal session.
fn healthy_after(c: &mut Checker, fake: &FakeGpu) -> Result<(), String> {
    let device =
        Device::open(Path::new(DEVICE), Duration::from_secs(5)).map_err(|e| format!("a fresh session: {e}"))?;
    c.pass();
    let space = device.attach(fake.fd()).map_err(|e| format!("a fresh session: {e}"))?;
    let region = Mapping::anonymous(1)?;
    region.manage(fake, 0, 1)?;
    device.register(space, PCM, region.page(0), PAGE, 0).map_err(|e| format!("a fresh session: {e}"))?;
    let mut cmds = [replay(GPU)];
    let done = device.submit(&mut cmds).map_err(|e| format!("a fresh session: {e}"))?;
    c.equal("a fresh session: a REPLAY runs", (done, cmds[0].result), (1, 0))?;
    Ok(())
}
