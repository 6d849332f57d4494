//! Requests, replies and error codes of protocol version [`crate::PROTOCOL_VERSION`].
//!
//! A connection starts with [`Request::Hello`]; every request gets exactly one [`Response`].
//! Replies that hand out shared memory carry file descriptors as `SCM_RIGHTS` on the reply's
//! first byte, in the order listed in [`ChannelInfo::fds`].

use serde::{Deserialize, Serialize};

/// Everything a client may ask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Opens the session; must be first. `client` names the program in logs.
    Hello { version: u32, client: String },
    /// Creates a channel owned by this connection. On the shim backend `base_va` is required:
    /// where the channel's pages start in the GPU address space this connection attached
    /// (page-aligned managed memory of [`ChannelInfo::placement_bytes`]); the emulated backend
    /// refuses it.
    CreateChannel {
        spec: ChannelSpec,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base_va: Option<u64>,
    },
    /// Attaches this process's GPU address space (its UVM file, passed as `SCM_RIGHTS` with
    /// the request's first byte): on the shim backend its channels are placed in it; on the
    /// emulated backend, where nvidia-uvm-tools exists (a GPU on the stock driver), wicd
    /// observes its GPU faults instead. One per connection, detached when the connection ends.
    AttachSpace {},
    /// Counts and times the GPU faults on `[base_va, base_va + length)` of the observed space
    /// (see [`Request::AttachSpace`]): pages an application's kernels fault on through the
    /// stock driver.
    Watch { base_va: u64, length: u64 },
    /// Destroys a channel this connection owns.
    DestroyChannel { channel: u32 },
    /// Issues a token that lets another process attach to a channel this connection owns.
    Grant { channel: u32, role: Role, uid: Option<u32> },
    /// Attaches to a channel with a token from [`Request::Grant`].
    Attach { token: String },
    /// Publishes a host producer's slot through the socket (the slow path; libwic uses shared
    /// memory and a doorbell instead).
    Publish { channel: u32, slot: u32 },
    /// Daemon identity, backend and load.
    Status {},
    /// Every channel with its owner and counters.
    Channels {},
    /// Engine and backend statistics.
    Stats {},
    /// Operators only (root and wicd's own user): with `on`, refuses every later
    /// `create_channel` with [`ErrorCode::Stopping`] until a `drain` with `on` false (or a
    /// restart of wicd), so that the channels there are can end before wicd is stopped: a
    /// fault on a channel's pages while no wicd runs is served with the page's old contents.
    /// Channels that exist keep working, attachments included. [`Status::draining`] says
    /// whether it is on.
    Drain { on: bool },
}

impl Request {
    /// The operation's name on the wire (its `op`), as logs name it.
    pub fn op(&self) -> &'static str {
        match self {
            Self::Hello { .. } => "hello",
            Self::CreateChannel { .. } => "create_channel",
            Self::AttachSpace {} => "attach_space",
            Self::Watch { .. } => "watch",
            Self::DestroyChannel { .. } => "destroy_channel",
            Self::Grant { .. } => "grant",
            Self::Attach { .. } => "attach",
            Self::Publish { .. } => "publish",
            Self::Status {} => "status",
            Self::Channels {} => "channels",
            Self::Stats {} => "stats",
            Self::Drain { .. } => "drain",
        }
    }
}

pub use wic_types::{ChannelSpec, Producer};

/// The part of a channel a process holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Created the channel: may publish, consume, grant and destroy.
    Owner,
    /// May publish.
    Producer,
    /// May consume.
    Consumer,
}

impl Role {
    /// Whether this role may publish data.
    pub fn may_publish(self) -> bool {
        matches!(self, Self::Owner | Self::Producer)
    }

    /// Whether this role may consume data.
    pub fn may_consume(self) -> bool {
        matches!(self, Self::Owner | Self::Consumer)
    }
}

/// A file descriptor passed with a channel reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FdKind {
    /// memfd of the consumer region ([`crate::shm::ConsumerLayout`]).
    ConsumerRegion,
    /// eventfd the consumer rings after posting faults.
    FaultDoorbell,
    /// memfd of the producer region ([`crate::shm::ProducerLayout`]).
    ProducerRegion,
    /// eventfd the producer rings after publishing.
    PublishDoorbell,
}

