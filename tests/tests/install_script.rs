//! `deploy/install.sh` into a staging root (DESTDIR): it installs what deploy/README.md lists,
//! headers for C and CUDA included, and runs no system tool.

use std::process::Command;

use wic_tests::{built, scratch, workspace};

#[test]
fn install_sh_stages_every_documented_file() {
    let root = scratch("install-sh");
    let out = Command::new("bash")
        .arg(workspace().join("deploy/install.sh"))
        .arg(built())
        .env("DESTDIR", &root)
        .output()
        .expect("run deploy/install.sh");
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "install.sh failed:\n{log}");
    for file in [
        "usr/bin/wicd",
        "usr/bin/wicctl",
        "usr/include/wic.h",
        "usr/include/wic/wic.cuh",
        "usr/lib/pkgconfig/wic.pc",
        "usr/lib/systemd/system/wicd.service",
        "usr/lib/systemd/system/wicd.socket",
        "usr/lib/systemd/system/wic-sleep.service",
        "usr/lib/sysusers.d/wic.conf",
        "usr/lib/tmpfiles.d/wic.conf",
        "usr/lib/udev/rules.d/70-wic.rules",
        "etc/wic/wicd.toml",
    ] {
        assert!(root.join(file).is_file(), "install.sh did not stage {file}:\n{log}");
    }
    assert!(log.contains("DESTDIR is set: not running"), "install.sh ran system tools into a staging root:\n{log}");
    // The README's table and the script agree on what goes where.
    let readme = std::fs::read_to_string(workspace().join("deploy/README.md")).unwrap();
    for unit in ["wicd.service", "wicd.socket", "wic-sleep.service"] {
        assert!(readme.contains(&format!("`/usr/lib/systemd/system/{unit}`")), "deploy/README.md does not list {unit}");
    }
}
