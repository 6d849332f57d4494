//! A C program links against libwic, once statically and once dynamically, and runs.
//!
//! Cargo compiles the library once for all its crate types (`rlib`, `staticlib`, `cdylib`), so
//! building this test builds `libwic.a` and `libwic.so` next to the `libwic.rlib` the test links:
//! in `target/<profile>/deps/`, this executable's own directory. (Only a `cargo build` of the
//! library itself also copies them up to `target/<profile>/`, which is searched second.)

mod common;

use std::path::{Path, PathBuf};

use common::{arg, c_compiler, compile, include_dir, run, scratch_dir};
use wic_proto::message::ErrorCode;

const PROGRAM: &str = r#"#include <stdio.h>
#include "wic.h"

int main(void)
{
	wic_client *client = (wic_client *)&client;
	int rc = wic_connect("/nonexistent/sock", &client);

	printf("version %s\n", wic_version());
	printf("busy %s\n", wic_strerror(WIC_EBUSY));
	printf("connect %d %s\n", rc, client ? "handle" : "null");
	wic_disconnect(client);
	return rc == WIC_ECONNECT ? 0 : 1;
}
"#;

/// A library artifact of the build this test belongs to.
fn artifact(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let deps = exe.parent().expect("the test executable is in a directory");
    let candidates = [deps.join(name), deps.parent().unwrap_or(deps).join(name)];
    candidates.iter().find(|path| path.is_file()).cloned().unwrap_or_else(|| {
        panic!(
            "{name} not found in {candidates:?}: cargo builds it with this test (crate-type cdylib and staticlib \
             in ffi/libwic/Cargo.toml)"
        )
    })
}

/// `Libs.private` of `wic.pc.in`: what a static link needs besides libwic.a.
fn libs_private() -> Vec<String> {
    let pc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../wic.pc.in")).expect("ffi/wic.pc.in");
    let line = pc.lines().find_map(|l| l.strip_prefix("Libs.private:")).expect("wic.pc.in has Libs.private");
    line.split_whitespace().map(str::to_owned).collect()
}

fn expected_output() -> String {
    format!(
        "version {}\nbusy {}\nconnect {} null\n",
        env!("CARGO_PKG_VERSION"),
        ErrorCode::Busy.describe(),
        -(ErrorCode::Connect as i32)
    )
}

fn source(dir: &common::ScratchDir) -> PathBuf {
    let path = dir.join("link.c");
    std::fs::write(&path, PROGRAM).unwrap();
    path
}

#[test]
fn static_library_links_and_runs() {
    let dir = scratch_dir("link-static");
    let source = source(&dir);
    let program = dir.join("link-static");
    let include = format!("-I{}", arg(&include_dir()));
    let archive = artifact("libwic.a");
    let mut args =
        vec!["-std=c11", "-Wall", "-Wextra", "-Werror", &include, "-o", arg(&program), arg(&source), arg(&archive)];
    let private = libs_private();
    args.extend(private.iter().map(String::as_str));
    compile(&c_compiler(), &args);
    assert_eq!(run(&program), expected_output());
}

/// The SONAME the build gives the shared library (`build.rs`).
fn soname() -> String {
    let major: u32 = env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap();
    if major == 0 {
        format!("libwic.so.0.{}", env!("CARGO_PKG_VERSION_MINOR"))
    } else {
        format!("libwic.so.{major}")
    }
}

#[test]
fn shared_library_links_and_runs() {
    let dir = scratch_dir("link-shared");
    let source = source(&dir);
    let program = dir.join("link-shared");
    let include = format!("-I{}", arg(&include_dir()));
    // Laid out as deploy/install.sh installs it: libwic.so for the linker and the SONAME for
    // the dynamic loader, both links to the library.
    let lib_dir = dir.join("lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    for link in ["libwic.so".to_string(), soname()] {
        std::os::unix::fs::symlink(artifact("libwic.so"), lib_dir.join(link)).unwrap();
    }
    let search = format!("-L{}", arg(&lib_dir));
    let rpath = format!("-Wl,-rpath,{}", arg(&lib_dir));
    compile(
        &c_compiler(),
        &[
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            &include,
            "-o",
            arg(&program),
            arg(&source),
            &search,
            "-lwic",
            &rpath,
        ],
    );
    // The program asks the loader for the SONAME, not for the linker's name.
    let binary = std::fs::read(&program).unwrap();
    let needed = format!("{}\0", soname());
    assert!(
        binary.windows(needed.len()).any(|w| w == needed.as_bytes()),
        "{} does not load {}",
        program.display(),
        soname()
    );
    assert_eq!(run(&program), expected_output());
}

#[test]
fn c_examples_build_cleanly() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/c");
    let dir = scratch_dir("examples");
    let include = format!("-I{}", arg(&include_dir()));
    let lib_dir = artifact("libwic.so").parent().unwrap().to_owned();
    let search = format!("-L{}", arg(&lib_dir));
    for name in ["consumer", "producer"] {
        let source = examples.join(format!("{name}.c"));
        let program = dir.join(name);
        compile(
            &c_compiler(),
            &[
                "-std=c11",
                "-pedantic",
                "-Wall",
                "-Wextra",
                "-Werror",
                &include,
                "-o",
                arg(&program),
                arg(&source),
                &search,
                "-lwic",
            ],
        );
    }
}
