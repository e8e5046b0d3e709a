//! Compiles `c/targets.c` with `-fpatchable-function-entry=7,5` into the
//! tests, `c/ipa.c` without it (its callee has the attribute), and
//! `c/dl.c` with it into `libpt_dl.so` and a stripped copy, which the
//! tests load and unload (`PT_DL_SO`, `PT_DL_STRIPPED_SO`); `c/unwind.cpp`
//! with it too, C++ linked with libstdc++, for the unwinding tests.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=c/targets.c");
    println!("cargo:rerun-if-changed=c/dl.c");
    println!("cargo:rerun-if-changed=c/ipa.c");
    println!("cargo:rerun-if-changed=c/unwind.cpp");
    cc::Build::new()
        .file("c/ipa.c")
        .opt_level(2)
        .warnings(true)
        .warnings_into_errors(true)
        .compile("fprobe_patch_ipa");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    // Compiled and linked in one plain compiler run: the object must not
    // inherit the tests' sanitizer flags (a shared object instrumented for
    // one cannot find its runtime, which the test binary does not export).
    let so = out.join("libpt_dl.so");
    let status = Command::new(cc::Build::new().get_compiler().path())
        .args([
            "-O2",
            "-fPIC",
            "-shared",
            "-fpatchable-function-entry=7,5",
            "-o",
        ])
        .arg(&so)
        .arg("c/dl.c")
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "linking {} failed", so.display());
    println!("cargo:rustc-env=PT_DL_SO={}", so.display());
    let stripped = out.join("libpt_dl_stripped.so");
    let status = Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(&so)
        .status()
        .expect("run strip");
    assert!(status.success(), "strip failed");
    println!("cargo:rustc-env=PT_DL_STRIPPED_SO={}", stripped.display());
    cc::Build::new()
        .file("c/targets.c")
        .flag("-fpatchable-function-entry=7,5")
        .flag("-std=c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .opt_level(2)
        .compile("fprobe_patch_targets");
    cc::Build::new()
        .cpp(true)
        .file("c/unwind.cpp")
        .flag("-fpatchable-function-entry=7,5")
        .flag("-std=c++17")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .opt_level(2)
        .compile("fprobe_patch_unwind");
}
