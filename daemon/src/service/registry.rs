//! The control plane's registry, sans-IO: who is connected, the channels and who owns, uses and
//! may see each, the address spaces connections attached, the grant tokens, and the bounds on
//! all a client may make wicd hold (connections, channels, slots, pool pages, address spaces,
//! tokens; their arithmetic is [`quota`]'s). It decides and records; the socket shell
//! ([`super::server`]) does the I/O around it: it asks the fast path to create, destroy or
//! attach what the registry admitted, and sends the replies.
//!
//! A connection owns the channels it creates and the address space it attached. When it goes
//! away, for whatever reason, the registry forgets them and names them to the shell, which
//! destroys the channels (their pages return to the pool) and detaches the space. Others reach
//! a channel only through a single-use token from `grant`, optionally bound to a uid.
//!
//! No sockets, no clock, no threads, no randomness (grant tokens come from a [`TokenSource`]):
//! its unit tests below drive it directly.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};

use wic_engine::PAGE_SIZE;
use wic_proto::message::{ChannelInfo, ChannelSpec, ChannelSummary, ErrorCode, FdKind, Role, SlotInfo, WireError};

use super::backend::ClientFds;
use super::control::{Created, PlacementRequest};
use super::core::ChannelCounters;
use super::quota;
use crate::config::Limits;

/// A connection, as the registry numbers them.
pub type ConnId = u64;

/// Who is on the other end of a connection (SO_PEERCRED).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub pid: u32,
    pub uid: u32,
}

/// What the bounds are measured against besides the limits (which a reload changes): fixed
/// while wicd runs.
#[derive(Debug, Clone, Copy)]
pub struct Capacity {
    /// wicd's descriptor limit, which every bound together must fit.
    pub nofile: u64,
    /// The engine's warps per slot generation: what a channel's placement size follows from.
    pub warps_per_batch: u32,
    /// The engine's slots and pool pages, which every user draws from.
    pub slots: u64,
    pub pool_pages: u64,
    /// Whether channels' pages come from that pool (emulated backend); otherwise (shim) they
    /// are the application's own memory, not a pool wicd has: they count against the uid's
    /// bound alone.
    pub pages_from_pool: bool,
}

impl Capacity {
    /// Whether `limits` fit: every connection and the channels' reserve within the descriptor
    /// limit, and the reserves of slots and pages below the engine's as it runs (its sizes
    /// change only at a restart).
    pub fn check(&self, limits: &Limits) -> Result<(), String> {
        quota::reserved_capacity(limits, self.nofile)?;
        let reserves = [
            ("reserved_slots", limits.reserved_slots, "engine.max_slots", self.slots),
            ("reserved_pages", limits.reserved_pages, "engine.pool_pages", self.pool_pages),
        ];
        for (key, reserved, of, total) in reserves {
            if u64::from(reserved) >= total {
                return Err(format!("limits.{key} ({reserved}) must leave room below the running {of} ({total})"));
            }
        }
        Ok(())
    }
}

/// A channel as the control plane tracks it.
struct Record {
    owner: ConnId,
    owner_peer: Peer,
    info: ChannelInfo,
    fds: ClientFds,
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
        let sides = [
            (role.may_consume(), &self.fds.consumer, [FdKind::ConsumerRegion, FdKind::FaultDoorbell]),
            (role.may_publish(), &self.fds.producer, [FdKind::ProducerRegion, FdKind::PublishDoorbell]),
        ];
        for (allowed, side, side_kinds) in sides {
            if let (true, Some(side)) = (allowed, side) {
                kinds.extend(side_kinds);
                fds.extend([side.region.as_raw_fd(), side.doorbell.as_raw_fd()]);
            }
        }
        (kinds, fds)
    }

    /// The channel's info as a connection of `role` gets it, and the descriptors that go with it.
    fn handed_to(&self, role: Role) -> (ChannelInfo, Vec<RawFd>) {
        let (kinds, fds) = self.fds_for(role);
        let mut info = self.info.clone();
        info.role = role;
        info.fds = kinds;
        (info, fds)
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

/// What a departed connection leaves for the shell to release: the channels it owned, already
/// forgotten here, to destroy, then the address space it attached, to detach.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Left {
    pub channels: Vec<u32>,
    pub space: Option<u32>,
}

/// Where grant tokens come from: randomness in wicd, a count in the tests.
pub type TokenSource = Box<dyn FnMut() -> Result<String, WireError> + Send>;

/// Who is connected, the channels, spaces and tokens, and the decisions on them.
pub struct Registry {
    /// wicd's own uid: with root, the operators, who see every channel, are not held to the
    /// per-uid bounds and may take what is reserved for them.
    operator_uid: u32,
    capacity: Capacity,
    new_token: TokenSource,
    next_conn: ConnId,
    clients: HashMap<ConnId, Peer>,
    channels: HashMap<u32, Record>,
    tokens: HashMap<String, Grant>,
    /// The address space each connection attached; `None` while its attachment is under way.
    spaces: HashMap<ConnId, Option<u32>>,
    /// Channels being created, by connection (a connection makes one request at a time), with
    /// what they will hold: they count against the bounds before they exist, so concurrent
    /// creations cannot overshoot them.
    creating: HashMap<ConnId, Holding>,
    /// New channels are refused (`drain`), so that those there are can end before a restart.
    draining: bool,
}

fn error(code: ErrorCode, message: impl Into<String>) -> WireError {
    WireError::new(code, message)
}

impl Registry {
    pub fn new(operator_uid: u32, capacity: Capacity, new_token: TokenSource) -> Self {
        Self {
            operator_uid,
            capacity,
            new_token,
            next_conn: 0,
            clients: HashMap::new(),
            channels: HashMap::new(),
            tokens: HashMap::new(),
            spaces: HashMap::new(),
            creating: HashMap::new(),
            draining: false,
        }
    }

    /// Root and wicd's own user.
    pub fn is_operator(&self, uid: u32) -> bool {
        uid == 0 || uid == self.operator_uid
    }

