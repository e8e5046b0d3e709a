//! Compiles `c/calls.c` with `-finstrument-functions` against the committed
//! header; the archive is linked before `fprobe-capi`, which defines the
//! hooks and the ABI it calls.

fn main() {
    println!("cargo:rerun-if-changed=c/calls.c");
    println!("cargo:rerun-if-changed=c/ctest.h");
    println!("cargo:rerun-if-changed=../include/fprobe.h");
    cc::Build::new()
        .file("c/calls.c")
        .include("../include")
        .flag("-finstrument-functions")
        .flag("-pthread")
        .flag("-std=c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        // Optimised like real code; the call counts are exact anyway:
        // instrumentation is kept in inlined copies and blocks turning
        // recursion into loops.
        .opt_level(2)
        .compile("fprobe_ctest");
}
