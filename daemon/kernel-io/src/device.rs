//! A session on `/dev/wic`: open, negotiate the version, map the record ring, attach spaces,
//! register ranges and submit commands by ioctl.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use wic_kabi::{self as kabi, WicAttach, WicCommand, WicRange, WicSubmit, WicVersion};

use crate::ring::{RecordRing, RingError};

/// The raw ioctls of `/dev/wic`, for callers that must send what [`Device`] would not (the
/// hostile-input tests).
pub mod raw {
    use wic_kabi::{self as kabi, WicAttach, WicRange, WicSubmit, WicVersion};

    nix::ioctl_readwrite_bad!(
        /// `WIC_IOC_VERSION`.
        ioc_version,
        kabi::WIC_IOC_VERSION,
        WicVersion
    );
    nix::ioctl_readwrite_bad!(
        /// `WIC_IOC_ATTACH`.
        ioc_attach,
        kabi::WIC_IOC_ATTACH,
        WicAttach
    );
    nix::ioctl_write_ptr_bad!(
        /// `WIC_IOC_DETACH`.
        ioc_detach,
        kabi::WIC_IOC_DETACH,
        u32
    );
    nix::ioctl_readwrite_bad!(
        /// `WIC_IOC_REGISTER`.
        ioc_register,
        kabi::WIC_IOC_REGISTER,
        WicRange
    );
    nix::ioctl_write_ptr_bad!(
        /// `WIC_IOC_UNREGISTER`.
        ioc_unregister,
        kabi::WIC_IOC_UNREGISTER,
        u32
    );
    nix::ioctl_readwrite_bad!(
        /// `WIC_IOC_SUBMIT`.
        ioc_submit,
        kabi::WIC_IOC_SUBMIT,
        WicSubmit
    );
}

use raw::{ioc_attach, ioc_detach, ioc_register, ioc_submit, ioc_unregister, ioc_version};

/// What can go wrong with `/dev/wic`.
#[derive(Debug)]
pub enum DeviceError {
    /// Opening the device failed.
    Open(io::Error),
    /// Another session held the device for longer than we waited.
    Busy,
    /// The module speaks another ABI version.
    Version { module: u32 },
    /// The record ring the module mapped is not one this daemon reads.
    Ring(RingError),
    /// The module announced a ring of this many records: not a power of two, or too large to
    /// map.
    RingSize { entries: u32 },
    /// Setting up io_uring, or a submission through it, failed (`what` says which).
    Uring { what: &'static str, error: io::Error },
    /// A call the module refused.
    Call { call: &'static str, errno: Errno },
}

impl std::fmt::Display for DeviceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Open(e) => write!(f, "cannot open the wic device: {e}"),
            Self::Busy => write!(f, "the wic device is held by another session (is another wicd running?)"),
            Self::Version { module } => {
                write!(f, "wic_shim speaks ABI version {module}, this wicd speaks {}", kabi::WIC_ABI_VERSION)
            }
            Self::Ring(e) => write!(f, "{e}"),
            Self::RingSize { entries } => {
                write!(f, "the module's record ring has {entries} records, not a power of two this process can map")
            }
            Self::Uring { what, error } => write!(f, "{what}: {error}"),
            Self::Call { call, errno } => write!(f, "{call}: {}", errno.desc()),
        }
    }
}

impl std::error::Error for DeviceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Open(e) | Self::Uring { error: e, .. } => Some(e),
            Self::Ring(e) => Some(e),
            Self::Busy | Self::Version { .. } | Self::RingSize { .. } | Self::Call { .. } => None,
        }
    }
}

impl From<RingError> for DeviceError {
    fn from(e: RingError) -> Self {
        Self::Ring(e)
    }
}

fn call(name: &'static str, result: nix::Result<libc::c_int>) -> Result<libc::c_int, DeviceError> {
    result.map_err(|errno| DeviceError::Call { call: name, errno })
}

/// Where the module shows its `max_hold_ms` parameter.
pub const MAX_HOLD_MS_PARAM: &str = "/sys/module/wic_shim/parameters/max_hold_ms";

/// The module's own bound on a hold, in ms: `None` when it has none (0), or when the module is
/// not loaded or says something else than a number.
pub fn module_max_hold_ms() -> Option<u64> {
    std::fs::read_to_string(MAX_HOLD_MS_PARAM).ok()?.trim().parse().ok().filter(|ms| *ms > 0)
}

/// An open session.
pub struct Device {
    file: File,
    limits: WicVersion,
    ring_map: NonNull<u8>,
    ring_len: usize,
    ring: RecordRing,
}

// SAFETY: the mapping is owned by the session and only read through `RecordRing`'s atomics.
unsafe impl Send for Device {}

