//! A session with wicd, shared by every channel opened through it.
//!
//! [`Client`] wraps the blocking [`wic_proto::client::Client`] in a mutex behind an [`Arc`]:
//! requests from several threads are serialised on the one socket, and channels keep the
//! connection alive after the [`Client`] itself is dropped (`wic_disconnect`), until the last
//! of them is closed.

use std::fmt;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use wic_proto::client::{Client as ProtoClient, ClientError, Daemon, Timeout};
use wic_proto::message::{ChannelSpec, ErrorCode, Producer, Reply, Request, Stats};

use crate::abi::{WicChannelSpec, WicStats, WIC_PRODUCER_GPU, WIC_PRODUCER_HOST};
use crate::channel::{self, Channel};
use crate::connection::Connection;

/// The name libwic gives itself in the daemon's logs.
pub const CLIENT_NAME: &str = "libwic";

/// Why a session request failed.
#[derive(Debug)]
pub enum Error {
    /// The request did not get a reply, or the daemon refused it.
    Request(ClientError),
    /// An argument libwic checks before asking the daemon was out of range.
    Invalid(&'static str),
    /// The daemon answered with something this version of libwic does not expect.
    Protocol(String),
    /// The channel the daemon handed out could not be opened.
    Channel(channel::Error),
}

impl Error {
    /// The error code this maps to in `wic.h`.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Request(e) => e.code(),
            Self::Invalid(_) => ErrorCode::Invalid,
            Self::Protocol(_) => ErrorCode::Protocol,
            Self::Channel(e) => e.code(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Request(e) => e.fmt(f),
            Self::Invalid(what) => write!(f, "invalid argument: {what}"),
            Self::Protocol(what) => write!(f, "unexpected answer from wicd: {what}"),
            Self::Channel(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Request(e) => Some(e),
            Self::Channel(e) => Some(e),
            Self::Invalid(_) | Self::Protocol(_) => None,
        }
    }
}

impl From<ClientError> for Error {
    fn from(e: ClientError) -> Self {
        Self::Request(e)
    }
}

impl From<channel::Error> for Error {
    fn from(e: channel::Error) -> Self {
        Self::Channel(e)
    }
}

/// A session with wicd.
#[derive(Debug)]
pub struct Client {
    conn: Arc<Connection>,
    daemon: Daemon,
}

impl Client {
    /// Connects to the daemon at `path`, else at [`wic_proto::socket_path`]`(None)`
    /// (`$WIC_SOCKET` or the default socket), and opens the session. Each request has the
    /// deadline `$WIC_TIMEOUT_MS` sets ([`Timeout::from_env`]); a malformed value is an
    /// [`ErrorCode::Invalid`] error.
    pub fn connect(path: Option<&Path>) -> Result<Self, Error> {
        let timeout = Timeout::from_env().map_err(ClientError::Setting)?;
        Self::connect_with_timeout(path, timeout)
    }

    /// [`Client::connect`] with the deadline of each request given: connecting and the hello
    /// together, then each request. A request that times out fails with
    /// [`ErrorCode::TimedOut`] and ends the connection, as the daemon's hanging up would: later
    /// requests, and the waits of the channels opened through this session, report
    /// [`ErrorCode::Connect`].
    pub fn connect_with_timeout(path: Option<&Path>, timeout: Timeout) -> Result<Self, Error> {
        let path: PathBuf = path.map_or_else(|| wic_proto::socket_path(None), Path::to_path_buf);
        let client = ProtoClient::connect_with_timeout(&path, CLIENT_NAME, timeout)?;
        let daemon = client.daemon().clone();
        Ok(Self { conn: Arc::new(Connection::new(client)), daemon })
    }

    /// What the daemon said about itself.
    pub fn daemon(&self) -> &Daemon {
        &self.daemon
    }

    /// Creates a channel owned by this session (emulated backend: the daemon places it).
    pub fn create_channel(&self, spec: &ChannelSpec) -> Result<Channel, Error> {
        self.create(spec, None)
    }

    /// Attaches this process's GPU address space, given its UVM file: on the shim backend the
    /// daemon can then place channels in the process's managed memory; on the emulated backend
    /// with an NVIDIA GPU present it observes the space's GPU faults. Returns the space id.
    pub fn attach_space(&self, uvm: BorrowedFd<'_>) -> Result<u32, Error> {
        match self.conn.call_passing(&Request::AttachSpace {}, &[uvm])? {
            Reply::Space { space } => Ok(space),
            other => Err(Error::Protocol(format!("expected a space, got {other:?}"))),
        }
    }

