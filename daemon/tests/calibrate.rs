//! `wicd calibrate` as the bring-up runs it: two `wicctl stats --json` snapshots in, a
//! calibration file out that `wicd demo --calibration` runs with.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use wic_emu::Calibration;
use wic_proto::message::{Stats, Submissions};

const MACHINE: &str = "NVIDIA H100 80GB HBM3, driver 580.159.04 (patched), test";

fn wicd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wicd")).args(args).output().expect("run wicd")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn temp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("calibrate-{}-{name}", std::process::id()))
}

/// `submissions` with one batch of each page count in `pages`, each taking `ns(pages)`.
fn record(submissions: &mut Submissions, pages: &[u64], ns: impl Fn(u64) -> u64) {
    for &p in pages {
        submissions.record(p, 0, ns(p));
    }
}

/// `stats` written as `wicctl stats --json` writes it.
fn snapshot(name: &str, stats: &Stats) -> PathBuf {
    let path = temp(name);
    std::fs::write(&path, serde_json::to_string_pretty(stats).expect("Stats serialize")).expect("write a snapshot");
    path
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// Batches before the first snapshot cost something else: only those between the two count.
#[test]
fn the_fitted_file_loads_and_the_demo_runs_with_it() {
    let pages: Vec<u64> = (0..48).map(|i| [1, 2, 4, 16, 33, 128][i % 6]).collect();
    let mut stats = Stats { faults_captured: 7, ..Stats::default() };
    record(&mut stats.submissions, &pages[..12], |p| 50_000 + 5_000 * p);
    let before = snapshot("before.json", &stats);
    record(&mut stats.submissions, &pages, |p| 2_600 + 140 * p);
    let after = snapshot("after.json", &stats);
    let out = temp("measured.toml");
    let _ = std::fs::remove_file(&out);

    let ran = wicd(&[
        "calibrate",
        "--before",
        path_str(&before),
        "--after",
        path_str(&after),
        "--machine",
        MACHINE,
        "--out",
        path_str(&out),
    ]);
    let stdout = text(&ran.stdout);
    assert!(ran.status.success(), "{:?}\n{stdout}\n{}", ran.status, text(&ran.stderr));
    assert!(stdout.contains("daemon.submission_ns = 2600 ns per batch"), "{stdout}");
    assert!(stdout.contains("daemon.per_page_ns = 140 ns per page"), "{stdout}");
    assert!(stdout.contains("fitted over 48 batches, 1472 pages"), "{stdout}");
    // wicd's other costs were measured where wicd ran: only the fault path's estimates are left.
    let estimates = stdout.lines().find(|l| l.starts_with("still estimates: ")).expect("the estimates' line");
    assert!(estimates.contains("fault.buffer_entries") && !estimates.contains("daemon."), "{stdout}");

    let cal = Calibration::from_toml(&std::fs::read_to_string(&out).expect("the file written")).expect("it loads");
    let (submission, per_page) = (&cal.daemon.submission_ns, &cal.daemon.per_page_ns);
    assert_eq!((submission.value, submission.measured, per_page.value, per_page.measured), (2600, true, 140, true));
    let source = format!(
        "measured by wicd calibrate from wicd's command batches on the shim backend (48 batches, 1472 pages): {MACHINE}"
    );
    assert_eq!((submission.source.as_str(), per_page.source.as_str()), (source.as_str(), source.as_str()));

    let demo = wicd(&["demo", "--only", "C_CG", "--no-corun", "--calibration", path_str(&out)]);
    let stdout = text(&demo.stdout);
    assert!(demo.status.success(), "{:?}\n{stdout}\n{}", demo.status, text(&demo.stderr));
    assert!(stdout.contains(&format!("  daemon.submission_ns = 2600 (measured): {source}")), "{stdout}");
    assert!(stdout.contains(&format!("  daemon.per_page_ns = 140 (measured): {source}")), "{stdout}");
    for path in [before, after, out] {
        let _ = std::fs::remove_file(path);
    }
}

/// Snapshots in the wrong order (or of a restarted wicd) are refused and nothing is written.
#[test]
fn snapshots_of_a_restarted_wicd_are_refused_writing_nothing() {
    let mut stats = Stats::default();
    record(&mut stats.submissions, &[1, 2, 3, 4].repeat(10), |p| 3000 + 200 * p);
    let later = snapshot("later.json", &stats);
    let restarted = snapshot("restarted.json", &Stats::default());
    let out = temp("refused.toml");
    let _ = std::fs::remove_file(&out);
    let ran = wicd(&[
        "calibrate",
        "--before",
        path_str(&later),
        "--after",
        path_str(&restarted),
        "--machine",
        MACHINE,
        "--out",
        path_str(&out),
    ]);
    let stderr = text(&ran.stderr);
    assert_eq!(ran.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("wicd: submissions.count is 0 in --after but 40 in --before: wicd restarted"),
        "{stderr}"
    );
    assert!(!out.exists() && ran.stdout.is_empty());
    for path in [later, restarted] {
        let _ = std::fs::remove_file(path);
    }
}
