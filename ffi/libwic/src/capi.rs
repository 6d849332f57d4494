//! The `extern "C"` functions of `wic.h`: null checks, argument conversion and error codes
//! around [`crate::client`] and [`crate::channel`]. Every function catches panics, which are
//! reported as `WIC_EIO` (or `NULL`) and never unwind into C.
//!
//! The opaque `wic_client` is a boxed [`Client`] and `wic_channel` a boxed [`Channel`].

use std::ffi::{c_char, c_int, c_void, CStr, CString, OsStr};
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use wic_proto::message::ErrorCode;

use wic_types::uvm_gpu::{Uuid, UvmGpus, PROCFS_GPUS};

use crate::abi::{
    err, role_from_c, WicChannelInfo, WicChannelSpec, WicRun, WicSlotInfo, WicStats, WIC_EINVALID, WIC_EIO,
    WIC_ENOT_FOUND, WIC_EPROTOCOL, WIC_EUNSUPPORTED, WIC_OK, WIC_TOKEN_LEN,
};
use crate::channel::{self, Channel};
use crate::client::{self, spec_from_abi, stats_to_abi, Client};

/// `wic_version`'s answer: the package version, NUL-terminated.
const VERSION: &CStr = match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
    Ok(version) => version,
    Err(_) => panic!("the package version contains a NUL"),
};

/// Errors that have a `wic.h` code.
trait Coded {
    fn code(&self) -> ErrorCode;
}

impl Coded for client::Error {
    fn code(&self) -> ErrorCode {
        client::Error::code(self)
    }
}

impl Coded for channel::Error {
    fn code(&self) -> ErrorCode {
        channel::Error::code(self)
    }
}

/// Runs `body`, turning a panic into `WIC_EIO`.
fn guard(body: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(WIC_EIO)
}

/// `WIC_OK` or the error's code.
fn status<E: Coded>(result: Result<(), E>) -> c_int {
    match result {
        Ok(()) => WIC_OK,
        Err(e) => err(e.code()),
    }
}

/// Stores a new handle in `*out`.
///
/// # Safety
/// `out` must be valid for a pointer write.
unsafe fn hand_out<T, E: Coded>(out: *mut *mut T, result: Result<T, E>) -> c_int {
    match result {
        Ok(value) => {
            // SAFETY: the caller guarantees `out` is writable.
            unsafe { out.write(Box::into_raw(Box::new(value))) };
            WIC_OK
        }
        Err(e) => err(e.code()),
    }
}

/// Returns the library version, `"MAJOR.MINOR.PATCH"`.
#[no_mangle]
pub extern "C" fn wic_version() -> *const c_char {
    VERSION.as_ptr()
}

/// Returns a static description of a `wic_*` return value.
#[no_mangle]
pub extern "C" fn wic_strerror(error: c_int) -> *const c_char {
    static MESSAGES: OnceLock<Vec<CString>> = OnceLock::new();
    let describe = || {
        if error == WIC_OK {
            return c"success".as_ptr();
        }
        let Some(code) = ErrorCode::from_c(error) else {
            return c"unknown error".as_ptr();
        };
        let messages = MESSAGES.get_or_init(|| {
            ErrorCode::ALL.iter().map(|c| CString::new(c.describe()).expect("descriptions have no NUL")).collect()
        });
        let index = ErrorCode::ALL.iter().position(|c| *c == code).expect("from_c returns listed codes");
        messages[index].as_ptr()
    };
    catch_unwind(describe).unwrap_or(c"unknown error".as_ptr())
}

/// Connects to wicd at `socket_path` (NULL: `$WIC_SOCKET` or the default socket).
///
/// # Safety
/// `socket_path` is NULL or a NUL-terminated string; `out` is valid for a pointer write.
#[no_mangle]
pub unsafe extern "C" fn wic_connect(socket_path: *const c_char, out: *mut *mut Client) -> c_int {
    guard(|| {
        if out.is_null() {
            return WIC_EINVALID;
        }
        // SAFETY: checked non-null above; the caller guarantees it is writable.
        unsafe { out.write(std::ptr::null_mut()) };
        let path = if socket_path.is_null() {
            None
        } else {
            // SAFETY: non-null, and the caller guarantees a NUL-terminated string.
            let bytes = unsafe { CStr::from_ptr(socket_path) }.to_bytes();
            Some(Path::new(OsStr::from_bytes(bytes)))
        };
        // SAFETY: `out` is writable, as above.
        unsafe { hand_out(out, Client::connect(path)) }
    })
}

