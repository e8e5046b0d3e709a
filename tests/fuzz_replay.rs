//! Replays the committed fuzz corpus (`fuzz/corpus/index_ops/`) and a fixed
//! set of generated inputs through the shared model checker, on stable, in
//! `cargo test`.

#[path = "../fuzz/ops/index_ops.rs"]
mod index_ops;

#[test]
fn replay_index_ops_corpus() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/index_ops");
    let mut n = 0;
    // Under miri a handful of inputs (each replays hundreds of operations).
    let limit = if cfg!(miri) { 3 } else { usize::MAX };
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten().take(limit) {
            let data = std::fs::read(e.path()).unwrap();
            index_ops::run_bytes(&data);
            n += 1;
        }
    }
    println!("replayed {n} corpus inputs");
}

#[test]
fn generated_index_ops_inputs() {
    // Deterministic pseudo-random inputs: the replay runs something even
    // when the corpus is empty.
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let count = if cfg!(miri) { 3 } else { 300 };
    for len in 0..count {
        let data: Vec<u8> = (0..(len * 7) % 1500)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        index_ops::run_bytes(&data);
    }
}
