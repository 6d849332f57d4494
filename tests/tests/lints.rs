//! The whole workspace passes clippy with warnings as errors, which includes the crates' own
//! `deny(clippy::unwrap_used)` outside tests: input reaching the daemon, the libraries and the
//! tools is answered with errors, not panics. The build goes to its own target directory so it
//! never waits on the test build's lock. And every Rust file is formatted as `rustfmt.toml`
//! says.

use std::process::Command;

use wic_tests::{target_dir, workspace};

#[test]
fn the_workspace_is_clippy_clean_with_warnings_denied() {
    let output = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .current_dir(workspace())
        .args(["clippy", "--workspace", "--all-targets", "--quiet", "--", "-D", "warnings"])
        .env("CARGO_TARGET_DIR", target_dir().parent().expect("target/<profile> has a parent").join("clippy"))
        .output()
        .expect("run cargo clippy");
    assert!(output.status.success(), "cargo clippy found problems:\n{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn every_rust_file_is_formatted_as_rustfmt_toml_says() {
    let output = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .current_dir(workspace())
        .args(["fmt", "--all", "--", "--check"])
        .output()
        .expect("run cargo fmt");
    assert!(
        output.status.success(),
        "cargo fmt --check found files to reformat (run `cargo fmt --all`):\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The client side (wire protocol, libwic, wicctl) takes what it shares with wicd from the
/// `wic-types` leaf crate, never from the daemon's engine. The kernel ABI (`wic-kabi`) is a leaf
/// too, taking at most `wic-types`; the daemon's side of the device (`wic-kernel-io`) reaches it
/// without the client protocol, and libwic never depends on the daemon's side of the device,
/// not even for its tests (the kernel-ABI tests live in `tests/tests/kernel_abi.rs`).
#[test]
fn crates_outside_the_daemon_do_not_depend_on_the_engine() {
    let output = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .current_dir(workspace())
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .expect("run cargo metadata");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).expect("cargo metadata's JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    let workspace_crates: Vec<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    // A package's dependencies of every kind (normal, dev, build) or of the normal kind only.
    let dependencies = |name: &str, all_kinds: bool| -> Vec<&str> {
        let package = packages.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("no package {name}"));
        package["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .filter(|d| all_kinds || d["kind"].is_null())
            .filter_map(|d| d["name"].as_str())
            .collect()
    };
    let mut checked = 0;
    for name in ["wic-types", "wic-proto", "wic", "wicctl"] {
        let normal = dependencies(name, false);
        assert!(!normal.contains(&"wic-engine"), "{name} depends on wic-engine: {normal:?}");
        checked += 1;
    }
    assert_eq!(checked, 4);

    let kabi: Vec<&str> = dependencies("wic-kabi", true)
        .into_iter()
        .filter(|d| workspace_crates.contains(d) && *d != "wic-types")
        .collect();
    assert!(kabi.is_empty(), "wic-kabi is a leaf (wic-types at most), yet depends on {kabi:?}");
    let kernel_io = dependencies("wic-kernel-io", true);
    assert!(!kernel_io.contains(&"wic-proto"), "wic-kernel-io depends on the client protocol: {kernel_io:?}");
    assert!(kernel_io.contains(&"wic-kabi"), "wic-kernel-io takes the kernel ABI from wic-kabi: {kernel_io:?}");
    let libwic = dependencies("wic", true);
    assert!(!libwic.contains(&"wic-kernel-io"), "libwic depends on wic-kernel-io: {libwic:?}");
}