/// One slot as the device library addresses it. On the shim backend every address is in the
/// application's placement; on the emulated backend they are the daemon's pool addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotInfo {
    /// First VA of run P (even generations) and P' (odd generations).
    pub runs: [u64; 2],
    /// The slot's PAT pages, for a GPU producer.
    pub pat: Option<[u64; 2]>,
    pub tag: u32,
}

/// A channel as handed to the process that created or attached to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelInfo {
    pub channel: u32,
    pub role: Role,
    pub spec: ChannelSpec,
    pub pages_per_run: u32,
    pub warps_per_batch: u32,
    /// Bytes one slot carries per generation: `warps_per_batch * message_bytes`.
    pub batch_bytes: u64,
    pub slots: Vec<SlotInfo>,
    /// The descriptors passed with this reply, in order.
    pub fds: Vec<FdKind>,
}

/// Daemon identity and load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub protocol: u32,
    pub pid: u32,
    /// `emulated` or `shim`.
    pub backend: String,
    /// GPUs the emulated backend presents; 0 on the shim backend, which learns GPU ids from
    /// the faults.
    pub gpus: u16,
    pub uptime_ns: u64,
    pub clients: u32,
    pub channels: u32,
    pub held: u32,
    pub pool_pages: u32,
    pub pool_pages_used: u32,
    /// New channels are refused ([`Request::Drain`]).
    #[serde(default)]
    pub draining: bool,
}

/// One channel in [`Reply::Channels`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelSummary {
    pub channel: u32,
    pub owner_pid: u32,
    pub owner_uid: u32,
    pub spec: ChannelSpec,
    pub pages: u32,
    /// Processes attached through grants.
    pub attached: u32,
    pub publishes: u64,
    pub deliveries: u64,
    pub timeouts: u64,
    /// Faults the channel's consumers report they found its fault ring full (emulated
    /// backend): their own count, which wicd cannot check. The highest value wicd has read,
    /// so it never goes backwards; it goes with the channel and is in no daemon-wide total.
    #[serde(default)]
    pub client_overflows: u64,
}

/// A log2-bucketed histogram: `buckets` lists `[upper_bound_inclusive, count]` for non-empty
/// buckets in ascending order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Histogram {
    pub count: u64,
    pub sum: u64,
    pub max: u64,
    pub buckets: Vec<[u64; 2]>,
}

/// Engine and backend counters, cumulative since the daemon started unless said otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Fault-buffer entries fetched.
    pub faults_captured: u64,
    /// Requests that had to wait for their data.
    pub faults_held: u64,
    /// Requests completed with data.
    pub faults_completed: u64,
    /// Requests completed with the timeout marker.
    pub faults_timed_out: u64,
    /// Requests completed with the channel-closed or stopping marker.
    pub faults_cancelled: u64,
    /// Entries that were duplicates, stale or not ours.
    pub faults_ignored: u64,
    /// Requests waiting now.
    pub pfq_depth: u32,
    pub dab_updates: u64,
    /// Producer publishes seen as faults on PAT pages.
    pub pat_faults: u64,
    /// Host publishes (doorbell and socket).
    pub host_publishes: u64,
    pub pool_pages: u32,
    pub pool_pages_used: u32,
    pub pool_longest_free_run: u32,
    /// Fault to replay, nanoseconds.
    pub wake_latency_ns: Histogram,
    /// Entries per fetched batch.
    pub batch_sizes: Histogram,
    /// Fault-buffer overflows wicd itself saw. Shim backend: faults the module could not
    /// record, its ring or held table being full. Emulated backend: the times wicd found a
    /// channel's fault ring full (a whole ring's worth of entries read in one pass), one each
    /// however many warps were turned away; the warps' own counts are each channel's
    /// [`ChannelSummary::client_overflows`].
    pub fault_buffer_overflows: u64,
    /// Replays issued.
    pub replays: u64,
    /// Commands that could not be carried out: the module refused them, or they named pages
    /// or data the backend does not have. The daemon logs each.
    #[serde(default)]
    pub commands_failed: u64,
    /// Holds the kernel module ended at its own bound (`max_hold_ms`) before wicd completed
    /// them: each one a warp that stalled its GPU, and every other context time-sliced on it,
    /// for that long. Those of a hold wicd still waited on also count in `faults_timed_out`.
    /// Shim backend only.
    #[serde(default)]
    pub faults_expired_in_module: u64,
    pub channels: u32,
    pub clients: u32,
    /// Address spaces whose GPU faults are observed through nvidia-uvm-tools now.
    #[serde(default)]
    pub uvm_spaces: u32,
    /// Observed GPU faults on watched pages.
    #[serde(default)]
    pub uvm_faults_watched: u64,
    /// Observed GPU faults elsewhere in the observed spaces.
    #[serde(default)]
    pub uvm_faults_other: u64,
    /// Fault replays the driver reported.
    #[serde(default)]
    pub uvm_replays: u64,
    /// Watched faults whose replay was never seen.
    #[serde(default)]
    pub uvm_faults_unpaired: u64,
    /// Events the driver dropped because wicd's queue was full.
    #[serde(default)]
    pub uvm_events_dropped: u64,
    /// Watched fault fetched by the driver to the replay of its batch, nanoseconds (CPU clock).
    #[serde(default)]
    pub uvm_fault_latency_ns: Histogram,
    /// Watched fault written by the GPU to its replay done, nanoseconds (GPU clock).
    #[serde(default)]
    pub uvm_fault_gpu_latency_ns: Histogram,
    /// wicd's command batches to the kernel module and what they took. Shim backend only.
    #[serde(default)]
    pub submissions: Submissions,
}

