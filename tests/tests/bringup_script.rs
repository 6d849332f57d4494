//! `device/bringup.sh` where the patched driver is not there (this machine: no NVIDIA driver, or
//! NVIDIA's stock one): it must stop at its first check, say why in its table, and exit 1, so
//! that an operator's automation never takes a machine without the hook for a good one.

use std::process::Command;

use wic_tests::{built, workspace};

#[test]
fn without_the_patched_driver_bringup_fails_at_the_hook_check() {
    // Only where no NVIDIA driver is installed (as on CI): elsewhere the script would load
    // nvidia-uvm (nvidia-modprobe), and on a machine with wic it would go on to the GPU cases.
    let driver = std::path::Path::new("/sys/module/nvidia").exists()
        || std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .any(|d| d.join("nvidia-modprobe").is_file());
    if driver {
        println!("SKIPPED: an NVIDIA driver is installed here; this test is for machines without one");
        return;
    }
    let out = Command::new("bash")
        .arg(workspace().join("device/bringup.sh"))
        .arg("--bin")
        .arg(built())
        .output()
        .expect("run device/bringup.sh");
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "bringup.sh exited {:?}:\n{table}", out.status.code());
    let hook = table.lines().find(|l| l.starts_with("hook ")).unwrap_or_else(|| panic!("no hook row:\n{table}"));
    assert!(hook.contains("FAIL"), "{hook}");
    assert!(
        hook.contains("nvidia-uvm is not loaded") || hook.contains("has no wic hook"),
        "the hook row does not say why: {hook}"
    );
    assert_eq!(table.lines().count(), 2, "checks ran past the missing hook:\n{table}");
}
