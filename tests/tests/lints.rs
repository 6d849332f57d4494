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
/// `wic-types` leaf crate, never from the daemon's engine.
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
    let mut checked = 0;
    for name in ["wic-types", "wic-proto", "wic", "wicctl"] {
        let package = packages.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("no package {name}"));
        let normal: Vec<&str> = package["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .filter(|d| d["kind"].is_null())
            .filter_map(|d| d["name"].as_str())
            .collect();
        assert!(!normal.contains(&"wic-engine"), "{name} depends on wic-engine: {normal:?}");
        checked += 1;
    }
    assert_eq!(checked, 4);
}