    /// Has wicd count and time the GPU faults on `[base_va, base_va + length)` of the attached
    /// space (emulated backend on a GPU with the stock driver: the faults the driver services).
    pub fn watch(&self, base_va: u64, length: u64) -> Result<(), Error> {
        match self.conn.call(&Request::Watch { base_va, length })? {
            Reply::Done => Ok(()),
            other => Err(Error::Protocol(format!("expected done, got {other:?}"))),
        }
    }

    /// Bytes of managed memory a channel of `spec` is placed in (shim backend).
    pub fn placement_bytes(&self, spec: &ChannelSpec) -> Result<u64, Error> {
        spec.placement_bytes(self.daemon.warps_per_batch)
            .ok_or(Error::Invalid("a channel needs a slot and a message byte, and a placement that fits in 64 bits"))
    }

    /// Creates a channel placed at `base_va` of the attached address space (shim backend):
    /// page-aligned managed memory of [`Client::placement_bytes`].
    pub fn create_channel_at(&self, spec: &ChannelSpec, base_va: u64) -> Result<Channel, Error> {
        self.create(spec, Some(base_va))
    }

    fn create(&self, spec: &ChannelSpec, base_va: Option<u64>) -> Result<Channel, Error> {
        let (reply, fds) = self.conn.call_with_fds(&Request::CreateChannel { spec: *spec, base_va })?;
        let Reply::Channel(info) = reply else {
            return Err(Error::Protocol(format!("expected a channel, got {reply:?}")));
        };
        let id = info.channel;
        Channel::open(Arc::clone(&self.conn), info, fds, base_va.is_some()).map_err(|e| {
            // The daemon holds a channel nobody can use: give it back. Best effort, the
            // daemon also drops it when this session ends.
            let _ = self.conn.call(&Request::DestroyChannel { channel: id });
            Error::Channel(e)
        })
    }

    /// Attaches to a channel with a token from [`Channel::grant`].
    pub fn attach(&self, token: &str) -> Result<Channel, Error> {
        let (reply, fds) = self.conn.call_with_fds(&Request::Attach { token: token.to_owned() })?;
        let Reply::Channel(info) = reply else {
            return Err(Error::Protocol(format!("expected a channel, got {reply:?}")));
        };
        Ok(Channel::open(Arc::clone(&self.conn), info, fds, false)?)
    }

