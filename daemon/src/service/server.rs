//! The control plane: a tokio server on the Unix socket. It authenticates every connection by
//! its peer credentials, keeps who owns and who may use each channel, and forwards the work to
//! the fast path.
//!
//! A connection owns the channels it creates and the address space it attached (the shim
//! backend places channels in it; the emulated one observes its GPU faults). When it goes away,
//! for whatever reason, its channels are destroyed, their pages return to the pool and the
//! space is detached. Others reach a channel only through a single-use token from `grant`,
//! optionally bound to a uid.
//!
//! Every member of the socket's group may connect, so nothing a client can make wicd hold is
//! unbounded: connections (per uid, with a reserve for operators), channels and grant tokens
//! (per connection or channel, and per uid), the descriptors a request may carry, the time a
//! connection may take to say hello, to finish a request and to read a reply, and the
//! descriptors all of it needs together ([`quota`]). Each refusal is logged with the peer's
//! uid, rate-limited.

use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};
use wic_engine::PAGE_SIZE;
use wic_proto::frame::{self, FrameError};
use wic_proto::message::{
    ChannelInfo, ChannelSpec, ChannelSummary, ErrorCode, FdKind, Producer, Reply, Request, Response, Role, SlotInfo,
    Status, WireError,
};
use wic_proto::PROTOCOL_VERSION;
use wic_types::uvm_gpu::{UvmGpus, PROCFS_GPUS};

use super::control::{Control, Created, DataplaneHandle, PlacementRequest};
use super::quota::{self, RefusalLog};
use super::sharing::{self, GpuRules, SharingPolicy};
use crate::config::Limits;
use crate::nvml;

type ConnId = u64;

/// Room for the most descriptors one message can carry (the kernel's SCM_MAX_FD), so the
/// kernel never truncates: every descriptor sent arrives, and is closed if unwanted.
const SCM_MAX_FD: usize = 253;

/// Most descriptors one request carries: `attach_space` passes the UVM file, nothing else
/// passes any. Extra ones are closed as they arrive.
const MAX_FDS_PER_REQUEST: usize = 1;

/// Who is on the other end of a connection (SO_PEERCRED).
#[derive(Debug, Clone, Copy)]
struct Peer {
    pid: u32,
    uid: u32,
}

/// A channel as the control plane tracks it.
struct Record {
    owner: ConnId,
    owner_peer: Peer,
    info: ChannelInfo,
    consumer_region: Option<OwnedFd>,
    fault_doorbell: Option<OwnedFd>,
    producer_region: Option<OwnedFd>,
    publish_doorbell: Option<OwnedFd>,
    /// Connections attached through grants, with their role.
    attached: HashMap<ConnId, Role>,
    /// Pages of its placement: the pool's on the emulated backend, the application's own on the
    /// shim.
    pages: u64,
}

impl Record {
    fn holding(&self) -> Holding {
        Holding { uid: self.owner_peer.uid, slots: u64::from(self.info.spec.slots), pages: self.pages }
    }

    /// Whether `peer` on `conn` may see this channel in `channels`: operators see all, a user
    /// the channels of its own uid and those it attached to through a grant.
    fn visible_to(&self, conn: ConnId, peer: Peer, operator_uid: u32) -> bool {
        peer.uid == 0
            || peer.uid == operator_uid
            || self.owner_peer.uid == peer.uid
            || self.attached.contains_key(&conn)
    }

    fn role_of(&self, conn: ConnId) -> Option<Role> {
        if conn == self.owner {
            Some(Role::Owner)
        } else {
            self.attached.get(&conn).copied()
        }
    }

    /// The descriptors a role gets, with their kinds.
    fn fds_for(&self, role: Role) -> (Vec<FdKind>, Vec<RawFd>) {
        let mut kinds = Vec::new();
        let mut fds = Vec::new();
        if let (true, Some(region), Some(bell)) = (role.may_consume(), &self.consumer_region, &self.fault_doorbell) {
            kinds.extend([FdKind::ConsumerRegion, FdKind::FaultDoorbell]);
            fds.extend([region.as_raw_fd(), bell.as_raw_fd()]);
        }
        if let (true, Some(region), Some(bell)) = (role.may_publish(), &self.producer_region, &self.publish_doorbell) {
            kinds.extend([FdKind::ProducerRegion, FdKind::PublishDoorbell]);
            fds.extend([region.as_raw_fd(), bell.as_raw_fd()]);
        }
        (kinds, fds)
    }
}

/// A token from `grant`, not yet used.
struct Grant {
    channel: u32,
    role: Role,
    uid: Option<u32>,
    /// Who issued it: the channel owner's uid, which the per-uid bound counts against.
    issuer_uid: u32,
}

#[derive(Default)]
struct Registry {
    next_conn: ConnId,
    clients: HashMap<ConnId, Peer>,
    channels: HashMap<u32, Record>,
    tokens: HashMap<String, Grant>,
    /// The address space each connection attached.
    spaces: HashMap<ConnId, u32>,
    /// Channels being created, by connection (a connection makes one request at a time), with
    /// what they will hold: they count against the bounds before they exist, so concurrent
    /// creations cannot overshoot them.
    creating: HashMap<ConnId, Holding>,
    /// New channels are refused (`drain`), so that those there are can end before a restart.
    draining: bool,
}

/// Channels, slots and pages held together.
#[derive(Debug, Clone, Copy, Default)]
struct Held {
    channels: u64,
    slots: u64,
    pages: u64,
}

/// What a channel holds of what all users share, counted against its owner's uid.
#[derive(Debug, Clone, Copy, Default)]
struct Holding {
    uid: u32,
    slots: u64,
    pages: u64,
}

impl Registry {
    fn clients_of(&self, uid: u32) -> usize {
        self.clients.values().filter(|peer| peer.uid == uid).count()
    }