/// Releases a client; its channels keep the connection open until they are closed.
///
/// # Safety
/// `client` is NULL or a handle from `wic_connect` not yet disconnected.
#[no_mangle]
pub unsafe extern "C" fn wic_disconnect(client: *mut Client) {
    if client.is_null() {
        return;
    }
    // SAFETY: the caller hands back a pointer made by `Box::into_raw` in `wic_connect`, once.
    let client = unsafe { Box::from_raw(client) };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(client)));
}

/// Creates a channel owned by `client`.
///
/// # Safety
/// `client` is a live handle, `spec` points to a `struct wic_channel_spec`, `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn wic_channel_create(
    client: *mut Client,
    spec: *const WicChannelSpec,
    out: *mut *mut Channel,
) -> c_int {
    // SAFETY: the caller's guarantees are those of `create`.
    unsafe { create(client, spec, None, out) }
}

/// `wic_channel_create` and `wic_channel_create_at`.
///
/// # Safety
/// `client` is a live handle, `spec` points to a `struct wic_channel_spec`, `out` is writable.
unsafe fn create(
    client: *mut Client,
    spec: *const WicChannelSpec,
    base_va: Option<u64>,
    out: *mut *mut Channel,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return WIC_EINVALID;
        }
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: the caller guarantees both are NULL or valid.
        let (Some(client), Some(spec)) = (unsafe { client.as_ref() }, unsafe { spec.as_ref() }) else {
            return WIC_EINVALID;
        };
        let channel = spec_from_abi(spec).and_then(|spec| match base_va {
            None => client.create_channel(&spec),
            Some(base_va) => client.create_channel_at(&spec, base_va),
        });
        // SAFETY: `out` is writable, as above.
        unsafe { hand_out(out, channel) }
    })
}

/// Attaches this process's GPU address space, given its UVM file descriptor (the one the CUDA
/// runtime opened on `/dev/nvidia-uvm`): channels can then be placed in its managed memory
/// (shim backend), or its GPU faults are observed (emulated backend on a GPU machine). Stores
/// the space id in `*space` when `space` is not NULL.
///
/// # Safety
/// `client` is a live handle; `space` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn wic_attach_space(client: *mut Client, uvm_fd: c_int, space: *mut u32) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `client` is NULL or live.
        let Some(client) = (unsafe { client.as_ref() }) else { return WIC_EINVALID };
        if uvm_fd < 0 {
            return WIC_EINVALID;
        }
        // SAFETY: a descriptor the caller owns and keeps open for this call; it is only sent.
        let uvm = unsafe { BorrowedFd::borrow_raw(uvm_fd) };
        match client.attach_space(uvm) {
            Ok(id) => {
                if !space.is_null() {
                    // SAFETY: non-null, and the caller guarantees it is writable.
                    unsafe { space.write(id) };
                }
                WIC_OK
            }
            Err(e) => err(e.code()),
        }
    })
}

/// Has wicd count and time the GPU faults on `length` bytes at `base_va` of the attached space.
///
/// # Safety
/// `client` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn wic_watch_range(client: *mut Client, base_va: u64, length: u64) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `client` is NULL or live.
        let Some(client) = (unsafe { client.as_ref() }) else { return WIC_EINVALID };
        status(client.watch(base_va, length))
    })
}

/// Bytes of managed memory `wic_channel_create_at` places a channel of `spec` in.
///
/// # Safety
/// `client` is a live handle, `spec` points to a `struct wic_channel_spec`, `bytes` is writable.
#[no_mangle]
pub unsafe extern "C" fn wic_placement_bytes(
    client: *mut Client,
    spec: *const WicChannelSpec,
    bytes: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees all three are NULL or valid.
        let (Some(client), Some(spec), false) = (unsafe { client.as_ref() }, unsafe { spec.as_ref() }, bytes.is_null())
        else {
            return WIC_EINVALID;
        };
        match spec_from_abi(spec).and_then(|spec| client.placement_bytes(&spec)) {
            Ok(placement) => {
                // SAFETY: non-null, and the caller guarantees it is writable.
                unsafe { bytes.write(placement) };
                WIC_OK
            }
            Err(e) => err(e.code()),
        }
    })
}