impl Device {
    /// Opens `path` and negotiates the ABI version. A previous session may still be closing
    /// (its file is released once the last reference goes, io_uring's included): `EBUSY` is
    /// retried until `busy_wait` has passed.
    pub fn open(path: &Path, busy_wait: Duration) -> Result<Self, DeviceError> {
        let deadline = Instant::now() + busy_wait;
        let file = loop {
            match OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(path) {
                Ok(file) => break file,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    if Instant::now() >= deadline {
                        return Err(DeviceError::Busy);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(DeviceError::Open(e)),
            }
        };
        let mut limits = WicVersion { abi_version: kabi::WIC_ABI_VERSION, ..Default::default() };
        // SAFETY: the request number and struct come from the checked ABI; `limits` is valid
        // for the module to read and write.
        match unsafe { ioc_version(file.as_raw_fd(), &mut limits) } {
            Ok(_) => {}
            Err(Errno::EPROTONOSUPPORT) => return Err(DeviceError::Version { module: limits.abi_version }),
            Err(errno) => return Err(DeviceError::Call { call: "WIC_IOC_VERSION", errno }),
        }
        let too_large = DeviceError::RingSize { entries: limits.ring_entries };
        if !limits.ring_entries.is_power_of_two() {
            return Err(too_large);
        }
        let ring_len = usize::try_from(kabi::ring_bytes(limits.ring_entries))
            .map_err(|_| too_large)?
            .next_multiple_of(kabi::WIC_PAGE_SIZE as usize);
        let len = std::num::NonZeroUsize::new(ring_len).expect("a ring has a header page");
        // SAFETY: a new shared mapping of the session's ring, which nothing else aliases in
        // this process; unmapped in Drop.
        let map = unsafe {
            mmap(None, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED, file.as_fd(), 0)
        }
        .map_err(|errno| DeviceError::Call { call: "mmap of the record ring", errno })?;
        let ring_map = map.cast::<u8>();
        // SAFETY: `ring_len` bytes were just mapped at `ring_map`, page aligned, and stay
        // mapped until `self` drops (the ring is dropped with it).
        let ring = match unsafe { RecordRing::new(ring_map, ring_len) } {
            Ok(ring) => ring,
            Err(e) => {
                // SAFETY: the mapping made above, not used after this.
                let _ = unsafe { munmap(map, ring_len) };
                return Err(e.into());
            }
        };
        Ok(Self { file, limits, ring_map, ring_len, ring })
    }

    /// The module's limits, as negotiated.
    pub fn limits(&self) -> &WicVersion {
        &self.limits
    }

    /// The session's descriptor: poll it for POLLIN, or submit io_uring commands on it.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// The record ring.
    pub fn ring(&mut self) -> &mut RecordRing {
        &mut self.ring
    }

    /// Attaches the VA space of an application's UVM file; returns its space id.
    pub fn attach(&self, uvm_file: BorrowedFd<'_>) -> Result<u32, DeviceError> {
        let mut arg = WicAttach { uvm_fd: uvm_file.as_raw_fd(), space_id: 0 };
        // SAFETY: checked ABI; `arg` is valid for reads and writes.
        call("WIC_IOC_ATTACH", unsafe { ioc_attach(self.file.as_raw_fd(), &mut arg) })?;
        Ok(arg.space_id)
    }

    /// Detaches a space; its held faults are completed with the channel-closed marker.
    pub fn detach(&self, space_id: u32) -> Result<(), DeviceError> {
        // SAFETY: checked ABI; the module reads one u32.
        call("WIC_IOC_DETACH", unsafe { ioc_detach(self.file.as_raw_fd(), &space_id) }).map(drop)
    }

    /// Registers `[start, start + length)` of a space as `kind` (`WIC_RANGE_*`), a PCM range
    /// made of pairs of `run_pages`-page runs (0: not said); returns its id.
    pub fn register(
        &self,
        space_id: u32,
        kind: u32,
        start: u64,
        length: u64,
        run_pages: u32,
    ) -> Result<u32, DeviceError> {
        let mut arg = WicRange { space_id, kind, start, length, range_id: 0, run_pages };
        // SAFETY: checked ABI; `arg` is valid for reads and writes.
        call("WIC_IOC_REGISTER", unsafe { ioc_register(self.file.as_raw_fd(), &mut arg) })?;
        Ok(arg.range_id)
    }

    /// Unregisters a range; its held faults are completed with the channel-closed marker.
    pub fn unregister(&self, range_id: u32) -> Result<(), DeviceError> {
        // SAFETY: checked ABI; the module reads one u32.
        call("WIC_IOC_UNREGISTER", unsafe { ioc_unregister(self.file.as_raw_fd(), &range_id) }).map(drop)
    }

    /// Runs `commands` by ioctl, in chunks of the module's maximum; each gets its result.
    /// Returns how many succeeded.
    pub fn submit(&self, commands: &mut [WicCommand]) -> Result<usize, DeviceError> {
        let mut succeeded = 0;
        for chunk in commands.chunks_mut(self.limits.max_commands.max(1) as usize) {
            let mut arg = WicSubmit { commands: chunk.as_mut_ptr() as u64, count: chunk.len() as u32, flags: 0 };
            // SAFETY: checked ABI; `arg` names `chunk`, valid for reads and writes of
            // `count` commands for the duration of the call.
            succeeded += call("WIC_IOC_SUBMIT", unsafe { ioc_submit(self.file.as_raw_fd(), &mut arg) })? as usize;
        }
        Ok(succeeded)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`; the ring reader using it goes with `self`.
        let _ = unsafe { munmap(self.ring_map.cast(), self.ring_len) };
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;

    /// A ring or io_uring failure keeps its type and its cause, not only a string.
    #[test]
    fn ring_and_io_uring_failures_keep_their_cause() {
        let ring = DeviceError::from(RingError::BadHeader("magic"));
        assert!(matches!(ring, DeviceError::Ring(RingError::BadHeader("magic"))));
        assert_eq!(ring.to_string(), "record ring header: magic");
        assert!(ring.source().is_some_and(|e| e.is::<RingError>()));
        let uring =
            DeviceError::Uring { what: "io_uring submission", error: io::Error::from_raw_os_error(libc::EBUSY) };
        assert!(uring.to_string().starts_with("io_uring submission: "), "{uring}");
        let cause = uring.source().and_then(|e| e.downcast_ref::<io::Error>()).expect("the io::Error");
        assert_eq!(cause.raw_os_error(), Some(libc::EBUSY));
        let size = DeviceError::RingSize { entries: 3 };
        assert!(size.to_string().contains("3 records") && size.source().is_none(), "{size}");
    }
}
