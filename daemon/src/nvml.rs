//! What NVIDIA's management library (NVML, `libnvidia-ml.so.1`, installed with the driver)
//! says of the GPUs: how each is shared between contexts. Loaded at run time, so that wicd
//! runs on machines without the driver; a failure to load is an answer, not an error of wicd.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::fmt;

/// The library, as the driver installs it.
const LIBRARY: &CStr = c"libnvidia-ml.so.1";
/// `NVML_SUCCESS`.
const SUCCESS: c_int = 0;
/// `NVML_ERROR_NOT_SUPPORTED`: asked of a GPU without MIG, for its MIG mode.
const ERROR_NOT_SUPPORTED: c_int = 3;
/// `NVML_DEVICE_NAME_V2_BUFFER_SIZE`, `NVML_DEVICE_UUID_V2_BUFFER_SIZE`.
const TEXT_BYTES: usize = 96;

/// `nvmlComputeMode_t`: which contexts may run on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeMode {
    /// `NVML_COMPUTEMODE_DEFAULT`: any number of contexts, time-sliced.
    Default,
    /// `NVML_COMPUTEMODE_EXCLUSIVE_THREAD` (deprecated): one context, of one thread.
    ExclusiveThread,
    /// `NVML_COMPUTEMODE_PROHIBITED`: no context.
    Prohibited,
    /// `NVML_COMPUTEMODE_EXCLUSIVE_PROCESS`: one context (one process, or an MPS server).
    ExclusiveProcess,
    /// A value this wicd does not know.
    Unknown(c_uint),
}

impl ComputeMode {
    fn from_raw(raw: c_uint) -> Self {
        match raw {
            0 => Self::Default,
            1 => Self::ExclusiveThread,
            2 => Self::Prohibited,
            3 => Self::ExclusiveProcess,
            other => Self::Unknown(other),
        }
    }
}

impl fmt::Display for ComputeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => write!(f, "DEFAULT"),
            Self::ExclusiveThread => write!(f, "EXCLUSIVE_THREAD"),
            Self::Prohibited => write!(f, "PROHIBITED"),
            Self::ExclusiveProcess => write!(f, "EXCLUSIVE_PROCESS"),
            Self::Unknown(raw) => write!(f, "unknown mode {raw}"),
        }
    }
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// NVML's index (the order of `nvidia-smi`).
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub compute_mode: ComputeMode,
    /// MIG mode enabled now: contexts run in GPU instances, scheduled apart.
    pub mig: bool,
}

/// Why NVML gave no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvmlError {
    /// The library or one of its functions is not there (no NVIDIA driver).
    Missing(String),
    /// A call failed with this `nvmlReturn_t`.
    Call { what: &'static str, code: c_int },
}

impl fmt::Display for NvmlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing(what) => write!(f, "NVML is not available: {what}"),
            Self::Call { what, code } => write!(f, "NVML's {what} failed with error {code}"),
        }
    }
}

impl std::error::Error for NvmlError {}

type Device = *mut c_void;
type Init = unsafe extern "C" fn() -> c_int;
type GetCount = unsafe extern "C" fn(*mut c_uint) -> c_int;
type GetHandle = unsafe extern "C" fn(c_uint, *mut Device) -> c_int;
type GetText = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_int;
type GetComputeMode = unsafe extern "C" fn(Device, *mut c_uint) -> c_int;
type GetMigMode = unsafe extern "C" fn(Device, *mut c_uint, *mut c_uint) -> c_int;

/// The loaded library; closed on drop.
struct Library(*mut c_void);