/// Creates a channel placed at `base_va` of the attached address space (shim backend).
///
/// # Safety
/// As `wic_channel_create`.
#[no_mangle]
pub unsafe extern "C" fn wic_channel_create_at(
    client: *mut Client,
    spec: *const WicChannelSpec,
    base_va: u64,
    out: *mut *mut Channel,
) -> c_int {
    // SAFETY: the caller's guarantees are those of `create`.
    unsafe { create(client, spec, Some(base_va), out) }
}

/// Issues a token for `role` (producer or consumer), for user `uid` or any user (-1).
///
/// # Safety
/// `ch` is a live channel handle and `token` is writable for `WIC_TOKEN_LEN` bytes.
#[no_mangle]
pub unsafe extern "C" fn wic_channel_grant(ch: *mut Channel, role: c_int, uid: i64, token: *mut c_char) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `ch` is NULL or a live handle.
        let Some(ch) = (unsafe { ch.as_ref() }) else { return WIC_EINVALID };
        if token.is_null() {
            return WIC_EINVALID;
        }
        let Some(role) = role_from_c(i64::from(role)) else { return WIC_EINVALID };
        let uid = match uid {
            -1 => None,
            uid => match u32::try_from(uid) {
                Ok(uid) => Some(uid),
                Err(_) => return WIC_EINVALID,
            },
        };
        let issued = match ch.grant(role, uid) {
            Ok(issued) => issued,
            Err(e) => return err(e.code()),
        };
        if issued.len() >= WIC_TOKEN_LEN || issued.bytes().any(|b| b == 0) {
            return WIC_EPROTOCOL;
        }
        // SAFETY: the caller guarantees WIC_TOKEN_LEN writable bytes; the token and its NUL fit.
        unsafe {
            std::ptr::copy_nonoverlapping(issued.as_ptr().cast::<c_char>(), token, issued.len());
            token.add(issued.len()).write(0);
        }
        WIC_OK
    })
}

/// Attaches to a channel with a token from `wic_channel_grant`.
///
/// # Safety
/// `client` is a live handle, `token` a NUL-terminated string and `out` writable.
#[no_mangle]
pub unsafe extern "C" fn wic_channel_attach(
    client: *mut Client,
    token: *const c_char,
    out: *mut *mut Channel,
) -> c_int {
    guard(|| {
        if out.is_null() || token.is_null() {
            return WIC_EINVALID;
        }
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: the caller guarantees `client` is NULL or live.
        let Some(client) = (unsafe { client.as_ref() }) else { return WIC_EINVALID };
        // SAFETY: non-null, and the caller guarantees a NUL-terminated string.
        let Ok(token) = unsafe { CStr::from_ptr(token) }.to_str() else { return WIC_EINVALID };
        // SAFETY: `out` is writable, as above.
        unsafe { hand_out(out, client.attach(token)) }
    })
}

/// Closes a channel handle (the owner's also destroys the channel) and frees it.
///
/// # Safety
/// `ch` is NULL or a live handle no other thread is using; it is invalid afterwards.
#[no_mangle]
pub unsafe extern "C" fn wic_channel_close(ch: *mut Channel) -> c_int {
    if ch.is_null() {
        return WIC_OK;
    }
    // SAFETY: the caller hands back a pointer made by `Box::into_raw` in create or attach, once.
    let ch = unsafe { Box::from_raw(ch) };
    guard(move || status(ch.close()))
}

/// Describes the channel.
///
/// # Safety
/// `ch` is a live handle and `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn wic_channel_info(ch: *const Channel, out: *mut WicChannelInfo) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `ch` is NULL or live.
        let Some(ch) = (unsafe { ch.as_ref() }) else { return WIC_EINVALID };
        if out.is_null() {
            return WIC_EINVALID;
        }
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { out.write(ch.abi_info()) };
        WIC_OK
    })
}

/// Describes one slot.
///
/// # Safety
/// `ch` is a live handle and `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn wic_channel_slot(ch: *const Channel, slot: u32, out: *mut WicSlotInfo) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `ch` is NULL or live.
        let Some(ch) = (unsafe { ch.as_ref() }) else { return WIC_EINVALID };
        if out.is_null() {
            return WIC_EINVALID;
        }
        match ch.abi_slot(slot) {
            Ok(info) => {
                // SAFETY: checked non-null; the caller guarantees it is writable.
                unsafe { out.write(info) };
                WIC_OK
            }
            Err(e) => err(e.code()),
        }
    })
}

