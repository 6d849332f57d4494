//! Timing: each figure is the median of several repetitions of a loop long enough to dwarf
//! the clock's own cost.

use std::time::{Duration, Instant};

/// Nanoseconds per operation of `op`, the median of `reps` repetitions, each running `op` until
/// `budget` has passed (at least `min_ops` times).
pub fn ns_per_op(reps: usize, budget: Duration, min_ops: u64, mut op: impl FnMut()) -> f64 {
    let mut samples: Vec<f64> = (0..reps)
        .map(|_| {
            let start = Instant::now();
            let mut ops = 0u64;
            while ops < min_ops || start.elapsed() < budget {
                for _ in 0..16 {
                    op();
                }
                ops += 16;
            }
            start.elapsed().as_nanos() as f64 / ops as f64
        })
        .collect();
    median(&mut samples)
}

pub fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}
