//! Latency samples per kind of operation, kept whole (a run has at most a few million) so the
//! percentiles are exact.

use std::time::{Duration, Instant};

/// What was timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Connecting and the hello exchange.
    Connect,
    Create,
    Grant,
    Attach,
    Stats,
    Destroy,
    /// A message from just before its publish to its consumer having checked it.
    Delivery,
}

impl Kind {
    /// The control requests, in the order they are reported.
    pub const CONTROL: [Kind; 6] = [Kind::Connect, Kind::Create, Kind::Grant, Kind::Attach, Kind::Stats, Kind::Destroy];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Connect => "connect",
            Kind::Create => "create",
            Kind::Grant => "grant",
            Kind::Attach => "attach",
            Kind::Stats => "stats",
            Kind::Destroy => "destroy",
            Kind::Delivery => "delivery",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

const KINDS: usize = Kind::Delivery as usize + 1;

/// Samples in nanoseconds, one list per kind.
#[derive(Debug, Default)]
pub struct Latencies {
    samples: [Vec<u64>; KINDS],
}

impl Latencies {
    pub fn record(&mut self, kind: Kind, nanos: u64) {
        self.samples[kind.index()].push(nanos);
    }

    /// Runs `op`, recording how long it took as `kind`.
    pub fn time<T>(&mut self, kind: Kind, op: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let result = op();
        self.record(kind, start.elapsed().as_nanos() as u64);
        result
    }

    pub fn merge(&mut self, other: Latencies) {
        for (mine, theirs) in self.samples.iter_mut().zip(other.samples) {
            mine.extend(theirs);
        }
    }

    /// The distribution of one kind.
    pub fn summary(&self, kind: Kind) -> Summary {
        Summary::of(self.samples[kind.index()].clone())
    }

    /// The distribution of all control requests together.
    pub fn control(&self) -> Summary {
        Summary::of(Kind::CONTROL.iter().flat_map(|k| self.samples[k.index()].iter().copied()).collect())
    }
}

/// Count, median, 99th percentile and maximum of a set of samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    pub count: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Summary {
    fn of(mut samples: Vec<u64>) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        // Nearest rank: the smallest sample with at least p% of the samples at or below it.
        let rank = |p: usize| samples[(samples.len() * p).div_ceil(100).max(1) - 1];
        Self {
            count: samples.len(),
            p50: Duration::from_nanos(rank(50)),
            p99: Duration::from_nanos(rank(99)),
            max: Duration::from_nanos(samples[samples.len() - 1]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut l = Latencies::default();
        for n in 1..=200 {
            l.record(Kind::Create, n);
        }
        l.record(Kind::Delivery, 5);
        let s = l.summary(Kind::Create);
        assert_eq!(
            (s.count, s.p50, s.p99, s.max),
            (200, Duration::from_nanos(100), Duration::from_nanos(198), Duration::from_nanos(200))
        );
        assert_eq!(l.control().count, 200, "deliveries are not control requests");
        assert_eq!(l.summary(Kind::Stats), Summary::default());
    }
}
