//! Builds three shared objects from the SQLite amalgamation that
//! `libsqlite3-sys` bundles, with the same flags:
//!
//! * `libsqlite_plain.so`: not instrumented (the baseline);
//! * `libsqlite_instr.so`: `-finstrument-functions`, its hooks resolved to
//!   `__cyg_profile_func_enter/_exit` of the profiler binary (the crate's
//!   runtime);
//! * `libsqlite_instr_wrapped.so`: the *same object file*, linked with
//!   `--wrap` so that its hooks resolve to `__wrap___cyg_profile_func_*`,
//!   the locked-HashMap dispatcher the profiler compares against.
//!
//! Each is linked with `-Bsymbolic`, so the three copies loaded with
//! `RTLD_LOCAL` into one process never bind to each other's symbols.

use std::path::{Path, PathBuf};
use std::process::Command;

fn objects(src: &Path, include: &Path, instrument: bool) -> Vec<PathBuf> {
    let mut b = cc::Build::new();
    b.file(src)
        .include(include)
        .opt_level(2)
        .debug(false)
        .pic(true)
        .warnings(false)
        .define("SQLITE_THREADSAFE", "1")
        .define("SQLITE_OMIT_LOAD_EXTENSION", None)
        .define("SQLITE_DQS", "0")
        .define("HAVE_USLEEP", "1")
        .define("HAVE_ISNAN", None)
        .define("_POSIX_THREAD_SAFE_FUNCTIONS", None);
    if instrument {
        b.flag("-finstrument-functions");
    }
    b.out_dir(
        PathBuf::from(std::env::var("OUT_DIR").unwrap()).join(if instrument {
            "instr"
        } else {
            "plain"
        }),
    );
    b.compile_intermediates()
}

fn link(objs: &[PathBuf], out: &Path, extra: &[&str]) {
    let cc = cc::Build::new().get_compiler();
    let status = Command::new(cc.path())
        .arg("-shared")
        .arg("-o")
        .arg(out)
        .args(objs)
        .args(["-Wl,-Bsymbolic", "-lpthread", "-lm"])
        .args(extra)
        .status()
        .expect("run the C compiler to link");
    assert!(status.success(), "linking {} failed", out.display());
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let include = PathBuf::from(
        std::env::var("DEP_SQLITE3_INCLUDE")
            .expect("libsqlite3-sys (feature bundled) exports its source directory"),
    );
    let src = include.join("sqlite3.c");
    assert!(src.exists(), "no amalgamation at {}", src.display());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());

    // The two compilations are independent: run them side by side.
    let (s, i) = (src.clone(), include.clone());
    let plain = std::thread::spawn(move || objects(&s, &i, false));
    let instr = objects(&src, &include, true);
    let plain = plain.join().expect("plain build");

    let paths = [
        ("PLAIN", out.join("libsqlite_plain.so")),
        ("INSTR", out.join("libsqlite_instr.so")),
        ("WRAPPED", out.join("libsqlite_instr_wrapped.so")),
    ];
    link(&plain, &paths[0].1, &[]);
    link(&instr, &paths[1].1, &[]);
    link(
        &instr,
        &paths[2].1,
        &[
            "-Wl,--wrap=__cyg_profile_func_enter",
            "-Wl,--wrap=__cyg_profile_func_exit",
        ],
    );
    for (name, p) in &paths {
        println!("cargo:rustc-env=FPROBE_SQLITE_{name}={}", p.display());
    }
    // The shared objects resolve their hooks against the executable.
    println!("cargo:rustc-link-arg-bins=-rdynamic");
}
