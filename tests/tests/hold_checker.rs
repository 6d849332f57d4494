//! The held-fault rules (shim/wic_hold.h, uvm_wic_run_final_replay() of shim/include/uvm_wic.h)
//! against a model of the fault buffer, nvidia-uvm's bottom half, the shim's table, ring and
//! expiry, and a quick, slow or gone wicd (tests/hold/hold_check.c): over thousands of drawn
//! interleavings no warp reads a wic page without its data or a marker, none stays held past the
//! bound, no other application's dropped fault waits past the deferred replay, and while the
//! system suspends no warp stays stalled past a short period. Built also with the rules before
//! the deferred replay and the relief, or without the suspend's, the checker must find them
//! wrong: it can fail.

use std::path::{Path, PathBuf};
use std::process::Command;

use wic_tests::{scratch, workspace};

/// Interleavings drawn per run: about 20 s on a 2-core machine.
const SEEDS: &str = "20000";

fn build(dir: &Path, name: &str, defines: &[&str]) -> PathBuf {
    let root = workspace();
    let out = dir.join(name);
    let status = Command::new("cc")
        .args(["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror"])
        // As Kbuild compiles the module: overflow wraps, no strict aliasing.
        .args(["-fno-strict-overflow", "-fno-strict-aliasing"])
        .args(defines)
        .arg("-I")
        .arg(root.join("fuzz/c"))
        .arg("-I")
        .arg(root.join("shim"))
        .arg("-I")
        .arg(root.join("shim/include"))
        .arg(root.join("tests/hold/hold_check.c"))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("cc is required to build the hold checker");
    assert!(status.success(), "compiling hold_check.c {defines:?} failed");
    out
}

fn check(checker: &Path) -> (bool, String) {
    let out = Command::new(checker).args(["--seeds", SEEDS]).output().expect("run the hold checker");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn every_held_fault_is_completed_in_time_and_none_without_its_data() {
    let dir = scratch("hold-checker");
    let (ok, out) = check(&build(&dir, "hold_check", &[]));
    assert!(ok, "the held-fault rules broke an invariant:\n{out}");
    assert!(out.contains(&format!("checked {SEEDS} runs")), "the checker did not run every seed:\n{out}");
}

#[test]
fn the_rules_before_the_deferred_replay_and_the_relief_are_found_wrong() {
    let dir = scratch("hold-checker-old");
    let (ok, out) = check(&build(&dir, "hold_check_old", &["-DHOLD_CHECK_OLD_RULES"]));
    assert!(!ok && out.contains("VIOLATION"), "the checker found nothing wrong with the old rules:\n{out}");
}

#[test]
fn holds_that_go_on_while_the_system_suspends_are_found_wrong() {
    let dir = scratch("hold-checker-no-suspend");
    let (ok, out) = check(&build(&dir, "hold_check_no_suspend", &["-DHOLD_CHECK_NO_SUSPEND"]));
    assert!(
        !ok && out.contains("while the system suspends"),
        "the checker found nothing wrong with holds that ignore a suspend:\n{out}"
    );
}
