//! Compiles `c/targets.c` with `-fpatchable-function-entry=7,5`.

fn main() {
    println!("cargo:rerun-if-changed=c/targets.c");
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