    /// Connections now.
    pub fn clients(&self) -> usize {
        self.clients.len()
    }

    /// Channels, those being created included: a drain waits for them as well.
    pub fn channel_count(&self) -> usize {
        self.channels.len() + self.creating.len()
    }

    pub fn draining(&self) -> bool {
        self.draining
    }

    /// Refuses new channels from now (`on`), or no longer; returns whether it did before.
    pub fn set_draining(&mut self, on: bool) -> bool {
        std::mem::replace(&mut self.draining, on)
    }

    fn clients_of(&self, uid: u32) -> usize {
        self.clients.values().filter(|peer| peer.uid == uid).count()
    }

    fn spaces_of(&self, uid: u32) -> usize {
        self.spaces.keys().filter(|conn| self.clients.get(conn).is_some_and(|peer| peer.uid == uid)).count()
    }

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

    /// Records a new client, unless that would pass `max_clients`, take one of the connections
    /// reserved for operators, or pass the uid's own bound.
    pub fn connect(&mut self, peer: Peer, limits: &Limits) -> Result<ConnId, WireError> {
        let connected = self.clients.len();
        if connected >= limits.max_clients as usize {
            return Err(error(
                ErrorCode::Exhausted,
                format!("too many clients: wicd serves at most {}", limits.max_clients),
            ));
        }
        if !self.is_operator(peer.uid) {
            if connected >= (limits.max_clients - limits.reserved_clients) as usize {
                return Err(error(
                    ErrorCode::Exhausted,
                    format!(
                        "too many clients: the last {} of {} connections are reserved for operators",
                        limits.reserved_clients, limits.max_clients
                    ),
                ));
            }
            if self.clients_of(peer.uid) >= limits.max_clients_per_uid as usize {
                return Err(error(
                    ErrorCode::Exhausted,
                    format!(
                        "too many clients: uid {} holds its limit of {} connections",
                        peer.uid, limits.max_clients_per_uid
                    ),
                ));
            }
        }
        self.next_conn += 1;
        let conn = self.next_conn;
        self.clients.insert(conn, peer);
        Ok(conn)
    }

    /// Why an idle connection is to be closed now, if it is: `idle_close_ms` is set, it is not
    /// an operator's, it holds nothing, and users hold three quarters of the connections they
    /// may take or more. So users who connect and wait cannot lock others out.
    pub fn idle_to_close(&self, conn: ConnId, peer: Peer, limits: &Limits) -> Option<String> {
        if limits.idle_close_ms == 0 || self.is_operator(peer.uid) {
            return None;
        }
        let users_part = u64::from(limits.max_clients - limits.reserved_clients);
        let users = self.clients.values().filter(|p| !self.is_operator(p.uid)).count() as u64;
        (4 * users >= 3 * users_part && self.holds_nothing(conn))
            .then(|| format!("holding nothing while users hold {users} of their {users_part} connections"))
    }

    /// Forgets a connection: its attachments are dropped, and its channels (with their unused
    /// tokens) and its address space forgotten and handed back to be released.
    pub fn disconnect(&mut self, conn: ConnId) -> Left {
        self.clients.remove(&conn);
        for record in self.channels.values_mut() {
            record.attached.remove(&conn);
        }
        let mut channels: Vec<u32> =
            self.channels.values().filter(|r| r.owner == conn).map(|r| r.info.channel).collect();
        channels.sort_unstable();
        let space = self.spaces.remove(&conn).flatten();
        self.unregister(&channels);
        Left { channels, space }
    }

    /// Counts the address space `conn` is about to attach against the bounds (each costs wicd
    /// a descriptor and, where GPU faults are observed, a driver event queue of several MiB),
    /// or says why it may not. Counted from now on, so that concurrent attachments cannot
    /// overshoot the bound; [`Registry::space_attached`] ends it.
    pub fn reserve_space(&mut self, conn: ConnId, peer: Peer, limits: &Limits) -> Result<(), WireError> {
        if self.spaces.contains_key(&conn) {
            return Err(error(ErrorCode::Busy, "this connection has attached its address space already"));
        }
        let limit = limits.max_spaces_per_uid;
        if !self.is_operator(peer.uid) && self.spaces_of(peer.uid) >= limit as usize {
            return Err(error(
                ErrorCode::Exhausted,
                format!("uid {} has attached its limit of {limit} address spaces", peer.uid),
            ));
        }
        self.spaces.insert(conn, None);
        Ok(())
    }

    /// Ends the attachment [`Registry::reserve_space`] counted: the space of `outcome` is
    /// `conn`'s from now on, or, refused, `conn` has none.
    pub fn space_attached(&mut self, conn: ConnId, outcome: Result<u32, WireError>) -> Result<u32, WireError> {
        match outcome {
            Ok(space) => self.spaces.insert(conn, Some(space)),
            Err(_) => self.spaces.remove(&conn),
        };
        outcome
    }

    /// The address space `conn` attached.
    pub fn space_of(&self, conn: ConnId) -> Option<u32> {
        self.spaces.get(&conn).copied().flatten()
    }

    /// Where a channel of `conn` goes with `base_va`: at that address of the space it attached.
    pub fn placement(&self, conn: ConnId, base_va: Option<u64>) -> Result<Option<PlacementRequest>, WireError> {
        let Some(base_va) = base_va else { return Ok(None) };
        match self.space_of(conn) {
            Some(space) => Ok(Some(PlacementRequest { space, base_va })),
            None => {
                Err(error(ErrorCode::Invalid, "base_va names a place in an attached address space: attach_space first"))
            }
        }
    }

