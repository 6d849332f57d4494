//! What clients may make wicd hold, as arithmetic the server applies: the descriptor budget
//! that keeps `accept` from ever failing with `EMFILE`, and the rate limit on logging refusals.
//! No I/O here: the server passes in the descriptor limit and the time.

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
