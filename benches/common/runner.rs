//! Shared by the multi-thread throughput benches (`hit_cache`, `probe`):
//! thread counts and run length from the environment, medians (the
//! harness's `stats`), and a runner that drives N threads for a fixed time
//! and counts their operations.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Thread counts: `FPROBE_THREADS=1,2,4` (default 1,2).
pub fn threads() -> Vec<usize> {
    std::env::var("FPROBE_THREADS")
        .ok()
        .map(|s| s.split(',').filter_map(|t| t.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2])
}

/// Length of one measured run: `FPROBE_RUN_MS` (default 300 ms).
pub fn run_length() -> Duration {
    Duration::from_millis(
        std::env::var("FPROBE_RUN_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300),
    )
}

/// The benchmark harness's statistics (`bench/src/stats.rs`), shared so
/// that every median in the repository is the same function.
#[path = "../../bench/src/stats.rs"]
#[allow(dead_code)] // the benches use `median` only
pub mod stats;

/// Total M operations/s of `workers`, each started on its own thread and
/// called in a loop (one batch per call, returning the operations it did)
/// until `run` has passed.
pub fn throughput<F>(workers: Vec<F>, run: Duration) -> f64
where
    F: FnMut() -> u64 + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(workers.len() + 1));
    let handles: Vec<_> = workers
        .into_iter()
        .map(|mut batch| {
            let (stop, start) = (stop.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += batch();
                }
                n
            })
        })
        .collect();
    start.wait();
    let t = Instant::now();
    std::thread::sleep(run);
    stop.store(true, Ordering::Relaxed);
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    total as f64 / t.elapsed().as_secs_f64() / 1e6
}
