//! The call-trace file: one little-endian `u32` function index per call,
//! written by the SQLite profiler's `--record-trace` and replayed by the
//! harness's `--workload trace` and `benches/hit_cache.rs` (both include
//! this file, the profiler too).

use std::io;
use std::path::Path;

/// Writes `calls` to `path`.
pub fn write(path: &Path, calls: &[u32]) -> io::Result<()> {
    let bytes: Vec<u8> = calls.iter().flat_map(|i| i.to_le_bytes()).collect();
    std::fs::write(path, bytes)
}

/// The calls in `path`.
pub fn read(path: &Path) -> io::Result<Vec<u32>> {
    let bytes = std::fs::read(path)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("chunks of 4")))
        .collect())
}