    /// The daemon's statistics.
    pub fn stats(&self) -> Result<Stats, Error> {
        match self.conn.call(&Request::Stats {})? {
            Reply::Stats(stats) => Ok(*stats),
            other => Err(Error::Protocol(format!("expected stats, got {other:?}"))),
        }
    }
}

/// The channel spec a `struct wic_channel_spec` describes.
pub fn spec_from_abi(spec: &WicChannelSpec) -> Result<ChannelSpec, Error> {
    if spec.reserved != 0 {
        return Err(Error::Invalid("wic_channel_spec.reserved must be 0"));
    }
    let producer = match spec.producer_kind {
        WIC_PRODUCER_HOST => Producer::Host,
        WIC_PRODUCER_GPU => Producer::Gpu { gpu: spec.producer_gpu, base_va: spec.producer_base_va },
        _ => {
            return Err(Error::Invalid(
                "wic_channel_spec.producer_kind is neither WIC_PRODUCER_HOST nor WIC_PRODUCER_GPU",
            ))
        }
    };
    Ok(ChannelSpec {
        consumer_gpu: spec.consumer_gpu,
        producer,
        message_bytes: spec.message_bytes,
        slots: spec.slots,
        timeout_ns: spec.timeout_ns,
    })
}

/// The `struct wic_stats` view of the daemon's statistics.
pub fn stats_to_abi(stats: &Stats) -> WicStats {
    WicStats {
        faults_captured: stats.faults_captured,
        faults_held: stats.faults_held,
        faults_completed: stats.faults_completed,
        faults_timed_out: stats.faults_timed_out,
        faults_cancelled: stats.faults_cancelled,
        faults_ignored: stats.faults_ignored,
        dab_updates: stats.dab_updates,
        pat_faults: stats.pat_faults,
        host_publishes: stats.host_publishes,
        fault_buffer_overflows: stats.fault_buffer_overflows,
        replays: stats.replays,
        wake_latency_count: stats.wake_latency_ns.count,
        wake_latency_sum_ns: stats.wake_latency_ns.sum,
        wake_latency_max_ns: stats.wake_latency_ns.max,
        pfq_depth: stats.pfq_depth,
        pool_pages: stats.pool_pages,
        pool_pages_used: stats.pool_pages_used,
        pool_longest_free_run: stats.pool_longest_free_run,
        channels: stats.channels,
        clients: stats.clients,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wic_proto::message::Histogram;

    fn host_spec() -> WicChannelSpec {
        WicChannelSpec { message_bytes: 64, slots: 2, ..WicChannelSpec::default() }
    }

    #[test]
    fn specs_are_validated_and_mapped() {
        let spec = spec_from_abi(&host_spec()).unwrap();
        assert_eq!(spec.producer, Producer::Host);
        assert_eq!((spec.message_bytes, spec.slots, spec.timeout_ns), (64, 2, 0));
        let gpu = WicChannelSpec {
            consumer_gpu: 1,
            producer_kind: WIC_PRODUCER_GPU,
            producer_gpu: 3,
            producer_base_va: 0x7000_0000,
            timeout_ns: 5,
            ..host_spec()
        };
        let spec = spec_from_abi(&gpu).unwrap();
        assert_eq!(spec.producer, Producer::Gpu { gpu: 3, base_va: 0x7000_0000 });
        assert_eq!((spec.consumer_gpu, spec.timeout_ns), (1, 5));
        for bad in [WicChannelSpec { reserved: 1, ..host_spec() }, WicChannelSpec { producer_kind: 2, ..host_spec() }] {
            assert_eq!(spec_from_abi(&bad).unwrap_err().code(), ErrorCode::Invalid);
        }
    }

    #[test]
    fn stats_map_field_by_field() {
        let stats = Stats {
            faults_captured: 1,
            faults_held: 2,
            faults_completed: 3,
            faults_timed_out: 4,
            faults_cancelled: 5,
            faults_ignored: 6,
            pfq_depth: 7,
            dab_updates: 8,
            pat_faults: 9,
            host_publishes: 10,
            pool_pages: 11,
            pool_pages_used: 12,
            pool_longest_free_run: 13,
            wake_latency_ns: Histogram { count: 14, sum: 15, max: 16, buckets: vec![[16, 14]] },
            batch_sizes: Histogram::default(),
            fault_buffer_overflows: 17,
            replays: 18,
            channels: 19,
            clients: 20,
            // Observed faults are wicctl's, not in struct wic_stats.
            ..Stats::default()
        };
        let c = stats_to_abi(&stats);
        let words = [
            c.faults_captured,
            c.faults_held,
            c.faults_completed,
            c.faults_timed_out,
            c.faults_cancelled,
            c.faults_ignored,
            u64::from(c.pfq_depth),
            c.dab_updates,
            c.pat_faults,
            c.host_publishes,
            u64::from(c.pool_pages),
            u64::from(c.pool_pages_used),
            u64::from(c.pool_longest_free_run),
            c.wake_latency_count,
            c.wake_latency_sum_ns,
            c.wake_latency_max_ns,
            c.fault_buffer_overflows,
            c.replays,
            u64::from(c.channels),
            u64::from(c.clients),
        ];
        assert_eq!(words.to_vec(), (1..=20).collect::<Vec<u64>>());
    }

    #[test]
    fn connecting_to_nothing_is_a_connect_error() {
        let err = Client::connect(Some(Path::new("/nonexistent/wicd.sock"))).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Connect);
    }

    #[test]
    fn a_daemon_that_does_not_answer_times_out() {
        let dir = std::env::temp_dir().join(format!("libwic-silent-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("wicd.sock");
        // Connections wait in the backlog and are never answered.
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let limit = std::time::Duration::from_millis(300);
        let start = std::time::Instant::now();
        // On a thread, so that a connect without a deadline fails the test instead of hanging it.
        let (done, result) = std::sync::mpsc::channel();
        std::thread::spawn(move || done.send(Client::connect_with_timeout(Some(&path), Timeout::after(limit)).err()));
        let err = result
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("connect returned within 5 s")
            .expect("no daemon answered");
        let took = start.elapsed();
        assert_eq!(err.code(), ErrorCode::TimedOut, "{err}");
        assert_eq!(err.to_string(), "wicd did not answer within 300 ms");
        assert!(took >= limit && took < limit + std::time::Duration::from_secs(2), "gave up after {took:?}");
    }
}
