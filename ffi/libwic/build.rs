//! Names the shared library for the dynamic linker. Its SONAME carries what must match for a
//! program linked against one build to run with another, as Cargo's semver reads a version: the
//! major number, or major and minor while the major is 0 (`libwic.so.0.1` for 0.1.x).
//! `deploy/install.sh` installs that name as a link to the library and `libwic.so` for the
//! linker.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let number = |part: &str| std::env::var(format!("CARGO_PKG_VERSION_{part}")).expect("Cargo sets the version");
    let major = number("MAJOR");
    let soname = if major == "0" { format!("libwic.so.0.{}", number("MINOR")) } else { format!("libwic.so.{major}") };
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
}
