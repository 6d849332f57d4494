//! A log2 histogram of `u64` values, for latency and size statistics.
//!
//! Buckets are powers of two so recording is a shift and an add with no allocation: the engine
//! records on its hot path and must stay sans-IO and allocation-free there. The price is that
//! quantiles are only known to within a factor of two, which is enough to tell microseconds
//! from milliseconds.

/// Counts of `u64` values in 65 log2 buckets, with their exact count, sum, minimum and maximum.
///
/// Bucket 0 holds the value 0; bucket `i` (1..=64) holds values in `[2^(i-1), 2^i - 1]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    counts: [u64; Histogram::BUCKETS],
    count: u64,
    sum: u64,
    max: u64,
    /// `u64::MAX` while empty, so that an empty histogram has a single representation.
    min: u64,
}

impl Default for Histogram {
    /// An empty histogram (written out because `Default` is not derived for arrays over 32).
    fn default() -> Self {
        Self { counts: [0; Self::BUCKETS], count: 0, sum: 0, max: 0, min: u64::MAX }
    }
}

impl Histogram {
    /// Number of buckets: one for 0 and one per bit length 1..=64, so every `u64` has a bucket.
    pub const BUCKETS: usize = 65;

    /// The bucket holding `value`: its bit length.
    fn bucket_of(value: u64) -> usize {
        (u64::BITS - value.leading_zeros()) as usize
    }

    /// Inclusive upper bound of bucket `index` (0, 1, 3, 7, ..., `u64::MAX`), the value
    /// [`Histogram::buckets`] and [`Histogram::quantile`] report for it.
    ///
    /// # Panics
    /// If `index >= BUCKETS`: such a bucket does not exist.
    pub fn bucket_upper_bound(index: usize) -> u64 {
        assert!(index < Self::BUCKETS, "bucket {index} out of range (0..{})", Self::BUCKETS);
        if index == 0 {
            0
        } else {
            u64::MAX >> (u64::BITS as usize - index)
        }
    }

    /// Counts one value; constant time and no allocation, so it is safe on the hot path.
    pub fn record(&mut self, value: u64) {
        self.counts[Self::bucket_of(value)] += 1;
        self.count += 1;
        self.sum = self.sum.saturating_add(value);
        self.max = self.max.max(value);
        self.min = self.min.min(value);
    }

    /// Values recorded, exactly.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of the values recorded, saturating at `u64::MAX` so a long run cannot panic or wrap.
    pub fn sum(&self) -> u64 {
        self.sum
    }

    /// Largest value recorded, exactly; 0 while empty.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Smallest value recorded, exactly; `None` while empty, where no value is meaningful.
    pub fn min(&self) -> Option<u64> {
        (self.count > 0).then_some(self.min)
    }

    /// The non-empty buckets, ascending, as (inclusive upper bound, count): what an exporter
    /// needs without knowing the bucket layout.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.counts.iter().enumerate().filter(|(_, &n)| n > 0).map(|(index, &n)| (Self::bucket_upper_bound(index), n))
    }

    /// An upper estimate of the `q`-quantile (nearest rank): the inclusive upper bound of the
    /// bucket holding it, clamped to [`Histogram::max`], so it is at least the true value and at
    /// most `2 * true + 1`. `q` is clamped to `[0, 1]` (NaN counts as 0); `None` while empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let rank = nearest_rank(q, self.count);
        let mut seen = 0u64;
        for (index, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(Self::bucket_upper_bound(index).min(self.max));
            }
        }
        unreachable!("bucket counts add up to count")
    }

    /// Adds `other`'s values to `self`, as if each had been recorded here: combines per-thread
    /// or per-interval histograms.
    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine = mine.saturating_add(*theirs);
        }
        self.count = self.count.saturating_add(other.count);
        self.sum = self.sum.saturating_add(other.sum);
        self.max = self.max.max(other.max);
        self.min = self.min.min(other.min);
    }
}

