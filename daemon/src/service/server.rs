//! The control plane's socket shell: a tokio server on the Unix socket. It authenticates every
//! connection by its peer credentials, holds each to its deadlines, reads its requests and
//! dispatches them: what a request may do, and what it leaves behind, the [`registry`] decides
//! and records; the work goes to the fast path; the replies go back with their descriptors
//! ([`super::socket`]).
//!
//! Every member of the socket's group may connect, so nothing a client can make wicd hold is
//! unbounded: connections, channels, slots, pool pages, address spaces and grant tokens (the
//! registry's bounds, [`quota`]'s arithmetic), the descriptors a request may carry, the time a
//! connection may take to say hello, to finish a request and to read a reply, and the
//! descriptors all of it needs together. Each refusal is logged with the peer's uid,
//! rate-limited.

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use tokio::net::{UnixListener, UnixStream};
use wic_proto::message::{ChannelSpec, ErrorCode, Reply, Request, Response, Status, WireError};
use wic_proto::PROTOCOL_VERSION;

use super::admission::Admission;
use super::backend::BackendTraits;
use super::control::{Control, Created, DataplaneHandle};
use super::quota::{self, RefusalLog};
use super::registry::{self, Capacity, ConnId, Peer, Registry};
use super::sharing::GpuRules;
use super::socket::{deadline_in, send, send_error, within, Inbound, Incoming, MAX_FDS_PER_REQUEST};
use crate::config::Limits;

/// What every connection task shares.
pub struct Shared {
    limits: RwLock<Limits>,
    /// What the limits are checked against at a reload.
    capacity: Capacity,
    pub dataplane: DataplaneHandle,
    /// What the backend is: its name for clients, and what the rules below depend on.
    pub backend: BackendTraits,
    pub gpus: u16,
    pub started: Instant,
    /// The checks with I/O before the fast path is asked: the backend's bound on a hold, the
    /// rules on GPUs.
    admission: Admission,
    registry: Mutex<Registry>,
    refusals: Mutex<RefusalLog>,
}

impl Shared {
    /// Control-plane state around a running fast path. Fails if `limits` could make wicd run
    /// out of descriptors.
    pub fn new(
        limits: Limits,
        capacity: Capacity,
        dataplane: DataplaneHandle,
        backend: BackendTraits,
        gpus: u16,
        gpu_rules: Option<GpuRules>,
    ) -> Result<Arc<Self>, String> {
        let (nofile, channels) = (capacity.nofile, quota::reserved_capacity(&limits, capacity.nofile)?);
        tracing::info!("descriptor limit {nofile}: room for {} clients and {channels} channels", limits.max_clients);
        let operator_uid = nix::unistd::geteuid().as_raw();
        Ok(Arc::new(Self {
            limits: RwLock::new(limits),
            capacity,
            dataplane,
            backend,
            gpus,
            started: Instant::now(),
            admission: Admission::new(&backend, gpu_rules),
            registry: Mutex::new(Registry::new(operator_uid, capacity, Box::new(new_token))),
            refusals: Mutex::new(RefusalLog::default()),
        }))
    }

    fn limits(&self) -> Limits {
        *self.limits.read().expect("limits lock")
    }