    fn spaces_of(&self, uid: u32) -> usize {
        self.spaces.keys().filter(|conn| self.clients.get(conn).is_some_and(|peer| peer.uid == uid)).count()
    }

    /// The channels of `uid`, those being created included: how many, their slots and pages.
    /// Whether `conn` holds nothing wicd keeps for it: no channel it owns, is attached to or is
    /// creating, and no address space.
    fn holds_nothing(&self, conn: ConnId) -> bool {
        !self.spaces.contains_key(&conn)
            && !self.creating.contains_key(&conn)
            && !self.channels.values().any(|r| r.owner == conn || r.attached.contains_key(&conn))
    }

    /// Channels, slots and pages held (or being created) by the uids `which` selects.
    fn holdings(&self, which: impl Fn(u32) -> bool) -> Held {
        let existing = self.channels.values().map(Record::holding);
        let all = existing.chain(self.creating.values().copied()).filter(|h| which(h.uid));
        all.fold(Held::default(), |held, h| Held {
            channels: held.channels + 1,
            slots: held.slots.saturating_add(h.slots),
            pages: held.pages.saturating_add(h.pages),
        })
    }
}

/// What the control plane needs of the engine's configuration.
#[derive(Debug, Clone, Copy)]
pub struct EngineShape {
    /// Warps per slot generation: what a channel's placement size follows from.
    pub warps_per_batch: u32,
    /// Slots and pool pages, which every user draws from.
    pub slots: u32,
    pub pool_pages: u32,
}

/// What every connection task shares.
pub struct Shared {
    limits: RwLock<Limits>,
    /// wicd's descriptor limit, which every bound together must fit.
    nofile: u64,
    pub dataplane: DataplaneHandle,
    pub backend: &'static str,
    pub gpus: u16,
    /// The engine's warps per slot generation: what a channel's placement size follows from.
    pub warps_per_batch: u32,
    /// The engine's slots and pool pages, which every user draws from.
    engine_slots: u64,
    pool_pages: u64,
    pub started: Instant,
    /// The daemon's own uid: with root, the operators who see every client's channels.
    operator_uid: u32,
    /// What to do at attach about GPUs that time-slice other contexts with held faults, and
    /// which GPUs channels may use; `None` where no fault is held (the emulated backend).
    gpu_rules: Option<GpuRules>,
    /// Whether the log said already that NVML cannot tell how the GPUs are shared.
    unchecked_gpus_told: AtomicBool,
    registry: Mutex<Registry>,
    refusals: Mutex<RefusalLog>,
}

impl Shared {
    /// Control-plane state around a running fast path; `nofile` is wicd's descriptor limit.
    /// Fails if `limits` could make wicd run out of descriptors.
    pub fn new(
        limits: Limits,
        nofile: u64,
        dataplane: DataplaneHandle,
        backend: &'static str,
        gpus: u16,
        engine: EngineShape,
        gpu_rules: Option<GpuRules>,
    ) -> Result<Arc<Self>, String> {
        let channels = quota::reserved_capacity(&limits, nofile)?;
        tracing::info!("descriptor limit {nofile}: room for {} clients and {channels} channels", limits.max_clients);
        Ok(Arc::new(Self {
            limits: RwLock::new(limits),
            nofile,
            dataplane,
            backend,
            gpus,
            warps_per_batch: engine.warps_per_batch,
            engine_slots: u64::from(engine.slots),
            pool_pages: u64::from(engine.pool_pages),
            started: Instant::now(),
            operator_uid: nix::unistd::geteuid().as_raw(),
            gpu_rules,
            unchecked_gpus_told: AtomicBool::new(false),
            registry: Mutex::new(Registry::default()),
            refusals: Mutex::new(RefusalLog::default()),
        }))
    }

    fn limits(&self) -> Limits {
        *self.limits.read().expect("limits lock")
    }

    /// Applies reloaded limits, unless they could make wicd run out of descriptors.
    pub fn set_limits(&self, limits: Limits) -> Result<(), String> {
        quota::reserved_capacity(&limits, self.nofile)?;
        // Against the engine as it runs: its sizes change only at a restart.
        let reserves = [
            ("reserved_slots", limits.reserved_slots, "engine.max_slots", self.engine_slots),
            ("reserved_pages", limits.reserved_pages, "engine.pool_pages", self.pool_pages),
        ];
        for (key, reserved, of, total) in reserves {
            if u64::from(reserved) >= total {
                return Err(format!("limits.{key} ({reserved}) must leave room below the running {of} ({total})"));
            }
        }
        *self.limits.write().expect("limits lock") = limits;
        Ok(())
    }

    /// Root and wicd's own user: they see every channel, are not held to the per-uid bounds
    /// and may take the connections reserved for them.
    fn is_operator(&self, peer: Peer) -> bool {
        self.is_operator_uid(peer.uid)
    }

    fn is_operator_uid(&self, uid: u32) -> bool {
        uid == 0 || uid == self.operator_uid
    }

    /// Logs a refusal with who was refused, unless too many of that uid's were logged just now.
    fn log_refusal(&self, peer: Peer, what: &str, e: &WireError) {
        if !self.refusals.lock().expect("refusal log lock").admit(peer.uid, Instant::now()) {
            return;
        }
        match e.code {
            // Bounds reached and broken protocol: what a misbehaving or hostile client causes.
            ErrorCode::Exhausted | ErrorCode::Protocol => {
                tracing::warn!(uid = peer.uid, pid = peer.pid, "{what} refused: {}", e.message)
            }
            _ => tracing::info!(uid = peer.uid, pid = peer.pid, "{what} refused ({}): {}", e.code.name(), e.message),
        }
    }

