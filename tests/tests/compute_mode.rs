//! `deploy/wic-compute-mode`, which `wic-compute-mode.service` runs at boot: it sets compute mode
//! `EXCLUSIVE_PROCESS` on the GPUs of `[shim] gpus` alone, through `nvidia-smi`, skips MIG
//! instances and refuses an empty list. `nvidia-smi` here is a stand-in that records its
//! arguments: no GPU's settings are ever changed by the tests.

use std::path::Path;
use std::process::Command;

use wic_tests::{binary, scratch, workspace};

const A: &str = "GPU-f8b6392b-54c8-ef74-2dc3-c6ed7bde1ec5";
const MIG: &str = "MIG-11111111-2222-3333-4444-555555555555";
const B: &str = "6871d114-5c34-a5ec-0b30-451b680ec522";

/// Runs the script on a configuration listing `gpus`, with a stand-in nvidia-smi that exits
/// `smi_status`: its exit status, output, and the nvidia-smi calls (one line each).
fn run(dir: &Path, gpus: &[&str], smi_status: i32) -> (Option<i32>, String, String) {
    let config = dir.join("wicd.toml");
    let list: Vec<String> = gpus.iter().map(|g| format!("\"{g}\"")).collect();
    std::fs::write(&config, format!("[shim]\ngpus = [{}]\n", list.join(", "))).unwrap();
    let calls = dir.join("calls");
    let _ = std::fs::remove_file(&calls);
    let smi = dir.join("nvidia-smi");
    std::fs::write(&smi, format!("#!/bin/sh\necho \"$*\" >> {}\nexit {smi_status}\n", calls.display())).unwrap();
    Command::new("chmod").arg("755").arg(&smi).status().unwrap();
    let out = Command::new("/bin/sh")
        .arg(workspace().join("deploy/wic-compute-mode"))
        .arg(&config)
        .env("WICD", binary("wicd"))
        .env("NVIDIA_SMI", &smi)
        .output()
        .expect("run wic-compute-mode");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text, std::fs::read_to_string(&calls).unwrap_or_default())
}

#[test]
fn only_the_listed_gpus_are_set_exclusive_and_an_empty_list_changes_nothing() {
    let dir = scratch("compute-mode");
    let (code, text, calls) = run(&dir, &[A, MIG, B], 0);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(
        calls,
        format!("-i {A} -c EXCLUSIVE_PROCESS\n-i GPU-{B} -c EXCLUSIVE_PROCESS\n"),
        "a bare UUID is a GPU's; a MIG instance is left alone:\n{text}"
    );
    assert!(text.contains(&format!("{MIG} is a MIG instance")), "{text}");

    let (code, text, calls) = run(&dir, &[], 0);
    assert_eq!(code, Some(1), "{text}");
    assert!(calls.is_empty() && text.contains("lists no GPU in [shim] gpus"), "{text}");

    let (code, text, _) = run(&dir, &[A], 9);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains(&format!("could not set {A}")), "{text}");

    let (code, text, calls) = run(&dir, &["GPU-0"], 0);
    assert_eq!(code, Some(1), "a malformed list: {text}");
    assert!(calls.is_empty() && text.contains("shim.gpus"), "{text}");
}
