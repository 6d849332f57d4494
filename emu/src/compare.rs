//! Every workload three ways, the naive baseline (alg1, the paper's Algorithm 1), wic.cuh's push
//! and WIC, on worker threads: the comparison that `wicd demo` prints and the evaluation report
//! plots.

use crate::pool::run_in_order;
use crate::{try_run, Calibration, Mode, RunReport, Workload};

/// The same workload three ways.
pub struct Comparison {
    /// The naive baseline: alg1, the paper's Algorithm 1 ([`Mode::Alg1`]).
    pub naive: RunReport,
    pub push: RunReport,
    /// WIC: [`Mode::Fault`], or the way [`try_compare_with`] was given (its `mode` says which).
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

/// Runs every workload as [`compare`] does, WIC both with its host producers writing in place
/// ([`Mode::Fault`]) and with wicd copying their batches ([`Mode::FaultCopy`], the path before
/// in place): per workload the two comparisons, in place first, sharing their alg1 and push
/// runs.
///
/// # Panics
/// If the model cannot hold a workload.
pub fn compare_in_place_and_copy(
    workloads: &[Workload],
    cal: &Calibration,
    seed: u64,
    threads: usize,
    mut progress: impl FnMut(usize, usize, &RunReport),
) -> Vec<(Comparison, Comparison)> {
    let [naive, push, in_place] = Mode::COMPARED;
    let modes = [naive, push, in_place, Mode::FaultCopy];
    let rows = try_run_modes(workloads, &modes, cal, seed, threads, |done, total, run| {
        if let Ok(report) = run {
            progress(done, total, report);
        }
    });
    rows.into_iter()
        .map(|row| match <[RunReport; 4]>::try_from(row.unwrap_or_else(|e| panic!("{e}"))) {
            Ok([naive, push, in_place, copy]) => (
                Comparison { naive: naive.clone(), push: push.clone(), fault: in_place },
                Comparison { naive, push, fault: copy },
            ),
            Err(_) => unreachable!("a run per mode"),
        })
        .collect()
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

/// Runs every workload in every mode ([`Mode::COMPARED`]) on `threads` workers (no more than there are
/// runs), one row per workload in order; a workload the model cannot hold is that row's error and the
/// others still run. `progress` sees each finished run.
pub fn try_compare(
    workloads: &[Workload],
    cal: &Calibration,
    seed: u64,
    threads: usize,
    progress: impl FnMut(usize, usize, &RunOutcome),
) -> Vec<Result<Comparison, RowError>> {
    try_compare_with(workloads, Mode::Fault, cal, seed, threads, progress)
}

/// [`try_compare`] with WIC run as `wic` ([`Mode::Fault`], [`Mode::FaultCopy`] or
/// [`Mode::FaultCopyEngine`]) instead of [`Mode::COMPARED`]'s in place.
pub fn try_compare_with(
    workloads: &[Workload],
    wic: Mode,
    cal: &Calibration,
    seed: u64,
    threads: usize,
    progress: impl FnMut(usize, usize, &RunOutcome),
) -> Vec<Result<Comparison, RowError>> {
    assert!(wic.is_wic(), "{} is not a way of WIC's", wic.name());
    let [naive, push, _] = Mode::COMPARED;
    try_run_modes(workloads, &[naive, push, wic], cal, seed, threads, progress)
        .into_iter()
        .map(|row| {
            let [naive, push, fault] =
                <[RunReport; 3]>::try_from(row?).unwrap_or_else(|_| unreachable!("a run per mode"));
            Ok(Comparison { naive, push, fault })
        })
        .collect()
}

/// Runs every workload in every mode of `modes` on `threads` workers (no more than there are
/// runs), one row per workload in order, its reports in `modes`' order; a workload the model
/// cannot hold is that row's error (the first mode's reason, whichever run finished first, so
/// the row reads the same every time) and the others still run. `progress` sees each finished
/// run.
fn try_run_modes(
    workloads: &[Workload],
    modes: &[Mode],
    cal: &Calibration,
    seed: u64,
    threads: usize,
    progress: impl FnMut(usize, usize, &RunOutcome),
) -> Vec<Result<Vec<RunReport>, RowError>> {
    let jobs: Vec<(&Workload, Mode)> = workloads.iter().flat_map(|w| modes.iter().map(move |&m| (w, m))).collect();
    let mut outcomes = run_in_order(
        &jobs,
        threads,
        |&(workload, mode)| try_run(workload, mode, cal, seed).map_err(|e| (workload.name, mode, e)),
        progress,
    )
    .into_iter();
    workloads
        .iter()
        .map(|_| {
            // The whole row is taken before its first error is kept, so the next row starts
            // at its own first run.
            let row: Vec<RunOutcome> = outcomes.by_ref().take(modes.len()).collect();
            row.into_iter().map(|run| run.map_err(|(workload, _, reason)| RowError { workload, reason })).collect()
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
            let [naive, push, fault] = Mode::COMPARED.map(|m| crate::run(&w, m, &cal, 1));
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

    /// The report's before and after: WIC in place and WIC copying, beside the same alg1 and
    /// push runs; and a comparison of one other way of WIC's.
    #[test]
    fn in_place_and_copy_share_the_baselines_and_a_comparison_runs_the_way_asked() {
        let cal = Calibration::built_in();
        let set = [by_name("C_SRS").unwrap().with_threads(1024), by_name("G_STN").unwrap().with_threads(64)];
        let mut runs = 0;
        let rows = compare_in_place_and_copy(&set, &cal, 1, 2, |_, total, _| {
            runs += 1;
            assert_eq!(total, 8);
        });
        assert_eq!(runs, 8);
        for ((in_place, copy), w) in rows.iter().zip(&set) {
            assert_eq!((in_place.fault.mode, copy.fault.mode), (Mode::Fault, Mode::FaultCopy));
            assert_eq!((in_place.naive.workload, copy.push.workload), (w.name, w.name));
            assert_eq!(in_place.push.runtime_ns, copy.push.runtime_ns);
            assert_eq!(in_place.naive.runtime_ns, copy.naive.runtime_ns);
        }
        // C_SRS's host producer's 16 KiB batches are no longer copied by wicd.
        assert!(rows[0].0.speedup_over_push() > rows[0].1.speedup_over_push());
        assert_eq!(rows[1].0.fault.runtime_ns, rows[1].1.fault.runtime_ns, "a GPU producer's path is the same");
        let engine = try_compare_with(&set[..1], Mode::FaultCopyEngine, &cal, 1, 1, |_, _, _| {});
        assert_eq!(engine[0].as_ref().unwrap().fault.mode, Mode::FaultCopyEngine);
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
