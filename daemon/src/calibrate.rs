//! `wicd calibrate`: measures the emulator's cost of one command batch to the kernel module,
//! `daemon.submission_ns + daemon.per_page_ns * pages` (emu/src/sim/wicd.rs `submit`), from the
//! batches a wicd on the shim backend ran between two `wicctl stats --json` snapshots. The model
//! charges the module's copies of the messages' bytes apart (`host.memcpy_gbps`), so the fit is
//! of each batch's time less that cost: what remains is the two constants' share alone.

use std::path::{Path, PathBuf};

use wic_emu::calibration::{self, Calibration, BUILT_IN};
use wic_proto::message::{Stats, Submissions};

/// Fewer batches than this are too few to call the fit a measurement.
const MIN_BATCHES: u64 = 20;

/// What the bring-up should run when the batches cannot separate the two constants.
const VARY_PAGES: &str = "run cases between the two snapshots whose batches map different numbers of pages \
     (messages of one page and of several, one waiting warp and many)";

#[derive(clap::Args)]
pub struct CalibrateArgs {
    /// `wicctl stats --json` of the wicd, taken before the cases.
    #[arg(long, value_name = "STATS.json")]
    before: PathBuf,
    /// `wicctl stats --json` of the same wicd (not restarted), taken after them.
    #[arg(long, value_name = "STATS.json")]
    after: PathBuf,
    /// The calibration file whose other constants to keep (default: the built-in one).
    #[arg(long, value_name = "CALIBRATION.toml")]
    base: Option<PathBuf>,
    /// The machine measured, written into the two constants' source: GPU, driver, date.
    #[arg(long, value_name = "TEXT")]
    machine: String,
    /// Where to write the calibration file.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

/// Batch time = `submission_ns` + `per_page_ns` x pages, fitted by least squares.
#[derive(Debug, PartialEq)]
struct Fit {
    submission_ns: f64,
    per_page_ns: f64,
}

pub fn run(args: &CalibrateArgs) -> Result<(), String> {
    let batches = between(&read_stats(&args.before)?, &read_stats(&args.after)?)?;
    let base = match &args.base {
        Some(path) => read(path)?,
        None => BUILT_IN.to_string(),
    };
    let copy_ns_per_byte = 1.0 / Calibration::from_toml(&base)?.host.memcpy_gbps.value;
    let fit = fit(&batches, copy_ns_per_byte)?;
    let source = format!(
        "measured by wicd calibrate from wicd's command batches on the shim backend ({} batches, {} pages): {}",
        batches.count, batches.pages, args.machine
    );
    // `fit` refused negative values, so the casts only round.
    let text = calibration::set_measured(&base, "daemon.submission_ns", fit.submission_ns.round() as u64, &source)?;
    let text = calibration::set_measured(&text, "daemon.per_page_ns", fit.per_page_ns.round() as u64, &source)?;
    std::fs::write(&args.out, &text).map_err(|e| format!("{}: {e}", args.out.display()))?;
    print!("{}", report(&Calibration::from_toml(&text)?, &batches, &args.out));
    Ok(())
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn read_stats(path: &Path) -> Result<Stats, String> {
    serde_json::from_str(&read(path)?).map_err(|e| format!("{}: not `wicctl stats --json` output: {e}", path.display()))
}

/// The batches that ran between two snapshots of one wicd's counters.
fn between(before: &Stats, after: &Stats) -> Result<Submissions, String> {
    let minus = |field: &str, after: u64, before: u64| {
        if after == u64::MAX {
            return Err(format!("submissions.{field} in --after reached its maximum and stopped counting"));
        }
        after.checked_sub(before).ok_or_else(|| {
            format!(
                "submissions.{field} is {after} in --after but {before} in --before: wicd restarted between \
                 them? Take both snapshots from one wicd run"
            )
        })
    };
    let (b, a) = (&before.submissions, &after.submissions);
    Ok(Submissions {
        count: minus("count", a.count, b.count)?,
        pages: minus("pages", a.pages, b.pages)?,
        ns: minus("ns", a.ns, b.ns)?,
        pages_squared: minus("pages_squared", a.pages_squared, b.pages_squared)?,
        pages_ns: minus("pages_ns", a.pages_ns, b.pages_ns)?,
        bytes: minus("bytes", a.bytes, b.bytes)?,
        pages_bytes: minus("pages_bytes", a.pages_bytes, b.pages_bytes)?,
    })
}

/// `p q - r s`, exact until the conversion (the products of sums overflow `u64`).
fn cross(p: u64, q: u64, r: u64, s: u64) -> f64 {
    let (pq, rs) = (u128::from(p) * u128::from(q), u128::from(r) * u128::from(s));
    if pq >= rs {
        (pq - rs) as f64
    } else {
        -((rs - pq) as f64)
    }
}

/// n² times the variance of the batches' pages.
fn pages_spread(s: &Submissions) -> f64 {
    cross(s.count, s.pages_squared, s.pages, s.pages)
}

/// Least squares of time, less the model's cost of the batch's copies at `copy_ns_per_byte`,
/// against pages over the batches' sums.
fn fit(s: &Submissions, copy_ns_per_byte: f64) -> Result<Fit, String> {
    if s.count < MIN_BATCHES {
        return Err(format!(
            "{} command batches ran between the snapshots, fewer than the {MIN_BATCHES} the fit needs: run more \
             cases between them (on the shim backend: the emulated one submits no batches)",
            s.count
        ));
    }
    let spread = pages_spread(s);
    if spread < 0.0 {
        return Err(
            "the submissions sums are inconsistent (n * pages_squared < pages^2): not one wicd's counters".into()
        );
    }
    if spread == 0.0 {
        return Err(format!(
            "all {} batches mapped or unmapped {} pages each: with no spread in pages the fit cannot separate \
             daemon.submission_ns from daemon.per_page_ns; {VARY_PAGES}",
            s.count,
            s.pages / s.count
        ));
    }
    // Sums of the times less the copies: t' = t - c b, so Σt' = Σt - c Σb, Σpt' = Σpt - c Σpb.
    let copies = copy_ns_per_byte * (s.count as f64 * s.pages_bytes as f64 - s.pages as f64 * s.bytes as f64);
    let per_page_ns = (cross(s.count, s.pages_ns, s.pages, s.ns) - copies) / spread;
    let ns = s.ns as f64 - copy_ns_per_byte * s.bytes as f64;
    let submission_ns = (ns - per_page_ns * s.pages as f64) / s.count as f64;
    if submission_ns.round() < 0.0 || per_page_ns.round() < 0.0 {
        return Err(format!(
            "the fit gives daemon.submission_ns = {submission_ns:.0} ns and daemon.per_page_ns = {per_page_ns:.1} \
             ns per page: a negative cost is noise, not a measurement; {VARY_PAGES}, and more of them"
        ));
    }
    Ok(Fit { submission_ns, per_page_ns })
}

/// What was written, and which of wicd's and the fault path's constants are still estimates.
fn report(cal: &Calibration, batches: &Submissions, out: &Path) -> String {
    let (n, d) = (batches.count as f64, &cal.daemon);
    let estimates: Vec<&str> = cal
        .table()
        .into_iter()
        .filter(|(name, _, _, measured)| !measured && (name.starts_with("daemon.") || name.starts_with("fault.")))
        .map(|(name, ..)| name)
        .collect();
    // Without the sum of squared times the fit's residuals are unknown; the pages' spread says how
    // well the batches separate the two constants.
    format!(
        "wrote {}:\n  daemon.submission_ns = {} ns per batch\n  daemon.per_page_ns = {} ns per page\n  \
         fitted over {} batches, {} pages (per batch: mean {:.1}, standard deviation {:.1}; mean time {:.0} ns)\n\
         still estimates: {}\n",
        out.display(),
        d.submission_ns.value,
        d.per_page_ns.value,
        batches.count,
        batches.pages,
        batches.pages as f64 / n,
        pages_spread(batches).sqrt() / n,
        batches.ns as f64 / n,
        if estimates.is_empty() { "none".to_string() } else { estimates.join(", ") }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sums wicd records for batches of `pages` that take `ns(pages)` each.
    fn sums(pages: impl IntoIterator<Item = u64>, ns: impl Fn(u64) -> u64) -> Submissions {
        let mut s = Submissions::default();
        for p in pages {
            s.record(p, 0, ns(p));
        }
        s
    }

    fn varied(batches: u64) -> impl Iterator<Item = u64> {
        (0..batches).map(|i| [0, 1, 2, 8, 32, 64][i as usize % 6])
    }

    fn snapshot(submissions: Submissions) -> Stats {
        Stats { submissions, ..Stats::default() }
    }

    #[test]
    fn the_fit_recovers_the_cost_of_exact_batches() {
        let s = sums(varied(60), |p| 2750 + 187 * p);
        assert_eq!(fit(&s, 0.0), Ok(Fit { submission_ns: 2750.0, per_page_ns: 187.0 }));
        // Zero costs are measurements too.
        assert_eq!(fit(&sums(varied(20), |p| 40 * p), 0.0), Ok(Fit { submission_ns: 0.0, per_page_ns: 40.0 }));
    }

    #[test]
    fn the_models_cost_of_the_copies_is_taken_out_before_the_fit() {
        // Each batch copies 2 KiB per page it maps, at 0.5 ns per byte: the model charges that
        // apart, so the two constants must not take it in.
        let mut s = Submissions::default();
        for p in varied(60) {
            s.record(p, 2048 * p, 2750 + 187 * p + 1024 * p);
        }
        assert_eq!(fit(&s, 0.5), Ok(Fit { submission_ns: 2750.0, per_page_ns: 187.0 }));
        assert_eq!(fit(&s, 0.0), Ok(Fit { submission_ns: 2750.0, per_page_ns: 1211.0 }), "counted twice");
    }

    #[test]
    fn the_fit_is_least_squares_through_noise() {
        let mut s = Submissions::default();
        for (i, p) in varied(120).enumerate() {
            // Each page count's batches lie 300 ns above the line as often as below it.
            let noise = if (i / 6) % 2 == 0 { 300 } else { -300 };
            s.record(p, 0, (1500 + 45 * p as i64 + noise) as u64);
        }
        assert_eq!(fit(&s, 0.0), Ok(Fit { submission_ns: 1500.0, per_page_ns: 45.0 }));
    }

    #[test]
    fn only_the_batches_between_the_snapshots_count() {
        let before = sums(varied(30), |p| 90_000 + 9_000 * p);
        let mut after = before.clone();
        for p in varied(40) {
            after.record(p, 0, 3000 + 200 * p);
        }
        let batches = between(&snapshot(before), &snapshot(after)).expect("after >= before");
        assert_eq!(batches, sums(varied(40), |p| 3000 + 200 * p));
        assert_eq!(fit(&batches, 0.0), Ok(Fit { submission_ns: 3000.0, per_page_ns: 200.0 }));
    }

    #[test]
    fn a_restarted_or_saturated_wicd_is_refused() {
        let (few, more) = (sums(varied(10), |p| 100 * p), sums(varied(30), |p| 100 * p));
        let e = between(&snapshot(more.clone()), &snapshot(few)).unwrap_err();
        assert!(e.starts_with("submissions.count is 10 in --after but 30 in --before: wicd restarted"), "{e}");
        let mut one_field_back = more.clone();
        one_field_back.ns -= 1;
        let e = between(&snapshot(more.clone()), &snapshot(one_field_back)).unwrap_err();
        assert!(e.starts_with("submissions.ns is "), "{e}");
        let mut saturated = more.clone();
        saturated.pages_ns = u64::MAX;
        let e = between(&snapshot(more), &snapshot(saturated)).unwrap_err();
        assert!(e.contains("submissions.pages_ns in --after reached its maximum"), "{e}");
    }

    #[test]
    fn too_few_batches_are_refused() {
        let e = fit(&sums(varied(19), |p| 3000 + 200 * p), 0.0).unwrap_err();
        assert!(e.starts_with("19 command batches ran between the snapshots, fewer than the 20"), "{e}");
        assert!(fit(&sums(varied(20), |p| 3000 + 200 * p), 0.0).is_ok());
    }

    #[test]
    fn batches_all_of_one_size_are_refused_saying_what_to_run() {
        for pages in [0, 4] {
            let e = fit(&sums([pages; 50], |p| 3000 + 200 * p), 0.0).unwrap_err();
            assert!(e.starts_with(&format!("all 50 batches mapped or unmapped {pages} pages each")), "{e}");
            assert!(e.contains("cannot separate") && e.contains(VARY_PAGES), "{e}");
        }
        let mut inconsistent = sums(varied(30), |p| 3000 + 200 * p);
        inconsistent.pages_squared = 0;
        assert!(fit(&inconsistent, 0.0).unwrap_err().contains("inconsistent"));
    }

    #[test]
    fn negative_costs_are_refused() {
        // Small batches slow, large ones fast: a negative slope.
        let e = fit(&sums(varied(30), |p| 10_000 - 100 * p), 0.0).unwrap_err();
        assert!(e.contains("daemon.per_page_ns = -100.0 ns per page") && e.contains("negative"), "{e}");
        let e = fit(&sums(varied(30), |p| (1000 * p).saturating_sub(500)), 0.0).unwrap_err();
        assert!(e.contains("daemon.submission_ns = -") && e.contains("negative"), "{e}");
    }

    #[test]
    fn the_report_names_the_values_and_the_estimates_left() {
        let batches = sums(varied(60), |p| 2750 + 187 * p);
        let text = calibration::set_measured(BUILT_IN, "daemon.submission_ns", 2750, "m").unwrap();
        let report = report(&Calibration::from_toml(&text).unwrap(), &batches, Path::new("c.toml"));
        assert!(report.contains("daemon.submission_ns = 2750 ns per batch"), "{report}");
        assert!(report.contains("fitted over 60 batches, 1070 pages"), "{report}");
        let estimates = report.split("still estimates: ").nth(1).unwrap();
        assert!(estimates.contains("daemon.per_page_ns") && estimates.contains("fault.replay_ns"), "{report}");
        assert!(!estimates.contains("daemon.submission_ns") && !estimates.contains("fault.per_fault_ns"), "{report}");
        assert!(!estimates.contains("gpu.") && !estimates.contains("link."), "{report}");
    }
}
