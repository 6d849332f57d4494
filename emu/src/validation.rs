//! The model against the GPU: device/apps' ten programs ([`crate::apps`]) described from their
//! committed GPU runs and run on the model in each mode both run ([`Mode::STOCK_DRIVER`]), each
//! emulated runtime beside the measured one. Only the tests and wic-report use this: the runs
//! are read from their files when asked for ([`measured_runs`]), never compiled in, so a binary
//! that runs the model (`wicd demo`) carries no dated measurement.

use std::path::Path;

use crate::apps::{all, find_run, parse_runs, AppRun};
use crate::calibration::Calibration;
use crate::sim::Mode;

/// Where [`MEASURED`]'s files are, from the repository's root.
pub const RESULTS_DIR: &str = "device/bench/results";

/// The runs the validation compares with, committed under [`RESULTS_DIR`]: each application
/// measured on H100s on the current code, the CPU-GPU ones on one, the inter-GPU ones on a pair.
/// Per file: the prefix of the applications it is for, its source as the report cites it, and
/// its name in [`RESULTS_DIR`].
pub const MEASURED: [(&str, &str, &str); 2] = [
    (
        "C_",
        "NVIDIA H100 80GB HBM3, driver 580.159.04, 2026-11-26, device/bench/results/apps-h100-2026-11-26-current.txt",
        "apps-h100-2026-11-26-current.txt",
    ),
    (
        "G_",
        "2 x NVIDIA H100 80GB HBM3 (NVLink), driver 580.159.04, 2026-11-26, device/bench/results/apps-h100x2-2026-11-26-validation.txt",
        "apps-h100x2-2026-11-26-validation.txt",
    ),
];

/// The runs of [`MEASURED`]'s files in `results` (the repository's [`RESULTS_DIR`]): of each
/// file, the applications it is for; an error naming a file that cannot be read.
pub fn measured_runs(results: &Path) -> Result<Vec<AppRun>, String> {
    let mut runs = Vec::new();
    for (prefix, _, file) in MEASURED {
        let path = results.join(file);
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        runs.extend(parse_runs(&text).into_iter().filter(|r| r.app.starts_with(prefix)));
    }
    Ok(runs)
}

/// The committed runs of [`MEASURED`], for the emulator's tests.
#[cfg(test)]
pub(crate) fn committed_runs() -> Vec<AppRun> {
    measured_runs(&Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(RESULTS_DIR)).expect("the committed runs")
}

/// The largest error, either way, of a row the model is held to.
pub const TOLERANCE: f64 = 0.25;

/// One row of the validation: an application in one mode, measured and emulated.
#[derive(Debug, Clone)]
pub struct Validation {
    pub app: &'static str,
    pub mode: Mode,
    pub measured_ms: f64,
    /// The emulated runtime, or why the model could not run it.
    pub emulated_ms: Result<f64, String>,
}

impl Validation {
    /// emulated / measured - 1.
    pub fn error(&self) -> Option<f64> {
        self.emulated_ms.as_ref().ok().map(|e| e / self.measured_ms - 1.0)
    }
}

/// Every application of `runs` with a no-wait run, in each of `modes` that `runs` measured:
/// described from its no-wait run and run on the model with `cal`.
pub fn validate(runs: &[AppRun], modes: &[Mode], cal: &Calibration, seed: u64) -> Vec<Validation> {
    let mut rows = Vec::new();
    for app in all() {
        let Some(nowait) = find_run(runs, app.name, "nowait") else { continue };
        let workload = app.workload(nowait, cal);
        for &mode in modes {
            let Some(measured) = find_run(runs, app.name, mode.name()) else { continue };
            let emulated_ms = workload
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|w| crate::try_run(w, mode, cal, seed))
                .map(|report| report.runtime_ns as f64 / 1e6);
            rows.push(Validation {
                app: app.name,
                mode,
                measured_ms: measured.number("median_ms").unwrap_or(f64::NAN),
                emulated_ms,
            });
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::by_name;

    fn validation() -> Vec<Validation> {
        validate(&committed_runs(), &Mode::STOCK_DRIVER, &Calibration::built_in(), 1)
    }

    #[test]
    fn every_application_was_measured_correct_in_every_mode_the_model_runs() {
        let runs = committed_runs();
        for app in all() {
            for mode in Mode::STOCK_DRIVER {
                let found = runs.iter().filter(|r| r.app == app.name && r.mode == mode.name()).collect::<Vec<_>>();
                assert!(found.len() == 1 && found[0].correct(), "{} {}: {found:?}", app.name, mode.name());
            }
        }
    }

    /// The no-wait rows check the descriptions, not the model: the consumer's compute comes
    /// from those very runs, and must come back out of the model.
    #[test]
    fn the_no_wait_rows_give_back_the_time_they_were_described_with() {
        let runs = committed_runs();
        let cal = Calibration::built_in();
        for app in all() {
            let nowait = find_run(&runs, app.name, "nowait").unwrap();
            let report = crate::run(&app.workload(nowait, &cal).unwrap(), Mode::NoWait, &cal, 1);
            let error = report.runtime_ns as f64 / 1e6 / nowait.number("median_ms").unwrap() - 1.0;
            assert!(error.abs() < 0.005, "{}: {error}", app.name);
            assert_eq!((report.corrupt_messages, report.error_markers), (0, 0), "{}", app.name);
        }
    }

    #[test]
    fn every_row_is_within_the_tolerance_or_names_the_mechanism_the_model_lacks() {
        for row in validation() {
            let app = by_name(row.app).unwrap();
            let error = row.error().unwrap_or_else(|| panic!("{} {}: {:?}", row.app, row.mode.name(), row.emulated_ms));
            let named = app.missing.iter().any(|(mode, _)| *mode == row.mode);
            assert_eq!(
                error.abs() > TOLERANCE,
                named,
                "{} {}: error {:+.0}%, missing mechanism named: {named}",
                row.app,
                row.mode.name(),
                100.0 * error
            );
        }
    }
}
