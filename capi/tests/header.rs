//! `include/fprobe.h` is what cbindgen generates from the sources now.

use std::path::Path;

#[test]
fn header_is_current() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let config =
        cbindgen::Config::from_file(Path::new(dir).join("cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen")
        .write(&mut out);
    let generated = String::from_utf8(out).unwrap();
    let path = Path::new(dir).join("include/fprobe.h");
    if std::env::var_os("FPROBE_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/fprobe.h is stale: run FPROBE_BLESS=1 cargo test -p fprobe-capi --test header"
    );
}