    /// Counts a channel of `spec` about to be created by `conn` against the bounds, or says
    /// which it would pass; returns its pages. [`Registry::add_channel`] or
    /// [`Registry::creation_ended`] ends the count as a creation.
    pub fn reserve_creation(
        &mut self,
        conn: ConnId,
        peer: Peer,
        spec: &ChannelSpec,
        limits: &Limits,
    ) -> Result<u64, WireError> {
        if spec.slots == 0 || spec.message_bytes == 0 {
            return Err(error(ErrorCode::Invalid, "a channel needs at least one slot and one byte per message"));
        }
        if spec.message_bytes > limits.max_message_bytes {
            return Err(error(
                ErrorCode::Invalid,
                format!("message_bytes {} exceeds the limit of {}", spec.message_bytes, limits.max_message_bytes),
            ));
        }
        let placement = spec.placement_bytes(self.capacity.warps_per_batch);
        let pages = placement.map_or(u64::MAX, |bytes| bytes / PAGE_SIZE);
        let new = Holding { uid: peer.uid, slots: u64::from(spec.slots), pages };
        // The shell reads and sets the registry under one lock, as `drain` sets it: a creation
        // either counts in `creating` before the drain begins, and so in the channels status
        // reports, or is refused.
        if self.draining {
            return Err(error(
                ErrorCode::Stopping,
                "wicd is draining for maintenance (wicctl drain): no new channels until the drain is undone or wicd restarts",
            ));
        }
        let owned = self.channels.values().filter(|r| r.owner == conn).count();
        if owned >= limits.max_channels_per_client as usize {
            return Err(error(
                ErrorCode::Exhausted,
                format!("a client may own at most {} channels", limits.max_channels_per_client),
            ));
        }
        // Within the descriptor limit, the channels that fit besides every connection: past
        // them, accept() would fail with EMFILE and lock everyone out, operators included.
        let capacity = quota::channel_capacity(limits, self.capacity.nofile).unwrap_or(0);
        let everyone = self.holdings(|_| true);
        if everyone.channels >= capacity {
            return Err(error(
                ErrorCode::Exhausted,
                format!("wicd holds {capacity} channels, all its descriptor limit allows"),
            ));
        }
        if !self.is_operator(peer.uid) {
            self.user_may_create(peer.uid, new, capacity, everyone, limits)?;
        }
        self.creating.insert(conn, new);
        Ok(pages)
    }

    /// Channels, slots (the engine's tags) and pool pages are shared by every user: neither one
    /// channel asking for all of them nor a group of uids each within its bounds may lock the
    /// others out, and operators keep a reserve of each.
    fn user_may_create(
        &self,
        uid: u32,
        new: Holding,
        capacity: u64,
        everyone: Held,
        limits: &Limits,
    ) -> Result<(), WireError> {
        let mine = self.holdings(|owner| owner == uid);
        let others = self.holdings(|owner| owner != uid && !self.is_operator(owner));
        let pages_pool = if self.capacity.pages_from_pool { self.capacity.pool_pages } else { u64::MAX };
        // (what, total, reserved, per uid, held by everyone, by the other users, by this uid, asked)
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
                self.capacity.slots,
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
        Ok(())
    }

    /// A creation of `conn`'s no longer counts, whether it failed or became a channel.
    pub fn creation_ended(&mut self, conn: ConnId) {
        self.creating.remove(&conn);
    }

    /// Records the channel of `spec` the fast path created for `conn`, of `pages` pages;
    /// returns its info and the descriptors its owner gets.
    pub fn add_channel(
        &mut self,
        conn: ConnId,
        peer: Peer,
        spec: ChannelSpec,
        created: Created,
        pages: u64,
    ) -> (ChannelInfo, Vec<RawFd>) {
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
        let record = Record { owner: conn, owner_peer: peer, info, fds: created.fds, attached: HashMap::new(), pages };
        let handed = record.handed_to(Role::Owner);
        self.channels.insert(handed.0.channel, record);
        // Counted once: from now as the channel, no longer as a creation.
        self.creating.remove(&conn);
        handed
    }

    /// Checks that `conn` owns `channel`.
    fn owned(&self, conn: ConnId, channel: u32) -> Result<(), WireError> {
        match self.channels.get(&channel) {
            None => Err(error(ErrorCode::NotFound, format!("no channel {channel}"))),
            Some(record) if record.owner == conn => Ok(()),
            Some(_) => Err(error(ErrorCode::Permission, format!("channel {channel} belongs to another client"))),
        }
    }

    /// Checks that `conn` may publish on `channel`: it owns it or attached as its producer.
    pub fn may_publish(&self, conn: ConnId, channel: u32) -> Result<(), WireError> {
        match self.channels.get(&channel).map(|r| r.role_of(conn)) {
            None => Err(error(ErrorCode::NotFound, format!("no channel {channel}"))),
            Some(Some(role)) if role.may_publish() => Ok(()),
            Some(_) => Err(error(ErrorCode::Permission, format!("not a producer of channel {channel}"))),
        }
    }

    /// Forgets `channel`, which `conn` is about to destroy, if it owns it.
    pub fn destroying(&mut self, conn: ConnId, channel: u32) -> Result<(), WireError> {
        self.owned(conn, channel)?;
        self.unregister(&[channel]);
        Ok(())
    }

    /// Forgets channels about to be destroyed, and their unused tokens. This comes before the
    /// fast path destroys them: from then on their ids may be handed out again, and the records
    /// of the new channels that get them must stay.
    fn unregister(&mut self, channels: &[u32]) {
        self.channels.retain(|id, _| !channels.contains(id));
        self.tokens.retain(|_, grant| !channels.contains(&grant.channel));
    }

    /// Issues a token for `channel`, within the bounds on unused tokens
    /// per channel and per uid.
    pub fn grant(
        &mut self,
        conn: ConnId,
        peer: Peer,
        channel: u32,
        role: Role,
        uid: Option<u32>,
        limits: &Limits,
    ) -> Result<String, WireError> {
        self.owned(conn, channel)?;
        if role == Role::Owner {
            return Err(error(ErrorCode::Invalid, "ownership cannot be granted; grant producer or consumer"));
        }
        let token = (self.new_token)()?;
        let of_channel = self.tokens.values().filter(|g| g.channel == channel).count();
        if of_channel >= limits.max_grants_per_channel as usize {
            return Err(error(
                ErrorCode::Exhausted,
                format!("channel {channel} has {of_channel} unused tokens, its limit: wait until they are used or destroy the channel"),
            ));
        }
        let of_uid = self.tokens.values().filter(|g| g.issuer_uid == peer.uid).count();
        if !self.is_operator(peer.uid) && of_uid >= limits.max_grants_per_uid as usize {
            return Err(error(ErrorCode::Exhausted, format!("uid {} has {of_uid} unused tokens, its limit", peer.uid)));
        }
        self.tokens.insert(token.clone(), Grant { channel, role, uid, issuer_uid: peer.uid });
        Ok(token)
    }

