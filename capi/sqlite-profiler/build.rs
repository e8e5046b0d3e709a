//! Builds four shared objects from the SQLite amalgamation that
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
//! * `libsqlite_patch.so`: `-fpatchable-function-entry=7,5`, the nops the
//!   patching runtime (`fprobe-patch`) turns into calls at run time.
//!
//! Each is linked with `-Bsymbolic`, so the three copies loaded with
//! `RTLD_LOCAL` into one process never bind to each other's symbols.

use std::path::{Path, PathBuf};
use std::process::Command;

/// How a copy is compiled.
#[derive(Clone, Copy)]
enum Build {
    Plain,
    Instrumented,
    Patchable,
}

fn objects(src: &Path, include: &Path, build: Build) -> Vec<PathBuf> {
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
    let dir = match build {
        Build::Plain => "plain",
        Build::Instrumented => {
            b.flag("-finstrument-functions");
            "instr"
        }
        Build::Patchable => {
            b.flag("-fpatchable-function-entry=7,5");
            "patch"
        }
    };
    b.out_dir(PathBuf::from(std::env::var("OUT_DIR").unwrap()).join(dir));
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

    // The compilations are independent: run them side by side.
    let spawn = |build| {
        let (s, i) = (src.clone(), include.clone());
        std::thread::spawn(move || objects(&s, &i, build))
    };
    let plain = spawn(Build::Plain);
    let patch = spawn(Build::Patchable);
    let instr = objects(&src, &include, Build::Instrumented);
    let plain = plain.join().expect("plain build");
    let patch = patch.join().expect("patchable build");

    let paths = [
        ("PLAIN", out.join("libsqlite_plain.so")),
        ("INSTR", out.join("libsqlite_instr.so")),
        ("WRAPPED", out.join("libsqlite_instr_wrapped.so")),
        ("PATCH", out.join("libsqlite_patch.so")),
    ];
    link(&plain, &paths[0].1, &[]);
    link(&patch, &paths[3].1, &[]);
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