    /// Logs how many refusals of each uid the rate limit left out, once their period is over.
    pub fn log_left_out_refusals(&self) {
        for (uid, count) in self.refusals.lock().expect("refusal log lock").left_out(Instant::now()) {
            tracing::warn!(uid, "{count} more refusals of this uid not logged");
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().expect("registry lock")
    }
}

/// Accepts connections until the task is dropped.
pub async fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(serve_connection(shared.clone(), stream));
                // Lets the new connection be admitted or refused (and closed) before the next
                // accept: a flood of connections cannot pile up descriptors past the reserve.
                tokio::task::yield_now().await;
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

fn error(code: ErrorCode, message: impl Into<String>) -> WireError {
    WireError::new(code, message)
}

/// Sends a response, with `fds` passed along, within the request timeout: a client that does
/// not read its replies is not served further.
async fn send(stream: &mut UnixStream, response: &Response, fds: &[RawFd], limits: &Limits) -> io::Result<()> {
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

async fn send_error(stream: &mut UnixStream, e: WireError, limits: &Limits) -> io::Result<()> {
    send(stream, &Response::Error(e), &[], limits).await
}

fn deadline_in(ms: u64) -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_millis(ms)
}

/// Runs `work` until `deadline`; past it, a `TimedOut` error saying `what` was late.
async fn within<T>(
    deadline: tokio::time::Instant,
    what: impl FnOnce() -> String,
    work: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    tokio::time::timeout_at(deadline, work)
        .await
        .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, what())))
}

async fn serve_connection(shared: Arc<Shared>, mut stream: UnixStream) {
    let peer = match stream.peer_cred() {
        Ok(cred) => Peer { pid: cred.pid().unwrap_or(0) as u32, uid: cred.uid() },
        Err(e) => {
            tracing::warn!("connection without peer credentials refused: {e}");
            return;
        }
    };
    let limits = shared.limits();
    let conn = match register(&shared, peer, &limits) {
        Ok(conn) => conn,
        Err(e) => {
            shared.log_refusal(peer, "connection", &e);
            // The client reads this even if its hello could not be sent (wic-proto does).
            let _ = send_error(&mut stream, e, &limits).await;
            return;
        }
    };
    tracing::debug!(conn, pid = peer.pid, uid = peer.uid, "client connected");
    match session(&shared, &mut stream, conn, peer).await {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::TimedOut => {
            shared.log_refusal(peer, "connection", &error(ErrorCode::Protocol, format!("{e}; closing it")));
        }
        Err(e) => tracing::debug!(conn, "connection ended: {e}"),
    }
    disconnect(&shared, conn, peer).await;
}

/// Waits for the first byte of a greeted client's next request. Every `idle_close_ms` (with
/// the limits as they are then: a reload applies) it looks whether the connection, not an
/// operator's, holds nothing while three quarters of the connections users may take are taken
/// by users: every such connection is then closed, so that users who connect and wait cannot
/// lock others out.
async fn idle_wait(
    shared: &Shared,
    stream: &mut UnixStream,
    inbound: &mut Inbound,
    byte: &mut [u8],
    conn: ConnId,
    peer: Peer,
) -> io::Result<bool> {
    loop {
        let limits = shared.limits();
        // Without the rule, still a look every second, for a reload that sets it.
        let period = Duration::from_millis(if limits.idle_close_ms == 0 { 1000 } else { limits.idle_close_ms });
        // Dropped only while no byte has come: a one-byte read completes as soon as one does.
        if let Ok(begun) = tokio::time::timeout(period, inbound.read_exact(stream, byte)).await {
            return begun;
        }
        if limits.idle_close_ms == 0 || shared.is_operator(peer) {
            continue;
        }
        let registry = shared.registry();
        let users_part = u64::from(limits.max_clients - limits.reserved_clients);
        let users = registry.clients.values().filter(|p| !shared.is_operator(**p)).count() as u64;
        if 4 * users >= 3 * users_part && registry.holds_nothing(conn) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "idle for at least {} ms holding nothing while users hold {users} of their {users_part} connections",
                    limits.idle_close_ms
                ),
            ));
        }
    }
}

/// Records a new client, unless that would pass `max_clients`, take one of the connections
/// reserved for operators, or pass the uid's own bound.
fn register(shared: &Shared, peer: Peer, limits: &Limits) -> Result<ConnId, WireError> {
    let mut registry = shared.registry();
    let connected = registry.clients.len();
    if connected >= limits.max_clients as usize {
        return Err(error(
            ErrorCode::Exhausted,
            format!("too many clients: wicd serves at most {}", limits.max_clients),
        ));
    }
    if !shared.is_operator(peer) {
        if connected >= (limits.max_clients - limits.reserved_clients) as usize {
            return Err(error(
                ErrorCode::Exhausted,
                format!(
                    "too many clients: the last {} of {} connections are reserved for operators",
                    limits.reserved_clients, limits.max_clients
                ),
            ));
        }
        if registry.clients_of(peer.uid) >= limits.max_clients_per_uid as usize {
            return Err(error(
                ErrorCode::Exhausted,
                format!(
                    "too many clients: uid {} holds its limit of {} connections",
                    peer.uid, limits.max_clients_per_uid
                ),
            ));
        }
    }
    registry.next_conn += 1;
    let conn = registry.next_conn;
    registry.clients.insert(conn, peer);
    Ok(conn)
}

/// A connection's incoming bytes, with the descriptors passed along with them.
struct Inbound {
    /// The descriptors of the request arriving now, at most [`MAX_FDS_PER_REQUEST`].
    fds: Vec<OwnedFd>,
    /// Descriptors past that bound that came with it; they were closed on arrival.
    excess_fds: usize,
    control: Vec<u8>,
}

impl Inbound {
    fn new() -> Self {
        Self { fds: Vec::new(), excess_fds: 0, control: nix::cmsg_space!([RawFd; SCM_MAX_FD]) }
    }