    /// Attaches `conn` to the channel of `token` in the role it grants, using the token up;
    /// returns the channel's info and the descriptors that role gets.
    pub fn attach(&mut self, conn: ConnId, peer: Peer, token: &str) -> Result<(ChannelInfo, Vec<RawFd>), WireError> {
        let Some(grant) = self.tokens.get(token) else {
            return Err(error(ErrorCode::NotFound, "unknown or already used token"));
        };
        if grant.uid.is_some_and(|uid| uid != peer.uid) {
            // The token stays valid for the user it was issued to.
            return Err(error(ErrorCode::Permission, "this token was granted to another user"));
        }
        let channel = grant.channel;
        if self.channels.get(&channel).is_some_and(|record| record.owner == conn) {
            // Refused before the token is used up: it is still good for whom it was meant for.
            return Err(error(ErrorCode::Invalid, "the owner already holds every role of its channel"));
        }
        let grant = self.tokens.remove(token).expect("looked up above");
        let record = self.channels.get_mut(&channel).expect("tokens of destroyed channels are dropped");
        record.attached.insert(conn, grant.role);
        Ok(record.handed_to(grant.role))
    }

    /// The channels `peer` on `conn` may see, by id, with their counters: operators see all, a
    /// user the channels of its own uid and those it attached to through a grant.
    pub fn channels_seen_by(
        &self,
        conn: ConnId,
        peer: Peer,
        counters: &HashMap<u32, ChannelCounters>,
    ) -> Vec<ChannelSummary> {
        let visible = |record: &&Record| {
            self.is_operator(peer.uid) || record.owner_peer.uid == peer.uid || record.attached.contains_key(&conn)
        };
        let mut channels: Vec<ChannelSummary> = self
            .channels
            .values()
            .filter(visible)
            .map(|record| {
                let counters = counters.get(&record.info.channel).copied().unwrap_or_default();
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
        channels
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::os::fd::OwnedFd;

    use wic_engine::{ChannelId, ChannelLayout, SlotLayout, TagId};
    use wic_proto::message::Producer;

    use super::*;
    use crate::service::backend::SharedSide;
    use crate::service::quota::{FDS_PER_CHANNEL, FDS_PER_CONNECTION, FDS_RESERVED};

    /// wicd's own uid here; root is the other operator.
    const WICD: u32 = 900;
    const ROOT: u32 = 0;
    const ALICE: u32 = 1000;
    const BOB: u32 = 1001;

    /// The registry as the socket shell drives it, with the fast path stood in: it creates
    /// each channel the registry admits, with the next id, one page per run and a descriptor
    /// for each region and doorbell. Tokens are counted: `token-1`, `token-2`, ...
    struct Shell {
        registry: Registry,
        limits: Limits,
        next_channel: u32,
    }

    /// The descriptor limit that leaves room for `channels` channels besides every connection.
    fn nofile_for(limits: &Limits, channels: u64) -> u64 {
        FDS_RESERVED + FDS_PER_CONNECTION * u64::from(limits.max_clients) + FDS_PER_CHANNEL * channels
    }

    fn peer(uid: u32) -> Peer {
        Peer { pid: 10_000 + uid, uid }
    }

    fn spec(slots: u32) -> ChannelSpec {
        ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes: 64, slots, timeout_ns: 0 }
    }

    fn descriptor() -> OwnedFd {
        File::open("/dev/null").expect("/dev/null").into()
    }

    impl Shell {
        /// Room for 64 channels, one warp per batch (a channel of `n` slots holds `2n` pages), a
        /// pool of 4096 pages that channels draw from.
        fn new(limits: Limits) -> Self {
            let capacity = Capacity {
                nofile: nofile_for(&limits, 64),
                warps_per_batch: 1,
                slots: 4096,
                pool_pages: 4096,
                pages_from_pool: true,
            };
            Self::with(limits, capacity)
        }

        fn with(limits: Limits, capacity: Capacity) -> Self {
            let mut issued = 0;
            let tokens: TokenSource = Box::new(move || {
                issued += 1;
                Ok(format!("token-{issued}"))
            });
            Self { registry: Registry::new(WICD, capacity, tokens), limits, next_channel: 1 }
        }

        fn connect(&mut self, uid: u32) -> ConnId {
            self.registry.connect(peer(uid), &self.limits).expect("connected")
        }

        /// `conn` of `uid` creates a channel of `slots` slots: counted, created, recorded.
        fn create(&mut self, conn: ConnId, uid: u32, slots: u32) -> Result<u32, WireError> {
            let pages = self.registry.reserve_creation(conn, peer(uid), &spec(slots), &self.limits)?;
            let id = self.next_channel;
            self.next_channel += 1;
            let layout = ChannelLayout {
                id: ChannelId(id),
                pages_per_run: 1,
                batch_bytes: 64,
                slots: (0..slots).map(|s| SlotLayout { runs: [0, 1], tag: TagId(s), pat: None }).collect(),
            };
            let side = || Some(SharedSide { region: descriptor(), doorbell: descriptor() });
            let created = Created { layout, fds: ClientFds { consumer: side(), producer: side() } };
            let (info, fds) = self.registry.add_channel(conn, peer(uid), spec(slots), created, pages);
            assert_eq!((info.role, fds.len()), (Role::Owner, 4), "its owner gets every descriptor");
            Ok(info.channel)
        }

        fn grant(
            &mut self,
            conn: ConnId,
            uid: u32,
            channel: u32,
            role: Role,
            to: Option<u32>,
        ) -> Result<String, WireError> {
            self.registry.grant(conn, peer(uid), channel, role, to, &self.limits)
        }

        /// `conn` of `uid` attaches with `token`: the role it got and the descriptors' kinds.
        fn attach(&mut self, conn: ConnId, uid: u32, token: &str) -> Result<(Role, Vec<FdKind>), WireError> {
            let (info, fds) = self.registry.attach(conn, peer(uid), token)?;
            assert_eq!(info.fds.len(), fds.len());
            Ok((info.role, info.fds))
        }

        /// The channels `conn` of `uid` sees, by id.
        fn seen(&self, conn: ConnId, uid: u32) -> Vec<u32> {
            self.registry.channels_seen_by(conn, peer(uid), &HashMap::new()).iter().map(|c| c.channel).collect()
        }
    }

    fn refused<T: std::fmt::Debug>(result: Result<T, WireError>, code: ErrorCode, says: &str) {
        let e = result.expect_err("refused");
        assert_eq!(e.code, code, "{e:?}");
        assert!(e.message.contains(says), "{:?} does not say {says:?}", e.message);
    }

    #[test]
    fn a_uid_past_its_connection_bound_is_refused_and_a_departure_makes_room_again() {
        let mut shell = Shell::new(Limits { max_clients_per_uid: 2, ..Limits::default() });
        let first = shell.connect(ALICE);
        shell.connect(ALICE);
        refused(
            shell.registry.connect(peer(ALICE), &shell.limits),
            ErrorCode::Exhausted,
            "uid 1000 holds its limit of 2",
        );
        shell.connect(BOB);
        for _ in 0..3 {
            shell.connect(WICD);
        }
        assert_eq!(shell.registry.clients(), 6, "operators are held to no per-uid bound");
        assert_eq!(shell.registry.disconnect(first), Left::default());
        shell.connect(ALICE);
    }

    #[test]
    fn the_last_connections_are_left_to_operators_and_past_max_clients_nobody_connects() {
        let mut shell = Shell::new(Limits { max_clients: 4, reserved_clients: 1, ..Limits::default() });
        for uid in [ALICE, BOB, BOB + 1] {
            shell.connect(uid);
        }
        let late = shell.registry.connect(peer(BOB + 2), &shell.limits);
        refused(late, ErrorCode::Exhausted, "the last 1 of 4 connections are reserved for operators");
        shell.connect(ROOT);
        refused(shell.registry.connect(peer(WICD), &shell.limits), ErrorCode::Exhausted, "at most 4");
    }

    #[test]
    fn connections_are_numbered_anew_and_never_reused() {
        let mut shell = Shell::new(Limits::default());
        let first = shell.connect(ALICE);
        shell.registry.disconnect(first);
        assert_ne!(shell.connect(ALICE), first);
    }

    #[test]
    fn a_spec_without_slots_or_bytes_or_past_the_message_limit_is_refused_before_it_counts() {
        let mut shell = Shell::new(Limits { max_message_bytes: 1024, ..Limits::default() });
        let conn = shell.connect(ALICE);
        let limits = shell.limits;
        for (bad, says) in [
            (ChannelSpec { slots: 0, ..spec(1) }, "at least one slot"),
            (ChannelSpec { message_bytes: 0, ..spec(1) }, "one byte per message"),
            (ChannelSpec { message_bytes: 1025, ..spec(1) }, "message_bytes 1025 exceeds the limit of 1024"),
        ] {
            refused(shell.registry.reserve_creation(conn, peer(ALICE), &bad, &limits), ErrorCode::Invalid, says);
        }
        assert_eq!(shell.registry.channel_count(), 0);
    }

    #[test]
    fn a_channel_counts_against_its_uid_while_it_is_created_and_a_failed_creation_gives_its_share_back() {
        let mut shell = Shell::new(Limits { max_channels_per_uid: 1, ..Limits::default() });
        let (first, second) = (shell.connect(ALICE), shell.connect(ALICE));
        let limits = shell.limits;
        assert_eq!(shell.registry.reserve_creation(first, peer(ALICE), &spec(3), &limits), Ok(6), "2 runs of a page");
        assert_eq!(shell.registry.channel_count(), 1, "a creation under way counts");
        let meanwhile = shell.registry.reserve_creation(second, peer(ALICE), &spec(1), &limits);
        refused(meanwhile, ErrorCode::Exhausted, "uid 1000 owns its limit of 1 channels");
        // The fast path refused it.
        shell.registry.creation_ended(first);
        assert_eq!(shell.registry.channel_count(), 0);
        shell.create(second, ALICE, 1).unwrap();
        assert_eq!(shell.registry.channel_count(), 1, "counted once: as the channel, no longer as a creation");
    }

    #[test]
    fn channels_are_bounded_per_client_and_per_uid_and_released_when_their_owner_goes() {
        let limits = Limits { max_channels_per_client: 2, max_channels_per_uid: 3, ..Limits::default() };
        let mut shell = Shell::new(limits);
        let (first, second, bob) = (shell.connect(ALICE), shell.connect(ALICE), shell.connect(BOB));
        let mine = [shell.create(first, ALICE, 1).unwrap(), shell.create(first, ALICE, 1).unwrap()];
        refused(shell.create(first, ALICE, 1), ErrorCode::Exhausted, "a client may own at most 2 channels");
        shell.create(second, ALICE, 1).unwrap();
        refused(shell.create(second, ALICE, 1), ErrorCode::Exhausted, "uid 1000 owns its limit of 3 channels");
        shell.create(bob, BOB, 1).expect("another uid has its own bound");
        assert_eq!(shell.registry.disconnect(first), Left { channels: mine.to_vec(), space: None });
        shell.create(second, ALICE, 1).expect("the departed connection's channels no longer count");
    }

    #[test]
    fn slots_and_pages_are_bounded_per_uid_and_pages_count_against_the_pool_only_where_channels_draw_from_it() {
        let limits = Limits { max_slots_per_uid: 40, reserved_pages: 8, max_pages_per_uid: 1000, ..Limits::default() };
        let pool = Capacity {
            nofile: nofile_for(&limits, 64),
            warps_per_batch: 1,
            slots: 4096,
            pool_pages: 64,
            pages_from_pool: true,
        };
        let mut shell = Shell::with(limits, pool);
        let conn = shell.connect(ALICE);
        refused(
            shell.create(conn, ALICE, 41),
            ErrorCode::Exhausted,
            "uid 1000 holds 0 slots; 41 more would pass its limit of 40",
        );
        // 20 slots, 40 pages: more than half of the 56 the reserve leaves users.
        refused(
            shell.create(conn, ALICE, 20),
            ErrorCode::Exhausted,
            "holds 0 pages; 40 more would pass its share of 28",
        );
        let root = shell.connect(ROOT);
        shell.create(root, ROOT, 20).expect("operators are held to none of it");
        // On the shim a channel's pages are the application's memory: only the uid's bound.
        let mut shim = Shell::with(limits, Capacity { pages_from_pool: false, ..pool });
        let conn = shim.connect(ALICE);
        shim.create(conn, ALICE, 30).unwrap();
    }

    #[test]
    fn the_descriptor_limit_bounds_the_channels_of_everyone_operators_included() {
        let limits = Limits { reserved_channels: 1, ..Limits::default() };
        let three = Capacity {
            nofile: nofile_for(&limits, 3),
            warps_per_batch: 1,
            slots: 4096,
            pool_pages: 4096,
            pages_from_pool: true,
        };
        let mut shell = Shell::with(limits, three);
        let (alice, root) = (shell.connect(ALICE), shell.connect(ROOT));
        shell.create(root, ROOT, 1).unwrap();
        shell.create(alice, ALICE, 1).unwrap();
        let more = shell.create(alice, ALICE, 1);
        refused(more, ErrorCode::Exhausted, "the last 1 channels of 3 are reserved for operators");
        shell.create(root, ROOT, 1).unwrap();
        let past = shell.create(root, ROOT, 1);
        refused(past, ErrorCode::Exhausted, "wicd holds 3 channels, all its descriptor limit allows");
    }

    #[test]
    fn a_drain_refuses_new_channels_until_it_is_undone() {
        let mut shell = Shell::new(Limits::default());
        let (alice, root) = (shell.connect(ALICE), shell.connect(ROOT));
        let existing = shell.create(alice, ALICE, 1).unwrap();
        assert!(!shell.registry.set_draining(true));
        assert!(shell.registry.draining());
        refused(shell.create(root, ROOT, 1), ErrorCode::Stopping, "draining");
        assert_eq!(shell.registry.may_publish(alice, existing), Ok(()), "channels there go on");
        assert!(shell.registry.set_draining(false));
        shell.create(alice, ALICE, 1).unwrap();
    }

    #[test]
    fn only_a_channels_owner_destroys_it_or_grants_it() {
        let mut shell = Shell::new(Limits::default());
        let (alice, other, bob) = (shell.connect(ALICE), shell.connect(ALICE), shell.connect(BOB));
        let channel = shell.create(alice, ALICE, 1).unwrap();
        refused(shell.registry.destroying(bob, channel), ErrorCode::Permission, "belongs to another client");
        refused(shell.registry.destroying(other, channel), ErrorCode::Permission, "belongs to another client");
        refused(shell.grant(other, ALICE, channel, Role::Consumer, None), ErrorCode::Permission, "another client");
        refused(shell.grant(alice, ALICE, 99, Role::Consumer, None), ErrorCode::NotFound, "no channel 99");
        refused(
            shell.grant(alice, ALICE, channel, Role::Owner, None),
            ErrorCode::Invalid,
            "ownership cannot be granted",
        );
        assert_eq!(shell.registry.destroying(alice, channel), Ok(()));
        refused(shell.registry.destroying(alice, channel), ErrorCode::NotFound, "no channel");
        assert_eq!(shell.registry.channel_count(), 0);
    }

    #[test]
    fn a_token_serves_once_and_a_uid_bound_token_only_that_uid() {
        let mut shell = Shell::new(Limits::default());
        let (alice, other, bob, bob_again) =
            (shell.connect(ALICE), shell.connect(ALICE), shell.connect(BOB), shell.connect(BOB));
        let channel = shell.create(alice, ALICE, 1).unwrap();
        let token = shell.grant(alice, ALICE, channel, Role::Consumer, Some(BOB)).unwrap();
        assert_eq!(token, "token-1");
        refused(shell.attach(other, ALICE, &token), ErrorCode::Permission, "granted to another user");
        refused(shell.attach(alice, ALICE, "token-9"), ErrorCode::NotFound, "unknown or already used token");
        assert!(shell.attach(bob, BOB, &token).is_ok(), "still good for whom it was meant for");
        refused(shell.attach(bob_again, BOB, &token), ErrorCode::NotFound, "unknown or already used token");
        let anyone = shell.grant(alice, ALICE, channel, Role::Producer, None).unwrap();
        assert!(shell.attach(other, ALICE, &anyone).is_ok(), "a token bound to no uid serves whoever has it");
    }

    #[test]
    fn the_owner_attaching_to_its_own_channel_is_refused_and_leaves_the_token_good() {
        let mut shell = Shell::new(Limits::default());
        let (alice, bob) = (shell.connect(ALICE), shell.connect(BOB));
        let channel = shell.create(alice, ALICE, 1).unwrap();
        let token = shell.grant(alice, ALICE, channel, Role::Producer, None).unwrap();
        refused(shell.attach(alice, ALICE, &token), ErrorCode::Invalid, "already holds every role");
        assert!(shell.attach(bob, BOB, &token).is_ok());
    }

    #[test]
    fn each_role_gets_the_descriptors_of_what_it_may_do_and_only_owners_and_producers_publish() {
        let mut shell = Shell::new(Limits::default());
        let (alice, consumer, producer, stranger) =
            (shell.connect(ALICE), shell.connect(BOB), shell.connect(BOB), shell.connect(BOB));
        let channel = shell.create(alice, ALICE, 1).unwrap();
        let token = shell.grant(alice, ALICE, channel, Role::Consumer, None).unwrap();
        assert_eq!(
            shell.attach(consumer, BOB, &token),
            Ok((Role::Consumer, vec![FdKind::ConsumerRegion, FdKind::FaultDoorbell]))
        );
        let token = shell.grant(alice, ALICE, channel, Role::Producer, None).unwrap();
        assert_eq!(
            shell.attach(producer, BOB, &token),
            Ok((Role::Producer, vec![FdKind::ProducerRegion, FdKind::PublishDoorbell]))
        );
        assert_eq!(shell.registry.may_publish(alice, channel), Ok(()));
        assert_eq!(shell.registry.may_publish(producer, channel), Ok(()));
        refused(shell.registry.may_publish(consumer, channel), ErrorCode::Permission, "not a producer of channel");
        refused(shell.registry.may_publish(stranger, channel), ErrorCode::Permission, "not a producer of channel");
        refused(shell.registry.may_publish(alice, 99), ErrorCode::NotFound, "no channel 99");
    }

    #[test]
    fn unused_tokens_are_bounded_per_channel_and_per_uid_and_a_used_one_makes_room() {
        let limits = Limits { max_grants_per_channel: 2, max_grants_per_uid: 3, ..Limits::default() };
        let mut shell = Shell::new(limits);
        let (alice, bob) = (shell.connect(ALICE), shell.connect(BOB));
        let [first, second] = [shell.create(alice, ALICE, 1).unwrap(), shell.create(alice, ALICE, 1).unwrap()];
        let token = shell.grant(alice, ALICE, first, Role::Consumer, None).unwrap();
        shell.grant(alice, ALICE, first, Role::Consumer, None).unwrap();
        refused(
            shell.grant(alice, ALICE, first, Role::Consumer, None),
            ErrorCode::Exhausted,
            "channel 1 has 2 unused tokens",
        );
        shell.grant(alice, ALICE, second, Role::Consumer, None).unwrap();
        refused(
            shell.grant(alice, ALICE, second, Role::Consumer, None),
            ErrorCode::Exhausted,
            "uid 1000 has 3 unused tokens",
        );
        shell.attach(bob, BOB, &token).unwrap();
        shell.grant(alice, ALICE, second, Role::Consumer, None).expect("a used token no longer counts");
        // Operators: the bound per channel only.
        let root = shell.connect(ROOT);
        let theirs = [shell.create(root, ROOT, 1).unwrap(), shell.create(root, ROOT, 1).unwrap()];
        for channel in theirs {
            for _ in 0..2 {
                shell.grant(root, ROOT, channel, Role::Producer, None).unwrap();
            }
        }
        refused(
            shell.grant(root, ROOT, theirs[0], Role::Producer, None),
            ErrorCode::Exhausted,
            "unused tokens, its limit",
        );
    }

    #[test]
    fn a_destroyed_channels_tokens_go_with_it_and_its_id_may_name_the_next_channel() {
        let limits = Limits { max_grants_per_uid: 1, ..Limits::default() };
        let mut shell = Shell::new(limits);
        let (alice, bob) = (shell.connect(ALICE), shell.connect(BOB));
        let channel = shell.create(alice, ALICE, 1).unwrap();
        let token = shell.grant(alice, ALICE, channel, Role::Consumer, None).unwrap();
        shell.registry.destroying(alice, channel).unwrap();
        refused(shell.attach(bob, BOB, &token), ErrorCode::NotFound, "unknown or already used token");
        // The fast path hands the id out again.
        shell.next_channel = channel;
        assert_eq!(shell.create(alice, ALICE, 1), Ok(channel));
        shell.grant(alice, ALICE, channel, Role::Consumer, None).expect("the old token no longer counts");
    }

    #[test]
    fn operators_see_every_channel_and_users_those_of_their_uid_and_those_they_attached_to() {
        let mut shell = Shell::new(Limits::default());
        let (alice, other, bob, root, wicd) =
            (shell.connect(ALICE), shell.connect(ALICE), shell.connect(BOB), shell.connect(ROOT), shell.connect(WICD));
        let [a, b] = [shell.create(alice, ALICE, 1).unwrap(), shell.create(alice, ALICE, 2).unwrap()];
        let own = shell.create(bob, BOB, 1).unwrap();
        assert_eq!(shell.seen(other, ALICE), [a, b], "its uid's, from another connection too");
        assert_eq!(shell.seen(bob, BOB), [own]);
        assert_eq!((shell.seen(root, ROOT), shell.seen(wicd, WICD)), (vec![a, b, own], vec![a, b, own]));
        let token = shell.grant(alice, ALICE, b, Role::Consumer, None).unwrap();
        shell.attach(bob, BOB, &token).unwrap();
        assert_eq!(shell.seen(bob, BOB), [b, own]);
        let counters = HashMap::from([(b, ChannelCounters { publishes: 3, deliveries: 2, ..Default::default() })]);
        let summary = &shell.registry.channels_seen_by(bob, peer(BOB), &counters)[0];
        assert_eq!((summary.owner_uid, summary.owner_pid, summary.pages, summary.attached), (ALICE, 11_000, 4, 1));
        assert_eq!((summary.publishes, summary.deliveries, summary.timeouts), (3, 2, 0));
    }

    #[test]
    fn a_departing_connection_drops_its_attachments_and_hands_back_its_channels_tokens_and_space() {
        let mut shell = Shell::new(Limits::default());
        let (alice, bob) = (shell.connect(ALICE), shell.connect(BOB));
        let channels = [shell.create(alice, ALICE, 1).unwrap(), shell.create(alice, ALICE, 1).unwrap()];
        shell.registry.reserve_space(alice, peer(ALICE), &shell.limits).unwrap();
        assert_eq!(shell.registry.space_attached(alice, Ok(7)), Ok(7));
        let token = shell.grant(alice, ALICE, channels[0], Role::Consumer, None).unwrap();
        shell.attach(bob, BOB, &token).unwrap();
        let unused = shell.grant(alice, ALICE, channels[1], Role::Consumer, None).unwrap();
        let theirs = shell.create(bob, BOB, 1).unwrap();
        let token = shell.grant(bob, BOB, theirs, Role::Consumer, None).unwrap();
        shell.attach(alice, ALICE, &token).unwrap();

        assert_eq!(shell.registry.disconnect(alice), Left { channels: channels.to_vec(), space: Some(7) });
        let root = shell.connect(ROOT);
        let summaries = shell.registry.channels_seen_by(root, peer(ROOT), &HashMap::new());
        assert_eq!(summaries.len(), 1);
        assert_eq!((summaries[0].channel, summaries[0].attached), (theirs, 0), "its attachment went with it");
        refused(shell.attach(bob, BOB, &unused), ErrorCode::NotFound, "unknown or already used token");
        assert_eq!(shell.registry.space_of(alice), None);
        assert_eq!(shell.registry.clients(), 2);
    }

    #[test]
    fn a_connection_attaches_one_address_space_within_its_uids_bound_counted_while_it_attaches() {
        let mut shell = Shell::new(Limits { max_spaces_per_uid: 1, ..Limits::default() });
        let (first, second, root) = (shell.connect(ALICE), shell.connect(ALICE), shell.connect(ROOT));
        let limits = shell.limits;
        shell.registry.reserve_space(first, peer(ALICE), &limits).unwrap();
        assert_eq!(shell.registry.space_of(first), None, "not before it is attached");
        refused(shell.registry.reserve_space(first, peer(ALICE), &limits), ErrorCode::Busy, "already");
        refused(
            shell.registry.reserve_space(second, peer(ALICE), &limits),
            ErrorCode::Exhausted,
            "limit of 1 address spaces",
        );
        let failed = WireError::new(ErrorCode::Unsupported, "the module refused");
        assert_eq!(shell.registry.space_attached(first, Err(failed.clone())), Err(failed));
        shell.registry.reserve_space(second, peer(ALICE), &limits).expect("a refused attachment gives its share back");
        assert_eq!(shell.registry.space_attached(second, Ok(3)), Ok(3));
        assert_eq!(shell.registry.space_of(second), Some(3));
        shell.registry.reserve_space(root, peer(ROOT), &limits).expect("operators are held to no per-uid bound");
    }

    #[test]
    fn a_placement_is_in_the_address_space_its_connection_attached() {
        let mut shell = Shell::new(Limits::default());
        let conn = shell.connect(ALICE);
        assert_eq!(shell.registry.placement(conn, None), Ok(None));
        refused(shell.registry.placement(conn, Some(0x10_0000)), ErrorCode::Invalid, "attach_space first");
        shell.registry.reserve_space(conn, peer(ALICE), &shell.limits).unwrap();
        shell.registry.space_attached(conn, Ok(5)).unwrap();
        assert_eq!(
            shell.registry.placement(conn, Some(0x10_0000)),
            Ok(Some(PlacementRequest { space: 5, base_va: 0x10_0000 }))
        );
    }

    #[test]
    fn an_idle_connection_is_closed_only_holding_nothing_while_users_hold_three_quarters_and_never_an_operators() {
        // Users may take 8 connections; 6 is three quarters.
        let limits = Limits { max_clients: 9, reserved_clients: 1, idle_close_ms: 1000, ..Limits::default() };
        let mut shell = Shell::new(limits);
        let idle = shell.connect(ALICE);
        let owner = shell.connect(ALICE);
        shell.create(owner, ALICE, 1).unwrap();
        let root = shell.connect(ROOT);
        for uid in BOB..BOB + 3 {
            shell.connect(uid);
        }
        assert_eq!(shell.registry.idle_to_close(idle, peer(ALICE), &limits), None, "5 users of 8: room enough");
        let attached = shell.connect(BOB + 3);
        assert_eq!(
            shell.registry.idle_to_close(idle, peer(ALICE), &limits).as_deref(),
            Some("holding nothing while users hold 6 of their 8 connections")
        );
        assert_eq!(shell.registry.idle_to_close(owner, peer(ALICE), &limits), None, "it owns a channel");
        assert_eq!(shell.registry.idle_to_close(root, peer(ROOT), &limits), None);
        let never = Limits { idle_close_ms: 0, ..limits };
        assert_eq!(shell.registry.idle_to_close(idle, peer(ALICE), &never), None);
        // Attached to a channel, or with an address space, a connection holds something too.
        let token = shell.grant(owner, ALICE, 1, Role::Consumer, None).unwrap();
        shell.attach(attached, BOB + 3, &token).unwrap();
        assert_eq!(shell.registry.idle_to_close(attached, peer(BOB + 3), &limits), None);
        shell.registry.reserve_space(idle, peer(ALICE), &limits).unwrap();
        assert_eq!(shell.registry.idle_to_close(idle, peer(ALICE), &limits), None, "even while it attaches");
    }

    #[test]
    fn limits_that_leave_users_nothing_of_the_running_engine_or_pass_the_descriptor_limit_are_refused() {
        let limits = Limits::default();
        let capacity = Capacity {
            nofile: nofile_for(&limits, 64),
            warps_per_batch: 1,
            slots: 512,
            pool_pages: 2048,
            pages_from_pool: true,
        };
        assert_eq!(capacity.check(&limits), Ok(()));
        let slots = capacity.check(&Limits { reserved_slots: 512, ..limits }).unwrap_err();
        assert!(slots.contains("reserved_slots (512)") && slots.contains("engine.max_slots (512)"), "{slots}");
        let pages = capacity.check(&Limits { reserved_pages: 2048, ..limits }).unwrap_err();
        assert!(pages.contains("engine.pool_pages (2048)"), "{pages}");
        let few = Capacity { nofile: nofile_for(&limits, 16), ..capacity };
        assert!(few.check(&limits).unwrap_err().contains("reserved_channels"));
        assert!(capacity.check(&Limits { max_clients: 1000, ..limits }).unwrap_err().contains("RLIMIT_NOFILE"));
    }
}