/// The buffer of `slot` a host producer fills before `wic_publish`; NULL if there is none.
///
/// # Safety
/// `ch` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn wic_slot_buffer(ch: *mut Channel, slot: u32) -> *mut c_void {
    let body = || {
        // SAFETY: the caller guarantees `ch` is NULL or live.
        let ch = unsafe { ch.as_ref() }?;
        ch.slot_buffer(slot).ok().map(|ptr| ptr.cast::<c_void>())
    };
    catch_unwind(AssertUnwindSafe(body)).ok().flatten().unwrap_or(std::ptr::null_mut())
}

/// Publishes `slot`, whose buffer holds the next generation.
///
/// # Safety
/// `ch` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn wic_publish(ch: *mut Channel, slot: u32) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `ch` is NULL or live.
        let Some(ch) = (unsafe { ch.as_ref() }) else { return WIC_EINVALID };
        status(ch.publish(slot))
    })
}

/// Copies `len` bytes into `slot`'s buffer and publishes them.
///
/// # Safety
/// `ch` is NULL or a live handle; `data` is readable for `len` bytes (or `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn wic_publish_copy(ch: *mut Channel, slot: u32, data: *const c_void, len: usize) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `ch` is NULL or live.
        let Some(ch) = (unsafe { ch.as_ref() }) else { return WIC_EINVALID };
        let data: &[u8] = match (data.is_null(), len) {
            (_, 0) => &[],
            (true, _) => return WIC_EINVALID,
            // SAFETY: non-null, and the caller guarantees `len` readable bytes that the call
            // does not outlive.
            (false, len) => unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) },
        };
        status(ch.publish_copy(slot, data))
    })
}

/// Waits until `slot` may be published again, at most `timeout_ns`.
///
/// # Safety
/// `ch` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn wic_wait_writable(ch: *mut Channel, slot: u32, timeout_ns: u64) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `ch` is NULL or live.
        let Some(ch) = (unsafe { ch.as_ref() }) else { return WIC_EINVALID };
        status(ch.wait_writable(slot, Duration::from_nanos(timeout_ns)))
    })
}

/// Waits until `slot` may be published again and lends its run to write in place.
///
/// # Safety
/// `ch` is NULL or a live handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn wic_run_acquire(ch: *mut Channel, slot: u32, timeout_ns: u64, out: *mut WicRun) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `ch` is NULL or live.
        let Some(ch) = (unsafe { ch.as_ref() }) else { return WIC_EINVALID };
        if out.is_null() {
            return WIC_EINVALID;
        }
        match ch.acquire_run(slot, Duration::from_nanos(timeout_ns)) {
            Ok(run) => {
                let run = WicRun {
                    data: run.data as usize,
                    heads: run.heads as usize,
                    batch_bytes: ch.info().batch_bytes,
                    pages: run.pages,
                    side: u32::from(run.side),
                    slot: run.slot,
                    reserved: 0,
                };
                // SAFETY: non-null and writable, per the caller.
                unsafe { out.write(run) };
                WIC_OK
            }
            Err(e) => status(Err(e)),
        }
    })
}

/// The run `run` describes, once checked: `None` for one that cannot have come from
/// `wic_run_acquire` (no pages, or heads for fewer pages than the batch spans).
///
/// # Safety
/// `run` came from `wic_run_acquire` of a channel this process still has open.
unsafe fn lent_run(run: &WicRun) -> Option<channel::Run<'static>> {
    let spans = run.batch_bytes.div_ceil(wic_types::PAGE_SIZE);
    if run.data == 0 || run.heads == 0 || run.side > 1 || u64::from(run.pages) < spans || run.reserved != 0 {
        return None;
    }
    // SAFETY: as the caller guarantees.
    Some(unsafe {
        channel::Run::from_raw(run.data as *mut u8, run.heads as *mut u64, run.pages, run.side as u8, run.slot)
    })
}

