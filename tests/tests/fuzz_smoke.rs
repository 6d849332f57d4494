//! The fuzz targets (`fuzz/`, see its README) build with libFuzzer's instrumentation on stable
//! Rust, and each runs for a short while from a copy of its seed corpus without a crash, a
//! failed property or a hang. The long runs are in docs/reliability.md.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use wic_tests::{scratch, target_dir, workspace};

const TARGETS: [&str; 5] = ["fault_decode", "fault_ring", "wire_protocol", "submit_validation", "shim_ranges"];

/// How long each target runs.
const SECONDS_EACH: u32 = 20;

/// Targets run at once: one per core of the smallest machine the tests run on.
const AT_ONCE: usize = 2;

/// What `cargo fuzz build` passes, minus the sanitizer (stable Rust has none): libFuzzer's
/// coverage counters and comparison hooks, and checks on in release.
const RUSTFLAGS: &str = "--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks";

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// The host's target triple: building for it explicitly keeps the instrumentation away from
/// build scripts and proc macros.
fn host_triple() -> String {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let output = Command::new(rustc).arg("-vV").output().expect("run rustc -vV");
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines().find_map(|line| line.strip_prefix("host: ")).expect("rustc -vV names the host").to_string()
}

/// Builds every target; the directory holding the binaries.
fn build() -> PathBuf {
    let triple = host_triple();
    let dir = target_dir().parent().expect("target/<profile> has a parent").join("fuzz");
    let mut build = cargo();
    build
        .current_dir(workspace().join("fuzz"))
        .args(["build", "--release", "--locked", "--target", &triple])
        .args(TARGETS.iter().flat_map(|target| ["--bin", target]))
        .env("CARGO_TARGET_DIR", &dir)
        .env("RUSTFLAGS", RUSTFLAGS)
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    let status = build.status().expect("run cargo build for fuzz/");
    assert!(status.success(), "building the fuzz targets failed");
    dir.join(triple).join("release")
}

/// A copy of `target`'s seed corpus in a scratch directory, which the run may add to.
fn corpus_copy(target: &str) -> PathBuf {
    let dir = scratch(&format!("fuzz-{target}"));
    let corpus = dir.join("corpus");
    std::fs::create_dir_all(&corpus).expect("create the corpus copy");
    let seeds = workspace().join("fuzz/corpus").join(target);
    for entry in std::fs::read_dir(&seeds).unwrap_or_else(|e| panic!("{}: {e}", seeds.display())) {
        let path = entry.expect("read the seed corpus").path();
        std::fs::copy(&path, corpus.join(path.file_name().expect("a file name"))).expect("copy a seed");
    }
    dir
}

fn start(bins: &Path, target: &str) -> (Child, PathBuf) {
    let dir = corpus_copy(target);
    let log = std::fs::File::create(dir.join("log")).expect("create the run's log");
    let child = Command::new(bins.join(target))
        .current_dir(&dir)
        .arg(format!("-max_total_time={SECONDS_EACH}"))
        // An input that runs this long is a hang.
        .arg("-timeout=10")
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", dir.display()))
        .arg("corpus")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start {target}: {e}"));
    (child, dir)
}

/// The figures of a finished run: libFuzzer's last status line and final statistics.
fn summary(log: &str) -> String {
    let status =
        log.lines().rev().find(|line| line.split_whitespace().nth(1) == Some("DONE")).unwrap_or("no DONE line");
    let stat = |name: &str| {
        log.lines().find_map(|line| line.strip_prefix(&format!("stat::{name}: "))).unwrap_or("?").to_string()
    };
    format!("{} execs, {} exec/s; {}", stat("number_of_executed_units"), stat("average_exec_per_sec"), status.trim())
}

#[test]
fn every_fuzz_target_runs_without_a_crash() {
    if Command::new("c++").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
        eprintln!("skipped: no C++ compiler (c++, from g++) to build libFuzzer");
        return;
    }
    let bins = build();
    let mut failures = Vec::new();
    for batch in TARGETS.chunks(AT_ONCE) {
        let runs: Vec<_> = batch.iter().map(|target| (target, start(&bins, target))).collect();
        for (target, (mut child, dir)) in runs {
            let status = child.wait().expect("wait for a fuzz run");
            let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
            println!("{target}: {}", summary(&log));
            if !status.success() {
                let tail: Vec<&str> = log.lines().rev().take(60).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                failures.push(format!("{target} ({status}, artifacts in {}):\n{}", dir.display(), tail.join("\n")));
            }
        }
    }
    assert!(failures.is_empty(), "fuzz targets failed:\n\n{}", failures.join("\n\n"));
}
