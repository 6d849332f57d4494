//! Framing: every message is a 4-byte little-endian length followed by that many bytes of UTF-8
//! JSON. Lengths are checked before anything is allocated, so an oversized or garbage header
//! costs the daemon nothing but an error reply. Descriptors passed with a frame arrive as
//! `SCM_RIGHTS` ([`take_passed_fds`]).

use std::fmt;

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

/// Takes ownership of the descriptors passed as `SCM_RIGHTS` with `msg`, appending them to `out`.
/// Fails with `ENOBUFS` if the control data was truncated.
pub fn take_passed_fds<S>(
    msg: &nix::sys::socket::RecvMsg<'_, '_, S>,
    out: &mut Vec<std::os::fd::OwnedFd>,
) -> nix::Result<()> {
    use std::os::fd::{FromRawFd, OwnedFd};
    for cmsg in msg.cmsgs()? {
        if let nix::sys::socket::ControlMessageOwned::ScmRights(received) = cmsg {
            // SAFETY: SCM_RIGHTS installed these descriptors in this process just now; nothing
            // else owns them.
            out.extend(received.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    Ok(())
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
