//! `device/bench/bounds.py` turns a GPU run's application lines and transport benchmark into each
//! application's bound and every mode's ratio to it. It runs on the GPU machines, where nothing
//! checks its arithmetic, so here it runs on lines whose answer is known: a streaming
//! application bound by its producer, one bound by its host pipeline (producer and copies
//! together), one bound by the copy of its bytes, one bound by its consumer, and an inter-GPU
//! application bound by its no-wait run.

use std::process::Command;

use wic_tests::{scratch, workspace};

const APPS: &str = "\
C_A nowait blocks=1 median_ms=2.000 min_ms=1 max_ms=3 producer_ms=20.000 bytes=1000000000 correct=yes
C_A push blocks=1 median_ms=25.000 min_ms=1 max_ms=3 producer_ms=21.000 bytes=1000000000 correct=yes
C_A launch blocks=1 median_ms=30.000 min_ms=1 max_ms=3 producer_ms=21.000 bytes=1000000000 correct=yes
C_A poll blocks=1 median_ms=100.000 min_ms=1 max_ms=3 producer_ms=21.000 bytes=1000000000 correct=yes
C_A alg1 blocks=1 median_ms=200.000 min_ms=1 max_ms=3 producer_ms=21.000 bytes=1000000000 correct=yes
C_B nowait blocks=1 median_ms=1.000 min_ms=1 max_ms=3 producer_ms=5.000 bytes=5000000000 correct=yes
C_B push blocks=1 median_ms=60.000 min_ms=1 max_ms=3 producer_ms=5.000 bytes=5000000000 correct=yes
C_B alg1 blocks=1 median_ms=120.000 min_ms=1 max_ms=3 producer_ms=5.000 bytes=5000000000 correct=no
C_D nowait blocks=1 median_ms=2.000 min_ms=1 max_ms=3 producer_ms=20.000 bytes=1000000000 pipeline_ms=24.000 correct=yes
C_D push blocks=1 median_ms=30.000 min_ms=1 max_ms=3 producer_ms=23.000 bytes=1000000000 waiting_ms=4.000 publishing_ms=1.000 correct=yes
C_C nowait blocks=1 median_ms=40.000 min_ms=1 max_ms=3 producer_ms=1.000 bytes=1000 correct=yes
C_C push blocks=1 median_ms=44.000 min_ms=1 max_ms=3 producer_ms=1.000 bytes=1000 correct=yes
C_C alg1 blocks=1 median_ms=88.000 min_ms=1 max_ms=3 producer_ms=1.000 bytes=1000 correct=yes
C_C: a line without a mode is not a result
";

const APPS_2GPU: &str = "\
G_X: GPU 0 (H100, 0000:00:06.0) and GPU 1 (H100, 0000:00:07.0), peer access both ways
G_X nowait n=4 gpus=0,1 median_ms=4.000 min_ms=1 max_ms=5 correct=yes
G_X push n=4 gpus=0,1 median_ms=5.000 min_ms=1 max_ms=6 correct=yes
G_X tagged n=4 gpus=0,1 median_ms=4.400 min_ms=1 max_ms=6 correct=yes
G_X picked n=4 gpus=0,1 median_ms=4.600 min_ms=1 max_ms=6 correct=yes
G_X alg1 n=4 gpus=0,1 median_ms=40.000 min_ms=1 max_ms=41 correct=yes
";

/// The bulk copy bandwidth the fixture's copy terms are computed with: 1e9 bytes take 10 ms.
const TRANSPORT: &str = "\
{\"measurement\":\"device\",\"name\":\"fixture\"}
{\"measurement\":\"bulk_copy\",\"bytes\":5e8,\"gbps\":100}
";

fn row<'a>(table: &'a str, app: &str) -> Vec<&'a str> {
    let line = table
        .lines()
        .find(|l| l.starts_with(&format!("| {app} |")))
        .unwrap_or_else(|| panic!("no row for {app} in:\n{table}"));
    line.trim_matches('|').split('|').map(str::trim).collect()
}

#[test]
fn bounds_take_the_largest_term_and_ratios_follow_from_it() {
    let dir = scratch("device-bounds");
    let (apps, apps_2gpu, transport) = (dir.join("apps.txt"), dir.join("apps-2gpu.txt"), dir.join("transport.jsonl"));
    std::fs::write(&apps, APPS).unwrap();
    std::fs::write(&apps_2gpu, APPS_2GPU).unwrap();
    std::fs::write(&transport, TRANSPORT).unwrap();
    let out = Command::new("python3")
        .arg(workspace().join("device/bench/bounds.py"))
        .args([&apps, &apps_2gpu, &transport])
        .output()
        .expect("run python3 device/bench/bounds.py");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(out.stdout).unwrap();

    // Columns: app, bound, binds, copy, producer, pipeline, nowait, serial, push/bound,
    // launch/bound, tagged/bound, picked/bound, poll/bound, alg1/bound, alg1/push, all correct.
    let a = row(&table, "C_A");
    assert_eq!(&a[1..8], ["20.00", "producer", "10.00", "20.00", "-", "2.00", "32.00"], "{table}");
    assert_eq!(&a[8..16], ["1.25", "1.50", "-", "-", "5.00", "10.00", "8.00", "yes"], "{table}");
    let d = row(&table, "C_D");
    assert_eq!(&d[1..8], ["24.00", "pipeline", "10.00", "20.00", "24.00", "2.00", "32.00"], "{table}");
    assert_eq!(d[8], "1.25", "{table}");
    let b = row(&table, "C_B");
    assert_eq!(&b[1..4], ["50.00", "copy", "50.00"], "{table}");
    assert_eq!(&b[8..16], ["1.20", "-", "-", "-", "-", "2.40", "2.00", "NO"], "{table}");
    let c = row(&table, "C_C");
    assert_eq!(&c[1..3], ["40.00", "consumer"], "{table}");
    assert_eq!(c[8], "1.10", "{table}");
    let x = row(&table, "G_X");
    assert_eq!(&x[1..4], ["4.00", "consumer", "-"], "{table}");
    assert_eq!(&x[8..16], ["1.25", "-", "1.10", "1.15", "-", "10.00", "8.00", "yes"], "{table}");

    // alg1 / push over the four applications: (8 * 2 * 2 * 8)^(1/4) = 4.
    assert!(table.contains("geometric mean over 4 applications: 4.00"), "{table}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_transport_file_without_the_bulk_copy_is_refused() {
    let dir = scratch("device-bounds-refused");
    let (apps, transport) = (dir.join("apps.txt"), dir.join("transport.jsonl"));
    std::fs::write(&apps, APPS).unwrap();
    std::fs::write(&transport, "{\"measurement\":\"device\"}\n").unwrap();
    let out = Command::new("python3")
        .arg(workspace().join("device/bench/bounds.py"))
        .args([&apps, &transport])
        .output()
        .expect("run python3 device/bench/bounds.py");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no bulk_copy measurement"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
