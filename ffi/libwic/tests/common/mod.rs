//! Helpers shared by the tests that compile C and C++ against `wic.h`, and by
//! `tests/tests/kernel_abi.rs` (included by path) for `wic_abi.h` and `wic_fakegpu.h`.

// Each test binary uses only some of these.
#![allow(dead_code)]

pub mod header;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// The directory holding `wic.h`.
pub fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../include")
}

/// A fresh, empty directory for one test's files; removed when dropped, unless the test failed
/// (the files are kept for a look at what went wrong).
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A fresh [`ScratchDir`] under cargo's temporary directory for tests.
pub fn scratch_dir(name: &str) -> ScratchDir {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    ScratchDir(dir)
}

/// The C compiler: `$CC`, else `cc`.
pub fn c_compiler() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// The C++ compiler: `$CXX`, else `c++`.
pub fn cxx_compiler() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".into())
}

/// Runs `compiler` with `args`; `None` if the compiler is not installed.
pub fn try_compile(compiler: &str, args: &[&str]) -> Option<Output> {
    match Command::new(compiler).args(args).output() {
        Ok(output) => Some(output),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("cannot run {compiler}: {e}"),
    }
}

/// Runs `compiler` with `args` and fails the test unless it succeeds; a missing compiler fails
/// the test too, with a message saying so.
pub fn compile(compiler: &str, args: &[&str]) {
    let output = try_compile(compiler, args).unwrap_or_else(|| {
        panic!("this test needs a C compiler: `{compiler}` was not found on PATH (set $CC to use another)")
    });
    check_success(compiler, args, &output);
}

/// Fails the test with the compiler's diagnostics unless `output` is a success.
pub fn check_success(compiler: &str, args: &[&str], output: &Output) {
    assert!(
        output.status.success(),
        "{compiler} {} failed ({}):\n{}{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs a compiled program and returns its standard output, failing the test if it fails.
pub fn run(program: &Path) -> String {
    let output = Command::new(program)
        .env_remove("WIC_SOCKET")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    assert!(
        output.status.success(),
        "{} failed ({}):\n{}{}",
        program.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("the program prints UTF-8")
}

/// A path as a compiler argument.
pub fn arg(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}