/// Copies `len` bytes from `src` to `offset` of the batch in `run`.
///
/// # Safety
/// `run` is NULL or from `wic_run_acquire` of a channel still open and not yet published;
/// `src` is readable for `len` bytes (or `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn wic_run_write(run: *const WicRun, offset: u64, src: *const c_void, len: usize) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `run` is NULL or valid.
        let Some(run) = (unsafe { run.as_ref() }) else { return WIC_EINVALID };
        // SAFETY: the caller guarantees `run` is from wic_run_acquire of an open channel.
        let Some(lent) = (unsafe { lent_run(run) }) else { return WIC_EINVALID };
        if (src.is_null() && len > 0) || offset.checked_add(len as u64).is_none_or(|end| end > run.batch_bytes) {
            return WIC_EINVALID;
        }
        if len == 0 {
            return WIC_OK;
        }
        // SAFETY: non-null, and the caller guarantees `len` readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) };
        // SAFETY: the run is lent and unpublished, per the caller, and the bytes end within
        // its batch, checked above.
        unsafe { lent.write(offset as usize, bytes) };
        WIC_OK
    })
}

/// Publishes the batch written in place into `run`.
///
/// # Safety
/// `ch` is NULL or a live handle; `run` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn wic_run_publish(ch: *mut Channel, slot: u32, run: *const WicRun) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `ch` is NULL or live, `run` NULL or readable.
        let (Some(ch), Some(run)) = (unsafe { ch.as_ref() }, unsafe { run.as_ref() }) else { return WIC_EINVALID };
        if run.batch_bytes != ch.info().batch_bytes || run.slot != slot {
            return WIC_EINVALID;
        }
        // SAFETY: the caller guarantees `run` is from wic_run_acquire of `ch`, which is live.
        let Some(lent) = (unsafe { lent_run(run) }) else { return WIC_EINVALID };
        status(ch.publish_run(&lent))
    })
}

/// Consumes `slot`'s next generation into `dst` (at most `len` bytes).
///
/// # Safety
/// `ch` is NULL or a live handle; `dst` is writable for `len` bytes (or `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn wic_consume(ch: *mut Channel, slot: u32, dst: *mut c_void, len: usize) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `ch` is NULL or live.
        let Some(ch) = (unsafe { ch.as_ref() }) else { return WIC_EINVALID };
        let dst: &mut [u8] = match (dst.is_null(), len) {
            (_, 0) => &mut [],
            (true, _) => return WIC_EINVALID,
            // SAFETY: non-null, and the caller guarantees `len` writable bytes, not aliased by
            // anything Rust holds, for the duration of the call.
            (false, len) => unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len) },
        };
        status(ch.consume(slot, dst).map(|_| ()))
    })
}

/// Fetches the daemon's statistics.
///
/// # Safety
/// `client` is NULL or a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn wic_stats(client: *mut Client, out: *mut WicStats) -> c_int {
    guard(|| {
        // SAFETY: the caller guarantees `client` is NULL or live.
        let Some(client) = (unsafe { client.as_ref() }) else { return WIC_EINVALID };
        if out.is_null() {
            return WIC_EINVALID;
        }
        match client.stats() {
            Ok(stats) => {
                // SAFETY: checked non-null; the caller guarantees it is writable.
                unsafe { out.write(stats_to_abi(&stats)) };
                WIC_OK
            }
            Err(e) => err(e.code()),
        }
    })
}

/// nvidia-uvm's id of the GPU whose UUID is `uuid`, from `dir` (nvidia-uvm's procfs listing).
fn uvm_gpu_id(dir: &Path, uuid: [u8; 16]) -> Result<u32, c_int> {
    let gpus = UvmGpus::read(dir).map_err(|e| match e.kind() {
        // No nvidia-uvm loaded.
        std::io::ErrorKind::NotFound => WIC_EUNSUPPORTED,
        _ => WIC_EIO,
    })?;
    gpus.id_of(Uuid(uuid)).map_err(|_| WIC_ENOT_FOUND)
}

