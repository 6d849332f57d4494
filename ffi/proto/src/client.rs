//! A blocking client: connect, say hello, send requests and collect replies with the file
//! descriptors passed along with them.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::errno::Errno;
use nix::sys::socket::{recv, recvmsg, send, sendmsg, ControlMessage, MsgFlags};

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
    /// A request failed partway and the stream was shut down.
    broken: bool,
}

impl Client {
    /// Connects to `path` and opens the session as `name`.
    pub fn connect(path: &Path, name: &str) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(path)
            .map_err(|e| ClientError::Connect(io::Error::new(e.kind(), format!("{}: {e}", path.display()))))?;
        let mut client = Self { stream, daemon: Daemon { version: String::new(), backend: String::new(), warps_per_batch: 0 }, broken: false };
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
    ///
    /// A request that fails partway, sent in part or its reply read in part, leaves bytes on
    /// the stream that would be taken for the next reply: the connection is shut down, so
    /// every later call and [`Client::daemon_gone`] report a hang-up instead.
    pub fn call_passing(&mut self, request: &Request, pass: &[BorrowedFd<'_>]) -> Result<(Reply, Vec<OwnedFd>), ClientError> {
        if self.broken {
            return Err(ClientError::Io(io::Error::new(io::ErrorKind::NotConnected, "an earlier request failed partway")));
        }
        let exchanged = self.exchange(request, pass);
        if let Err(ClientError::Io(_) | ClientError::Frame(_)) = exchanged {
            self.broken = true;
            // Fails only if the daemon already hung up: nothing more to do then.
            let _ = self.stream.shutdown(Shutdown::Both);
        }
        let (body, fds) = exchanged?;
        match serde_json::from_slice::<Response>(&body) {
            Ok(Response::Ok(reply)) => Ok((reply, fds)),
            Ok(Response::Error(e)) => Err(ClientError::Refused(e)),
            Err(e) => Err(ClientError::Decode(e.to_string())),
        }
    }

    /// Sends one request frame and reads its reply frame.
    fn exchange(&mut self, request: &Request, pass: &[BorrowedFd<'_>]) -> Result<(Vec<u8>, Vec<OwnedFd>), ClientError> {
        let body = serde_json::to_vec(request).expect("requests always serialize");
        let bytes = frame::encode(&body);
        let mut sent = 0;
        if !pass.is_empty() {
            let raw: Vec<RawFd> = pass.iter().map(AsRawFd::as_raw_fd).collect();
            let rights = [ControlMessage::ScmRights(&raw)];
            sent = retry_interrupted(|| sendmsg::<()>(self.stream.as_raw_fd(), &[IoSlice::new(&bytes)], &rights, MsgFlags::MSG_NOSIGNAL, None))?;
        }
        self.send_raw(&bytes[sent..])?;
        self.receive()
    }

    /// Writes bytes as they are: for tests that speak broken protocol on purpose. A daemon
    /// that hung up is an error, never a `SIGPIPE`.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        let mut sent = 0;
        while sent < bytes.len() {
            sent += retry_interrupted(|| send(self.stream.as_raw_fd(), &bytes[sent..], MsgFlags::MSG_NOSIGNAL))?;
        }
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
            let msg = match recvmsg::<()>(self.stream.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
                // As in `retry_interrupted`, which cannot lend the buffers out.
                Err(Errno::EINTR) => continue,
                received => received.map_err(|e| ClientError::Io(e.into()))?,
            };
            frame::take_passed_fds(&msg, fds).map_err(|e| ClientError::Io(e.into()))?;
            if msg.bytes == 0 {
                return Err(ClientError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "wicd closed the connection")));
            }
            filled += msg.bytes;
        }
        Ok(())
    }

    /// Whether the daemon has hung up (or the connection was shut down after a failed
    /// request), without blocking: how a stalled emulated warp notices that nobody will ever
    /// replay its fault.
    pub fn daemon_gone(&self) -> bool {
        if self.broken {
            return true;
        }
        let mut byte = [0u8; 1];
        match recv(self.stream.as_raw_fd(), &mut byte, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
            Ok(0) => true,
            Ok(_) => false,
            Err(nix::errno::Errno::EAGAIN) => false,
            Err(_) => true,
        }
    }
}

