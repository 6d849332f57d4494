//! `wic-bench doorbell --quick` wakes a real wicd through libwic and writes a sane row: every
//! figure positive, each p99 at least its p50, and the span from the publish call's start at
//! least the wake-up it contains and the publish call itself.

use std::process::Command;

use wic_bench::Results;

#[test]
fn the_quick_doorbell_bench_writes_a_sane_row() {
    let json = std::env::temp_dir().join(format!("wic-bench-doorbell-test-{}.json", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_wic-bench"))
        .args(["doorbell", "--quick", "--json"])
        .arg(&json)
        .output()
        .expect("run wic-bench");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.lines().any(|l| l.starts_with("doorbell: ")), "no summary line:\n{stdout}");
    let results: Results = serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON")).expect("results");
    let _ = std::fs::remove_file(&json);
    let row = results.doorbell.expect("a doorbell row");
    assert!(row.rounds > 0);
    let pairs = [
        (row.publish_p50_ns, row.publish_p99_ns),
        (row.span_p50_ns, row.span_p99_ns),
        (row.wakeup_p50_ns, row.wakeup_p99_ns),
        (row.uring_wake_p50_ns, row.uring_wake_p99_ns),
        (row.read_wake_p50_ns, row.read_wake_p99_ns),
    ];
    for (p50, p99) in pairs {
        assert!(p50 > 0.0 && p99 >= p50, "{row:?}");
    }
    assert!(row.write_p50_ns > 0.0 && row.wakeup_over_uring_p50 > 0.0, "{row:?}");
    assert!(row.span_p50_ns >= row.wakeup_p50_ns && row.span_p99_ns >= row.wakeup_p99_ns, "{row:?}");
    assert!(row.span_p50_ns >= row.publish_p50_ns, "the span holds the publish call: {row:?}");
}
