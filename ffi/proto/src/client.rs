//! A blocking client: connect, say hello, send requests and collect replies with the file
//! descriptors passed along with them.
//!
//! Every request has a deadline ([`Timeout`]; `$WIC_TIMEOUT_MS`, 10 s by default): connecting
//! and the hello together, then each request's send and its whole reply. A daemon that stops
//! answering (stopped, hung, its listen backlog full) is [`ClientError::TimedOut`], not a hang.

use std::ffi::OsStr;
use std::fmt;
use std::io::{self, IoSlice};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    connect, recv, send, sendmsg, socket, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr,
};

use crate::frame::{self, FrameError, MAX_REPLY_BYTES};
use crate::message::{ErrorCode, Reply, Request, Response, WireError};
use crate::PROTOCOL_VERSION;

/// Most descriptors one reply carries.
const MAX_FDS: usize = 4;

/// Environment variable that sets the clients' [`Timeout`], in milliseconds.
pub const TIMEOUT_ENV: &str = "WIC_TIMEOUT_MS";

/// A request's deadline unless configured otherwise, in milliseconds.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;

/// Longest deadline that can be configured, in milliseconds: an hour. Longer ones are surely
/// typos; 0 waits without a deadline.
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// Longest pause between two connection attempts while the daemon's listen backlog is full.
const MAX_CONNECT_PAUSE: Duration = Duration::from_millis(20);

/// How long a request whose send found the daemon gone looks for a reply the daemon queued
/// before it hung up. Such a reply is already in the receive queue: this only bounds the wait
/// on a daemon that shut down its reading side but not its writing side.
const QUEUED_REPLY_GRACE: Duration = Duration::from_millis(100);

/// How long a request may take: connecting and the hello, or sending one request and reading
/// its whole reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeout(Option<Duration>);

impl Timeout {
    /// [`DEFAULT_TIMEOUT_MS`].
    pub const DEFAULT: Self = Self(Some(Duration::from_millis(DEFAULT_TIMEOUT_MS)));

    /// No deadline: wait for the daemon as long as it takes.
    pub const NEVER: Self = Self(None);

    /// A deadline `limit` after each request starts; for callers that budget their own time
    /// (zero fails every request that has to wait).
    pub fn after(limit: Duration) -> Self {
        Self(Some(limit))
    }

    /// `ms` milliseconds as configured: 0 is [`Timeout::NEVER`]; more than [`MAX_TIMEOUT_MS`]
    /// is refused.
    pub fn from_millis(ms: u64) -> Result<Self, String> {
        match ms {
            0 => Ok(Self::NEVER),
            1..=MAX_TIMEOUT_MS => Ok(Self::after(Duration::from_millis(ms))),
            _ => Err(format!("{ms} ms is more than the longest timeout, {MAX_TIMEOUT_MS} ms (0 waits without end)")),
        }
    }

    /// Parses a number of milliseconds, as `$WIC_TIMEOUT_MS` and `wicctl --timeout-ms` give it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let ms = text.parse::<u64>().map_err(|_| {
            format!("`{text}` is not a timeout: give whole milliseconds from 1 to {MAX_TIMEOUT_MS}, or 0 for none")
        })?;
        Self::from_millis(ms)
    }

    /// The timeout `$WIC_TIMEOUT_MS` sets: [`Timeout::DEFAULT`] where it is unset or empty, an
    /// error naming the variable where it is malformed.
    pub fn from_env() -> Result<Self, String> {
        Self::from_env_value(std::env::var_os(TIMEOUT_ENV).as_deref())
    }

    /// [`Timeout::from_env`] for the variable's value.
    pub fn from_env_value(value: Option<&OsStr>) -> Result<Self, String> {
        match value {
            None => Ok(Self::DEFAULT),
            Some(value) if value.is_empty() => Ok(Self::DEFAULT),
            Some(value) => {
                let text = value.to_str().ok_or_else(|| format!("{TIMEOUT_ENV} is not valid UTF-8"))?;
                Self::parse(text).map_err(|e| format!("{TIMEOUT_ENV}: {e}"))
            }
        }
    }

    /// The time allowed, or `None` for no deadline.
    pub fn limit(self) -> Option<Duration> {
        self.0
    }
}

impl fmt::Display for Timeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(limit) => write!(f, "{} ms", limit.as_millis()),
            None => f.write_str("no deadline"),
        }
    }
}

/// When the request under way must be done, and the limit that came from (for the error).
#[derive(Debug, Clone, Copy)]
struct Deadline {
    at: Instant,
    limit: Duration,
}

