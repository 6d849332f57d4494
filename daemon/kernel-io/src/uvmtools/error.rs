use std::io;

use nix::errno::Errno;

use super::abi;

/// The name of an NV_STATUS the tools calls return, if it is one of them.
pub fn nv_status_name(status: u32) -> Option<&'static str> {
    Some(match status {
        abi::NV_OK => "NV_OK",
        abi::NV_ERR_ILLEGAL_ACTION => "NV_ERR_ILLEGAL_ACTION",
        abi::NV_ERR_IN_USE => "NV_ERR_IN_USE",
        abi::NV_ERR_INSUFFICIENT_PERMISSIONS => "NV_ERR_INSUFFICIENT_PERMISSIONS",
        abi::NV_ERR_INVALID_ADDRESS => "NV_ERR_INVALID_ADDRESS",
        abi::NV_ERR_INVALID_ARGUMENT => "NV_ERR_INVALID_ARGUMENT",
        abi::NV_ERR_INVALID_STATE => "NV_ERR_INVALID_STATE",
        abi::NV_ERR_NO_MEMORY => "NV_ERR_NO_MEMORY",
        abi::NV_ERR_NOT_SUPPORTED => "NV_ERR_NOT_SUPPORTED",
        abi::NV_ERR_GENERIC => "NV_ERR_GENERIC",
        _ => return None,
    })
}

/// What can go wrong with the UVM tools interface.
#[derive(Debug)]
pub enum UvmToolsError {
    /// Opening the tools device failed.
    Open(io::Error),
    /// A system call failed: an ioctl, or the allocation of the queue.
    Ioctl { call: &'static str, errno: Errno },
    /// The driver answered the call with a non-zero NV_STATUS in `rmStatus`.
    Status { call: &'static str, nv_status: u32 },
    /// A queue size or buffer the driver would refuse, or that this reader cannot use.
    Layout(String),
}

impl UvmToolsError {
    /// Whether the driver refused the nvidia-uvm file as not being an initialized VA space
    /// (CUDA's secondary file, or a reopened one): worth trying another of the process's files.
    pub fn is_not_va_space(&self) -> bool {
        matches!(self, Self::Status { nv_status: abi::NV_ERR_ILLEGAL_ACTION, .. })
    }
}

impl std::fmt::Display for UvmToolsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Open(e) => write!(f, "cannot open the UVM tools device: {e}"),
            Self::Ioctl { call, errno } => {
                write!(f, "{call}: {}", errno.desc())?;
                if *call == "UVM_TOOLS_INIT_EVENT_TRACKER_V2" && *errno == Errno::EINVAL {
                    write!(f, " (drivers before 565 lack this call)")?;
                }
                Ok(())
            }
            Self::Status { call, nv_status } => {
                match nv_status_name(*nv_status) {
                    Some(name) => write!(f, "{call}: {name} ({nv_status:#x})")?,
                    None => write!(f, "{call}: NV_STATUS {nv_status:#x}")?,
                }
                if self.is_not_va_space() {
                    write!(f, " (not an initialized nvidia-uvm VA-space file)")?;
                }
                Ok(())
            }
            Self::Layout(what) => write!(f, "UVM event queue: {what}"),
        }
    }
}

impl std::error::Error for UvmToolsError {}

/// Checks an ioctl's errno and then its `rmStatus`.
pub(super) fn checked(
    call: &'static str,
    result: nix::Result<libc::c_int>,
    rm_status: u32,
) -> Result<(), UvmToolsError> {
    result.map_err(|errno| UvmToolsError::Ioctl { call, errno })?;
    match rm_status {
        abi::NV_OK => Ok(()),
        nv_status => Err(UvmToolsError::Status { call, nv_status }),
    }
}
