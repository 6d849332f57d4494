//! The device code (device/: wic.cuh, its test, the applications and the calibration
//! benchmarks) compiles for Hopper with `-Wall -Wextra` as errors, so it never rots on machines
//! without a GPU. It can only run on a GPU (device/run.sh). nvcc is taken from `$WIC_NVCC`, the
//! PATH, or the CUDA wheels `.ci/run` installs into target/cuda; without one the test says so
//! and skips, unless `WIC_REQUIRE_NVCC` is set (as CI does).

use std::path::{Path, PathBuf};
use std::process::Command;

use wic_tests::workspace;

fn nvcc() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("WIC_NVCC") {
        return Some(path.into());
    }
    let wheel = workspace().join("target/cuda/nvidia/cu13/bin/nvcc");
    if wheel.is_file() {
        return Some(wheel);
    }
    Command::new("nvcc").arg("--version").output().ok().filter(|o| o.status.success()).map(|_| "nvcc".into())
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("device/ is readable").flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "cu") {
            out.push(path);
        }
    }
}

#[test]
fn every_cuda_source_compiles_for_hopper_without_warnings() {
    let Some(nvcc) = nvcc() else {
        assert!(std::env::var_os("WIC_REQUIRE_NVCC").is_none(), "WIC_REQUIRE_NVCC is set but no nvcc was found");
        eprintln!(
            "skipped: no nvcc (set WIC_NVCC, put nvcc on the PATH, or run .ci/run, which installs the CUDA wheels)"
        );
        return;
    };
    let root = workspace();
    let mut files = Vec::new();
    sources(&root.join("device"), &mut files);
    files.sort();
    assert!(files.len() >= 14, "expected the device sources, found {files:?}");
    let out = wic_tests::scratch("device-compile");
    for (i, file) in files.iter().enumerate() {
        let output = Command::new(&nvcc)
            .args([
                "-c",
                "-O2",
                "-arch=sm_90",
                "-std=c++17",
                "-Werror",
                "all-warnings",
                "-Xcompiler",
                "-Wall,-Wextra,-Werror",
            ])
            .arg("-I")
            .arg(root.join("device/include"))
            .arg("-I")
            .arg(root.join("ffi/include"))
            .arg(file)
            .arg("-o")
            .arg(out.join(format!("{i}.o")))
            .output()
            .expect("run nvcc");
        assert!(
            output.status.success(),
            "{} does not compile:\n{}{}",
            file.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
