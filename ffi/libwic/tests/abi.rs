//! `wic.h` and the Rust mirrors in `wic::abi` describe the same ABI.
//!
//! The struct fields and constants are read from the header itself, a C program prints the
//! size and alignment of every struct, the offset of every field and the value of every
//! constant, and the full set of lines is compared with the same lines computed in Rust: a
//! field, struct or constant present on one side only fails the test.

mod common;

use std::collections::BTreeSet;

use common::header::{c_program, parse_header};
use common::{arg, c_compiler, check_success, compile, cxx_compiler, include_dir, run, scratch_dir, try_compile};
use wic::abi::{self, WicChannelInfo, WicChannelSpec, WicRun, WicSlotInfo, WicStats};
use wic_proto::message::ErrorCode;
use wic_types::ErrorMarker;

/// The same lines, computed from `wic::abi` and the crates it must agree with.
fn rust_lines() -> BTreeSet<String> {
    fn layout<T>(lines: &mut BTreeSet<String>, name: &str, fields: &[(&str, usize)]) {
        lines.insert(format!("sizeof {name} {}", std::mem::size_of::<T>()));
        lines.insert(format!("alignof {name} {}", std::mem::align_of::<T>()));
        for (field, offset) in fields {
            lines.insert(format!("offsetof {name}.{field} {offset}"));
        }
    }
    let mut lines = BTreeSet::new();
    layout::<WicChannelSpec>(&mut lines, WicChannelSpec::C_NAME, WicChannelSpec::FIELDS);
    layout::<WicSlotInfo>(&mut lines, WicSlotInfo::C_NAME, WicSlotInfo::FIELDS);
    layout::<WicChannelInfo>(&mut lines, WicChannelInfo::C_NAME, WicChannelInfo::FIELDS);
    layout::<WicStats>(&mut lines, WicStats::C_NAME, WicStats::FIELDS);
    layout::<WicRun>(&mut lines, WicRun::C_NAME, WicRun::FIELDS);

    let version = |part: &str| part.parse::<i128>().unwrap();
    let mut constants: Vec<(String, i128)> = vec![
        ("WIC_VERSION_MAJOR".into(), version(env!("CARGO_PKG_VERSION_MAJOR"))),
        ("WIC_VERSION_MINOR".into(), version(env!("CARGO_PKG_VERSION_MINOR"))),
        ("WIC_VERSION_PATCH".into(), version(env!("CARGO_PKG_VERSION_PATCH"))),
        ("WIC_OK".into(), i128::from(abi::WIC_OK)),
        ("WIC_TOKEN_LEN".into(), abi::WIC_TOKEN_LEN as i128),
        ("WIC_ERROR_MARKER_MAGIC".into(), i128::from(ErrorMarker::MAGIC)),
        ("WIC_PRODUCER_HOST".into(), i128::from(abi::WIC_PRODUCER_HOST)),
        ("WIC_PRODUCER_GPU".into(), i128::from(abi::WIC_PRODUCER_GPU)),
        ("WIC_ROLE_OWNER".into(), i128::from(abi::WIC_ROLE_OWNER)),
        ("WIC_ROLE_PRODUCER".into(), i128::from(abi::WIC_ROLE_PRODUCER)),
        ("WIC_ROLE_CONSUMER".into(), i128::from(abi::WIC_ROLE_CONSUMER)),
    ];
    constants.extend(ErrorCode::ALL.iter().map(|code| (format!("WIC_E{}", code.name()), -(*code as i128))));
    for (name, value) in constants {
        lines.insert(format!("const {name} {value}"));
    }
    lines
}

#[test]
fn rust_mirrors_match_the_header() {
    let header_text = std::fs::read_to_string(include_dir().join("wic.h")).expect("ffi/include/wic.h");
    let header = parse_header(&header_text);
    let names: Vec<&str> = header.structs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["wic_channel_spec", "wic_slot_info", "wic_channel_info", "wic_stats", "wic_run"], "{header:#?}");
    assert!(header.constants.len() > 20, "too few constants read from wic.h: {:?}", header.constants);

    let dir = scratch_dir("abi");
    let source = dir.join("abi.c");
    let program = dir.join("abi");
    std::fs::write(&source, c_program(&header, "wic.h")).unwrap();
    let include = format!("-I{}", arg(&include_dir()));
    compile(&c_compiler(), &["-std=c11", &include, "-o", arg(&program), arg(&source)]);

    let c_lines: BTreeSet<String> = run(&program).lines().map(str::to_owned).collect();
    let rust_lines = rust_lines();
    let only_c: Vec<_> = c_lines.difference(&rust_lines).collect();
    let only_rust: Vec<_> = rust_lines.difference(&c_lines).collect();
    assert!(
        only_c.is_empty() && only_rust.is_empty(),
        "wic.h and wic::abi disagree\n  in C only:    {only_c:#?}\n  in Rust only: {only_rust:#?}"
    );
    // The error marker in the header is the one the daemon writes.
    assert!(c_lines.contains(&format!("const WIC_ERROR_MARKER_MAGIC {}", ErrorMarker::MAGIC)));
}

#[test]
fn header_compiles_cleanly_as_strict_c11() {
    let dir = scratch_dir("strict-c");
    let source = dir.join("strict.c");
    // Included twice to exercise the include guard.
    std::fs::write(&source, "#include \"wic.h\"\n#include \"wic.h\"\nint main(void) { return WIC_OK; }\n").unwrap();
    let include = format!("-I{}", arg(&include_dir()));
    let object = dir.join("strict.o");
    compile(
        &c_compiler(),
        &["-Wall", "-Wextra", "-Werror", "-std=c11", "-pedantic", &include, "-c", "-o", arg(&object), arg(&source)],
    );
}

#[test]
fn header_compiles_as_cxx() {
    let dir = scratch_dir("strict-cxx");
    let source = dir.join("strict.cpp");
    std::fs::write(
        &source,
        "#include \"wic.h\"\n#include \"wic.h\"\n\
         static_assert(sizeof(wic_channel_spec) == sizeof(struct wic_channel_spec), \"\");\n\
         int main() { wic_role r = WIC_ROLE_PRODUCER; return r == WIC_ROLE_PRODUCER ? WIC_OK : 1; }\n",
    )
    .unwrap();
    let include = format!("-I{}", arg(&include_dir()));
    let object = dir.join("strict.o");
    let compiler = cxx_compiler();
    let args =
        ["-Wall", "-Wextra", "-Werror", "-std=c++11", "-pedantic", &include, "-c", "-o", arg(&object), arg(&source)];
    match try_compile(&compiler, &args) {
        Some(output) => check_success(&compiler, &args, &output),
        None => println!("note: `{compiler}` not found, skipping the C++ check of wic.h"),
    }
}

#[test]
fn the_parser_sees_what_the_header_declares() {
    let header = parse_header(
        "/* struct wic_ghost { int no; }; */\n#define WIC_A 1 // c\n#define WIC_F(x) x\n#define WIC_GUARD\n\
         struct wic_s { uint64_t a[2], b; uint32_t c; /* d */ };\nint f(struct wic_s *s, enum wic_e e);\n\
         enum wic_e { WIC_X = 0, WIC_Y = 1, };\n",
    );
    assert_eq!(header.structs.len(), 1);
    assert_eq!(header.structs[0].name, "wic_s");
    assert_eq!(header.structs[0].fields, ["a", "b", "c"]);
    assert_eq!(header.constants, ["WIC_A", "WIC_X", "WIC_Y"]);
}