impl Library {
    fn open() -> Result<Self, NvmlError> {
        // SAFETY: a NUL-terminated name; the handle is checked before use.
        let handle = unsafe { libc::dlopen(LIBRARY.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(NvmlError::Missing(format!("cannot load {}", LIBRARY.to_string_lossy())));
        }
        Ok(Self(handle))
    }

    /// The function `name`, of the C type `F` its header gives it.
    ///
    /// # Safety
    ///
    /// `F` must be the function's type in `nvml.h`.
    unsafe fn function<F: Copy>(&self, name: &CStr) -> Result<F, NvmlError> {
        // SAFETY: a live handle and a NUL-terminated name.
        let symbol = unsafe { libc::dlsym(self.0, name.as_ptr()) };
        if symbol.is_null() {
            return Err(NvmlError::Missing(format!("{} has no {}", LIBRARY.to_string_lossy(), name.to_string_lossy())));
        }
        const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>(), "a function pointer") };
        // SAFETY: the caller names the symbol's type; a function pointer is pointer-sized.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&symbol) })
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: the handle from dlopen, closed once; no function of it is used afterwards.
        unsafe { libc::dlclose(self.0) };
    }
}

fn check(what: &'static str, code: c_int) -> Result<(), NvmlError> {
    if code == SUCCESS {
        Ok(())
    } else {
        Err(NvmlError::Call { what, code })
    }
}

/// A NUL-terminated text NVML filled in.
fn text(buffer: &[c_char]) -> String {
    let bytes: Vec<u8> = buffer.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Every GPU NVML sees, with how it is shared.
pub fn survey() -> Result<Vec<Gpu>, NvmlError> {
    let library = Library::open()?;
    // SAFETY: each `function` is given the type nvml.h declares for that name.
    let (init, shutdown, count, handle, name, uuid, compute_mode, mig_mode) = unsafe {
        (
            library.function::<Init>(c"nvmlInit_v2")?,
            library.function::<Init>(c"nvmlShutdown")?,
            library.function::<GetCount>(c"nvmlDeviceGetCount_v2")?,
            library.function::<GetHandle>(c"nvmlDeviceGetHandleByIndex_v2")?,
            library.function::<GetText>(c"nvmlDeviceGetName")?,
            library.function::<GetText>(c"nvmlDeviceGetUUID")?,
            library.function::<GetComputeMode>(c"nvmlDeviceGetComputeMode")?,
            library.function::<GetMigMode>(c"nvmlDeviceGetMigMode")?,
        )
    };
    // SAFETY: no argument; paired with the shutdown below.
    check("nvmlInit_v2", unsafe { init() })?;
    let gpus = (|| {
        let mut n: c_uint = 0;
        // SAFETY: a valid out pointer.
        check("nvmlDeviceGetCount_v2", unsafe { count(&mut n) })?;
        (0..n)
            .map(|index| {
                let mut device: Device = std::ptr::null_mut();
                // SAFETY: an index below the count and a valid out pointer.
                check("nvmlDeviceGetHandleByIndex_v2", unsafe { handle(index, &mut device) })?;
                let mut name_buffer = [0 as c_char; TEXT_BYTES];
                let mut uuid_buffer = [0 as c_char; TEXT_BYTES];
                let (mut mode, mut mig_now, mut mig_pending): (c_uint, c_uint, c_uint) = (0, 0, 0);
                // SAFETY: each call gets a live device handle and buffers of the lengths given.
                unsafe {
                    check("nvmlDeviceGetName", name(device, name_buffer.as_mut_ptr(), TEXT_BYTES as c_uint))?;
                    check("nvmlDeviceGetUUID", uuid(device, uuid_buffer.as_mut_ptr(), TEXT_BYTES as c_uint))?;
                    check("nvmlDeviceGetComputeMode", compute_mode(device, &mut mode))?;
                }
                // SAFETY: a live device handle and valid out pointers.
                let mig = match unsafe { mig_mode(device, &mut mig_now, &mut mig_pending) } {
                    SUCCESS => mig_now == 1,
                    ERROR_NOT_SUPPORTED => false,
                    code => return Err(NvmlError::Call { what: "nvmlDeviceGetMigMode", code }),
                };
                Ok(Gpu {
                    index,
                    name: text(&name_buffer),
                    uuid: text(&uuid_buffer),
                    compute_mode: ComputeMode::from_raw(mode),
                    mig,
                })
            })
            .collect::<Result<Vec<_>, _>>()
    })();
    // SAFETY: after a successful init; nothing of NVML is used afterwards.
    unsafe { shutdown() };
    gpus
}