/// Sums over wicd's command batches to the kernel module (shim backend) whose every command was
/// carried out and whose data, if any, came from host producers: each batch's time from its
/// submission to its last command's result, the pages it maps or unmaps as the emulator's model
/// counts them (two per page of a completed run: the companion's unmap and the run's map; one
/// per PAT page serviced or rearmed) and the bytes the module copied into runs. What a
/// least-squares fit of time, less the model's own cost of those copies, against pages needs:
/// time = `daemon.submission_ns` + `daemon.per_page_ns` x pages + copy. Cumulative, so the
/// difference of two snapshots covers what ran between them. Saturating.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submissions {
    pub count: u64,
    pub pages: u64,
    pub ns: u64,
    pub pages_squared: u64,
    pub pages_ns: u64,
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub pages_bytes: u64,
}

impl Submissions {
    /// Adds one batch of `pages` pages and `bytes` copied that took `ns`.
    pub fn record(&mut self, pages: u64, bytes: u64, ns: u64) {
        self.count = self.count.saturating_add(1);
        self.pages = self.pages.saturating_add(pages);
        self.ns = self.ns.saturating_add(ns);
        self.pages_squared = self.pages_squared.saturating_add(pages.saturating_mul(pages));
        self.pages_ns = self.pages_ns.saturating_add(pages.saturating_mul(ns));
        self.bytes = self.bytes.saturating_add(bytes);
        self.pages_bytes = self.pages_bytes.saturating_add(pages.saturating_mul(bytes));
    }
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reply {
    /// `warps_per_batch` sizes a channel's placement: see
    /// `wic_types::ChannelSpec::placement_bytes`.
    Hello {
        version: u32,
        daemon: String,
        backend: String,
        warps_per_batch: u32,
    },
    Channel(ChannelInfo),
    /// The space attached by [`Request::AttachSpace`].
    Space {
        space: u32,
    },
    Token {
        token: String,
    },
    Done,
    Status(Status),
    Channels {
        channels: Vec<ChannelSummary>,
    },
    Stats(Box<Stats>),
}

/// Every answer: `{"ok": …}` or `{"error": …}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Ok(Reply),
    Error(WireError),
}

/// A refused request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
}

impl WireError {
    /// An error with its explanation.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.name(), self.message)
    }
}

impl std::error::Error for WireError {}

