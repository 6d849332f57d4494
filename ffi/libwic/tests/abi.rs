//! `wic.h` and the Rust mirrors in `wic::abi` describe the same ABI.
//!
//! The struct fields and constants are read from the header itself, a C program prints the
//! size and alignment of every struct, the offset of every field and the value of every
//! constant, and the full set of lines is compared with the same lines computed in Rust: a
//! field, struct or constant present on one side only fails the test.

mod common;

use std::collections::BTreeSet;
use std::fmt::Write as _;

use common::{arg, c_compiler, check_success, compile, cxx_compiler, include_dir, run, scratch_dir, try_compile};
use wic::abi::{self, WicChannelInfo, WicChannelSpec, WicSlotInfo, WicStats};
use wic_engine::ErrorMarker;
use wic_proto::message::ErrorCode;

/// A struct of the header: its name and its fields, in order.
#[derive(Debug)]
struct CStruct {
    name: String,
    fields: Vec<String>,
}

/// The header's contents, as far as the ABI goes.
#[derive(Debug, Default)]
struct Header {
    structs: Vec<CStruct>,
    constants: Vec<String>,
}

fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("/*") {
            let end = after.find("*/").expect("unterminated comment in wic.h");
            out.push(' ');
            rest = &after[end + 2..];
        } else if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |end| &after[end..]);
        } else {
            let ch = rest.chars().next().unwrap();
            out.push(ch);
            rest = &rest[ch.len_utf8()..];
        }
    }
    out
}

fn is_ident(word: &str) -> bool {
    !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The body between the `{` at or after `from` and its matching `}`, and where it ends.
fn braced(text: &str, from: usize) -> Option<(&str, usize)> {
    let open = from + text[from..].find('{')?;
    let close = open + text[open..].find('}')?;
    Some((&text[open + 1..close], close))
}

/// Reads struct definitions (`struct wic_x { type a; type b[2], c; };`), `#define WIC_*`
/// object-like macros with a value, and `enum` constants: the constructs `wic.h` uses.
fn parse_header(text: &str) -> Header {
    let text = strip_comments(text);
    let mut header = Header::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() == Some("#define") {
            let name_and_rest = line.trim_start().trim_start_matches("#define").trim_start();
            let name: String = name_and_rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let after = &name_and_rest[name.len()..];
            let function_like = after.starts_with('(');
            if name.starts_with("WIC_") && !function_like && !after.trim().is_empty() {
                header.constants.push(name);
            }
        }
    }
    let mut at = 0;
    while let Some(found) = text[at..].find("struct wic_").map(|i| at + i) {
        let after = &text[found + "struct ".len()..];
        let name: String = after.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let rest = after[name.len()..].trim_start();
        at = found + "struct ".len() + name.len();
        if !rest.starts_with('{') {
            continue; // a use of the struct, not its definition
        }
        let (body, end) = braced(&text, at).expect("struct body");
        at = end;
        let mut fields = Vec::new();
        for declaration in body.split(';').map(str::trim).filter(|d| !d.is_empty()) {
            for (i, declarator) in declaration.split(',').enumerate() {
                let declarator = declarator.split('[').next().unwrap().trim();
                let name = if i == 0 { declarator.split_whitespace().last().unwrap_or("") } else { declarator };
                let name = name.trim_start_matches('*');
                assert!(is_ident(name), "cannot read field {declarator:?} of struct {name}");
                fields.push(name.to_owned());
            }
        }
        header.structs.push(CStruct { name, fields });
    }
    let mut at = 0;
    while let Some(found) = text[at..].find("enum ").map(|i| at + i) {
        at = found + "enum ".len();
        let rest = text[at..].trim_start();
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if !rest[name.len()..].trim_start().starts_with('{') {
            continue; // a parameter of enum type
        }
        let (body, end) = braced(&text, at).expect("enum body");
        at = end;
        for enumerator in body.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let name = enumerator.split('=').next().unwrap().trim();
            assert!(is_ident(name), "cannot read enumerator {enumerator:?}");
            header.constants.push(name.to_owned());
        }
    }
    header
}

/// The C program printing the header's view of every struct and constant.
fn c_program(header: &Header) -> String {
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"wic.h\"\n\n\
         #define CONST(n) do { if ((n) < 0) printf(\"const %s %lld\\n\", #n, (long long)(n)); \
         else printf(\"const %s %llu\\n\", #n, (unsigned long long)(n)); } while (0)\n\n\
         int main(void)\n{\n",
    );
    for s in &header.structs {
        let name = &s.name;
        writeln!(c, "\tprintf(\"sizeof {name} %zu\\n\", sizeof(struct {name}));").unwrap();
        writeln!(c, "\tprintf(\"alignof {name} %zu\\n\", (size_t)_Alignof(struct {name}));").unwrap();
        for field in &s.fields {
            writeln!(c, "\tprintf(\"offsetof {name}.{field} %zu\\n\", offsetof(struct {name}, {field}));").unwrap();
        }
    }
    for constant in &header.constants {
        writeln!(c, "\tCONST({constant});").unwrap();
    }
    c.push_str("\treturn 0;\n}\n");
    c
}

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
    assert_eq!(names, ["wic_channel_spec", "wic_slot_info", "wic_channel_info", "wic_stats"], "{header:#?}");
    assert!(header.constants.len() > 20, "too few constants read from wic.h: {:?}", header.constants);

    let dir = scratch_dir("abi");
    let source = dir.join("abi.c");
    let program = dir.join("abi");
    std::fs::write(&source, c_program(&header)).unwrap();
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
    let args = ["-Wall", "-Wextra", "-Werror", "-std=c++11", "-pedantic", &include, "-c", "-o", arg(&object), arg(&source)];
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
