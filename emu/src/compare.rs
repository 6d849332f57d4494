//! Every workload three ways, the naive baseline (alg1, the paper's Algorithm 1), wic.cuh's push
//! and WIC, on worker threads: the comparison that `wicd demo` prints and the evaluation report
//! plots.

use crossbeam::channel;

use crate::{try_run, Calibration, Mode, RunReport, Workload};

/// The modes of a comparison, in the order its runs are reported.
pub const MODES: [Mode; 3] = [Mode::Alg1, Mode::Push, Mode::Fault];

/// The same workload three ways.
pub struct Comparison {
    /// The naive baseline: alg1, the paper's Algorithm 1 ([`Mode::Alg1`]).
    pub naive: RunReport,
    pub push: RunReport,
    pub fault: RunReport,
}

impl Comparison {
    /// WIC's speedup over the naive baseline (alg1).
    pub fn speedup(&self) -> f64 {
        self.naive.runtime_ns as f64 / self.fault.runtime_ns as f64
    }

    /// WIC's speedup over push, what the stock driver runs today.
    pub fn speedup_over_push(&self) -> f64 {
        self.push.runtime_ns as f64 / self.fault.runtime_ns as f64
    }
}

/// A share as a percentage with one decimal, as the comparison tables print it.
pub fn percent(share: f64) -> String {
    format!("{:.1}%", 100.0 * share)
}

/// The geometric mean of the rows' speedups over the naive baseline (alg1; 1 for no rows): of a slice
/// (`&rows`), or of the rows that ran (`rows.iter().flatten()` over results).
pub fn geomean_speedup<'a>(rows: impl IntoIterator<Item = &'a Comparison>) -> f64 {
    geomean(rows, Comparison::speedup)
}

/// The same over push.
pub fn geomean_speedup_over_push<'a>(rows: impl IntoIterator<Item = &'a Comparison>) -> f64 {
    geomean(rows, Comparison::speedup_over_push)
}

fn geomean<'a>(rows: impl IntoIterator<Item = &'a Comparison>, ratio: fn(&Comparison) -> f64) -> f64 {
    let (sum, n) = rows.into_iter().fold((0.0, 0u32), |(sum, n), r| (sum + ratio(r).ln(), n + 1));
    (sum / f64::from(n.max(1))).exp()
}

/// Runs every workload in every mode on `threads` workers; `progress` sees each finished run.
///
/// # Panics
/// If the model cannot hold a workload ([`try_compare`] reports it as that row's error instead).
pub fn compare(
    workloads: &[Workload],
    cal: &Calibration,
    seed: u64,
    threads: usize,
    mut progress: impl FnMut(usize, usize, &RunReport),
) -> Vec<Comparison> {
    let rows = try_compare(workloads, cal, seed, threads, |done, total, run| {
        if let Ok(report) = run {
            progress(done, total, report);
        }
    });
    rows.into_iter().map(|row| row.unwrap_or_else(|e| panic!("{e}"))).collect()
}

/// Why a workload has no row: the model cannot hold it (see [`crate::sim::check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowError {
    pub workload: &'static str,
    pub reason: String,
}

impl std::fmt::Display for RowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.workload, self.reason)
    }
}

impl std::error::Error for RowError {}