impl Deadline {
    /// The deadline of a request starting now; `None` without one (or one past the clock's
    /// range).
    fn start(timeout: Timeout) -> Option<Self> {
        let limit = timeout.limit()?;
        Some(Self { at: Instant::now().checked_add(limit)?, limit })
    }

    /// The time left, or the timeout error once none is.
    fn remaining(self) -> Result<Duration, ClientError> {
        match self.at.checked_duration_since(Instant::now()) {
            Some(left) if !left.is_zero() => Ok(left),
            _ => Err(ClientError::TimedOut(self.limit)),
        }
    }
}

/// Why a request did not get a reply.
#[derive(Debug)]
pub enum ClientError {
    /// The socket could not be connected.
    Connect(io::Error),
    /// Reading or writing the socket failed, or the daemon hung up.
    Io(io::Error),
    /// The daemon did not answer within the request's deadline, this long.
    TimedOut(Duration),
    /// The client's configuration is malformed (`$WIC_TIMEOUT_MS`).
    Setting(String),
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
            Self::TimedOut(_) => ErrorCode::TimedOut,
            Self::Setting(_) => ErrorCode::Invalid,
            Self::Frame(_) | Self::Decode(_) => ErrorCode::Protocol,
            Self::Refused(e) => e.code,
        }
    }
}

fn is_hang_up(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::NotConnected
    )
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connect(e) => write!(f, "cannot connect to wicd: {e}"),
            Self::Io(e) => write!(f, "wicd connection: {e}"),
            Self::TimedOut(limit) => write!(f, "wicd did not answer within {} ms", limit.as_millis()),
            Self::Setting(e) => f.write_str(e),
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
    /// Non-blocking: every wait is a `poll` bounded by the request's deadline.
    stream: UnixStream,
    daemon: Daemon,
    timeout: Timeout,
    /// A request failed partway or timed out, or the daemon hung up, and the stream was shut
    /// down.
    broken: bool,
}

impl Client {
    /// Connects to `path` and opens the session as `name`, with the [`Timeout`] of
    /// `$WIC_TIMEOUT_MS`.
    pub fn connect(path: &Path, name: &str) -> Result<Self, ClientError> {
        let timeout = Timeout::from_env().map_err(ClientError::Setting)?;
        Self::connect_with_timeout(path, name, timeout)
    }

    /// Connects to `path` and opens the session as `name`; `timeout` bounds the connection and
    /// the hello together, then each request.
    pub fn connect_with_timeout(path: &Path, name: &str, timeout: Timeout) -> Result<Self, ClientError> {
        let deadline = Deadline::start(timeout);
        let stream = connect_by(path, deadline)?;
        let daemon = Daemon { version: String::new(), backend: String::new(), warps_per_batch: 0 };
        let mut client = Self { stream, daemon, timeout, broken: false };
        let hello = Request::Hello { version: PROTOCOL_VERSION, client: name.to_owned() };
        match client.call_by(&hello, &[], deadline)?.0 {
            Reply::Hello { daemon, backend, warps_per_batch, .. } => {
                client.daemon = Daemon { version: daemon, backend, warps_per_batch }
            }
            other => return Err(ClientError::Decode(format!("expected hello, got {other:?}"))),
        }
        Ok(client)
    }

    /// The daemon this session talks to.
    pub fn daemon(&self) -> &Daemon {
        &self.daemon
    }

    /// The deadline of each request.
    pub fn timeout(&self) -> Timeout {
        self.timeout
    }

