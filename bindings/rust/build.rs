//! Links the prebuilt `librekindle.a` (the top-level `make` builds it first)
//! and compiles `csrc/layout.c`, the C half of the struct layout check.
//!
//! `REKINDLE_LIB_DIR` names the directory holding `librekindle.a`; without
//! it, `../../build/lib` relative to this crate. `REKINDLE_INCLUDE_DIR`
//! names the directory holding `rekindle.h`; without it,
//! `../../runtime/include`.
use std::env;
use std::path::PathBuf;

fn dir_from_env(var: &str, default: &str) -> PathBuf {
    println!("cargo:rerun-if-env-changed={var}");
    match env::var_os(var) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            let manifest =
                env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
            PathBuf::from(manifest).join(default)
        }
    }
}

fn main() {
    let lib_dir = dir_from_env("REKINDLE_LIB_DIR", "../../build/lib");
    let include_dir = dir_from_env("REKINDLE_INCLUDE_DIR", "../../runtime/include");
    let lib = lib_dir.join("librekindle.a");
    if !lib.is_file() {
        panic!(
            "{} not found: build the runtime first (`make runtime` at the top of the repository) \
             or set REKINDLE_LIB_DIR to the directory that holds librekindle.a",
            lib.display()
        );
    }
    let header = include_dir.join("rekindle.h");
    if !header.is_file() {
        panic!(
            "{} not found: set REKINDLE_INCLUDE_DIR to the directory that holds rekindle.h",
            header.display()
        );
    }
    println!("cargo:rerun-if-changed={}", lib.display());
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rerun-if-changed=csrc/layout.c");

    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=static=rekindle");
    println!("cargo:rustc-link-lib=pthread");

    cc::Build::new()
        .file("csrc/layout.c")
        .include(&include_dir)
        .std("c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("rekindle_rs_layout");
}