/// Error codes, identical on the wire (by name) and in `wic.h` (as `-value`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[repr(i32)]
pub enum ErrorCode {
    /// A malformed request or an argument out of range.
    Invalid = 1,
    /// Not allowed for this peer.
    Permission = 2,
    /// No such channel, slot or token.
    NotFound = 3,
    /// The page pool, slot table or a per-client limit is exhausted.
    Exhausted = 4,
    /// The slot's previous data has not been delivered yet.
    Busy = 5,
    /// The wait exceeded the channel's timeout.
    TimedOut = 6,
    /// The channel was destroyed.
    Closed = 7,
    /// The daemon is stopping.
    Stopping = 8,
    /// The peer broke the protocol (bad frame, wrong version, missing hello).
    Protocol = 9,
    /// The daemon cannot be reached.
    Connect = 10,
    /// The backend cannot do this.
    Unsupported = 11,
    /// A system call failed.
    Io = 12,
    /// The generation asked for was overwritten by a newer one (device library only).
    Stale = 13,
    /// A stream broke the stream rule: the legacy default stream, or one whose queued copies
    /// did not run while the consumers waited (device library only).
    Stream = 14,
}

impl ErrorCode {
    /// Every code, in value order.
    pub const ALL: [Self; 14] = [
        Self::Invalid,
        Self::Permission,
        Self::NotFound,
        Self::Exhausted,
        Self::Busy,
        Self::TimedOut,
        Self::Closed,
        Self::Stopping,
        Self::Protocol,
        Self::Connect,
        Self::Unsupported,
        Self::Io,
        Self::Stale,
        Self::Stream,
    ];