    /// Applies reloaded limits, unless they could make wicd run out of descriptors or leave
    /// users nothing of the running engine.
    pub fn set_limits(&self, limits: Limits) -> Result<(), String> {
        self.capacity.check(&limits)?;
        *self.limits.write().expect("limits lock") = limits;
        Ok(())
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

    fn registry(&self) -> MutexGuard<'_, Registry> {
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

async fn serve_connection(shared: Arc<Shared>, mut stream: UnixStream) {
    let peer = match stream.peer_cred() {
        Ok(cred) => Peer { pid: cred.pid().unwrap_or(0) as u32, uid: cred.uid() },
        Err(e) => {
            tracing::warn!("connection without peer credentials refused: {e}");
            return;
        }
    };
    let limits = shared.limits();
    let connected = shared.registry().connect(peer, &limits);
    let conn = match connected {
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
/// the limits as they are then: a reload applies) it asks the registry whether the connection
/// is to be closed for holding nothing while users take most of their connections.
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
        if let Some(why) = shared.registry().idle_to_close(conn, peer, &limits) {
            let message = format!("idle for at least {} ms {why}", limits.idle_close_ms);
            return Err(io::Error::new(io::ErrorKind::TimedOut, message));
        }
    }
}

/// Serves requests until the peer hangs up, breaks the framing or runs out of time.
async fn session(shared: &Shared, stream: &mut UnixStream, conn: ConnId, peer: Peer) -> io::Result<()> {
    let connected = tokio::time::Instant::now();
    let mut greeted = false;
    let mut inbound = Inbound::default();
    loop {
        let limits = shared.limits();
        let hello_deadline = connected + Duration::from_millis(limits.hello_timeout_ms);
        let no_hello = || format!("no hello within {} ms of connecting", limits.hello_timeout_ms);
        let mut first = [0u8; 1];
        // Between requests a greeted client may stay silent as long as it likes while it holds
        // something (its channels are in use meanwhile), or while there is room for others.
        // Before its hello, a connection serves nobody.
        let begun = if greeted {
            idle_wait(shared, stream, &mut inbound, &mut first, conn, peer).await?
        } else {
            within(hello_deadline, no_hello, inbound.read_exact(stream, &mut first)).await?
        };
        if !begun {
            return Ok(());
        }
        let mut deadline = deadline_in(limits.request_timeout_ms);
        if !greeted {
            deadline = deadline.min(hello_deadline);
        }
        let late = || format!("a request did not arrive in full within {} ms", limits.request_timeout_ms);
        let (request, fds, excess_fds) =
            match inbound.read_request(stream, first[0], deadline, late, limits.max_frame_bytes).await? {
                Incoming::Request { request, fds, excess_fds } => (request, fds, excess_fds),
                Incoming::Refused(e) => {
                    refuse(shared, stream, peer, "request", e, &limits).await?;
                    continue;
                }
                Incoming::Closing(e) => {
                    refuse(shared, stream, peer, "request", e, &limits).await?;
                    return Ok(());
                }
            };
        let op = request.op();
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

type Handled = Result<(Reply, Vec<RawFd>), WireError>;

async fn handle(shared: &Shared, conn: ConnId, peer: Peer, request: Request, fds: Vec<OwnedFd>) -> Handled {
    let done = || -> Handled { Ok((Reply::Done, Vec::new())) };
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
                backend: shared.backend.name.into(),
                warps_per_batch: shared.capacity.warps_per_batch,
            };
            Ok((reply, Vec::new()))
        }
        Request::CreateChannel { spec, base_va } => create(shared, conn, peer, spec, base_va).await,
        Request::AttachSpace {} => attach_space(shared, conn, peer, fds).await,
        Request::Watch { base_va, length } => {
            let space = shared.registry().space_of(conn).ok_or_else(|| {
                error(ErrorCode::Invalid, "watch names pages of an attached address space: attach_space first")
            })?;
            let end = base_va.checked_add(length).ok_or_else(|| error(ErrorCode::Invalid, "the range wraps around"))?;
            shared.dataplane.ask(|reply| Control::Watch { space, start: base_va, end, reply }).await??;
            tracing::debug!(space, pid = peer.pid, uid = peer.uid, "watching {length} bytes at {base_va:#x}");
            done()
        }
        Request::DestroyChannel { channel } => {
            shared.registry().destroying(conn, channel)?;
            shared.dataplane.ask(|reply| Control::Destroy { channel, reply }).await??;
            tracing::debug!(channel, pid = peer.pid, uid = peer.uid, "channel destroyed");
            done()
        }
        Request::Grant { channel, role, uid } => {
            let limits = shared.limits();
            let token = shared.registry().grant(conn, peer, channel, role, uid, &limits)?;
            // Debug, not info: granting is routine, and a client granting in a loop must not
            // fill the journal.
            tracing::debug!(channel, ?role, ?uid, issuer_uid = peer.uid, pid = peer.pid, "grant issued");
            Ok((Reply::Token { token }, Vec::new()))
        }
        Request::Attach { token } => {
            let (info, fds) = shared.registry().attach(conn, peer, &token)?;
            tracing::debug!(channel = info.channel, pid = peer.pid, uid = peer.uid, role = ?info.role, "attached");
            Ok((Reply::Channel(info), fds))
        }
        Request::Publish { channel, slot } => {
            shared.registry().may_publish(conn, channel)?;
            shared.dataplane.ask(|reply| Control::Publish { channel, slot, reply }).await??;
            done()
        }
        Request::Status {} => {
            let snapshot = shared.dataplane.ask(|reply| Control::Snapshot { reply }).await?;
            let registry = shared.registry();
            let status = Status {
                version: env!("CARGO_PKG_VERSION").into(),
                protocol: PROTOCOL_VERSION,
                pid: std::process::id(),
                backend: shared.backend.name.into(),
                gpus: shared.gpus,
                uptime_ns: shared.started.elapsed().as_nanos() as u64,
                clients: registry.clients() as u32,
                channels: registry.channel_count() as u32,
                held: snapshot.held,
                pool_pages: snapshot.stats.pool_pages,
                pool_pages_used: snapshot.stats.pool_pages_used,
                draining: registry.draining(),
            };
            Ok((Reply::Status(status), Vec::new()))
        }
        Request::Channels {} => {
            let snapshot = shared.dataplane.ask(|reply| Control::Snapshot { reply }).await?;
            let channels = shared.registry().channels_seen_by(conn, peer, &snapshot.channels);
            Ok((Reply::Channels { channels }, Vec::new()))
        }
        Request::Stats {} => {
            let mut stats = shared.dataplane.ask(|reply| Control::Snapshot { reply }).await?.stats;
            stats.clients = shared.registry().clients() as u32;
            Ok((Reply::Stats(Box::new(stats)), Vec::new()))
        }
        Request::Drain { on } => {
            let mut registry = shared.registry();
            if !registry.is_operator(peer.uid) {
                return Err(error(ErrorCode::Permission, "only root and wicd's user may drain wicd"));
            }
            if registry.set_draining(on) != on {
                let what =
                    if on { "draining: new channels are refused" } else { "drain undone: channels may be created" };
                tracing::info!(pid = peer.pid, uid = peer.uid, "{what}");
            }
            done()
        }
    }
}

/// Attaches the address space of the UVM file passed with the request.
async fn attach_space(shared: &Shared, conn: ConnId, peer: Peer, fds: Vec<OwnedFd>) -> Handled {
    let [uvm]: [OwnedFd; 1] = fds.try_into().map_err(|fds: Vec<OwnedFd>| {
        error(ErrorCode::Invalid, format!("attach_space takes one descriptor (the UVM file), got {}", fds.len()))
    })?;
    let limits = shared.limits();
    shared.registry().reserve_space(conn, peer, &limits)?;
    let attached = async {
        shared.admission.space(peer).await?;
        shared.dataplane.ask(|reply| Control::AttachSpace { uvm, reply }).await?
    };
    let outcome = attached.await;
    let space = shared.registry().space_attached(conn, outcome)?;
    tracing::debug!(space, pid = peer.pid, uid = peer.uid, "address space attached");
    Ok((Reply::Space { space }, Vec::new()))
}

async fn create(shared: &Shared, conn: ConnId, peer: Peer, spec: ChannelSpec, base_va: Option<u64>) -> Handled {
    let limits = shared.limits();
    let pages = shared.registry().reserve_creation(conn, peer, &spec, &limits)?;
    let created = create_reserved(shared, conn, peer, spec, base_va, pages, &limits).await;
    shared.registry().creation_ended(conn);
    created
}

/// Creates a channel the registry counts already: after the checks that need I/O, by the fast
/// path.
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
    shared.admission.channel(&spec).await?;
    let placement = shared.registry().placement(conn, base_va)?;
    let created: Created = shared.dataplane.ask(|reply| Control::Create { spec, placement, reply }).await??;
    let (info, fds) = shared.registry().add_channel(conn, peer, spec, created, pages);
    tracing::debug!(channel = info.channel, pid = peer.pid, uid = peer.uid, slots = spec.slots, "channel created");
    Ok((Reply::Channel(info), fds))
}

/// A grant token: 16 random bytes in hex.
fn new_token() -> Result<String, WireError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| error(ErrorCode::Io, format!("no randomness for a token: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Releases everything a connection held: its channels are destroyed, its attachments dropped.
async fn disconnect(shared: &Shared, conn: ConnId, peer: Peer) {
    let registry::Left { channels, space } = shared.registry().disconnect(conn);
    for channel in channels {
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