/// Runs a socket call again while a signal interrupts it: a signal handler installed without
/// `SA_RESTART` must not fail a request halfway.
fn retry_interrupted<T>(mut call: impl FnMut() -> nix::Result<T>) -> Result<T, ClientError> {
    loop {
        match call() {
            Err(Errno::EINTR) => continue,
            other => return other.map_err(|e| ClientError::Io(e.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Stats;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;
    use std::path::PathBuf;
    use std::sync::mpsc;
    use std::thread::{self, JoinHandle};
    use std::time::Duration;

    fn read_request(stream: &mut UnixStream) -> Option<Request> {
        let mut header = [0u8; frame::HEADER_BYTES];
        stream.read_exact(&mut header).ok()?;
        let mut body = vec![0u8; frame::body_len(header, 1 << 20).ok()?];
        stream.read_exact(&mut body).ok()?;
        serde_json::from_slice(&body).ok()
    }

    fn reply_bytes(reply: Reply) -> Vec<u8> {
        frame::encode(&serde_json::to_vec(&Response::Ok(reply)).unwrap())
    }

    /// A daemon stand-in on a fresh socket for one connection: it greets, then hands the
    /// stream to `serve`.
    fn stand_in(name: &str, serve: impl FnOnce(&mut UnixStream) + Send + 'static) -> (PathBuf, JoinHandle<()>) {
        let dir = std::env::temp_dir().join(format!("wic-proto-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("wicd.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            assert!(matches!(read_request(&mut stream), Some(Request::Hello { .. })));
            let hello = Reply::Hello { version: PROTOCOL_VERSION, daemon: "stand-in".into(), backend: "emulated".into(), warps_per_batch: 16 };
            stream.write_all(&reply_bytes(hello)).unwrap();
            serve(&mut stream);
        });
        (path, server)
    }

    extern "C" fn ignore(_: libc::c_int) {}

    #[test]
    fn a_signal_during_a_request_does_not_fail_it() {
        // A handler without SA_RESTART: blocking socket calls return EINTR when it runs.
        let action = nix::sys::signal::SigAction::new(
            nix::sys::signal::SigHandler::Handler(ignore),
            nix::sys::signal::SaFlags::empty(),
            nix::sys::signal::SigSet::empty(),
        );
        // SAFETY: the handler does nothing, so it is async-signal-safe.
        unsafe { nix::sys::signal::sigaction(nix::sys::signal::Signal::SIGUSR1, &action) }.unwrap();
        let (path, server) = stand_in("eintr", |stream| {
            assert!(matches!(read_request(stream), Some(Request::Stats {})));
            thread::sleep(Duration::from_millis(300));
            stream.write_all(&reply_bytes(Reply::Stats(Box::new(Stats { replays: 7, ..Stats::default() })))).unwrap();
        });
        let (thread_id, receive_id) = mpsc::channel();
        let caller = thread::spawn(move || {
            let mut client = Client::connect(&path, "test").unwrap();
            // SAFETY: pthread_self has no preconditions.
            thread_id.send(unsafe { libc::pthread_self() }).unwrap();
            client.call(&Request::Stats {})
        });
        let caller_thread = receive_id.recv().unwrap();
        thread::sleep(Duration::from_millis(100));
        // SAFETY: the caller thread is alive until it has its reply, 200 ms from now.
        assert_eq!(unsafe { libc::pthread_kill(caller_thread, libc::SIGUSR1) }, 0);
        match caller.join().unwrap() {
            Ok(Reply::Stats(stats)) => assert_eq!(stats.replays, 7),
            other => panic!("the interrupted request got {other:?}"),
        }
        server.join().unwrap();
    }

    #[test]
    fn a_reply_read_in_part_ends_the_connection_rather_than_shifting_later_replies() {
        let (path, server) = stand_in("cut", |stream| {
            assert!(matches!(read_request(stream), Some(Request::Stats {})));
            // A header the client refuses, then a whole reply it must never take for the
            // answer to a later request.
            let mut bytes = u32::MAX.to_le_bytes().to_vec();
            bytes.extend(reply_bytes(Reply::Stats(Box::default())));
            stream.write_all(&bytes).unwrap();
            // Whatever else comes, the client must have hung up.
            while read_request(stream).is_some() {}
        });
        let mut client = Client::connect(&path, "test").unwrap();
        assert!(matches!(client.call(&Request::Stats {}), Err(ClientError::Frame(FrameError::TooLarge { .. }))));
        assert!(client.daemon_gone(), "the broken connection reads as a hang-up");
        match client.call(&Request::Stats {}) {
            Err(e) => assert_eq!(e.code(), ErrorCode::Connect, "{e}"),
            Ok(reply) => panic!("a later request got the earlier reply: {reply:?}"),
        }
        server.join().unwrap();
    }
}
