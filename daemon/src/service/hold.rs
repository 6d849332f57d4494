//! The bound a backend's GPU side may put on a held fault, past which it ends the hold itself
//! (wic_shim's `max_hold_ms`), and the channel timeouts that bound leaves: wicd's own timeout
//! must end a hold well before. The backend that has such a bound says so, and how to read it,
//! in its [`super::backend::BackendTraits`]; the control plane reads it at each creation (an
//! operator may change it while wicd runs) and `serve.rs` once at the start.

use wic_proto::message::{ErrorCode, WireError};

/// A backend's own bound on a held fault.
#[derive(Debug, Clone, Copy)]
pub struct HoldBound {
    /// What it is, as refusals and warnings name it.
    pub what: &'static str,
    /// Reads it now, in milliseconds; `None` when it cannot be read. Blocking: a file read.
    pub read_ms: fn() -> Option<u64>,
}

impl HoldBound {
    /// Refuses a channel timeout of `timeout_ns` unless it ends well below `bound_ms`.
    pub fn admit(&self, timeout_ns: u64, bound_ms: u64) -> Result<(), WireError> {
        // The module would end such a hold itself first, as a failure of the application's run
        // (and, where it cannot complete the whole run, leaving the slot's other run mapped).
        // Its clock starts when the fault is held, wicd's once wicd has read the record, and
        // the module looks every quarter of its bound: wicd's timeout must end well before.
        let longest = longest_timeout_ns(bound_ms);
        if timeout_ns <= longest {
            return Ok(());
        }
        Err(WireError::new(
            ErrorCode::Invalid,
            format!(
                "timeout_ns {timeout_ns} is not well below {} of {bound_ms} ms, which would end the hold first; ask for at most {longest} ns (0 takes limits.default_timeout_ms)",
                self.what
            ),
        ))
    }
}

/// The longest channel timeout a bound of `bound_ms` on a held fault leaves: a quarter of the
/// bound below it, at least 100 ms, for the time between a fault's hold and wicd's reading of
/// its record, wicd's completion, and the module's own period, with room to spare.
pub fn longest_timeout_ns(bound_ms: u64) -> u64 {
    let bound_ns = bound_ms.saturating_mul(1_000_000);
    bound_ns.saturating_sub((bound_ns / 4).max(100_000_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_stays_a_quarter_of_the_module_bound_below_it_and_at_least_100_ms() {
        assert_eq!(longest_timeout_ns(500), 375_000_000);
        assert_eq!(longest_timeout_ns(10_000), 7_500_000_000);
        assert_eq!(longest_timeout_ns(200), 100_000_000, "100 ms above a quarter");
        assert_eq!(longest_timeout_ns(50), 0, "no timeout fits");
        assert_eq!(longest_timeout_ns(u64::MAX), u64::MAX - u64::MAX / 4, "saturated");
    }

    #[test]
    fn a_timeout_up_to_the_longest_the_bound_leaves_is_admitted_and_one_past_it_refused_naming_the_bound() {
        let bound = HoldBound { what: "the test's bound", read_ms: || Some(500) };
        assert!(bound.admit(375_000_000, 500).is_ok());
        let e = bound.admit(375_000_001, 500).unwrap_err();
        assert_eq!(e.code, ErrorCode::Invalid);
        assert!(
            e.message.contains("the test's bound of 500 ms") && e.message.contains("at most 375000000 ns"),
            "{e:?}"
        );
    }
}
