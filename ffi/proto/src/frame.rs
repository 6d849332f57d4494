//! Framing: every message is a 4-byte little-endian length followed by that many bytes of UTF-8
//! JSON. Lengths are checked before anything is allocated, so an oversized or garbage header
//! costs the daemon nothing but an error reply. Descriptors passed with a frame arrive as
//! `SCM_RIGHTS` ([`recv_with_fds`]).

use std::fmt;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Bytes of the length prefix.
pub const HEADER_BYTES: usize = 4;

/// Largest reply a client accepts: a channel list or a 4096-slot layout fits with room to spare.
pub const MAX_REPLY_BYTES: usize = 16 << 20;

/// Why a frame could not be taken from the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The announced length exceeds the receiver's limit.
    TooLarge { len: usize, max: usize },
    /// A zero-length frame: never valid JSON.
    Empty,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLarge { len, max } => write!(f, "frame of {len} bytes exceeds the limit of {max} bytes"),
            Self::Empty => f.write_str("empty frame"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Prepends the length header to `body`.
pub fn encode(body: &[u8]) -> Vec<u8> {
    let len = u32::try_from(body.len()).expect("frames are far below 4 GiB");
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// Validates a received header and returns the body length that follows it.
pub fn body_len(header: [u8; HEADER_BYTES], max: usize) -> Result<usize, FrameError> {
    let len = u32::from_le_bytes(header) as usize;
    if len == 0 {
        return Err(FrameError::Empty);
    }
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    Ok(len)
}

/// One `recvmsg(2)` of `socket` into `buf`, with `control` as room for control data and
/// `flags` (`MSG_CMSG_CLOEXEC` and the like). Takes ownership of the descriptors passed as
/// `SCM_RIGHTS` with the bytes, appending them to `fds`, and returns how many bytes arrived and
/// whether the kernel cut the control data short (`MSG_CTRUNC`: descriptors were lost).
///
/// Taken by hand rather than through nix, which refuses truncated control data: the kernel
/// truncates it when the receiver is out of descriptors (EMFILE) after installing some, and
/// those must be closed, not leaked.
pub fn recv_with_fds(
    socket: RawFd,
    buf: &mut [u8],
    control: &mut [u8],
    flags: libc::c_int,
    fds: &mut Vec<OwnedFd>,
) -> io::Result<(usize, bool)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: an all-zero msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len();
    // SAFETY: `msg` points at `iov` over `buf` and at the control buffer, all live and
    // writable for the call.
    let got = unsafe { libc::recvmsg(socket, &mut msg, flags) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: recvmsg filled `msg`; the CMSG macros stay within `msg_controllen` of it.
    let mut header = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !header.is_null() {
        // SAFETY: a non-null header from CMSG_FIRSTHDR/NXTHDR lies within the control data.
        let cmsg = unsafe { &*header };
        if cmsg.cmsg_level == libc::SOL_SOCKET && cmsg.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN has no preconditions.
            let data_len = cmsg.cmsg_len as usize - unsafe { libc::CMSG_LEN(0) } as usize;
            // SAFETY: the header's data holds `data_len` bytes of descriptors.
            let data = unsafe { libc::CMSG_DATA(header) }.cast::<RawFd>();
            for i in 0..data_len / std::mem::size_of::<RawFd>() {
                // SAFETY: within the data; SCM_RIGHTS installed the descriptor in this
                // process just now and nothing else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(data.add(i).read_unaligned()) });
            }
        }
        // SAFETY: `header` is a header of `msg`'s control data.
        header = unsafe { libc::CMSG_NXTHDR(&msg, header) };
    }
    Ok((got as usize, msg.msg_flags & libc::MSG_CTRUNC != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_limits_apply() {
        let frame = encode(b"{}");
        assert_eq!(&frame[..4], &[2, 0, 0, 0]);
        assert_eq!(body_len(frame[..4].try_into().unwrap(), 16), Ok(2));
        assert_eq!(body_len([0; 4], 16), Err(FrameError::Empty));
        assert_eq!(body_len(17u32.to_le_bytes(), 16), Err(FrameError::TooLarge { len: 17, max: 16 }));
        assert_eq!(body_len([0xff; 4], 1 << 20), Err(FrameError::TooLarge { len: u32::MAX as usize, max: 1 << 20 }));
    }
}
