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

/// nvcc, or `None` after saying the test is skipped; a failure instead under `WIC_REQUIRE_NVCC`.
fn nvcc_or_skip() -> Option<PathBuf> {
    let found = nvcc();
    if found.is_none() {
        assert!(std::env::var_os("WIC_REQUIRE_NVCC").is_none(), "WIC_REQUIRE_NVCC is set but no nvcc was found");
        eprintln!(
            "skipped: no nvcc (set WIC_NVCC, put nvcc on the PATH, or run .ci/run, which installs the CUDA wheels)"
        );
    }
    found
}

/// Every warning an error, nvcc's and the host compiler's.
const WARNINGS: [&str; 4] = ["-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra,-Werror"];

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

/// `nvcc -c` of `source` into `object` for Hopper at -O2, with the include paths of wic.cuh and
/// wic.h and `flags` besides.
fn compile(nvcc: &Path, source: &Path, object: &Path, flags: &[&str]) -> std::process::Output {
    let root = workspace();
    Command::new(nvcc)
        .args(["-c", "-O2", "-arch=sm_90", "-std=c++17"])
        .args(flags)
        .arg("-I")
        .arg(root.join("device/include"))
        .arg("-I")
        .arg(root.join("ffi/include"))
        .arg(source)
        .arg("-o")
        .arg(object)
        .output()
        .expect("run nvcc")
}

