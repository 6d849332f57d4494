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
        "usr/lib/systemd/system/wic-compute-mode.service",
        "usr/lib/wic/wic-compute-mode",
        "usr/lib/sysusers.d/wic.conf",
        "usr/lib/tmpfiles.d/wic.conf",
        "usr/lib/udev/rules.d/70-wic.rules",
        "etc/wic/wicd.toml",
    ] {
        assert!(root.join(file).is_file(), "install.sh did not stage {file}:\n{log}");
    }
    assert!(log.contains("DESTDIR is set: not running"), "install.sh ran system tools into a staging root:\n{log}");
    // Every part of the device library that wic.cuh includes.
    for header in std::fs::read_dir(workspace().join("device/include/wic")).unwrap() {
        let name = header.unwrap().file_name();
        assert!(root.join("usr/include/wic").join(&name).is_file(), "install.sh did not stage wic/{name:?}:\n{log}");
    }

    // libwic under its version, with the links the loader (its SONAME) and the linker use.
    let lib = root.join("usr/lib");
    let version = std::fs::read_to_string(workspace().join("ffi/libwic/Cargo.toml"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("version = \"").and_then(|v| v.strip_suffix('"')).map(str::to_owned))
        .expect("libwic's version");
    let real = format!("libwic.so.{version}");
    assert!(lib.join(&real).is_file() && !lib.join(&real).is_symlink(), "no {real}:\n{log}");
    let readelf = Command::new("readelf").arg("-d").arg(lib.join(&real)).output().expect("run readelf");
    let dynamic = String::from_utf8_lossy(&readelf.stdout);
    let soname = dynamic
        .lines()
        .find(|l| l.contains("(SONAME)"))
        .and_then(|l| l.split('[').nth(1))
        .and_then(|l| l.strip_suffix(']'))
        .unwrap_or_else(|| panic!("libwic has no SONAME:\n{dynamic}"))
        .to_string();
    let fits = real == soname || real.strip_prefix(&soname).is_some_and(|rest| rest.starts_with('.'));
    assert!(fits && soname.starts_with("libwic.so."), "SONAME {soname} of {real}");
    assert_eq!(std::fs::read_link(lib.join(&soname)).unwrap(), std::path::Path::new(&real), "{soname}");
    assert_eq!(std::fs::read_link(lib.join("libwic.so")).unwrap(), std::path::Path::new(&soname), "libwic.so");
    assert!(lib.join("libwic.a").is_file(), "libwic.a:\n{log}");
    // The README's table and the script agree on what goes where.
    let readme = std::fs::read_to_string(workspace().join("deploy/README.md")).unwrap();
    for unit in ["wicd.service", "wicd.socket", "wic-sleep.service", "wic-compute-mode.service"] {
        assert!(readme.contains(&format!("`/usr/lib/systemd/system/{unit}`")), "deploy/README.md does not list {unit}");
    }
}
