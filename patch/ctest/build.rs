//! Compiles `c/targets.c` with `-fpatchable-function-entry=7,5` into the
//! tests, and `c/dl.c` the same way into `libpt_dl.so`, which the tests
//! load and unload (`PT_DL_SO`; stripped, `PT_DL_STRIPPED_SO`), and `c/ipa.c` without the flag (its
//! callee has the attribute).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=c/targets.c");
    println!("cargo:rerun-if-changed=c/dl.c");
    println!("cargo:rerun-if-changed=c/ipa.c");
    cc::Build::new()
        .file("c/ipa.c")
        .opt_level(2)
        .warnings(true)
        .warnings_into_errors(true)
        .compile("fprobe_patch_ipa");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let objs = cc::Build::new()
        .file("c/dl.c")
        .flag("-fpatchable-function-entry=7,5")
        .pic(true)
        .opt_level(2)
        .out_dir(out.join("dl"))
        .compile_intermediates();
    let so = out.join("libpt_dl.so");
    let status = Command::new(cc::Build::new().get_compiler().path())
        .arg("-shared")
        .arg("-o")
        .arg(&so)
        .args(&objs)
        .status()
        .expect("run the C compiler to link");
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
}
