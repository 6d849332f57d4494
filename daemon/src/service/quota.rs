//! What clients may make wicd hold, as arithmetic the server applies: the descriptor budget
//! that keeps `accept` from ever failing with `EMFILE`, the rule by which users share what they
//! all draw from (channels, slots, pool pages), and the rate limit on logging refusals. No I/O
//! here: the server passes in the descriptor limit, the holdings and the time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::config::Limits;

/// Descriptors a connection can make wicd hold besides its channels: the socket, the UVM file
/// of the address space it attached and, where GPU faults are observed, the nvidia-uvm-tools
/// file opened for it, and the one descriptor a request may carry while it is arriving.
pub const FDS_PER_CONNECTION: u64 = 4;

/// Descriptors wicd holds for one channel, on either backend: at most 6 (emulated: the
/// consumer and producer regions and their doorbells as handed to clients, and the fast
/// path's own two doorbells; the shim holds 3). The other 2 cover a destroyed channel's fast
/// path doorbells, which live on until their cancelled reads complete, after the channel no
/// longer counts. `hostile_clients.rs` measures a channel's real cost against this bound.
pub const FDS_PER_CHANNEL: u64 = 8;

/// Descriptors kept back for wicd itself: the fast path's io_uring, eventfds and the GPU
/// device, logs, the listening socket; room for the most descriptors one `recvmsg` can deliver
/// (the kernel's `SCM_MAX_FD`) before the excess of a request is closed; and for connections
/// accepted but not yet refused (the accept loop yields after each).
pub const FDS_RESERVED: u64 = 64 + 253 + 64;

/// How many channels wicd can hold at once within `nofile` descriptors while every one of
/// `limits.max_clients` connections is open; an error when the connections alone do not fit.
pub fn channel_capacity(limits: &Limits, nofile: u64) -> Result<u64, String> {
    let connections = FDS_PER_CONNECTION * u64::from(limits.max_clients);
    let room = nofile.checked_sub(FDS_RESERVED + connections).ok_or_else(|| {
        format!(
            "limits.max_clients = {} needs {connections} descriptors besides the {FDS_RESERVED} wicd keeps for itself, \
             but its descriptor limit (RLIMIT_NOFILE) is {nofile}: lower max_clients or raise LimitNOFILE=",
            limits.max_clients
        )
    })?;
    Ok(room / FDS_PER_CHANNEL)
}

/// [`channel_capacity`], refused when `limits.reserved_channels` leaves users none of it.
pub fn reserved_capacity(limits: &Limits, nofile: u64) -> Result<u64, String> {
    let capacity = channel_capacity(limits, nofile)?;
    if u64::from(limits.reserved_channels) >= capacity {
        return Err(format!(
            "limits.reserved_channels ({}) must leave room below the {capacity} channels wicd's descriptor limit allows",
            limits.reserved_channels
        ));
    }
    Ok(capacity)
}

/// One resource all users draw from: how much there is, the part only operators may take, and
/// what one uid may hold at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    pub total: u64,
    pub reserved: u64,
    pub per_uid: u64,
}

/// Why a user may not take more of a [`Pool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It would eat into what is reserved for operators.
    Reserve,
    /// It would pass the uid's own bound.
    PerUid,
    /// It would pass the uid's share: half of what the other users leave, `bound`.
    Share { bound: u64 },
}

/// Whether a user who holds `mine` may take `more` of `pool`, where everyone (operators
/// included) holds `everyone` and the other users `others`.
///
/// Three bounds, in the order they are told: the uid's own bound, `per_uid`. The reserve: users
/// together never hold more than `total - reserved`, so operators always find room. And a share: a uid may hold at
/// most half of what the other users leave of the users' part. Per-uid bounds alone let a few
/// uids within their bounds take everything (four, with the defaults, for pool pages and slots);
/// with the share, each further uid that takes all it may leaves half of what it found, so the
/// next uid always finds room until the users' part is down to a unit, about log2 of it uids in
/// (14 for the default pool), and the reserve is left whatever they do.
pub fn user_may_take(pool: Pool, everyone: u64, others: u64, mine: u64, more: u64) -> Result<(), Refusal> {
    let holding = mine.saturating_add(more);
    if holding > pool.per_uid {
        return Err(Refusal::PerUid);
    }
    let users_part = pool.total.saturating_sub(pool.reserved);
    if everyone.saturating_add(more) > users_part {
        return Err(Refusal::Reserve);
    }
    let bound = users_part.saturating_sub(others) / 2;
    if holding > bound {
        return Err(Refusal::Share { bound });
    }
    Ok(())
}

/// Refusals of one uid logged in a burst before the rest of the period is only counted.
const REFUSALS_PER_PERIOD: u32 = 10;
pub const REFUSAL_PERIOD: Duration = Duration::from_secs(1);

/// Rate limit on refusal log lines, per uid: a client refused in a loop must not flood the
/// journal (journald would then drop everyone's lines) nor crowd out other users' refusals.
/// No refusal goes unreported: what a period left out is reported once it is over
/// ([`RefusalLog::left_out`]).
#[derive(Debug, Default)]
pub struct RefusalLog {
    uids: HashMap<u32, Burst>,
}

#[derive(Debug)]
struct Burst {
    start: Instant,
    logged: u32,
    left_out: u64,
}

