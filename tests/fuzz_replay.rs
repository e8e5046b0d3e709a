//! Replays the committed fuzz corpora (`fuzz/corpus/<target>/`) and a fixed
//! set of generated inputs through the shared model checkers, on stable, in
//! `cargo test`. Under miri, two short generated inputs per target.

#[path = "../fuzz/ops/index_concurrent.rs"]
mod index_concurrent;
#[path = "../fuzz/ops/index_ops.rs"]
mod index_ops;
#[path = "../fuzz/ops/objpool_ops.rs"]
mod objpool_ops;
#[path = "../fuzz/ops/probe_ops.rs"]
mod probe_ops;

/// Runs every committed input of `target` (none under miri).
fn replay(target: &str, run: fn(&[u8])) {
    if cfg!(miri) {
        // Not even the listing: reading and sorting a thousand paths takes
        // minutes under miri, and the generated inputs below take every
        // model through it.
        return;
    }
    let dir = format!("{}/fuzz/corpus/{target}", env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    // Same inputs in the same order on every run.
    files.sort();
    let mut n = 0;
    for path in files {
        let data = std::fs::read(&path).unwrap();
        if let Err(e) = std::panic::catch_unwind(|| run(&data)) {
            eprintln!("{target}: corpus input {} fails", path.display());
            std::panic::resume_unwind(e);
        }
        n += 1;
    }
    println!("{target}: replayed {n} corpus inputs");
}

/// Deterministic pseudo-random inputs: the replay runs something even when
/// a corpus is empty.
fn generated(count: usize, max_len: usize, run: fn(&[u8])) {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let count = if cfg!(miri) { 2 } else { count };
    for len in 0..count {
        let data: Vec<u8> = (0..(len * 7) % max_len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        run(&data);
    }
}

#[test]
fn replay_index_ops_corpus() {
    replay("index_ops", index_ops::run_bytes);
}

#[test]
fn generated_index_ops_inputs() {
    generated(300, 1500, index_ops::run_bytes);
}

#[test]
fn replay_index_concurrent_corpus() {
    replay("index_concurrent", index_concurrent::run_bytes);
}

#[test]
fn generated_index_concurrent_inputs() {
    generated(200, 1000, index_concurrent::run_bytes);
}

#[test]
fn replay_objpool_ops_corpus() {
    replay("objpool_ops", objpool_ops::run_bytes);
}

#[test]
fn generated_objpool_ops_inputs() {
    generated(300, 600, objpool_ops::run_bytes);
}

#[test]
fn replay_probe_ops_corpus() {
    replay("probe_ops", probe_ops::run_bytes);
}

#[test]
fn generated_probe_ops_inputs() {
    generated(300, 600, probe_ops::run_bytes);
}

#[test]
fn replay_probe_returns_corpus() {
    replay("probe_returns", probe_ops::run_bytes_taking_returns);
}

#[test]
fn generated_probe_returns_inputs() {
    generated(300, 600, probe_ops::run_bytes_taking_returns);
}
