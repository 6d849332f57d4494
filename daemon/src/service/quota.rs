//! What clients may make wicd hold, as arithmetic the server applies: the descriptor budget
//! that keeps `accept` from ever failing with `EMFILE`, and the rate limit on logging refusals.
//! No I/O here: the server passes in the descriptor limit and the time.

use std::time::{Duration, Instant};

use crate::config::Limits;

/// Descriptors a connection can make wicd hold besides its channels: the socket, the UVM file
/// of the address space it attached, and the one descriptor a request may carry while the
/// request is still arriving.
pub const FDS_PER_CONNECTION: u64 = 3;

/// Descriptors wicd holds for one channel, on either backend: the consumer and producer
/// regions and their doorbells as handed to clients, and the fast path's own doorbell copies.
/// `service_protocol.rs` measures a channel's real cost against this bound.
pub const FDS_PER_CHANNEL: u64 = 8;

/// Descriptors kept back for wicd itself: the fast path's io_uring, eventfds and the GPU
/// device, logs, the listening socket, and room for the most descriptors one `recvmsg` can
/// deliver (the kernel's `SCM_MAX_FD`) before the excess of a request is closed.
pub const FDS_RESERVED: u64 = 64 + 253;

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

/// Refusals logged in a burst before the rest of the period is only counted.
const REFUSALS_PER_PERIOD: u32 = 10;
const REFUSAL_PERIOD: Duration = Duration::from_secs(1);

/// Rate limit on refusal log lines: a client that is refused in a loop must not flood the
/// journal (journald would then drop everyone's lines), but no refusal goes unreported: the
/// next line logged says how many were left out.
#[derive(Debug)]
pub struct RefusalLog {
    period_start: Option<Instant>,
    logged: u32,
    left_out: u64,
}

impl RefusalLog {
    pub const fn new() -> Self {
        Self { period_start: None, logged: 0, left_out: 0 }
    }

    /// Whether a refusal at `now` is logged; if so, with how many were left out before it.
    pub fn admit(&mut self, now: Instant) -> Option<u64> {
        let new_period = self.period_start.is_none_or(|start| now.saturating_duration_since(start) >= REFUSAL_PERIOD);
        if new_period {
            self.period_start = Some(now);
            self.logged = 0;
        }
        if self.logged == REFUSALS_PER_PERIOD {
            self.left_out += 1;
            return None;
        }
        self.logged += 1;
        Some(std::mem::take(&mut self.left_out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_channel_capacity_is_what_is_left_after_the_reserve_and_every_connection() {
        let limits = Limits { max_clients: 100, ..Limits::default() };
        let nofile = FDS_RESERVED + 300 + 8 * FDS_PER_CHANNEL + 7;
        assert_eq!(channel_capacity(&limits, nofile), Ok(8));
        assert_eq!(channel_capacity(&limits, FDS_RESERVED + 300), Ok(0));
        let err = channel_capacity(&limits, FDS_RESERVED + 299).unwrap_err();
        assert!(err.contains("max_clients = 100") && err.contains("RLIMIT_NOFILE"), "{err}");
    }

    #[test]
    fn refusals_past_the_burst_are_counted_and_reported_with_the_next_line() {
        let start = Instant::now();
        let mut log = RefusalLog::new();
        for _ in 0..REFUSALS_PER_PERIOD {
            assert_eq!(log.admit(start), Some(0));
        }
        for _ in 0..5 {
            assert_eq!(log.admit(start + Duration::from_millis(999)), None);
        }
        assert_eq!(log.admit(start + REFUSAL_PERIOD), Some(5), "the next period's first line reports the five");
        assert_eq!(log.admit(start + REFUSAL_PERIOD), Some(0));
    }
}
