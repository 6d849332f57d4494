//! `wicd demo` as a user runs it: the README's sweep end to end, and scales and calibration files
//! it refuses.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn wicd_demo(args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_wicd")).arg("demo").args(args).output().expect("run wicd demo");
    (out, started.elapsed())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The README's thread sweep, exactly as the README gives it: every table complete, every row
/// run and checked byte for byte. It used to stop after three tables: G_GEM's channel at a
/// million threads did not fit the emulator's fixed page pool, and the panic ended the demo.
#[test]
fn the_readmes_sweep_runs_every_row_of_every_table_intact() {
    let readme = include_str!("../../README.md");
    assert!(readme.contains("`wicd demo --scale 64,1K,16K,1M`"), "the README's sweep changed; update this test");
    let (out, took) = wicd_demo(&["--scale", "64,1K,16K,1M"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{:?} after {took:?}\n{stdout}\n{stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let tables: Vec<&str> = stdout.split("\n== ").skip(1).collect();
    assert_eq!(tables.len(), 4, "{stdout}");
    let workloads = ["C_SRS", "C_CG", "C_FE", "C_H3D", "G_BFS", "G_BS", "G_C2D", "G_STN", "G_GEM", "G_KMN"];
    for (table, threads) in tables.iter().zip(["64", "1024", "16384", "1048576"]) {
        assert!(table.starts_with(&format!("{threads} consumer threads per kernel ==")), "{table}");
        let rows: Vec<&str> = table.lines().skip(2).take_while(|line| !line.starts_with("geometric-mean")).collect();
        let names: Vec<&str> = rows.iter().map(|row| row.split_whitespace().next().unwrap_or("")).collect();
        assert_eq!(names, workloads, "{table}");
        for row in rows {
            // app, push and WIC runtimes, WIC over push, naive runtime, WIC over naive, four
            // shares, wicd's share, faults, checked.
            let cells: Vec<&str> = row.split_whitespace().collect();
            assert_eq!((cells.len(), cells[12]), (13, "ok"), "{threads} threads: {row}");
        }
        assert!(table.contains("geometric-mean speedup of WIC over push: "), "{table}");
        assert!(table.contains("; over the naive baseline (alg1)*: "), "{table}");
    }
    assert!(stdout.contains("What the model takes from a GPU, and what it cannot know"), "{stdout}");
    // The co-run table, once, after the sweep's last table.
    assert_eq!(stdout.matches(CORUN_TITLE).count(), 1, "{stdout}");
    assert!(tables[3].contains(CORUN_TITLE), "{stdout}");
    eprintln!("the README's sweep took {took:?}");
}

const CORUN_TITLE: &str = "What waiting costs the work beside it (emulated;";

/// `--only` picks workloads, not the co-run: its table is printed with any of them, every row
/// run, unless `--no-corun` skips it.
#[test]
fn the_corun_table_is_printed_with_only_and_skipped_with_no_corun() {
    let (out, took) = wicd_demo(&["--only", "C_CG"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{:?} after {took:?}\n{stdout}\n{}", out.status, text(&out.stderr));
    let corun = stdout.split(CORUN_TITLE).nth(1).unwrap_or_else(|| panic!("no co-run table: {stdout}"));
    let rows: Vec<&str> = corun.lines().skip(2).take_while(|line| line.contains(" us ")).collect();
    assert_eq!(rows.len(), 8, "{stdout}");
    assert!(rows.iter().all(|row| !row.contains("not run")), "{stdout}");
    assert!(corun.contains("The naive (alg1) rows are not validated"), "{stdout}");
    let (out, took) = wicd_demo(&["--only", "C_CG", "--no-corun"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{:?} after {took:?}\n{stdout}", out.status);
    assert!(stdout.contains("C_CG ") && !stdout.contains("What waiting costs"), "{stdout}");
}

#[test]
fn scales_past_16m_threads_are_refused_by_the_argument_parser() {
    for scale in ["2048M", "64,1K,4096M", "99999999999"] {
        let (out, took) = wicd_demo(&["--scale", scale]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{scale}: {stderr}");
        assert!(stderr.contains("from 32 to 16777216 (16M) consumer threads"), "{scale}: {stderr}");
        assert!(out.stdout.is_empty() && took < Duration::from_secs(10), "{scale}: nothing runs ({took:?})");
    }
}

/// 512M threads of C_CG used to panic in its fault run while the poll run went on for minutes.
#[test]
fn half_a_billion_threads_are_refused_before_anything_runs() {
    let (out, took) = wicd_demo(&["--scale", "512M", "--only", "C_CG"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("`512M` is 536870912 threads, more than the maximum"), "{stderr}");
    assert!(!stderr.contains("panicked") && out.stdout.is_empty() && took < Duration::from_secs(10), "{stderr}");
}

/// The built-in calibration file with `key`'s value replaced by `value`, written for this test.
fn calibration_file(key: &str, value: &str) -> std::path::PathBuf {
    let text = wic_emu::calibration::BUILT_IN;
    let header = format!("[{key}]\nvalue = ");
    let start = text.find(&header).unwrap_or_else(|| panic!("no {key} in the built-in file")) + header.len();
    let end = start + text[start..].find('\n').expect("a line");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("calibration-{}-{key}.toml", std::process::id()));
    std::fs::write(&path, format!("{}{value}{}", &text[..start], &text[end..])).expect("write the calibration file");
    path
}

/// A calibration file with a constant past its range is refused before anything runs, naming
/// the key, the value and the range. `gpu.sms = 4294967295` used to allocate billions of SMs
/// and a latency of 2^63 - 1 ns to overflow the emulated clock, a panic.
#[test]
fn a_calibration_constant_past_its_range_is_refused_before_anything_runs() {
    let cases = [
        ("gpu.sms", "4294967295", "4294967295", "1 to 1024"),
        ("fault.interrupt_to_bh_ns", "9223372036854775807", "9223372036854775807", "0 to 1000000000"),
        ("daemon.wakeup_ns", "1000000001", "1000000001", "0 to 1000000000"),
        ("gpu.warp_slots_per_sm", "4294967295", "4294967295", "1 to 1024"),
        ("link.pcie_gbps", "1e-300", "1e-300", "0.01 to 100000.0"),
        ("gpu.clock_ghz", "nan", "NaN", "0.01 to 10.0"),
    ];
    for (key, written, shown, range) in cases {
        let path = calibration_file(key, written);
        let (out, took) = wicd_demo(&["--only", "C_CG,G_STN", "--calibration", path.to_str().expect("UTF-8 path")]);
        let stderr = text(&out.stderr);
        let _ = std::fs::remove_file(&path);
        assert_eq!(out.status.code(), Some(1), "{key} = {written} after {took:?}: {stderr}");
        let expected = format!("wicd: calibration: {key} = {shown} is outside the allowed range {range}\n");
        assert!(stderr.contains(&expected), "{key}: {stderr}");
        assert!(
            !stderr.contains("panicked") && out.stdout.is_empty() && took < Duration::from_secs(10),
            "{key}: {took:?} {stderr}"
        );
    }
}