    /// Fills `buf`; `false` when the peer hung up before its first byte.
    async fn read_exact(&mut self, stream: &UnixStream, buf: &mut [u8]) -> io::Result<bool> {
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

/// Serves requests until the peer hangs up, breaks the framing or runs out of time.
async fn session(shared: &Shared, stream: &mut UnixStream, conn: ConnId, peer: Peer) -> io::Result<()> {
    let connected = tokio::time::Instant::now();
    let mut greeted = false;
    let mut inbound = Inbound::new();
    loop {
        let limits = shared.limits();
        let hello_deadline = connected + Duration::from_millis(limits.hello_timeout_ms);
        let no_hello = || format!("no hello within {} ms of connecting", limits.hello_timeout_ms);
        let mut header = [0u8; frame::HEADER_BYTES];
        // Between requests a greeted client may stay silent as long as it likes while it holds
        // something (its channels are in use meanwhile), or while there is room for others.
        // Before its hello, a connection serves nobody.
        let begun = if greeted {
            idle_wait(shared, stream, &mut inbound, &mut header[..1], conn, peer).await?
        } else {
            within(hello_deadline, no_hello, inbound.read_exact(stream, &mut header[..1])).await?
        };
        if !begun {
            return Ok(());
        }
        let mut deadline = deadline_in(limits.request_timeout_ms);
        if !greeted {
            deadline = deadline.min(hello_deadline);
        }
        let late = || format!("a request did not arrive in full within {} ms", limits.request_timeout_ms);
        within(deadline, late, inbound.read_rest(stream, &mut header[1..])).await?;
        let len = match frame::body_len(header, limits.max_frame_bytes) {
            Ok(len) => len,
            Err(FrameError::Empty) => {
                inbound.take();
                refuse(shared, stream, peer, "request", error(ErrorCode::Protocol, "empty frame"), &limits).await?;
                continue;
            }
            Err(e @ FrameError::TooLarge { .. }) => {
                // The body cannot be skipped safely (it may never come): answer and hang up.
                let e = error(ErrorCode::Protocol, format!("{e}; closing the connection"));
                refuse(shared, stream, peer, "request", e, &limits).await?;
                return Ok(());
            }
        };
        let mut body = vec![0u8; len];
        within(deadline, late, inbound.read_rest(stream, &mut body)).await?;
        let (fds, excess_fds) = inbound.take();
        let request = match serde_json::from_slice::<Request>(&body) {
            Ok(request) => request,
            Err(e) => {
                refuse(
                    shared,
                    stream,
                    peer,
                    "request",
                    error(ErrorCode::Invalid, format!("malformed request: {e}")),
                    &limits,
                )
                .await?;
                continue;
            }
        };
        let op = op_name(&request);
        let hello = matches!(request, Request::Hello { .. });
        let outcome = if excess_fds > 0 {
            Err(error(
                ErrorCode::Invalid,
                format!("a request carries at most {MAX_FDS_PER_REQUEST} descriptor; the {excess_fds} more it came with were closed"),
            ))
        } else if !greeted && !hello {
            Err(error(ErrorCode::Protocol, "the first request must be hello"))
        } else if !fds.is_empty() && !matches!(request, Request::AttachSpace {}) {
            Err(error(ErrorCode::Invalid, "descriptors are accepted only with attach_space"))
        } else {
            handle(shared, conn, peer, request, fds).await
        };
        match outcome {
            Ok((reply, fds)) => {
                send(stream, &Response::Ok(reply), &fds, &limits).await?;
                greeted |= hello;
            }
            Err(e) => {
                refuse(shared, stream, peer, op, e, &limits).await?;
                // A peer speaking another protocol version cannot be served further, even
                // after an earlier hello went well.
                if hello {
                    return Ok(());
                }
            }
        }
    }
}

/// Logs a refusal and sends it.
async fn refuse(
    shared: &Shared,
    stream: &mut UnixStream,
    peer: Peer,
    what: &str,
    e: WireError,
    limits: &Limits,
) -> io::Result<()> {
    shared.log_refusal(peer, what, &e);
    send_error(stream, e, limits).await
}

/// The operation's name on the wire, for the log.
fn op_name(request: &Request) -> &'static str {
    match request {
        Request::Hello { .. } => "hello",
        Request::CreateChannel { .. } => "create_channel",
        Request::AttachSpace {} => "attach_space",
        Request::Watch { .. } => "watch",
        Request::DestroyChannel { .. } => "destroy_channel",
        Request::Grant { .. } => "grant",
        Request::Attach { .. } => "attach",
        Request::Publish { .. } => "publish",
        Request::Status {} => "status",
        Request::Channels {} => "channels",
        Request::Stats {} => "stats",
        Request::Drain { .. } => "drain",
    }
}

type Handled = Result<(Reply, Vec<RawFd>), WireError>;

async fn handle(shared: &Shared, conn: ConnId, peer: Peer, request: Request, fds: Vec<OwnedFd>) -> Handled {
    match request {
        Request::Hello { version, client } => {
            if version != PROTOCOL_VERSION {
                return Err(error(
                    ErrorCode::Protocol,
                    format!("protocol version {version} is not supported; this daemon speaks {PROTOCOL_VERSION}"),
                ));
            }
            tracing::debug!(conn, pid = peer.pid, "hello from {client}");
            let reply = Reply::Hello {
                version: PROTOCOL_VERSION,
                daemon: env!("CARGO_PKG_VERSION").into(),
                backend: shared.backend.into(),
                warps_per_batch: shared.warps_per_batch,
            };
            Ok((reply, Vec::new()))
        }
        Request::CreateChannel { spec, base_va } => create(shared, conn, peer, spec, base_va).await,
        Request::AttachSpace {} => attach_space(shared, conn, peer, fds).await,
        Request::Watch { base_va, length } => {
            let space = shared.registry().spaces.get(&conn).copied();
            let space = space.ok_or_else(|| {
                error(ErrorCode::Invalid, "watch names pages of an attached address space: attach_space first")
            })?;
            let end = base_va.checked_add(length).ok_or_else(|| error(ErrorCode::Invalid, "the range wraps around"))?;
            shared.dataplane.ask(|reply| Control::Watch { space, start: base_va, end, reply }).await??;
            tracing::debug!(space, pid = peer.pid, uid = peer.uid, "watching {length} bytes at {base_va:#x}");
            Ok((Reply::Done, Vec::new()))
        }
        Request::DestroyChannel { channel } => {
            owned(shared, conn, channel)?;
            unregister(shared, &[channel]);
            shared.dataplane.ask(|reply| Control::Destroy { channel, reply }).await??;
            tracing::debug!(channel, pid = peer.pid, uid = peer.uid, "channel destroyed");
            Ok((Reply::Done, Vec::new()))
        }
        Request::Grant { channel, role, uid } => grant(shared, conn, peer, channel, role, uid),
        Request::Attach { token } => attach(shared, conn, peer, &token),
        Request::Publish { channel, slot } => {
            let role = shared.registry().channels.get(&channel).map(|r| r.role_of(conn));
            match role {
                None => return Err(error(ErrorCode::NotFound, format!("no channel {channel}"))),
                Some(Some(role)) if role.may_publish() => {}
                Some(_) => return Err(error(ErrorCode::Permission, format!("not a producer of channel {channel}"))),
            }
            shared.dataplane.ask(|reply| Control::Publish { channel, slot, reply }).await??;
            Ok((Reply::Done, Vec::new()))
        }
        Request::Status {} => {
            let snapshot = shared.dataplane.ask(|reply| Control::Snapshot { reply }).await?;
            let registry = shared.registry();
            let status = Status {
                version: env!("CARGO_PKG_VERSION").into(),
                protocol: PROTOCOL_VERSION,
                pid: std::process::id(),
                backend: shared.backend.into(),
                gpus: shared.gpus,
                uptime_ns: shared.started.elapsed().as_nanos() as u64,
                clients: registry.clients.len() as u32,
                // Those being created too: a drain waits for them as well.
                channels: (registry.channels.len() + registry.creating.len()) as u32,
                held: snapshot.held,
                pool_pages: snapshot.stats.pool_pages,
                pool_pages_used: snapshot.stats.pool_pages_used,
                draining: registry.draining,
            };
            Ok((Reply::Status(status), Vec::new()))
        }
        Request::Channels {} => {
            let snapshot = shared.dataplane.ask(|reply| Control::Snapshot { reply }).await?;
            let registry = shared.registry();
            let mut channels: Vec<ChannelSummary> = registry
                .channels
                .values()
                .filter(|record| record.visible_to(conn, peer, shared.operator_uid))
                .map(|record| {
                    let counters = snapshot.channels.get(&record.info.channel).copied().unwrap_or_default();
                    ChannelSummary {
                        channel: record.info.channel,
                        owner_pid: record.owner_peer.pid,
                        owner_uid: record.owner_peer.uid,
                        spec: record.info.spec,
                        pages: 2 * record.info.spec.slots * record.info.pages_per_run,
                        attached: record.attached.len() as u32,
                        publishes: counters.publishes,
                        deliveries: counters.deliveries,
                        timeouts: counters.timeouts,
                        client_overflows: counters.client_overflows,
                    }
                })
                .collect();
            channels.sort_by_key(|c| c.channel);
            Ok((Reply::Channels { channels }, Vec::new()))
        }
        Request::Stats {} => {
            let mut stats = shared.dataplane.ask(|reply| Control::Snapshot { reply }).await?.stats;
            stats.clients = shared.registry().clients.len() as u32;
            Ok((Reply::Stats(Box::new(stats)), Vec::new()))
        }
        Request::Drain { on } => {
            if !shared.is_operator(peer) {
                return Err(error(ErrorCode::Permission, "only root and wicd's user may drain wicd"));
            }
            let was = std::mem::replace(&mut shared.registry().draining, on);
            if was != on {
                let what =
                    if on { "draining: new channels are refused" } else { "drain undone: channels may be created" };
                tracing::info!(pid = peer.pid, uid = peer.uid, "{what}");
            }
            Ok((Reply::Done, Vec::new()))
        }
    }
}

/// Checks that `conn` owns `channel`.
fn owned(shared: &Shared, conn: ConnId, channel: u32) -> Result<(), WireError> {
    match shared.registry().channels.get(&channel) {
        None => Err(error(ErrorCode::NotFound, format!("no channel {channel}"))),
        Some(record) if record.owner == conn => Ok(()),
        Some(_) => Err(error(ErrorCode::Permission, format!("channel {channel} belongs to another client"))),
    }
}

/// Issues a token for `channel`, within the bounds on unused tokens per channel and per uid.
fn grant(shared: &Shared, conn: ConnId, peer: Peer, channel: u32, role: Role, uid: Option<u32>) -> Handled {
    owned(shared, conn, channel)?;
    if role == Role::Owner {
        return Err(error(ErrorCode::Invalid, "ownership cannot be granted; grant producer or consumer"));
    }
    let limits = shared.limits();
    let token = new_token()?;
    let mut registry = shared.registry();
    let of_channel = registry.tokens.values().filter(|g| g.channel == channel).count();
    if of_channel >= limits.max_grants_per_channel as usize {
        return Err(error(
            ErrorCode::Exhausted,
            format!("channel {channel} has {of_channel} unused tokens, its limit: wait until they are used or destroy the channel"),
        ));
    }
    let of_uid = registry.tokens.values().filter(|g| g.issuer_uid == peer.uid).count();
    if !shared.is_operator(peer) && of_uid >= limits.max_grants_per_uid as usize {
        return Err(error(ErrorCode::Exhausted, format!("uid {} has {of_uid} unused tokens, its limit", peer.uid)));
    }
    registry.tokens.insert(token.clone(), Grant { channel, role, uid, issuer_uid: peer.uid });
    // Debug, not info: granting is routine, and a client granting in a loop must not fill the
    // journal.
    tracing::debug!(channel, ?role, ?uid, issuer_uid = peer.uid, pid = peer.pid, "grant issued");
    Ok((Reply::Token { token }, Vec::new()))
}

/// The space of a connection whose `attach_space` is under way.
const ATTACHING: u32 = u32::MAX;

/// Attaches the address space of the UVM file passed with the request.
async fn attach_space(shared: &Shared, conn: ConnId, peer: Peer, fds: Vec<OwnedFd>) -> Handled {
    let [uvm]: [OwnedFd; 1] = fds.try_into().map_err(|fds: Vec<OwnedFd>| {
        error(ErrorCode::Invalid, format!("attach_space takes one descriptor (the UVM file), got {}", fds.len()))
    })?;
    {
        let mut registry = shared.registry();
        if registry.spaces.contains_key(&conn) {
            return Err(error(ErrorCode::Busy, "this connection has attached its address space already"));
        }
        // Each attached space costs wicd a descriptor and, where GPU faults are observed, a
        // driver event queue of several MiB.
        let limit = shared.limits().max_spaces_per_uid;
        if !shared.is_operator(peer) && registry.spaces_of(peer.uid) >= limit as usize {
            return Err(error(
                ErrorCode::Exhausted,
                format!("uid {} has attached its limit of {limit} address spaces", peer.uid),
            ));
        }
        // Counted from now on, so that concurrent attachments cannot overshoot the bound.
        registry.spaces.insert(conn, ATTACHING);
    }
    let attached = match check_gpu_sharing(shared, peer).await {
        Ok(()) => shared.dataplane.ask(|reply| Control::AttachSpace { uvm, reply }).await.and_then(|result| result),
        Err(e) => Err(e),
    };
    let space = match attached {
        Ok(space) => space,
        Err(e) => {
            shared.registry().spaces.remove(&conn);
            return Err(e);
        }
    };
    shared.registry().spaces.insert(conn, space);
    tracing::debug!(space, pid = peer.pid, uid = peer.uid, "address space attached");
    Ok((Reply::Space { space }, Vec::new()))
}

/// The deployment rule for held faults, asked of NVML at each attachment (an operator may
/// change a GPU's compute mode between two): a GPU that time-slices other contexts with wic's
/// held faults is logged, or the attachment refused, as `[shim] gpu_sharing` says.
async fn check_gpu_sharing(shared: &Shared, peer: Peer) -> Result<(), WireError> {
    let Some(rules) = shared.gpu_rules.as_ref().filter(|r| r.sharing != SharingPolicy::Ignore) else { return Ok(()) };
    // NVML's calls reach the driver and can take a while: off the control plane's threads.
    let survey = tokio::task::spawn_blocking(nvml::survey)
        .await
        .map_err(|e| error(ErrorCode::Io, format!("checking the GPUs: {e}")))?;
    match sharing::check(rules, &survey) {
        Ok(warnings) => {
            // Without NVML every attachment would say the same: once is enough.
            let first_unchecked = survey.is_err() && !shared.unchecked_gpus_told.swap(true, Ordering::Relaxed);
            for warning in warnings {
                if survey.is_ok() || first_unchecked {
                    tracing::warn!(pid = peer.pid, uid = peer.uid, "attaching an address space: {warning}");
                } else {
                    tracing::debug!(pid = peer.pid, uid = peer.uid, "attaching an address space: {warning}");
                }
            }
            Ok(())
        }
        Err(refusal) => Err(error(ErrorCode::Unsupported, refusal)),
    }
}

async fn create(shared: &Shared, conn: ConnId, peer: Peer, spec: ChannelSpec, base_va: Option<u64>) -> Handled {
    let limits = shared.limits();
    if spec.slots == 0 || spec.message_bytes == 0 {
        return Err(error(ErrorCode::Invalid, "a channel needs at least one slot and one byte per message"));
    }
    if spec.message_bytes > limits.max_message_bytes {
        return Err(error(
            ErrorCode::Invalid,
            format!("message_bytes {} exceeds the limit of {}", spec.message_bytes, limits.max_message_bytes),
        ));
    }
    let engine_spec: wic_engine::ChannelSpec = spec.into();
    let pages = engine_spec.placement_bytes(shared.warps_per_batch).map_or(u64::MAX, |bytes| bytes / PAGE_SIZE);
    let holding = Holding { uid: peer.uid, slots: u64::from(spec.slots), pages };
    reserve_creation(shared, conn, peer, holding, &limits)?;
    let created = create_reserved(shared, conn, peer, spec, base_va, pages, &limits).await;
    shared.registry().creating.remove(&conn);
    created
}

/// Counts a channel about to be created against the bounds, or says which it would pass.
fn reserve_creation(shared: &Shared, conn: ConnId, peer: Peer, new: Holding, limits: &Limits) -> Result<(), WireError> {
    let mut registry = shared.registry();
    // Under the registry's lock, as `drain` sets it: a creation either counts in `creating`
    // before the drain begins, and so in the channels status reports, or is refused.
    if registry.draining {
        return Err(error(
            ErrorCode::Stopping,
            "wicd is draining for maintenance (wicctl drain): no new channels until the drain is undone or wicd restarts",
        ));
    }
    let owned = registry.channels.values().filter(|r| r.owner == conn).count();
    if owned >= limits.max_channels_per_client as usize {
        return Err(error(
            ErrorCode::Exhausted,
            format!("a client may own at most {} channels", limits.max_channels_per_client),
        ));
    }
    // Within the descriptor limit, the channels that fit besides every connection: past
    // them, accept() would fail with EMFILE and lock everyone out, operators included.
    let capacity = quota::channel_capacity(limits, shared.nofile).unwrap_or(0);
    let everyone = registry.holdings(|_| true);
    if everyone.channels >= capacity {
        return Err(error(
            ErrorCode::Exhausted,
            format!("wicd holds {capacity} channels, all its descriptor limit allows"),
        ));
    }
    if !shared.is_operator(peer) {
        // Channels, slots (the engine's tags) and pool pages are shared by every user: neither
        // one channel asking for all of them nor a group of uids each within its bounds may
        // lock the others out, and operators keep a reserve of each.
        let uid = peer.uid;
        let mine = registry.holdings(|owner| owner == uid);
        let others = registry.holdings(|owner| owner != uid && !shared.is_operator_uid(owner));
        // (what, total, reserved, per uid, held by everyone, by the other users, by this uid, asked)
        // On the shim a channel's pages are the application's own memory, not a pool wicd
        // has: they count against the uid's bound alone.
        let pages_pool = if shared.backend == "shim" { u64::MAX } else { shared.pool_pages };
        let pools = [
            (
                "channels",
                capacity,
                limits.reserved_channels,
                limits.max_channels_per_uid,
                everyone.channels,
                others.channels,
                mine.channels,
                1,
            ),
            (
                "slots",
                shared.engine_slots,
                limits.reserved_slots,
                limits.max_slots_per_uid,
                everyone.slots,
                others.slots,
                mine.slots,
                new.slots,
            ),
            (
                "pages",
                pages_pool,
                limits.reserved_pages,
                limits.max_pages_per_uid,
                everyone.pages,
                others.pages,
                mine.pages,
                new.pages,
            ),
        ];
        for (what, total, reserved, per_uid, all, theirs, held, more) in pools {
            let pool = quota::Pool { total, reserved: u64::from(reserved), per_uid: u64::from(per_uid) };
            if let Err(refusal) = quota::user_may_take(pool, all, theirs, held, more) {
                let why = match refusal {
                    quota::Refusal::Reserve => {
                        format!("the last {reserved} {what} of {total} are reserved for operators")
                    }
                    quota::Refusal::PerUid if what == "channels" => {
                        format!("uid {uid} owns its limit of {per_uid} channels")
                    }
                    quota::Refusal::PerUid => {
                        format!("uid {uid} holds {held} {what}; {more} more would pass its limit of {per_uid}")
                    }
                    quota::Refusal::Share { bound } => format!(
                        "uid {uid} holds {held} {what}; {more} more would pass its share of {bound}, half of what the other users leave"
                    ),
                };
                return Err(error(ErrorCode::Exhausted, why));
            }
        }
    }
    registry.creating.insert(conn, new);
    Ok(())
}

/// The longest channel timeout the module's `max_hold_ms` leaves: a quarter of the bound below
/// it, at least 100 ms, for the time between a fault's hold and wicd's reading of its record,
/// wicd's completion, and the module's own period, with room to spare.
pub fn longest_timeout_ns(bound_ms: u64) -> u64 {
    let bound_ns = bound_ms.saturating_mul(1_000_000);
    bound_ns.saturating_sub((bound_ns / 4).max(100_000_000))
}

async fn create_reserved(
    shared: &Shared,
    conn: ConnId,
    peer: Peer,
    mut spec: ChannelSpec,
    base_va: Option<u64>,
    pages: u64,
    limits: &Limits,
) -> Handled {
    if spec.timeout_ns == 0 {
        spec.timeout_ns = limits.default_timeout_ns();
    }
    let bound_ms = match shared.backend {
        "shim" => tokio::task::spawn_blocking(wic_kmod::device::module_max_hold_ms).await.ok().flatten(),
        _ => None,
    };
    if let Some(bound_ms) = bound_ms {
        // The module would end such a hold itself first, as a failure of the application's run
        // (and, where it cannot complete the whole run, leaving the slot's other run mapped).
        // Its clock starts when the fault is held, wicd's once wicd has read the record, and
        // the module looks every quarter of its bound: wicd's timeout must end well before.
        let longest = longest_timeout_ns(bound_ms);
        if spec.timeout_ns > longest {
            return Err(error(
                ErrorCode::Invalid,
                format!(
                    "timeout_ns {} is not well below wic_shim's max_hold_ms of {bound_ms} ms, which would end the hold first; ask for at most {longest} ns (0 takes limits.default_timeout_ms)",
                    spec.timeout_ns
                ),
            ));
        }
    }
    if let Some(rules) = shared.gpu_rules.as_ref().filter(|r| !r.allowed.is_empty()) {
        admit_gpus(rules, &spec).await?;
    }
    let engine_spec = spec.into();
    let placement = match base_va {
        None => None,
        Some(base_va) => match shared.registry().spaces.get(&conn) {
            Some(&space) => Some(PlacementRequest { space, base_va }),
            None => {
                return Err(error(
                    ErrorCode::Invalid,
                    "base_va names a place in an attached address space: attach_space first",
                ))
            }
        },
    };
    let created: Created =
        shared.dataplane.ask(|reply| Control::Create { spec: engine_spec, placement, reply }).await??;
    let layout = &created.layout;
    let info = ChannelInfo {
        channel: layout.id.0,
        role: Role::Owner,
        spec,
        pages_per_run: layout.pages_per_run,
        warps_per_batch: (layout.batch_bytes / u64::from(spec.message_bytes)) as u32,
        batch_bytes: layout.batch_bytes,
        slots: layout.slots.iter().map(|s| SlotInfo { runs: s.runs, pat: s.pat, tag: s.tag.0 }).collect(),
        fds: Vec::new(),
    };
    let record = Record {
        owner: conn,
        owner_peer: peer,
        info,
        consumer_region: created.consumer_region,
        fault_doorbell: created.fault_doorbell,
        producer_region: created.producer_region,
        publish_doorbell: created.publish_doorbell,
        attached: HashMap::new(),
        pages,
    };
    let (kinds, fds) = record.fds_for(Role::Owner);
    let mut info = record.info.clone();
    info.fds = kinds;
    tracing::debug!(channel = info.channel, pid = peer.pid, uid = peer.uid, slots = spec.slots, "channel created");
    let mut registry = shared.registry();
    registry.channels.insert(info.channel, record);
    // Counted once: from now as the channel, no longer as a creation.
    registry.creating.remove(&conn);
    drop(registry);
    Ok((Reply::Channel(info), fds))
}

/// Whether the channel's GPUs are among `[shim] gpus`, by nvidia-uvm's listing of its GPUs now.
async fn admit_gpus(rules: &GpuRules, spec: &ChannelSpec) -> Result<(), WireError> {
    let gpus = tokio::task::spawn_blocking(|| UvmGpus::read(Path::new(PROCFS_GPUS)))
        .await
        .map_err(|e| error(ErrorCode::Io, format!("reading nvidia-uvm's GPUs: {e}")))?
        .map_err(|e| error(ErrorCode::Unsupported, format!("{PROCFS_GPUS}: {e}: is nvidia-uvm loaded?")))?;
    rules
        .admit(&gpus, spec.consumer_gpu)
        .map_err(|why| error(ErrorCode::Permission, format!("consumer_gpu: {why}")))?;
    if let Producer::Gpu { gpu, .. } = spec.producer {
        rules.admit(&gpus, gpu).map_err(|why| error(ErrorCode::Permission, format!("producer gpu: {why}")))?;
    }
    Ok(())
}

fn attach(shared: &Shared, conn: ConnId, peer: Peer, token: &str) -> Handled {
    let mut registry = shared.registry();
    let Some(grant) = registry.tokens.get(token) else {
        return Err(error(ErrorCode::NotFound, "unknown or already used token"));
    };
    if grant.uid.is_some_and(|uid| uid != peer.uid) {
        // The token stays valid for the user it was issued to.
        return Err(error(ErrorCode::Permission, "this token was granted to another user"));
    }
    let channel = grant.channel;
    if registry.channels.get(&channel).is_some_and(|record| record.owner == conn) {
        // Refused before the token is used up: it is still good for whom it was meant for.
        return Err(error(ErrorCode::Invalid, "the owner already holds every role of its channel"));
    }
    let grant = registry.tokens.remove(token).expect("looked up above");
    let record = registry.channels.get_mut(&channel).expect("tokens of destroyed channels are dropped");
    record.attached.insert(conn, grant.role);
    let (kinds, fds) = record.fds_for(grant.role);
    let mut info = record.info.clone();
    info.role = grant.role;
    info.fds = kinds;
    tracing::debug!(channel = info.channel, pid = peer.pid, uid = peer.uid, role = ?grant.role, "attached");
    Ok((Reply::Channel(info), fds))
}

fn new_token() -> Result<String, WireError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| error(ErrorCode::Io, format!("no randomness for a token: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Drops the records of channels about to be destroyed, and their unused tokens. This comes
/// before the fast path destroys them: from then on their ids may be handed out again, and
/// the records of the new channels that get them must stay.
fn unregister(shared: &Shared, channels: &[u32]) {
    let mut registry = shared.registry();
    registry.channels.retain(|id, _| !channels.contains(id));
    registry.tokens.retain(|_, grant| !channels.contains(&grant.channel));
}

/// Releases everything a connection held: its channels are destroyed, its attachments dropped.
async fn disconnect(shared: &Shared, conn: ConnId, peer: Peer) {
    let (owned, space) = {
        let mut registry = shared.registry();
        registry.clients.remove(&conn);
        for record in registry.channels.values_mut() {
            record.attached.remove(&conn);
        }
        let owned: Vec<u32> = registry.channels.values().filter(|r| r.owner == conn).map(|r| r.info.channel).collect();
        (owned, registry.spaces.remove(&conn))
    };
    unregister(shared, &owned);
    for channel in owned {
        match shared.dataplane.ask(|reply| Control::Destroy { channel, reply }).await {
            Ok(Ok(())) | Err(_) => {}
            Ok(Err(e)) => tracing::warn!(channel, "reclaiming channel of a departed client: {e}"),
        }
        tracing::debug!(channel, conn, uid = peer.uid, "channel reclaimed: its owner disconnected");
    }
    if let Some(space) = space {
        // After the channels: their ranges are unregistered before the space goes.
        let _ = shared.dataplane.ask(|reply| Control::DetachSpace { space, reply }).await;
        tracing::debug!(space, conn, uid = peer.uid, "address space detached: its connection ended");
    }
}

#[cfg(test)]
mod tests {
    use super::longest_timeout_ns;

    #[test]
    fn a_timeout_stays_a_quarter_of_the_module_bound_below_it_and_at_least_100_ms() {
        assert_eq!(longest_timeout_ns(500), 375_000_000);
        assert_eq!(longest_timeout_ns(10_000), 7_500_000_000);
        assert_eq!(longest_timeout_ns(200), 100_000_000, "100 ms above a quarter");
        assert_eq!(longest_timeout_ns(50), 0, "no timeout fits");
        assert_eq!(longest_timeout_ns(u64::MAX), u64::MAX - u64::MAX / 4, "saturated");
    }
}
