//! Gives the shared library the soname of the installed C library when
//! `scripts/install-capi.sh` builds it.
//!
//! The soname (`libfprobe.so.0.1` for 0.1.x: the script holds the
//! versioning policy) is set only when `FPROBE_CAPI_SONAME` names it. A
//! plain `cargo build` leaves `target/*/libfprobe_capi.so` without one, as
//! before: a program linked in the tree with `-lfprobe_capi` then needs
//! `libfprobe_capi.so` at run time, not an installed `libfprobe.so.0.1`.
//! The install script builds in a target directory of its own, so the two
//! builds never invalidate each other.

use std::env;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=FPROBE_CAPI_SONAME");
    let soname = env::var("FPROBE_CAPI_SONAME").unwrap_or_default();
    if soname.is_empty() {
        return;
    }
    // -Wl splits on commas; a soname is a plain file name.
    assert!(
        soname.starts_with("lib")
            && soname
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b)),
        "FPROBE_CAPI_SONAME={soname:?} is not a plain library file name"
    );
    // ELF sonames as the GNU linker (and lld, mold) take them: Linux only.
    if env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    }
}