    /// Sets the deadline of the next requests.
    pub fn set_timeout(&mut self, timeout: Timeout) {
        self.timeout = timeout;
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
    /// A request that fails partway, sent in part or its reply read in part, or that times
    /// out, leaves bytes on the stream that would be taken for the next reply: the connection
    /// is shut down, so every later call and [`Client::daemon_gone`] report a hang-up instead.
    pub fn call_passing(
        &mut self,
        request: &Request,
        pass: &[BorrowedFd<'_>],
    ) -> Result<(Reply, Vec<OwnedFd>), ClientError> {
        self.call_by(request, pass, Deadline::start(self.timeout))
    }

    fn call_by(
        &mut self,
        request: &Request,
        pass: &[BorrowedFd<'_>],
        deadline: Option<Deadline>,
    ) -> Result<(Reply, Vec<OwnedFd>), ClientError> {
        if self.broken {
            return Err(ClientError::Io(io::Error::new(
                io::ErrorKind::NotConnected,
                "an earlier request failed partway",
            )));
        }
        let exchanged = self.exchange(request, pass, deadline);
        if let Err(ClientError::Io(_) | ClientError::Frame(_) | ClientError::TimedOut(_)) = exchanged {
            self.shut_down();
        }
        let (body, fds) = exchanged?;
        match serde_json::from_slice::<Response>(&body) {
            Ok(Response::Ok(reply)) => Ok((reply, fds)),
            Ok(Response::Error(e)) => Err(ClientError::Refused(e)),
            Err(e) => Err(ClientError::Decode(e.to_string())),
        }
    }

    /// Marks the connection unusable and shuts the stream down.
    fn shut_down(&mut self) {
        self.broken = true;
        // Fails only if the daemon already hung up: nothing more to do then.
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Sends one request frame and reads its reply frame.
    fn exchange(
        &mut self,
        request: &Request,
        pass: &[BorrowedFd<'_>],
        deadline: Option<Deadline>,
    ) -> Result<(Vec<u8>, Vec<OwnedFd>), ClientError> {
        let body = serde_json::to_vec(request).expect("requests always serialize");
        let bytes = frame::encode(&body);
        match self.send_by(&bytes, pass, deadline) {
            Ok(()) => self.receive_by(deadline),
            // A daemon that turns a connection away (too many clients) answers and hangs up
            // without reading the request, so the send may fail while the refusal is already
            // in the receive queue: that is the answer to give.
            Err(ClientError::Io(e)) if is_hang_up(&e) => {
                let grace = Instant::now() + QUEUED_REPLY_GRACE;
                let soon = match deadline {
                    Some(deadline) => Deadline { at: deadline.at.min(grace), ..deadline },
                    None => Deadline { at: grace, limit: QUEUED_REPLY_GRACE },
                };
                let queued = self.receive_by(Some(soon)).map_err(|_| ClientError::Io(e))?;
                // The daemon has hung up: no later request can reach it.
                self.shut_down();
                Ok(queued)
            }
            Err(e) => Err(e),
        }
    }

    /// Writes bytes as they are: for tests that speak broken protocol on purpose. A daemon
    /// that hung up is an error, never a `SIGPIPE`.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.send_by(bytes, &[], Deadline::start(self.timeout))
    }

    /// Writes `bytes`, with `pass` as `SCM_RIGHTS` on the first byte, by `deadline`.
    fn send_by(&self, bytes: &[u8], pass: &[BorrowedFd<'_>], deadline: Option<Deadline>) -> Result<(), ClientError> {
        let raw: Vec<RawFd> = pass.iter().map(AsRawFd::as_raw_fd).collect();
        let fd = self.stream.as_raw_fd();
        let mut sent = 0;
        while sent < bytes.len() {
            let result = if sent == 0 && !raw.is_empty() {
                let rights = [ControlMessage::ScmRights(&raw)];
                sendmsg::<()>(fd, &[IoSlice::new(bytes)], &rights, MsgFlags::MSG_NOSIGNAL, None)
            } else {
                send(fd, &bytes[sent..], MsgFlags::MSG_NOSIGNAL)
            };
            match result {
                Ok(n) => sent += n,
                Err(Errno::EAGAIN) => self.wait_for(PollFlags::POLLOUT, deadline)?,
                Err(e) => return Err(ClientError::Io(e.into())),
            }
        }
        Ok(())
    }

    /// Reads one reply frame; for tests that check what broken requests get back.
    pub fn receive(&mut self) -> Result<(Vec<u8>, Vec<OwnedFd>), ClientError> {
        self.receive_by(Deadline::start(self.timeout))
    }

    /// Reads one reply frame, all of it by `deadline`.
    fn receive_by(&self, deadline: Option<Deadline>) -> Result<(Vec<u8>, Vec<OwnedFd>), ClientError> {
        let mut fds = Vec::new();
        let mut header = [0u8; frame::HEADER_BYTES];
        self.recv_exact(&mut header, &mut fds, deadline)?;
        let len = frame::body_len(header, MAX_REPLY_BYTES).map_err(ClientError::Frame)?;
        let mut body = vec![0u8; len];
        self.recv_exact(&mut body, &mut fds, deadline)?;
        Ok((body, fds))
    }

    fn recv_exact(
        &self,
        buf: &mut [u8],
        fds: &mut Vec<OwnedFd>,
        deadline: Option<Deadline>,
    ) -> Result<(), ClientError> {
        let mut filled = 0;
        while filled < buf.len() {
            let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
            let received = match frame::recv_with_fds(
                self.stream.as_raw_fd(),
                &mut buf[filled..],
                &mut space,
                libc::MSG_CMSG_CLOEXEC,
                fds,
            ) {
                Ok((bytes, false)) => bytes,
                // Descriptors were lost: the reply cannot be used as sent.
                Ok((_, true)) => return Err(ClientError::Io(Errno::ENOBUFS.into())),
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    self.wait_for(PollFlags::POLLIN, deadline)?;
                    continue;
                }
                Err(e) => return Err(ClientError::Io(e)),
            };
            if received == 0 {
                return Err(ClientError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "wicd closed the connection",
                )));
            }
            filled += received;
        }
        Ok(())
    }

    /// Waits until the socket may be ready for `events`, or fails once `deadline` has passed.
    /// Returns early on a signal: the caller's next attempt finds out.
    fn wait_for(&self, events: PollFlags, deadline: Option<Deadline>) -> Result<(), ClientError> {
        let timeout = match deadline {
            // Rounded up, so that a wait never ends just before the deadline and spins.
            Some(deadline) => {
                PollTimeout::try_from(deadline.remaining()?.as_nanos().div_ceil(1_000_000)).unwrap_or(PollTimeout::MAX)
            }
            None => PollTimeout::NONE,
        };
        match poll(&mut [PollFd::new(self.stream.as_fd(), events)], timeout) {
            Ok(_) | Err(Errno::EINTR) => Ok(()),
            Err(e) => Err(ClientError::Io(e.into())),
        }
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

/// Connects a non-blocking socket to `path` by `deadline`. Where the daemon's listen backlog is
/// full, a blocking connect would wait in the kernel past any deadline; a non-blocking one
/// fails with `EAGAIN` instead, and is tried again a little later each time.
fn connect_by(path: &Path, deadline: Option<Deadline>) -> Result<UnixStream, ClientError> {
    let failed = |e: Errno| {
        let e = io::Error::from(e);
        ClientError::Connect(io::Error::new(e.kind(), format!("{}: {e}", path.display())))
    };
    let addr = UnixAddr::new(path).map_err(failed)?;
    let fd = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None)
        .map_err(failed)?;
    let mut pause = Duration::from_millis(1);
    loop {
        match connect(fd.as_raw_fd(), &addr) {
            Ok(()) => return Ok(UnixStream::from(fd)),
            Err(Errno::EAGAIN) => {
                thread::sleep(match deadline {
                    Some(deadline) => pause.min(deadline.remaining()?),
                    None => pause,
                });
                pause = (pause * 2).min(MAX_CONNECT_PAUSE);
            }
            Err(e) => return Err(failed(e)),
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
            let hello = Reply::Hello {
                version: PROTOCOL_VERSION,
                daemon: "stand-in".into(),
                backend: "emulated".into(),
                warps_per_batch: 16,
            };
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

    #[test]
    fn timeouts_parse_as_documented() {
        assert_eq!(Timeout::parse("0"), Ok(Timeout::NEVER));
        assert_eq!(Timeout::parse("1"), Ok(Timeout::after(Duration::from_millis(1))));
        assert_eq!(Timeout::parse("3600000"), Ok(Timeout::after(Duration::from_secs(3600))));
        for bad in ["", "3600001", "-1", "1.5", " 5", "5ms", "18446744073709551616"] {
            assert!(Timeout::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Timeout::from_env_value(None), Ok(Timeout::DEFAULT));
        assert_eq!(Timeout::from_env_value(Some(OsStr::new(""))), Ok(Timeout::DEFAULT), "empty is unset");
        assert_eq!(Timeout::from_env_value(Some(OsStr::new("250"))), Ok(Timeout::after(Duration::from_millis(250))));
        let bad = Timeout::from_env_value(Some(OsStr::new("ten"))).unwrap_err();
        assert!(bad.starts_with("WIC_TIMEOUT_MS: `ten` is not a timeout"), "{bad}");
        use std::os::unix::ffi::OsStrExt;
        assert!(Timeout::from_env_value(Some(OsStr::from_bytes(b"\xff"))).unwrap_err().contains("UTF-8"));
        assert_eq!(Timeout::DEFAULT.to_string(), "10000 ms");
    }

    /// The deadline the timeout tests give the client.
    const LIMIT: Duration = Duration::from_millis(400);

    /// Runs `f` on a thread and returns what it returned and how long it took; fails the test
    /// if that is more than 5 s, so that a client without a deadline cannot hang the test.
    fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> (T, Duration) {
        let (done, result) = mpsc::channel();
        let start = Instant::now();
        thread::spawn(move || done.send(f()));
        let value = result.recv_timeout(Duration::from_secs(5)).expect("the client returned within 5 s");
        (value, start.elapsed())
    }

    /// Checks that `result` is the timeout error, reported after the deadline but well before
    /// twice it.
    fn assert_timed_out<T: std::fmt::Debug>(result: Result<T, ClientError>, took: Duration) {
        match result {
            Err(e @ ClientError::TimedOut(_)) => {
                assert_eq!(e.code(), ErrorCode::TimedOut);
                assert_eq!(e.to_string(), format!("wicd did not answer within {} ms", LIMIT.as_millis()));
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(took >= LIMIT && took < LIMIT + Duration::from_secs(2), "gave up after {took:?}");
    }

    fn socket_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wic-proto-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_daemon_that_accepts_and_never_answers_times_out() {
        let path = socket_dir("silent").join("wicd.sock");
        let listener = UnixListener::bind(&path).unwrap();
        // Holds the connection open, reading nothing, until the test process ends.
        thread::spawn(move || {
            let held = listener.accept();
            thread::sleep(Duration::from_secs(3600));
            drop(held);
        });
        let (result, took) = bounded(move || Client::connect_with_timeout(&path, "test", Timeout::after(LIMIT)));
        assert_timed_out(result, took);
    }

    #[test]
    fn a_full_listen_backlog_times_out() {
        let path = socket_dir("backlog").join("wicd.sock");
        let listener = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).unwrap();
        nix::sys::socket::bind(listener.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
        // A backlog of 0 holds one connection not yet accepted; nothing is ever accepted here.
        nix::sys::socket::listen(&listener, nix::sys::socket::Backlog::new(0).unwrap()).unwrap();
        let _first = UnixStream::connect(&path).unwrap();
        let (result, took) = bounded(move || {
            let result = Client::connect_with_timeout(&path, "test", Timeout::after(LIMIT));
            drop(listener);
            result
        });
        assert_timed_out(result, took);
    }

    #[test]
    fn a_request_without_an_answer_times_out_and_ends_the_connection() {
        let (hung_up, saw_hang_up) = mpsc::channel();
        let (path, _server) = stand_in("mute", move |stream| {
            assert!(matches!(read_request(stream), Some(Request::Stats {})));
            // Say nothing until the client hangs up.
            let mut rest = Vec::new();
            hung_up.send(stream.read_to_end(&mut rest).is_ok()).unwrap();
        });
        let mut client = Client::connect_with_timeout(&path, "test", Timeout::after(LIMIT)).unwrap();
        let ((mut client, result), took) = bounded(move || {
            let result = client.call(&Request::Stats {});
            (client, result)
        });
        assert_timed_out(result, took);
        assert!(saw_hang_up.recv_timeout(Duration::from_secs(5)).unwrap(), "the client shut the connection down");
        assert!(client.daemon_gone());
        assert_eq!(client.call(&Request::Stats {}).unwrap_err().code(), ErrorCode::Connect);
    }

    #[test]
    fn the_deadline_covers_the_whole_reply_not_each_read() {
        let (path, _server) = stand_in("trickle", |stream| {
            assert!(matches!(read_request(stream), Some(Request::Stats {})));
            // A byte every 50 ms: each read gets something, the reply never completes in time.
            for byte in reply_bytes(Reply::Stats(Box::default())) {
                if stream.write_all(&[byte]).is_err() {
                    return;
                }
                thread::sleep(Duration::from_millis(50));
            }
        });
        let mut client = Client::connect_with_timeout(&path, "test", Timeout::after(LIMIT)).unwrap();
        let (result, took) = bounded(move || client.call(&Request::Stats {}));
        assert_timed_out(result, took);
    }

    #[test]
    fn a_refusal_sent_before_hanging_up_is_reported() {
        let dir = socket_dir("exhausted");
        let path = dir.join("wicd.sock");
        let listener = UnixListener::bind(&path).unwrap();
        const ATTEMPTS: usize = 50;
        // As wicd at max_clients: answer at once, without reading the hello, and hang up.
        thread::spawn(move || {
            let refusal = frame::encode(
                &serde_json::to_vec(&Response::Error(WireError::new(ErrorCode::Exhausted, "too many clients")))
                    .unwrap(),
            );
            for stream in listener.incoming().take(ATTEMPTS) {
                let _ = stream.unwrap().write_all(&refusal);
            }
        });
        let (outcomes, _) = bounded(move || {
            (0..ATTEMPTS)
                .map(|_| Client::connect_with_timeout(&path, "test", Timeout::after(Duration::from_secs(2))))
                .collect::<Vec<_>>()
        });
        let refused = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, Err(ClientError::Refused(e)) if e.code == ErrorCode::Exhausted && e.message == "too many clients"))
            .count();
        let other: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().err()).map(ToString::to_string).collect();
        assert_eq!(refused, ATTEMPTS, "{other:?}");
    }
}
