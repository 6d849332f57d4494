//! `wicd demo`: the ten workloads, naive polling vs WIC, on the emulated GPU through the real
//! engine, run on worker threads with progress on stderr.

use std::io::Write;
use std::time::Instant;

use wic_emu::compare::{percent, Comparison};
use wic_emu::RunReport;

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
            percent(row.poll.consumer_overhead),
            percent(row.fault.consumer_overhead),
            percent(row.poll.overlap_efficiency),
            percent(row.fault.overlap_efficiency),
            percent(row.fault.daemon_share),
            engine.entries,
            if row.poll.corrupt_messages + row.fault.corrupt_messages == 0 { "ok" } else { "FAILED" },
        ));
    }
    let geomean = wic_emu::compare::geomean_speedup(rows);
    out.push_str(&format!("geometric-mean speedup of WIC over naive polling: {geomean:.3}x\n"));
    out
}
