//! `wicd demo`: the ten workloads, naive polling vs WIC, on the emulated GPU through the real
//! engine, run on worker threads with progress on stderr.

use std::io::Write;
use std::time::Instant;

use crossbeam::channel;
use wic_emu::{run, Calibration, Mode, RunReport, Workload};

/// One row of the table: the same workload both ways.
pub struct Comparison {
    pub poll: RunReport,
    pub fault: RunReport,
}

impl Comparison {
    pub fn speedup(&self) -> f64 {
        self.poll.runtime_ns as f64 / self.fault.runtime_ns as f64
    }
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

/// Progress line on stderr: `[3/20] C_CG fault 1.2s`.
pub fn stderr_progress(started: Instant) -> impl FnMut(usize, usize, &RunReport) {
    move |done, total, report| {
        eprint!(
            "\r[{done}/{total}] {} {} done ({:.1}s)      ",
            report.workload,
            report.mode.name(),
            started.elapsed().as_secs_f64()
        );
        if done == total {
            eprintln!();
        }
        let _ = std::io::stderr().flush();
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// The comparison table, one workload a row, plus the geometric-mean speedup.
pub fn table(rows: &[Comparison]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<6} {:>10} {:>10} {:>7} {:>13} {:>13} {:>9} {:>9} {:>8} {:>9} {:>7}\n",
        "app", "naive ms", "WIC ms", "speedup", "cons.ovh naive", "cons.ovh WIC", "ovl naive", "ovl WIC", "WIC ovh", "faults", "checked"
    ));
    for row in rows {
        let engine = row.fault.engine.as_ref().expect("fault runs carry engine stats");
        out.push_str(&format!(
            "{:<6} {:>10.3} {:>10.3} {:>6.3}x {:>13} {:>13} {:>9} {:>9} {:>8} {:>9} {:>7}\n",
            row.poll.workload,
            row.poll.runtime_ns as f64 / 1e6,
            row.fault.runtime_ns as f64 / 1e6,
            row.speedup(),
            pct(row.poll.consumer_overhead),
            pct(row.fault.consumer_overhead),
            pct(row.poll.overlap_efficiency),
            pct(row.fault.overlap_efficiency),
            pct(row.fault.daemon_share),
            engine.entries,
            if row.poll.corrupt_messages + row.fault.corrupt_messages == 0 { "ok" } else { "FAILED" },
        ));
    }
    let geomean = (rows.iter().map(|r| r.speedup().ln()).sum::<f64>() / rows.len().max(1) as f64).exp();
    out.push_str(&format!("geometric-mean speedup of WIC over naive polling: {geomean:.3}x\n"));
    out
}

/// The calibration line of the demo's report: which constants were measured on a GPU, by name,
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