    /// The name used on the wire and, prefixed with `WIC_E`, in `wic.h`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Invalid => "INVALID",
            Self::Permission => "PERMISSION",
            Self::NotFound => "NOT_FOUND",
            Self::Exhausted => "EXHAUSTED",
            Self::Busy => "BUSY",
            Self::TimedOut => "TIMED_OUT",
            Self::Closed => "CLOSED",
            Self::Stopping => "STOPPING",
            Self::Protocol => "PROTOCOL",
            Self::Connect => "CONNECT",
            Self::Unsupported => "UNSUPPORTED",
            Self::Io => "IO",
            Self::Stale => "STALE",
            Self::Stream => "STREAM",
        }
    }

    /// A one-line explanation, what `wic_strerror` returns.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Invalid => "invalid argument",
            Self::Permission => "permission denied",
            Self::NotFound => "no such channel, slot or token",
            Self::Exhausted => "resources exhausted",
            Self::Busy => "slot busy: previous data not yet delivered",
            Self::TimedOut => {
                "timed out: no data within the channel's timeout, or no answer from wicd within $WIC_TIMEOUT_MS"
            }
            Self::Closed => "channel closed",
            Self::Stopping => "daemon stopping",
            Self::Protocol => "protocol error",
            Self::Connect => "cannot reach wicd",
            Self::Unsupported => "not supported by this backend",
            Self::Io => "I/O error",
            Self::Stale => "stale: the generation was overwritten by a newer one, or an in-place publish missed it",
            Self::Stream => "stream rule broken: the publish's stream waits for the consumer kernel",
        }
    }

    /// The code for a C return value (`-value`).
    pub fn from_c(value: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|code| -(*code as i32) == value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_the_documented_json_shape() {
        let create = Request::CreateChannel {
            spec: ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes: 64, slots: 2, timeout_ns: 0 },
            base_va: None,
        };
        let json = serde_json::to_string(&create).unwrap();
        assert_eq!(
            json,
            r#"{"op":"create_channel","spec":{"consumer_gpu":0,"producer":"host","message_bytes":64,"slots":2,"timeout_ns":0}}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), create);
        let gpu: Producer = serde_json::from_str(r#"{"gpu":{"gpu":1,"base_va":4096}}"#).unwrap();
        assert_eq!(gpu, Producer::Gpu { gpu: 1, base_va: 4096 });
        assert_eq!(serde_json::to_string(&Request::Stats {}).unwrap(), r#"{"op":"stats"}"#);
        let placed: Request = serde_json::from_str(
            r#"{"op":"create_channel","spec":{"consumer_gpu":0,"producer":"host","message_bytes":64,"slots":2,"timeout_ns":0},"base_va":65536}"#,
        )
        .unwrap();
        assert!(matches!(placed, Request::CreateChannel { base_va: Some(65536), .. }));
        assert_eq!(serde_json::to_string(&Request::AttachSpace {}).unwrap(), r#"{"op":"attach_space"}"#);
    }

    #[test]
    fn unknown_ops_and_fields_are_rejected() {
        assert!(serde_json::from_str::<Request>(r#"{"op":"format_disk"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"destroy_channel","channel":1,"force":true}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"destroy_channel","channel":-1}"#).is_err());
        // Operations without arguments refuse them too.
        for op in ["status", "stats", "channels", "attach_space"] {
            let extra = format!(r#"{{"op":"{op}","verbose":true}}"#);
            let err = serde_json::from_str::<Request>(&extra).expect_err(&extra).to_string();
            assert!(err.contains("verbose"), "{extra}: {err}");
            assert!(serde_json::from_str::<Request>(&format!(r#"{{"op":"{op}"}}"#)).is_ok(), "{op}");
        }
    }

    #[test]
    fn a_channel_summary_without_client_overflows_reads_as_none_reported() {
        let json = r#"{"channel":1,"owner_pid":2,"owner_uid":3,"spec":{"consumer_gpu":0,"producer":"host","message_bytes":64,"slots":2,"timeout_ns":0},"pages":4,"attached":0,"publishes":5,"deliveries":5,"timeouts":0}"#;
        let summary: ChannelSummary = serde_json::from_str(json).unwrap();
        assert_eq!((summary.publishes, summary.client_overflows), (5, 0));
    }

    #[test]
    fn responses_are_ok_or_error() {
        let ok = serde_json::to_string(&Response::Ok(Reply::Done)).unwrap();
        assert_eq!(ok, r#"{"ok":{"kind":"done"}}"#);
        let err = Response::Error(WireError::new(ErrorCode::NotFound, "no channel 3"));
        assert_eq!(serde_json::to_string(&err).unwrap(), r#"{"error":{"code":"NOT_FOUND","message":"no channel 3"}}"#);
    }

    #[test]
    fn error_codes_are_distinct_and_round_trip_through_c_values() {
        for (i, code) in ErrorCode::ALL.iter().enumerate() {
            assert_eq!(*code as i32, i as i32 + 1);
            assert_eq!(ErrorCode::from_c(-(*code as i32)), Some(*code));
            let json = serde_json::to_string(code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.name()));
        }
        assert_eq!(ErrorCode::from_c(0), None);
        assert_eq!(ErrorCode::from_c(-(ErrorCode::ALL.len() as i32) - 1), None);
    }
}

#[cfg(test)]
mod reference {
    use super::*;

    const REFERENCE: &str = include_str!("../../../docs/protocol.md");

    /// The op names the reference lists in its request table (rows starting with a backticked op).
    fn documented_ops() -> Vec<String> {
        REFERENCE
            .lines()
            .filter_map(|line| line.strip_prefix("| `"))
            .filter_map(|rest| rest.split('`').next())
            .filter(|name| name.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn every_request_and_error_code_is_documented_and_nothing_else() {
        let requests = [
            Request::Hello { version: 1, client: String::new() },
            Request::CreateChannel {
                spec: ChannelSpec {
                    consumer_gpu: 0,
                    producer: Producer::Host,
                    message_bytes: 1,
                    slots: 1,
                    timeout_ns: 0,
                },
                base_va: None,
            },
            Request::AttachSpace {},
            Request::Watch { base_va: 0, length: 0 },
            Request::DestroyChannel { channel: 0 },
            Request::Grant { channel: 0, role: Role::Producer, uid: None },
            Request::Attach { token: String::new() },
            Request::Publish { channel: 0, slot: 0 },
            Request::Status {},
            Request::Channels {},
            Request::Stats {},
            Request::Drain { on: true },
        ];
        let mut ops: Vec<String> =
            requests.iter().map(|r| serde_json::to_value(r).unwrap()["op"].as_str().unwrap().to_owned()).collect();
        for (request, op) in requests.iter().zip(&ops) {
            assert_eq!(request.op(), op, "the name logs give {request:?}");
        }
        ops.sort();
        let mut documented = documented_ops();
        documented.sort();
        assert_eq!(documented, ops);
        for code in ErrorCode::ALL {
            let row = format!("| {} | `{}` |", code as i32, code.name());
            assert!(REFERENCE.contains(&row), "docs/protocol.md lacks the row {row}");
        }
    }
}