#[test]
fn every_cuda_source_compiles_for_hopper_without_warnings() {
    let Some(nvcc) = nvcc_or_skip() else {
        return;
    };
    let root = workspace();
    let mut files = Vec::new();
    sources(&root.join("device"), &mut files);
    files.sort();
    assert!(files.len() >= 14, "expected the device sources, found {files:?}");
    let out = wic_tests::scratch("device-compile");
    for (i, file) in files.iter().enumerate() {
        let output = compile(&nvcc, file, &out.join(format!("{i}.o")), &WARNINGS);
        assert!(
            output.status.success(),
            "{} does not compile:\n{}{}",
            file.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// Each part of the device library (`device/include/wic/*.cuh`) compiles on its own, so a reader
/// may include just the one they need, and together through `wic/wic.cuh`.
#[test]
fn every_header_compiles_on_its_own() {
    let Some(nvcc) = nvcc_or_skip() else {
        return;
    };
    let out = wic_tests::scratch("device-headers");
    let mut headers: Vec<_> = std::fs::read_dir(workspace().join("device/include/wic"))
        .expect("device/include/wic")
        .map(|entry| entry.expect("entry").file_name().into_string().expect("UTF-8 name"))
        .collect();
    headers.sort();
    assert!(headers.len() >= 9 && headers.contains(&"wic.cuh".to_owned()), "the device headers: {headers:?}");
    for header in headers {
        let source = out.join(format!("{header}.cu"));
        std::fs::write(&source, format!("#include <wic/{header}>\nint main() {{ return 0; }}\n")).expect("write");
        let output = compile(&nvcc, &source, &out.join(format!("{header}.o")), &WARNINGS);
        assert!(
            output.status.success(),
            "wic/{header} does not compile on its own:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// wic.cuh's host side runs without a GPU over a fake CUDA runtime (`device/tests/host/`): what
/// publish() refuses, the copies coalesce() queues and on which stream, when a held-back run is
/// queued, wait_free()'s answers and timeouts, tagged's lines, release(). nvcc drives the host
/// compiler with CUDA's headers and links no CUDA runtime (`-cudart none`): the fake's calls are
/// the only ones.
#[test]
fn host_side_runs_over_a_fake_runtime() {
    let Some(nvcc) = nvcc_or_skip() else {
        return;
    };
    let root = workspace();
    let host = root.join("device/tests/host");
    let binary = wic_tests::scratch("device-host").join("host_logic");
    let output = Command::new(&nvcc)
        .args(["-std=c++17", "-cudart", "none", "-Xcompiler", "-Wall,-Wextra,-Werror", "-I"])
        .arg(root.join("device/include"))
        .arg("-I")
        .arg(root.join("ffi/include"))
        .arg(host.join("host_logic.cc"))
        .arg(host.join("fake_cudart.cc"))
        .arg("-o")
        .arg(&binary)
        .output()
        .expect("run nvcc");
    assert!(
        output.status.success(),
        "host_logic.cc does not build:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let run = Command::new(&binary).output().expect("run host_logic");
    let report = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success() && report.contains("ok: 0 failed"), "host_logic failed:\n{report}");
    assert!(report.lines().filter(|l| l.starts_with("ok ")).count() >= 12, "too few checks ran:\n{report}");
}

/// Registers and stack bytes of each kernel, from ptxas's `-v` report: an entry's registers
/// follow its "Compiling entry function 'NAME'" line, its stack frame the "Function properties for
/// NAME" line of the same name (a function not inlined has a block of its own).
fn kernel_resources(report: &str) -> std::collections::BTreeMap<String, (u32, u32)> {
    let mut kernels = std::collections::BTreeMap::new();
    let (mut entry, mut properties): (Option<String>, Option<String>) = (None, None);
    let quoted = |rest: &str| rest.trim().trim_matches('\'').split('\'').next().map(str::to_owned);
    let number_before = |line: &str, word: &str| -> Option<u32> {
        let at = line.find(word)?;
        line[..at].split_whitespace().last()?.parse().ok()
    };
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            entry = rest.split('\'').next().map(str::to_owned);
            kernels.insert(entry.clone().unwrap_or_default(), (0, 0));
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            properties = quoted(rest);
        } else if let Some(name) = &entry {
            let resources = kernels.get_mut(name).expect("inserted above");
            if let Some(stack) = number_before(line, "bytes stack frame").filter(|_| properties.as_ref() == Some(name))
            {
                resources.1 = stack;
            }
            if let Some(registers) = number_before(line, "registers") {
                resources.0 = registers;
            }
        }
    }
    kernels
}

/// A consumer pays for its own transport's wait only (`wic::recv<K>()`): the newcomer's kernels of
/// `device/tests/register_budget.cu` stay within budgets set from their measured use (nvcc 13.0,
/// sm_90, -O2, 2026-11-28, with the argument checks and stale reports, waiting without a timeout):
/// 25 registers for a 16-warp consumer and 14 to 15 for a one-warp one on push, poll, alg1, mapped
/// and fault; tagged, which unpacks lines, 62 and 48; the run-time `wic::recv()`, which carries
/// every wait, 64 and 55; none uses a stack. A 16-warp consumer of any transport launches with its
/// 512 threads.
#[test]
fn each_transports_consumer_stays_within_its_register_budget() {
    let Some(nvcc) = nvcc_or_skip() else {
        return;
    };
    let root = workspace();
    let out = wic_tests::scratch("register-budget");
    let source = root.join("device/tests/register_budget.cu");
    let output = compile(&nvcc, &source, &out.join("budget.o"), &["-Xptxas", "-v"]);
    let report = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "register_budget.cu does not compile:\n{report}");
    let kernels = kernel_resources(&report);
    // (transport, registers, stack bytes) at most.
    let budgets = [
        ("fault", 32, 0),
        ("push", 32, 0),
        ("poll", 32, 0),
        ("alg1", 32, 0),
        ("mapped", 32, 0),
        ("tagged", 64, 0),
        ("any", 64, 0),
    ];
    for (transport, registers, stack) in budgets {
        for shape in ["consume16", "latency1"] {
            let name = format!("{shape}_{transport}");
            let &(used, frame) = kernels.get(&name).unwrap_or_else(|| panic!("ptxas reported no {name}:\n{report}"));
            assert!(
                used <= registers && frame <= stack,
                "{name} uses {used} registers and {frame} stack bytes; its budget is {registers} and {stack}"
            );
        }
    }
}

/// `wic::error_name()` (wic/status.cuh) names every status wic.h defines, with wic.h's own name.
#[test]
fn every_status_of_wic_h_has_its_name_in_wic_cuh() {
    let root = workspace();
    let header = std::fs::read_to_string(root.join("ffi/include/wic.h")).expect("wic.h");
    let device = std::fs::read_to_string(root.join("device/include/wic/status.cuh")).expect("wic/status.cuh");
    // WIC_OK and the error codes, whose values are negative: "#define WIC_EIO (-12)".
    let names: Vec<&str> = header
        .lines()
        .filter_map(|line| line.strip_prefix("#define "))
        .filter_map(|rest| {
            let mut words = rest.split_whitespace();
            let (name, value) = (words.next()?, words.next()?);
            (name == "WIC_OK" || name.starts_with("WIC_E") && value.starts_with("(-")).then_some(name)
        })
        .collect();
    assert!(names.len() >= 13, "wic.h's statuses: {names:?}");
    for name in names {
        assert!(
            device.contains(&format!("case {name}:\n\t\treturn \"{name}\";")),
            "wic::error_name() does not name {name}"
        );
    }
}

/// The report's form, as ptxas 13.0 writes it: a callee's stack block must not be taken for the
/// kernel's.
#[test]
fn kernel_resources_reads_each_entrys_own_stack() {
    let report = "\
ptxas info    : Compiling entry function 'latency1_any' for 'sm_90'
ptxas info    : Function properties for latency1_any
    64 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 62 registers, used 0 barriers, 64 bytes cumulative stack size
ptxas info    : Compiling entry function 'consume16_push' for 'sm_90'
ptxas info    : Function properties for some_callee
    48 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Function properties for consume16_push
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 25 registers, used 0 barriers
";
    let kernels = kernel_resources(report);
    assert_eq!(kernels["latency1_any"], (62, 64));
    assert_eq!(kernels["consume16_push"], (25, 0));
}
