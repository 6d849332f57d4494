//! One connection's I/O on the socket: a request's frame read and parsed with the descriptors
//! passed along (`SCM_RIGHTS`; past [`MAX_FDS_PER_REQUEST`] they are closed as they arrive),
//! replies sent with theirs, each by a deadline.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use wic_proto::frame::{self, FrameError};
use wic_proto::message::{ErrorCode, Request, Response, WireError};

use crate::config::Limits;

/// Room for the most descriptors one message can carry (the kernel's SCM_MAX_FD), so the
/// kernel never truncates: every descriptor sent arrives, and is closed if unwanted.
const SCM_MAX_FD: usize = 253;

/// Most descriptors one request carries: `attach_space` passes the UVM file, nothing else
/// passes any. Extra ones are closed as they arrive.
pub const MAX_FDS_PER_REQUEST: usize = 1;

/// A request read in full.
pub enum Incoming {
    /// The request, the descriptors that came with it, and how many more did, which were
    /// closed.
    Request { request: Request, fds: Vec<OwnedFd>, excess_fds: usize },
    /// A frame to refuse; the connection goes on.
    Refused(WireError),
    /// A frame to refuse, after which the connection is closed.
    Closing(WireError),
}

/// A connection's incoming bytes, with the descriptors passed along with them.
pub struct Inbound {
    /// The descriptors of the request arriving now, at most [`MAX_FDS_PER_REQUEST`].
    fds: Vec<OwnedFd>,
    /// Descriptors past that bound that came with it; they were closed on arrival.
    excess_fds: usize,
    control: Vec<u8>,
}

impl Default for Inbound {
    fn default() -> Self {
        Self { fds: Vec::new(), excess_fds: 0, control: nix::cmsg_space!([RawFd; SCM_MAX_FD]) }
    }
}

impl Inbound {
    /// Fills `buf`; `false` when the peer hung up before its first byte.
    pub async fn read_exact(&mut self, stream: &UnixStream, buf: &mut [u8]) -> io::Result<bool> {
        let mut filled = 0;
        while filled < buf.len() {
            let got = stream.async_io(Interest::READABLE, || self.recv(stream.as_raw_fd(), &mut buf[filled..])).await?;
            match got {
                0 if filled == 0 => return Ok(false),
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                got => filled += got,
            }
        }
        Ok(true)
    }

    /// Reads the rest of a request whose first byte, `first`, has come, by `deadline` (past it,
    /// a `TimedOut` error saying what `late` says), and parses it.
    pub async fn read_request(
        &mut self,
        stream: &UnixStream,
        first: u8,
        deadline: tokio::time::Instant,
        late: impl Fn() -> String,
        max_frame_bytes: usize,
    ) -> io::Result<Incoming> {
        let mut header = [0u8; frame::HEADER_BYTES];
        header[0] = first;
        within(deadline, &late, self.read_rest(stream, &mut header[1..])).await?;
        let len = match frame::body_len(header, max_frame_bytes) {
            Ok(len) => len,
            Err(FrameError::Empty) => {
                self.take();
                return Ok(Incoming::Refused(WireError::new(ErrorCode::Protocol, "empty frame")));
            }
            Err(e @ FrameError::TooLarge { .. }) => {
                // The body cannot be skipped safely (it may never come): answer and hang up.
                let e = WireError::new(ErrorCode::Protocol, format!("{e}; closing the connection"));
                return Ok(Incoming::Closing(e));
            }
        };
        let mut body = vec![0u8; len];
        within(deadline, &late, self.read_rest(stream, &mut body)).await?;
        let (fds, excess_fds) = self.take();
        Ok(match serde_json::from_slice::<Request>(&body) {
            Ok(request) => Incoming::Request { request, fds, excess_fds },
            Err(e) => Incoming::Refused(WireError::new(ErrorCode::Invalid, format!("malformed request: {e}"))),
        })
    }

    /// Fills `buf` with the rest of a request that has begun.
    async fn read_rest(&mut self, stream: &UnixStream, buf: &mut [u8]) -> io::Result<()> {
        match self.read_exact(stream, buf).await? {
            true => Ok(()),
            false => Err(io::ErrorKind::UnexpectedEof.into()),
        }
    }

    fn recv(&mut self, socket: RawFd, buf: &mut [u8]) -> io::Result<usize> {
        let (got, truncated) = wic_proto::frame::recv_with_fds(
            socket,
            buf,
            &mut self.control,
            libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
            &mut self.fds,
        )?;
        // Closed now, not when the request is complete: a client trickling a request out with
        // descriptors on every byte must not make wicd hold them.
        if self.fds.len() > MAX_FDS_PER_REQUEST {
            self.excess_fds += self.fds.len() - MAX_FDS_PER_REQUEST;
            self.fds.truncate(MAX_FDS_PER_REQUEST);
        }
        if truncated {
            // Descriptors were lost: the request cannot be served as sent.
            return Err(io::Error::other(
                "descriptors passed with a request were cut off (wicd is out of descriptors)",
            ));
        }
        Ok(got)
    }

    /// The complete request's descriptors, and how many more it came with.
    fn take(&mut self) -> (Vec<OwnedFd>, usize) {
        (std::mem::take(&mut self.fds), std::mem::take(&mut self.excess_fds))
    }
}

/// Sends a response, with `fds` passed along, within the request timeout: a client that does
/// not read its replies is not served further.
pub async fn send(stream: &mut UnixStream, response: &Response, fds: &[RawFd], limits: &Limits) -> io::Result<()> {
    let not_read = || format!("the client did not read its reply within {} ms", limits.request_timeout_ms);
    within(deadline_in(limits.request_timeout_ms), not_read, send_now(stream, response, fds)).await
}

async fn send_now(stream: &mut UnixStream, response: &Response, fds: &[RawFd]) -> io::Result<()> {
    let body = serde_json::to_vec(response).expect("responses always serialize");
    let bytes = frame::encode(&body);
    if fds.is_empty() {
        return stream.write_all(&bytes).await;
    }
    let raw = stream.as_raw_fd();
    let sent = stream
        .async_io(Interest::WRITABLE, || {
            let rights = [ControlMessage::ScmRights(fds)];
            sendmsg::<()>(raw, &[IoSlice::new(&bytes)], &rights, MsgFlags::MSG_NOSIGNAL, None).map_err(io::Error::from)
        })
        .await?;
    stream.write_all(&bytes[sent..]).await
}

pub async fn send_error(stream: &mut UnixStream, e: WireError, limits: &Limits) -> io::Result<()> {
    send(stream, &Response::Error(e), &[], limits).await
}

pub fn deadline_in(ms: u64) -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_millis(ms)
}

/// Runs `work` until `deadline`; past it, a `TimedOut` error saying `what` was late.
pub async fn within<T>(
    deadline: tokio::time::Instant,
    what: impl FnOnce() -> String,
    work: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    tokio::time::timeout_at(deadline, work)
        .await
        .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, what())))
}