/// One finished run for [`try_compare`]'s progress: its report, or the workload and mode that
/// could not run and why.
pub type RunOutcome = Result<RunReport, (&'static str, Mode, String)>;

/// Runs every workload in every mode ([`MODES`]) on `threads` workers (no more than there are
/// runs), one row per workload in order; a workload the model cannot hold is that row's error and the
/// others still run. `progress` sees each finished run.
pub fn try_compare(
    workloads: &[Workload],
    cal: &Calibration,
    seed: u64,
    threads: usize,
    mut progress: impl FnMut(usize, usize, &RunOutcome),
) -> Vec<Result<Comparison, RowError>> {
    let jobs: Vec<(usize, Mode)> = (0..workloads.len()).flat_map(|i| MODES.map(|m| (i, m))).collect();
    let (job_tx, job_rx) = channel::unbounded();
    for job in &jobs {
        job_tx.send(*job).expect("receiver alive");
    }
    drop(job_tx);
    let (done_tx, done_rx) = channel::unbounded();
    let mut results: Vec<[Option<RunOutcome>; 3]> = (0..workloads.len()).map(|_| [None, None, None]).collect();
    crossbeam::scope(|scope| {
        for _ in 0..threads.clamp(1, jobs.len().max(1)) {
            let (job_rx, done_tx) = (job_rx.clone(), done_tx.clone());
            scope.spawn(move |_| {
                for (index, mode) in job_rx {
                    let workload = &workloads[index];
                    let outcome = try_run(workload, mode, cal, seed).map_err(|e| (workload.name, mode, e));
                    if done_tx.send((index, mode, outcome)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(done_tx);
        for (finished, (index, mode, outcome)) in done_rx.iter().enumerate() {
            progress(finished + 1, jobs.len(), &outcome);
            results[index][MODES.iter().position(|m| *m == mode).expect("one of MODES")] = Some(outcome);
        }
    })
    .expect("a worker panicked");
    results
        .into_iter()
        .map(|[naive, push, fault]| {
            match (naive.expect("naive run"), push.expect("push run"), fault.expect("fault run")) {
                (Ok(naive), Ok(push), Ok(fault)) => Ok(Comparison { naive, push, fault }),
                // The first mode's reason, whichever run finished first, so the row reads the same
                // every time.
                (Err((workload, _, reason)), _, _)
                | (_, Err((workload, _, reason)), _)
                | (_, _, Err((workload, _, reason))) => Err(RowError { workload, reason }),
            }
        })
        .collect()
}

/// The calibration line of a report: which constants were measured on a GPU, by name,
/// and how many are datasheet, published or estimated values.
pub fn calibration_summary(cal: &Calibration) -> String {
    let table = cal.table();
    // wicd's own costs are measured where wicd runs (this machine's CPU, or a GPU machine's by
    // its bring-up test: each source says which); the others on a GPU.
    let (daemon, gpu): (Vec<&str>, Vec<&str>) =
        table.iter().filter(|row| row.3).map(|row| row.0).partition(|name| name.starts_with("daemon."));
    let list = |names: &[&str]| if names.is_empty() { String::new() } else { format!(" ({})", names.join(", ")) };
    let on_cpu = if daemon.is_empty() {
        String::new()
    } else {
        format!(" and {} of wicd's own costs where wicd ran{}", daemon.len(), list(&daemon))
    };
    format!(
        "Calibration: {} of {} constants measured on a GPU{}{on_cpu}; the other {} are datasheet, published or estimated values (sources in emu/calibration.toml).",
        gpu.len(),
        table.len(),
        list(&gpu),
        table.len() - gpu.len() - daemon.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::by_name;

    #[test]
    fn a_workload_the_model_cannot_hold_is_its_rows_error_and_the_others_still_run() {
        let set = [
            by_name("C_CG").unwrap().with_threads(64),
            by_name("G_GEM").unwrap().with_threads(512 << 20),
            by_name("G_STN").unwrap().with_threads(64),
        ];
        let mut seen = Vec::new();
        // More workers than runs are not started.
        let rows = try_compare(&set, &Calibration::built_in(), 1, 1000, |done, total, outcome| {
            seen.push((done, total, outcome.as_ref().map(|r| r.workload).unwrap_or_else(|e| e.0)));
        });
        assert_eq!(seen.len(), 9);
        assert!(seen.iter().enumerate().all(|(i, (done, total, _))| (*done, *total) == (i + 1, 9)));
        assert_eq!(seen.iter().filter(|s| s.2 == "G_GEM").count(), 3);
        assert_eq!(rows[0].as_ref().unwrap().fault.workload, "C_CG");
        assert_eq!(rows[2].as_ref().unwrap().naive.workload, "G_STN");
        let refused = rows[1].as_ref().err().expect("G_GEM at 512M threads is refused");
        assert_eq!(refused.workload, "G_GEM");
        assert!(refused.reason.contains("request slots"), "{refused}");
        assert!(refused.to_string().starts_with("G_GEM: phase 0 has"), "{refused}");
    }

    #[test]
    fn the_geometric_mean_is_over_the_rows_given_slice_or_iterator() {
        let cal = Calibration::built_in();
        let row = |name| {
            let w = by_name(name).unwrap().with_threads(64);
            let [naive, push, fault] = MODES.map(|m| crate::run(&w, m, &cal, 1));
            Comparison { naive, push, fault }
        };
        let rows = vec![row("C_CG"), row("G_STN")];
        let (a, b) = (rows[0].speedup(), rows[1].speedup());
        assert!((geomean_speedup(&rows) - (a * b).sqrt()).abs() < 1e-12);
        let (c, d) = (rows[0].speedup_over_push(), rows[1].speedup_over_push());
        assert!((geomean_speedup_over_push(&rows) - (c * d).sqrt()).abs() < 1e-12);
        assert!(a != c, "over push is not over polling");
        let results = [Ok(row("C_CG")), Err(RowError { workload: "G_GEM", reason: "no room".into() })];
        assert!((geomean_speedup(results.iter().flatten()) - a).abs() < 1e-12, "only the rows that ran");
        assert_eq!(geomean_speedup(&[]), 1.0);
    }

    #[test]
    fn the_calibration_line_names_exactly_the_measured_constants() {
        let mut cal = Calibration::built_in();
        cal.gpu.sms.measured = false;
        cal.link.pcie_gbps.measured = true;
        cal.gpu.warp_ipc.measured = true;
        cal.daemon.wakeup_ns.measured = true;
        let line = calibration_summary(&cal);
        let measured: Vec<&str> = cal.table().into_iter().filter(|row| row.3).map(|row| row.0).collect();
        assert!(measured.contains(&"gpu.warp_ipc") && !measured.contains(&"gpu.sms"));
        for (name, _, _, was_measured) in cal.table() {
            assert_eq!(line.contains(name), was_measured, "{name} in {line}");
        }
        // wicd's own costs are counted apart: they were measured where wicd ran, not on a GPU.
        let on_cpu = measured.iter().filter(|name| name.starts_with("daemon.")).count();
        assert!(on_cpu >= 1, "{measured:?}");
        assert!(
            line.starts_with(&format!(
                "Calibration: {} of {} constants measured on a GPU",
                measured.len() - on_cpu,
                cal.table().len()
            )),
            "{line}"
        );
        assert!(line.contains(&format!(" and {on_cpu} of wicd's own costs where wicd ran (")), "{line}");
    }
}
