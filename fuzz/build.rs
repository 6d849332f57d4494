//! Compiles the shim's argument checks (`shim/wic_validate.h`) for user space, through
//! `c/shim_validate.c`, with the kernel's flags that change what C code means.

fn main() {
    let mut build = cc::Build::new();
    build
        .file("c/shim_validate.c")
        .include("c")
        .include("../shim")
        .include("../ffi/include")
        .std("gnu11")
        // As Kbuild compiles the module: overflow wraps, NULL checks stay, no strict aliasing.
        .flag("-fno-strict-overflow")
        .flag("-fno-delete-null-pointer-checks")
        .flag("-fno-strict-aliasing")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true);
    if std::env::var_os("CARGO_CFG_FUZZING").is_some() {
        // gcc emits no edge coverage libFuzzer can read, but it can report the C side's
        // comparisons, which libFuzzer turns into mutations.
        build.flag("-fsanitize-coverage=trace-cmp");
    }
    build.compile("wic_shim_validate");
    for path in ["c/shim_validate.c", "c/kernel_compat.h", "../shim/wic_validate.h", "../ffi/include/wic_abi.h"] {
        println!("cargo:rerun-if-changed={path}");
    }
}
