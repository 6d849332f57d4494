//! Pacing and time stamps for `wicctl stats --watch`.

use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Paces repeated samples: the first at once, the next ones every `interval`, counted from the
/// first so that the time a reply takes does not make the samples drift.
#[derive(Debug)]
pub struct Ticker {
    interval: Duration,
    /// Samples still to take; `None` until interrupted.
    remaining: Option<u64>,
    /// When the next sample is due; `None` before the first.
    due: Option<Instant>,
}

impl Ticker {
    /// `count` samples (`None`: without end), `interval` apart.
    pub fn new(interval: Duration, count: Option<u64>) -> Self {
        Self { interval, remaining: count, due: None }
    }

    /// Waits until the next sample is due; false once all samples were taken.
    pub fn wait(&mut self) -> bool {
        if let Some(remaining) = &mut self.remaining {
            if *remaining == 0 {
                return false;
            }
            *remaining -= 1;
        }
        let now = Instant::now();
        let due = match self.due {
            None => now,
            Some(due) => {
                if let Some(wait) = due.checked_duration_since(now) {
                    sleep(wait);
                }
                due
            }
        };
        // After a stall longer than an interval (a slow daemon, a suspended terminal) start
        // afresh instead of catching up with a burst of samples.
        let next = due + self.interval;
        let now = Instant::now();
        self.due = Some(if next < now { now + self.interval } else { next });
        true
    }
}

/// `t` in UTC as RFC 3339 with whole seconds, e.g. `2023-11-14T22:13:20Z`; times before 1970
/// (a clock gone badly wrong) show as the epoch.
pub fn utc_timestamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (year, month, day) = civil_from_days(secs / 86_400);
    let second_of_day = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        second_of_day / 3_600,
        second_of_day / 60 % 60,
        second_of_day % 60
    )
}

/// The Gregorian (year, month, day) of day `days` after 1970-01-01: Howard Hinnant's
/// `civil_from_days`, in eras of 400 years that start on March 1st so leap days come last.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_rfc3339() {
        let at = |secs| utc_timestamp(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(951_868_799), "2000-02-29T23:59:59Z");
        assert_eq!(at(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(at(4_107_542_400), "2100-03-01T00:00:00Z");
        assert_eq!(utc_timestamp(UNIX_EPOCH - Duration::from_secs(5)), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn ticker_counts_and_paces() {
        let interval = Duration::from_millis(20);
        let mut ticker = Ticker::new(interval, Some(3));
        let start = Instant::now();
        assert!(ticker.wait());
        assert!(start.elapsed() < interval, "the first sample is immediate");
        assert!(ticker.wait() && ticker.wait());
        assert!(start.elapsed() >= 2 * interval);
        assert!(!ticker.wait());
        assert!(!ticker.wait());

        let mut endless = Ticker::new(Duration::ZERO, None);
        assert!((0..1000).all(|_| endless.wait()));
    }
}
