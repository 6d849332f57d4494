//! Reading a C header's ABI: its structs, fields and constants, and a C program printing
//! their sizes, offsets and values as the C compiler sees them.

use std::fmt::Write as _;

/// A struct of the header: its name and its fields, in order.
#[derive(Debug)]
pub struct CStruct {
    pub name: String,
    pub fields: Vec<String>,
}

/// The header's contents, as far as the ABI goes.
#[derive(Debug, Default)]
pub struct Header {
    pub structs: Vec<CStruct>,
    pub constants: Vec<String>,
}

fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("/*") {
            let end = after.find("*/").expect("unterminated comment in the header");
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
pub fn parse_header(text: &str) -> Header {
    let text = strip_comments(text);
    let mut header = Header::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() == Some("#define") {
            let name_and_rest = line.trim_start().trim_start_matches("#define").trim_start();
            let name: String = name_and_rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let after = &name_and_rest[name.len()..];
            let function_like = after.starts_with('(');
            // String constants are compared as text by the tests that have them.
            let string = after.trim().starts_with('"');
            if name.starts_with("WIC_") && !function_like && !string && !after.trim().is_empty() {
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

/// The C program printing `include`'s view of every struct and constant of `header`.
pub fn c_program(header: &Header, include: &str) -> String {
    let mut c = format!(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"{include}\"\n\n\
         #define CONST(n) do {{ if ((n) < 0) printf(\"const %s %lld\\n\", #n, (long long)(n)); \
         else printf(\"const %s %llu\\n\", #n, (unsigned long long)(n)); }} while (0)\n\n\
         int main(void)\n{{\n",
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
