//! A blocking client: connect, say hello, send requests and collect replies with the file
//! descriptors passed along with them.

use std::io::{self, IoSlice, IoSliceMut, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::sys::socket::{recv, recvmsg, sendmsg, ControlMessage, MsgFlags};

use crate::frame::{self, FrameError, MAX_REPLY_BYTES};
use crate::message::{ErrorCode, Reply, Request, Response, WireError};
use crate::PROTOCOL_VERSION;

/// Most descriptors one reply carries.
const MAX_FDS: usize = 4;

/// Why a request did not get a reply.
#[derive(Debug)]
pub enum ClientError {
    /// The socket could not be connected.
    Connect(io::Error),
    /// Reading or writing the socket failed, or the daemon hung up.
    Io(io::Error),
    /// The daemon sent a frame this client cannot accept.
    Frame(FrameError),
    /// The daemon sent something that is not a response of this protocol.
    Decode(String),
    /// The daemon refused the request.
    Refused(WireError),
}

impl ClientError {
    /// The error code this maps to in libwic. A daemon that hung up is "cannot reach wicd",
    /// however the hang-up showed (a broken pipe on write, a reset or end of file on read).
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Connect(_) => ErrorCode::Connect,
            Self::Io(e) if is_hang_up(e) => ErrorCode::Connect,
            Self::Io(_) => ErrorCode::Io,
            Self::Frame(_) | Self::Decode(_) => ErrorCode::Protocol,
            Self::Refused(e) => e.code,
        }
    }
}

fn is_hang_up(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof | io::ErrorKind::NotConnected)
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Connect(e) => write!(f, "cannot connect to wicd: {e}"),
            Self::Io(e) => write!(f, "wicd connection: {e}"),
            Self::Frame(e) => write!(f, "bad reply from wicd: {e}"),
            Self::Decode(e) => write!(f, "bad reply from wicd: {e}"),
            Self::Refused(e) => write!(f, "wicd refused: {e}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// What the daemon said about itself in its hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    pub version: String,
    pub backend: String,
    /// What a channel's placement size follows from (shim backend).
    pub warps_per_batch: u32,
}

/// A connected, greeted session with wicd.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
    daemon: Daemon,
}

impl Client {
    /// Connects to `path` and opens the session as `name`.
    pub fn connect(path: &Path, name: &str) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(path)
            .map_err(|e| ClientError::Connect(io::Error::new(e.kind(), format!("{}: {e}", path.display()))))?;
        let mut client = Self { stream, daemon: Daemon { version: String::new(), backend: String::new(), warps_per_batch: 0 } };
        match client.call(&Request::Hello { version: PROTOCOL_VERSION, client: name.to_owned() })? {
            Reply::Hello { daemon, backend, warps_per_batch, .. } => client.daemon = Daemon { version: daemon, backend, warps_per_batch },
            other => return Err(ClientError::Decode(format!("expected hello, got {other:?}"))),
        }
        Ok(client)
    }

    /// The daemon this session talks to.
    pub fn daemon(&self) -> &Daemon {
        &self.daemon
    }

    /// Sends `request` and returns the reply, dropping any descriptors that came with it.
    pub fn call(&mut self, request: &Request) -> Result<Reply, ClientError> {
        self.call_with_fds(request).map(|(reply, _)| reply)
    }

    /// Sends `request` and returns the reply with the descriptors passed along.
    pub fn call_with_fds(&mut self, request: &Request) -> Result<(Reply, Vec<OwnedFd>), ClientError> {
        self.call_passing(request, &[])
    }

    /// Sends `request` with `pass` as `SCM_RIGHTS` on its first byte, and returns the reply
    /// with the descriptors passed back.
    pub fn call_passing(&mut self, request: &Request, pass: &[BorrowedFd<'_>]) -> Result<(Reply, Vec<OwnedFd>), ClientError> {
        let body = serde_json::to_vec(request).expect("requests always serialize");
        let bytes = frame::encode(&body);
        if pass.is_empty() {
            self.send_raw(&bytes)?;
        } else {
            let raw: Vec<RawFd> = pass.iter().map(AsRawFd::as_raw_fd).collect();
            let rights = [ControlMessage::ScmRights(&raw)];
            let sent = sendmsg::<()>(self.stream.as_raw_fd(), &[IoSlice::new(&bytes)], &rights, MsgFlags::MSG_NOSIGNAL, None)
                .map_err(|e| ClientError::Io(e.into()))?;
            self.send_raw(&bytes[sent..])?;
        }
        let (body, fds) = self.receive()?;
        match serde_json::from_slice::<Response>(&body) {
            Ok(Response::Ok(reply)) => Ok((reply, fds)),
            Ok(Response::Error(e)) => Err(ClientError::Refused(e)),
            Err(e) => Err(ClientError::Decode(e.to_string())),
        }
    }

    /// Writes bytes as they are: for tests that speak broken protocol on purpose.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Reads one reply frame; for tests that check what broken requests get back.
    pub fn receive(&mut self) -> Result<(Vec<u8>, Vec<OwnedFd>), ClientError> {
        let mut fds = Vec::new();
        let mut header = [0u8; frame::HEADER_BYTES];
        self.recv_exact(&mut header, &mut fds)?;
        let len = frame::body_len(header, MAX_REPLY_BYTES).map_err(ClientError::Frame)?;
        let mut body = vec![0u8; len];
        self.recv_exact(&mut body, &mut fds)?;
        Ok((body, fds))
    }

    fn recv_exact(&self, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> Result<(), ClientError> {
        let mut filled = 0;
        while filled < buf.len() {
            let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
            let mut iov = [IoSliceMut::new(&mut buf[filled..])];
            let msg = recvmsg::<()>(self.stream.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
                .map_err(|e| ClientError::Io(e.into()))?;
            frame::take_passed_fds(&msg, fds).map_err(|e| ClientError::Io(e.into()))?;
            if msg.bytes == 0 {
                return Err(ClientError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "wicd closed the connection")));
            }
            filled += msg.bytes;
        }
        Ok(())
    }

    /// Whether the daemon has hung up, without blocking: how a stalled emulated warp notices
    /// that nobody will ever replay its fault.
    pub fn daemon_gone(&self) -> bool {
        let mut byte = [0u8; 1];
        match recv(self.stream.as_raw_fd(), &mut byte, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
            Ok(0) => true,
            Ok(_) => false,
            Err(nix::errno::Errno::EAGAIN) => false,
            Err(_) => true,
        }
    }
}