/// 1-based nearest rank of quantile `q` among `count > 0` values: `ceil(q * count)` in `1..=count`.
fn nearest_rank(q: f64, count: u64) -> u64 {
    let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
    ((q * count as f64).ceil() as u64).clamp(1, count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn empty_histogram_reports_nothing() {
        let h = Histogram::default();
        assert_eq!((h.count(), h.sum(), h.max(), h.min()), (0, 0, 0, None));
        assert_eq!(h.quantile(0.5), None);
        assert_eq!(h.buckets().count(), 0);
    }

    #[test]
    fn bucket_bounds_are_powers_of_two_minus_one() {
        let bounds: Vec<u64> = (0..5).map(Histogram::bucket_upper_bound).collect();
        assert_eq!(bounds, [0, 1, 3, 7, 15]);
        assert_eq!(Histogram::bucket_upper_bound(63), (1 << 63) - 1);
        assert_eq!(Histogram::bucket_upper_bound(64), u64::MAX);
        for index in 1..Histogram::BUCKETS {
            let low = Histogram::bucket_upper_bound(index - 1) + 1;
            let high = Histogram::bucket_upper_bound(index);
            assert_eq!((Histogram::bucket_of(low), Histogram::bucket_of(high)), (index, index));
        }
        assert_eq!(Histogram::bucket_of(0), 0);
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn bucket_past_the_last_panics() {
        Histogram::bucket_upper_bound(Histogram::BUCKETS);
    }

    #[test]
    fn records_bucket_and_quantiles() {
        let mut h = Histogram::default();
        for v in [0, 1, 2, 3, 4, 100, 1000] {
            h.record(v);
        }
        assert_eq!((h.count(), h.sum(), h.max(), h.min()), (7, 1110, 1000, Some(0)));
        let buckets: Vec<(u64, u64)> = h.buckets().collect();
        assert_eq!(buckets, [(0, 1), (1, 1), (3, 2), (7, 1), (127, 1), (1023, 1)]);
        assert_eq!(h.quantile(0.0), Some(0));
        assert_eq!(h.quantile(0.5), Some(3), "rank 4 of 7 is 3, in bucket [2, 3]");
        assert_eq!(h.quantile(1.0), Some(1000), "clamped to the maximum, not 1023");
        assert_eq!(h.quantile(7.0), h.quantile(1.0));
        assert_eq!(h.quantile(-1.0), h.quantile(0.0));
        assert_eq!(h.quantile(f64::NAN), h.quantile(0.0));
    }

    #[test]
    fn sum_saturates() {
        let mut h = Histogram::default();
        h.record(u64::MAX);
        h.record(1);
        assert_eq!((h.sum(), h.max(), h.count()), (u64::MAX, u64::MAX, 2));
        assert_eq!(h.buckets().collect::<Vec<_>>(), [(1, 1), (u64::MAX, 1)]);
    }

    fn value() -> impl Strategy<Value = u64> {
        prop_oneof![
            0..16u64,
            (0..64u32).prop_map(|shift| 1u64 << shift),
            (0..Histogram::BUCKETS).prop_map(Histogram::bucket_upper_bound),
            any::<u64>(),
        ]
    }

    fn recorded(values: &[u64]) -> Histogram {
        let mut h = Histogram::default();
        for &v in values {
            h.record(v);
        }
        h
    }

    proptest! {
        #[test]
        fn matches_sorted_reference(values in prop::collection::vec(value(), 0..200), qs in prop::collection::vec(-0.5f64..1.5, 1..8)) {
            let h = recorded(&values);
            let mut sorted = values.clone();
            sorted.sort_unstable();
            let exact_sum = sorted.iter().map(|&v| u128::from(v)).sum::<u128>();
            prop_assert_eq!(h.count(), sorted.len() as u64);
            prop_assert_eq!(h.sum(), exact_sum.min(u128::from(u64::MAX)) as u64);
            prop_assert_eq!(h.max(), sorted.last().copied().unwrap_or(0));
            prop_assert_eq!(h.min(), sorted.first().copied());

            // Each value lands in the bucket whose bounds contain it.
            let mut model = [0u64; Histogram::BUCKETS];
            for &v in &sorted {
                let index = (0..Histogram::BUCKETS).find(|&i| v <= Histogram::bucket_upper_bound(i)).unwrap();
                prop_assert!(index == 0 || v > Histogram::bucket_upper_bound(index - 1));
                model[index] += 1;
            }
            let expected: Vec<(u64, u64)> = model
                .iter()
                .enumerate()
                .filter(|(_, &n)| n > 0)
                .map(|(i, &n)| (Histogram::bucket_upper_bound(i), n))
                .collect();
            prop_assert_eq!(h.buckets().collect::<Vec<_>>(), expected);

            for q in qs {
                match sorted.len() {
                    0 => prop_assert_eq!(h.quantile(q), None),
                    n => {
                        let clamped = q.clamp(0.0, 1.0);
                        let rank = ((clamped * n as f64).ceil() as usize).clamp(1, n);
                        let truth = sorted[rank - 1];
                        let got = h.quantile(q).unwrap();
                        prop_assert!(got >= truth, "q={} got {} < true {}", q, got, truth);
                        prop_assert!(u128::from(got) <= 2 * u128::from(truth) + 1, "q={} got {} > 2*{}+1", q, got, truth);
                        prop_assert!(got <= h.max());
                    }
                }
            }
        }

        #[test]
        fn merge_equals_recording_both(a in prop::collection::vec(value(), 0..50), b in prop::collection::vec(value(), 0..50)) {
            let mut merged = recorded(&a);
            merged.merge(&recorded(&b));
            let both: Vec<u64> = a.iter().chain(&b).copied().collect();
            prop_assert_eq!(merged, recorded(&both));
        }
    }
}
