//! Timing: each figure is the fastest of several repetitions of a loop long enough to dwarf
//! the clock's own cost. Other tenants of a shared machine only ever add time, so the fastest
//! repetition is the best estimate of the code's own cost; baselines are taken the same way.

use std::time::{Duration, Instant};

/// Nanoseconds per operation of `op`, the fastest of `reps` repetitions, each running `op` until
/// `budget` has passed (at least `min_ops` times).
pub fn ns_per_op(reps: usize, budget: Duration, min_ops: u64, mut op: impl FnMut()) -> f64 {
    let samples: Vec<f64> = (0..reps)
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
    fastest(&samples)
}

/// The smallest of `samples` (infinity if there are none).
pub fn fastest(samples: &[f64]) -> f64 {
    samples.iter().copied().fold(f64::INFINITY, f64::min)
}

/// The value at fraction `p` of `sorted` samples, by nearest rank.
///
/// # Panics
/// If `sorted` is empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// `samples` in ascending order.
pub fn sorted(samples: &[f64]) -> Vec<f64> {
    let mut samples = samples.to_vec();
    samples.sort_by(f64::total_cmp);
    samples
}

/// A fixed computation with no memory traffic beyond one cache-resident table: `rounds`
/// multiply-xor steps over it. A control of known, constant work, so that its spread over a
/// run is the machine's own.
pub fn spin(table: &mut [u64; 512], rounds: u32) -> u64 {
    let mut acc = 0u64;
    for round in 0..u64::from(rounds) {
        let slot = &mut table[(round as usize * 7) % 512];
        *slot = slot.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(round);
        acc ^= *slot;
    }
    std::hint::black_box(acc)
}
