//! Every workload both ways, naive polling and WIC, on worker threads: the comparison that
//! `wicd demo` prints and the evaluation report plots.

use crossbeam::channel;

use crate::{run, Calibration, Mode, RunReport, Workload};

/// The same workload both ways.
pub struct Comparison {
    pub poll: RunReport,
    pub fault: RunReport,
}

impl Comparison {
    pub fn speedup(&self) -> f64 {
        self.poll.runtime_ns as f64 / self.fault.runtime_ns as f64
    }
}

/// A share as a percentage with one decimal, as the comparison tables print it.
pub fn percent(share: f64) -> String {
    format!("{:.1}%", 100.0 * share)
}

/// The geometric mean of the rows' speedups (1 for no rows).
pub fn geomean_speedup(rows: &[Comparison]) -> f64 {
    (rows.iter().map(|r| r.speedup().ln()).sum::<f64>() / rows.len().max(1) as f64).exp()
}

/// Runs every workload in both modes on `threads` workers; `progress` sees each finished run.
pub fn compare(
    workloads: &[Workload],
    cal: &Calibration,
    seed: u64,
    threads: usize,
    mut progress: impl FnMut(usize, usize, &RunReport),
) -> Vec<Comparison> {
    let jobs: Vec<(usize, Mode)> =
        (0..workloads.len()).flat_map(|i| [Mode::Poll, Mode::Fault].map(|m| (i, m))).collect();
    let (job_tx, job_rx) = channel::unbounded();
    for job in &jobs {
        job_tx.send(*job).expect("receiver alive");
    }
    drop(job_tx);
    let (done_tx, done_rx) = channel::unbounded();
    let mut results: Vec<(Option<RunReport>, Option<RunReport>)> = (0..workloads.len()).map(|_| (None, None)).collect();
    crossbeam::scope(|scope| {
        for _ in 0..threads.max(1) {
            let (job_rx, done_tx) = (job_rx.clone(), done_tx.clone());
            scope.spawn(move |_| {
                for (index, mode) in job_rx {
                    let report = run(&workloads[index], mode, cal, seed);
                    if done_tx.send((index, report)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(done_tx);
        for (finished, (index, report)) in done_rx.iter().enumerate() {
            progress(finished + 1, jobs.len(), &report);
            let slot = &mut results[index];
            match report.mode {
                Mode::Poll => slot.0 = Some(report),
                Mode::Fault => slot.1 = Some(report),
            }
        }
    })
    .expect("a worker panicked");
    results
        .into_iter()
        .map(|(poll, fault)| Comparison { poll: poll.expect("poll run"), fault: fault.expect("fault run") })
        .collect()
}

/// The calibration line of a report: which constants were measured on a GPU, by name,
/// and how many are datasheet, published or estimated values.
pub fn calibration_summary(cal: &Calibration) -> String {
    let table = cal.table();
    let measured: Vec<&str> = table.iter().filter(|row| row.3).map(|row| row.0).collect();
    let list = if measured.is_empty() { String::new() } else { format!(" ({})", measured.join(", ")) };
    format!(
        "Calibration: {} of {} constants measured on a GPU{list}; the other {} are datasheet, published or estimated values (sources in emu/calibration.toml).",
        measured.len(),
        table.len(),
        table.len() - measured.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calibration_line_names_exactly_the_measured_constants() {
        let mut cal = Calibration::built_in();
        cal.gpu.sms.measured = false;
        cal.link.pcie_gbps.measured = true;
        cal.gpu.warp_ipc.measured = true;
        let line = calibration_summary(&cal);
        let measured: Vec<&str> = cal.table().into_iter().filter(|row| row.3).map(|row| row.0).collect();
        assert!(measured.contains(&"gpu.warp_ipc") && !measured.contains(&"gpu.sms"));
        for (name, _, _, was_measured) in cal.table() {
            assert_eq!(line.contains(name), was_measured, "{name} in {line}");
        }
        assert!(line.starts_with(&format!("Calibration: {} of {} constants", measured.len(), cal.table().len())), "{line}");
    }
}