impl RefusalLog {
    /// Whether a refusal of `uid` at `now` is logged.
    pub fn admit(&mut self, uid: u32, now: Instant) -> bool {
        let burst = self.uids.entry(uid).or_insert(Burst { start: now, logged: 0, left_out: 0 });
        if now.saturating_duration_since(burst.start) >= REFUSAL_PERIOD && burst.left_out == 0 {
            *burst = Burst { start: now, logged: 0, left_out: 0 };
        }
        if burst.logged == REFUSALS_PER_PERIOD {
            burst.left_out += 1;
            return false;
        }
        burst.logged += 1;
        true
    }

    /// The uids whose period is over with refusals left out, and how many, to be logged now;
    /// forgets the uids with nothing left, so the table holds only recent refusers.
    pub fn left_out(&mut self, now: Instant) -> Vec<(u32, u64)> {
        let mut due = Vec::new();
        self.uids.retain(|&uid, burst| {
            if now.saturating_duration_since(burst.start) < REFUSAL_PERIOD {
                return true;
            }
            if burst.left_out > 0 {
                due.push((uid, burst.left_out));
            }
            false
        });
        due.sort_unstable();
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_channel_capacity_is_what_is_left_after_the_reserve_and_every_connection() {
        let limits = Limits { max_clients: 100, ..Limits::default() };
        let connections = 100 * FDS_PER_CONNECTION;
        let nofile = FDS_RESERVED + connections + 8 * FDS_PER_CHANNEL + 7;
        assert_eq!(channel_capacity(&limits, nofile), Ok(8));
        assert_eq!(channel_capacity(&limits, FDS_RESERVED + connections), Ok(0));
        let err = channel_capacity(&limits, FDS_RESERVED + connections - 1).unwrap_err();
        assert!(err.contains("max_clients = 100") && err.contains("RLIMIT_NOFILE"), "{err}");
    }

    /// The pool of the report: 16384 pages, 4096 per uid, 1024 reserved.
    const PAGES: Pool = Pool { total: 16384, reserved: 1024, per_uid: 4096 };

    /// Uids in turn, each taking `unit` at a time for as long as it may: what each got.
    fn greedy(pool: Pool, uids: usize, unit: u64) -> Vec<u64> {
        let mut held = Vec::new();
        for _ in 0..uids {
            let others: u64 = held.iter().sum();
            let mut mine = 0;
            while user_may_take(pool, others + mine, others, mine, unit).is_ok() {
                mine += unit;
            }
            held.push(mine);
        }
        held
    }

    #[test]
    fn greedy_uids_leave_the_reserve_and_room_for_the_next_uid() {
        // The four uids, each 8 channels of 512 pages: 8, 8, 7 and 3 channels.
        assert_eq!(greedy(PAGES, 4, 512), [4096, 4096, 3584, 1536]);
        // One page at a time, as many uids as it takes: the users' part is never passed, and
        // each uid leaves the next some room while there is more than one page left.
        let held = greedy(PAGES, 40, 1);
        let users_part = PAGES.total - PAGES.reserved;
        assert!(held.iter().sum::<u64>() <= users_part);
        let mut left = users_part;
        for &got in &held {
            if left > 1 {
                assert!(got >= 1, "a uid found no room with {left} pages left: {held:?}");
            }
            left -= got;
        }
        assert!(held.iter().filter(|&&got| got > 0).count() >= 14, "{held:?}");
    }

    #[test]
    fn each_bound_refuses_with_its_own_reason() {
        // The reserve: whoever holds what, users stop at total - reserved.
        assert_eq!(user_may_take(PAGES, 15360, 0, 0, 1), Err(Refusal::Reserve));
        assert_eq!(user_may_take(PAGES, 15359, 15359, 0, 1), Err(Refusal::Share { bound: 0 }));
        // The uid's own bound.
        assert_eq!(user_may_take(PAGES, 4096, 0, 4096, 1), Err(Refusal::PerUid));
        // The share: half of what the others leave.
        assert_eq!(user_may_take(PAGES, 12000, 12000, 0, 1681), Err(Refusal::Share { bound: 1680 }));
        assert_eq!(user_may_take(PAGES, 12000, 12000, 0, 1680), Ok(()));
        // Operators' holdings count against the reserve only through `everyone`.
        assert_eq!(user_may_take(PAGES, 1024, 0, 0, 4096), Ok(()));
        // Alone, a uid takes up to its bound.
        assert_eq!(user_may_take(PAGES, 0, 0, 0, 4096), Ok(()));
    }

    #[test]
    fn refusals_past_the_burst_are_counted_per_uid_and_reported_once_the_period_is_over() {
        let start = Instant::now();
        let mut log = RefusalLog::default();
        for _ in 0..REFUSALS_PER_PERIOD {
            assert!(log.admit(1000, start));
        }
        for _ in 0..5 {
            assert!(!log.admit(1000, start + Duration::from_millis(999)));
        }
        assert!(log.admit(1001, start), "another uid is not crowded out");
        assert_eq!(log.left_out(start + Duration::from_millis(999)), [], "not before the period is over");
        // Until reported, a uid's count goes on growing, whatever the time.
        assert!(!log.admit(1000, start + REFUSAL_PERIOD));
        assert_eq!(log.left_out(start + REFUSAL_PERIOD), [(1000, 6)]);
        assert_eq!(log.left_out(start + REFUSAL_PERIOD), [], "reported once, and idle uids are forgotten");
        assert!(log.admit(1000, start + REFUSAL_PERIOD), "a new period logs again");
    }
}
