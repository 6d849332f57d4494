//! The soak binary keeps its invariants over randomized runs, and the invariant check itself
//! catches what it is there to catch.

use std::process::Command;

use wic_emu::{run, workload, Calibration, Mode};

#[test]
fn a_short_soak_delivers_every_message_exactly_once() {
    let out = Command::new(env!("CARGO_BIN_EXE_wic-soak"))
        .args(["--messages", "200000", "--seed", "7"])
        .output()
        .expect("run wic-soak");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "wic-soak failed:\n{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("a JSON summary");
    assert!(summary["messages_each_mode"].as_u64().unwrap() >= 200_000, "{summary}");
    assert!(summary["runs"].as_u64().unwrap() > 10 && summary["wic_gpu_faults"].as_u64().unwrap() > 0, "{summary}");
}

#[test]
fn bad_options_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_wic-soak")).args(["--messages", "many"]).output().expect("run wic-soak");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a number"));
}

/// A way to break one invariant of a good report.
type Spoil = Box<dyn Fn(&mut wic_emu::RunReport)>;

#[test]
fn the_invariant_check_catches_each_broken_invariant() {
    let cal = Calibration::built_in();
    let w = workload::by_name("C_CG").unwrap().with_threads(256);
    let warps = u64::from(w.phases[0].warps_per_cta);
    let (poll, fault) = (run(&w, Mode::Alg1, &cal, 3), run(&w, Mode::Fault, &cal, 3));
    assert_eq!(wic_tests::check_runs(&poll, &fault, warps), Ok(()));
    let broken: [(&str, Spoil); 5] = [
        ("corrupted", Box::new(|r| r.corrupt_messages = 1)),
        ("lost", Box::new(|r| r.engine.as_mut().unwrap().delivered -= 1)),
        ("duplicated", Box::new(move |r| r.messages_checked += warps)),
        ("PFQ", Box::new(|r| r.pfq_empty = false)),
        ("pool", Box::new(|r| r.pool_restored = false)),
    ];
    for (what, spoil) in broken {
        let mut bad = fault.clone();
        spoil(&mut bad);
        assert!(wic_tests::check_runs(&poll, &bad, warps).is_err(), "{what} went unnoticed");
    }
}