/// nvidia-uvm's id of a GPU, from its 16-byte UUID.
///
/// # Safety
/// `uuid` is NULL or points to 16 readable bytes; `gpu_id` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn wic_uvm_gpu_id(uuid: *const u8, gpu_id: *mut u32) -> c_int {
    guard(|| {
        if uuid.is_null() || gpu_id.is_null() {
            return WIC_EINVALID;
        }
        // SAFETY: checked non-null; the caller guarantees 16 readable bytes.
        let uuid = unsafe { uuid.cast::<[u8; 16]>().read_unaligned() };
        match uvm_gpu_id(Path::new(PROCFS_GPUS), uuid) {
            Ok(id) => {
                // SAFETY: checked non-null; the caller guarantees it is writable.
                unsafe { gpu_id.write_unaligned(id) };
                WIC_OK
            }
            Err(code) => code,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::*;
    use std::ptr::{null, null_mut};

    fn text(ptr: *const c_char) -> &'static str {
        // SAFETY: the library returns static NUL-terminated strings.
        unsafe { CStr::from_ptr(ptr) }.to_str().unwrap()
    }

    #[test]
    fn version_and_error_strings() {
        assert_eq!(text(wic_version()), env!("CARGO_PKG_VERSION"));
        assert_eq!(text(wic_strerror(WIC_OK)), "success");
        for code in ErrorCode::ALL {
            assert_eq!(text(wic_strerror(err(code))), code.describe());
        }
        assert_eq!(text(wic_strerror(1)), "unknown error");
        assert_eq!(text(wic_strerror(-(ErrorCode::ALL.len() as c_int) - 1)), "unknown error");
        assert_eq!(text(wic_strerror(c_int::MIN)), "unknown error");
    }

    #[test]
    fn null_arguments_are_refused_and_null_handles_released() {
        // SAFETY: every pointer is NULL or points to a live local.
        unsafe {
            assert_eq!(wic_connect(null(), null_mut()), WIC_EINVALID);
            let mut out = null_mut();
            assert_eq!(wic_channel_create(null_mut(), null(), &mut out), WIC_EINVALID);
            assert!(out.is_null());
            assert_eq!(wic_channel_attach(null_mut(), c"x".as_ptr(), &mut out), WIC_EINVALID);
            assert_eq!(wic_channel_grant(null_mut(), 1, -1, null_mut()), WIC_EINVALID);
            assert_eq!(wic_channel_info(null(), null_mut()), WIC_EINVALID);
            assert_eq!(wic_channel_slot(null(), 0, null_mut()), WIC_EINVALID);
            assert!(wic_slot_buffer(null_mut(), 0).is_null());
            assert_eq!(wic_publish(null_mut(), 0), WIC_EINVALID);
            assert_eq!(wic_publish_copy(null_mut(), 0, null(), 0), WIC_EINVALID);
            assert_eq!(wic_wait_writable(null_mut(), 0, 0), WIC_EINVALID);
            assert_eq!(wic_consume(null_mut(), 0, null_mut(), 0), WIC_EINVALID);
            assert_eq!(wic_stats(null_mut(), null_mut()), WIC_EINVALID);
            assert_eq!(wic_channel_close(null_mut()), WIC_OK);
            wic_disconnect(null_mut());
        }
    }

    #[test]
    fn connect_failure_is_econnect() {
        let mut client = std::ptr::NonNull::<Client>::dangling().as_ptr();
        // SAFETY: a valid C string and a live out pointer.
        assert_eq!(unsafe { wic_connect(c"/nonexistent/wicd.sock".as_ptr(), &mut client) }, WIC_ECONNECT);
        assert!(client.is_null());
    }

    #[test]
    fn uvm_gpu_ids_come_from_nvidia_uvms_listing() {
        let uuid = [0x68, 0x71, 0xd1, 0x14, 0x5c, 0x34, 0xa5, 0xec, 0x0b, 0x30, 0x45, 0x1b, 0x68, 0x0e, 0xc5, 0x22];
        let dir = std::env::temp_dir().join(format!("libwic-uvm-gpus-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink("GPU-6871d114-5c34-a5ec-0b30-451b680ec522/0", dir.join("9")).unwrap();
        let found = uvm_gpu_id(&dir, uuid);
        let other = uvm_gpu_id(&dir, [0; 16]);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!((found, other), (Ok(9), Err(WIC_ENOT_FOUND)));
        assert_eq!(uvm_gpu_id(Path::new("/nonexistent/gpus"), uuid), Err(WIC_EUNSUPPORTED));
        let mut id = 0;
        // SAFETY: NULL is refused before anything is read.
        assert_eq!(unsafe { wic_uvm_gpu_id(null(), &mut id) }, WIC_EINVALID);
        // SAFETY: `uuid` is 16 readable bytes; NULL out is refused.
        assert_eq!(unsafe { wic_uvm_gpu_id(uuid.as_ptr(), null_mut()) }, WIC_EINVALID);
        if !Path::new(PROCFS_GPUS).exists() {
            // SAFETY: both pointers are valid.
            assert_eq!(unsafe { wic_uvm_gpu_id(uuid.as_ptr(), &mut id) }, WIC_EUNSUPPORTED);
        }
    }
}
