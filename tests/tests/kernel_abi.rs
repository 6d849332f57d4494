//! `wic_abi.h` (the kernel ABI of `/dev/wic`) and its Rust view `wic_kabi` describe the same
//! structs and constants, and so do `wic_fakegpu.h` (the VM tests' stand-in for nvidia-uvm) and
//! `wic_kmod::fakegpu`: each header is compiled as user-space C and every size, field offset and
//! constant it prints is compared with the Rust side, in both directions.

// The header reader libwic's ABI test uses for `wic.h`.
#[path = "../../ffi/libwic/tests/common/header.rs"]
mod header;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use header::{c_program, parse_header};
use wic_kabi as kabi;
use wic_kmod::fakegpu;
use wic_tests::{scratch, workspace};

/// The C compiler: `$CC`, else `cc`.
fn c_compiler() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// Runs the C compiler with `args` and fails the test unless it succeeds.
fn compile(args: &[&str]) {
    let compiler = c_compiler();
    let output = Command::new(&compiler).args(args).output().unwrap_or_else(|e| {
        panic!("this test needs a C compiler: cannot run `{compiler}` ({e}; set $CC to use another)")
    });
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
fn run(program: &Path) -> String {
    let output = Command::new(program).output().unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    assert!(output.status.success(), "{} failed ({})", program.display(), output.status);
    String::from_utf8(output.stdout).expect("the program prints UTF-8")
}

/// A path as a compiler argument.
fn arg(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

/// The directory holding `wic_abi.h`.
fn include_dir() -> PathBuf {
    workspace().join("ffi/include")
}

fn lines(structs: Vec<kabi::StructLayout>, constants: Vec<(&str, i128)>) -> BTreeSet<String> {
    let mut lines = BTreeSet::new();
    for s in structs {
        lines.insert(format!("sizeof {} {}", s.name, s.size));
        lines.insert(format!("alignof {} {}", s.name, s.align));
        for (field, offset) in s.fields {
            lines.insert(format!("offsetof {}.{field} {offset}", s.name));
        }
    }
    for (name, value) in constants {
        lines.insert(format!("const {name} {value}"));
    }
    lines
}

#[test]
fn rust_view_matches_the_kernel_abi_header() {
    let text = std::fs::read_to_string(include_dir().join("wic_abi.h")).expect("ffi/include/wic_abi.h");
    let header = parse_header(&text);
    assert_eq!(header.structs.len(), kabi::structs().len(), "{header:#?}");

    let dir = scratch("kabi");
    let source = dir.join("kabi.c");
    let program = dir.join("kabi");
    std::fs::write(&source, c_program(&header, "wic_abi.h")).unwrap();
    let include = format!("-I{}", arg(&include_dir()));
    compile(&["-std=gnu11", "-Wall", "-Wextra", "-Werror", &include, "-o", arg(&program), arg(&source)]);

    let c_lines: BTreeSet<String> = run(&program).lines().map(str::to_owned).collect();
    let rust_lines = lines(kabi::structs(), kabi::constants());
    let only_c: Vec<_> = c_lines.difference(&rust_lines).collect();
    let only_rust: Vec<_> = rust_lines.difference(&c_lines).collect();
    assert!(
        only_c.is_empty() && only_rust.is_empty(),
        "wic_abi.h and wic_kabi disagree\n  in C only:    {only_c:#?}\n  in Rust only: {only_rust:#?}"
    );
}

#[test]
fn the_ring_size_macro_agrees() {
    let dir = scratch("kabi-ring");
    let source = dir.join("ring.c");
    let program = dir.join("ring");
    std::fs::write(
        &source,
        "#include <stdio.h>\n#include \"wic_abi.h\"\n\
         int main(void) { printf(\"%llu %llu\\n\", (unsigned long long)WIC_RING_BYTES(256), \
         (unsigned long long)WIC_RING_BYTES(65536)); return 0; }\n",
    )
    .unwrap();
    let include = format!("-I{}", arg(&include_dir()));
    compile(&["-Wall", "-Werror", &include, "-o", arg(&program), arg(&source)]);
    assert_eq!(run(&program).trim(), format!("{} {}", kabi::ring_bytes(256), kabi::ring_bytes(65536)));
}

#[test]
fn rust_view_matches_the_fake_gpu_header() {
    let shim_test = workspace().join("shim/test");
    let text = std::fs::read_to_string(shim_test.join("wic_fakegpu.h")).expect("shim/test/wic_fakegpu.h");
    let header = parse_header(&text);
    assert!(text.contains(&format!("#define WIC_FAKEGPU_DEVICE \"{}\"", fakegpu::DEVICE)));
    let dir = scratch("fakegpu-abi");
    let source = dir.join("fakegpu.c");
    let program = dir.join("fakegpu");
    std::fs::write(&source, c_program(&header, "wic_fakegpu.h")).unwrap();
    let include = format!("-I{}", arg(&shim_test));
    compile(&["-std=gnu11", &include, "-o", arg(&program), arg(&source)]);
    let c_lines: BTreeSet<String> = run(&program).lines().map(str::to_owned).collect();
    let rust_lines = lines(fakegpu::structs(), fakegpu::constants());
    let only_c: Vec<_> = c_lines.difference(&rust_lines).collect();
    let only_rust: Vec<_> = rust_lines.difference(&c_lines).collect();
    assert!(
        only_c.is_empty() && only_rust.is_empty(),
        "wic_fakegpu.h and wic_kmod::fakegpu disagree\n  in C only:    {only_c:#?}\n  in Rust only: {only_rust:#?}"
    );
}
