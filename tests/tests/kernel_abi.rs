//! `wic_abi.h` (the kernel ABI of `/dev/wic`) and its Rust view `wic_kabi` describe the same
//! structs and constants, and so do `wic_fakegpu.h` (the VM tests' stand-in for nvidia-uvm) and
//! `wic_kernel_io::fakegpu`: each header is compiled as user-space C and every size, field offset and
//! constant it prints is compared with the Rust side, in both directions.

// The C-compiling helpers and header reader libwic's ABI test uses for `wic.h`.
#[path = "../../ffi/libwic/tests/common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::header::{c_program, parse_header};
use common::{arg, c_compiler, compile, run};
use wic_kabi as kabi;
use wic_kernel_io::fakegpu;
use wic_tests::{scratch, workspace};

/// The directory holding `wic_abi.h`.
fn abi_include_dir() -> PathBuf {
    workspace().join("ffi/include")
}

/// Runs the compiled `program` and checks that what it prints of its header is `rust_lines`,
/// the Rust view's `what`.
fn assert_header_matches(program: &Path, rust_lines: BTreeSet<String>, what: &str) {
    let c_lines: BTreeSet<String> = run(program).lines().map(str::to_owned).collect();
    let only_c: Vec<_> = c_lines.difference(&rust_lines).collect();
    let only_rust: Vec<_> = rust_lines.difference(&c_lines).collect();
    assert!(
        only_c.is_empty() && only_rust.is_empty(),
        "{what} disagree\n  in C only:    {only_c:#?}\n  in Rust only: {only_rust:#?}"
    );
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
    let text = std::fs::read_to_string(abi_include_dir().join("wic_abi.h")).expect("ffi/include/wic_abi.h");
    let header = parse_header(&text);
    assert_eq!(header.structs.len(), kabi::structs().len(), "{header:#?}");

    let dir = scratch("kabi");
    let source = dir.join("kabi.c");
    let program = dir.join("kabi");
    std::fs::write(&source, c_program(&header, "wic_abi.h")).unwrap();
    let include = format!("-I{}", arg(&abi_include_dir()));
    compile(&c_compiler(), &["-std=gnu11", "-Wall", "-Wextra", "-Werror", &include, "-o", arg(&program), arg(&source)]);

    assert_header_matches(&program, lines(kabi::structs(), kabi::constants()), "wic_abi.h and wic_kabi");
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
    let include = format!("-I{}", arg(&abi_include_dir()));
    compile(&c_compiler(), &["-Wall", "-Werror", &include, "-o", arg(&program), arg(&source)]);
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
    compile(&c_compiler(), &["-std=gnu11", &include, "-o", arg(&program), arg(&source)]);
    assert_header_matches(
        &program,
        lines(fakegpu::structs(), fakegpu::constants()),
        "wic_fakegpu.h and wic_kernel_io::fakegpu",
    );
}
