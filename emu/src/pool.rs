//! Independent runs on worker threads, their results in the order of their jobs: what the
//! comparison tables (`compare`) and `wicd demo`'s co-run rows run on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

/// Runs `work` on every job of `jobs` on up to `threads` worker threads (at least one, no more
/// than there are jobs), each worker taking the next job not yet taken, and returns the results
/// in `jobs`' order. `progress` sees each result as it finishes, on the calling thread: how many
/// have finished, of how many, and the result.
///
/// # Panics
/// If `work` panicked on a job.
pub fn run_in_order<J: Sync, R: Send>(
    jobs: &[J],
    threads: usize,
    work: impl Fn(&J) -> R + Sync,
    mut progress: impl FnMut(usize, usize, &R),
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let (done_tx, done_rx) = mpsc::channel();
    let mut results: Vec<Option<R>> = std::iter::repeat_with(|| None).take(jobs.len()).collect();
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, jobs.len().max(1)) {
            let (next, work, done_tx) = (&next, &work, done_tx.clone());
            scope.spawn(move || loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(index) else { return };
                if done_tx.send((index, work(job))).is_err() {
                    return;
                }
            });
        }
        drop(done_tx);
        for (finished, (index, result)) in done_rx.iter().enumerate() {
            progress(finished + 1, jobs.len(), &result);
            results[index] = Some(result);
        }
    });
    results.into_iter().map(|result| result.expect("every job ran")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_the_jobs_order_whatever_order_they_finish_in() {
        let jobs: Vec<u64> = (0..40).collect();
        let mut seen = Vec::new();
        let squares = run_in_order(
            &jobs,
            4,
            |&n| {
                // Early jobs take longest, so they finish after later ones.
                std::thread::sleep(std::time::Duration::from_micros(40 - n));
                n * n
            },
            |done, total, &square| seen.push((done, total, square)),
        );
        assert_eq!(squares, jobs.iter().map(|n| n * n).collect::<Vec<_>>());
        assert!(seen.iter().enumerate().all(|(i, (done, total, _))| (*done, *total) == (i + 1, 40)));
        let mut finished: Vec<u64> = seen.iter().map(|s| s.2).collect();
        finished.sort_unstable();
        assert_eq!(finished, squares);
        let none: Vec<u64> = run_in_order(&[] as &[u64], 8, |&n| n, |_, _, _| panic!("no job"));
        assert!(none.is_empty());
    }
}
