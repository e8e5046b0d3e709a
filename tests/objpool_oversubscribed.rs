//! More threads than CPUs: 256 objects, each thread popping one object and
//! dropping it at once (so at most one object per thread is out), at 4, 8
//! and 16 threads. Every pop must succeed: the pool's bound on misses
//! counts only objects in the magazines of threads inside a pop or push,
//! and with the default magazines (16 objects, refilled 8 at a time) the
//! depot never runs dry here, so no pop ever needs one of those.
//!
//! Each row lasts `FPROBE_OBJPOOL_SECS` seconds (1 by default):
//!
//! ```sh
//! FPROBE_OBJPOOL_SECS=10 cargo test --release --test objpool_oversubscribed -- --nocapture
//! ```

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fprobe::ObjPool;

fn row_duration() -> Duration {
    let secs: f64 = std::env::var("FPROBE_OBJPOOL_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    Duration::from_secs_f64(secs)
}

#[test]
#[cfg_attr(miri, ignore)] // threads and wall-clock time
fn no_pop_fails_with_more_threads_than_cpus() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    for threads in [4, 8, 16] {
        let pool = ObjPool::new(256, |i| i);
        let stop = AtomicBool::new(false);
        let start = Barrier::new(threads + 1);
        let (pops, nones) = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    let (pool, stop, start) = (&pool, &stop, &start);
                    s.spawn(move || {
                        start.wait();
                        let (mut pops, mut nones) = (0u64, 0u64);
                        while !stop.load(Ordering::Relaxed) {
                            for _ in 0..256 {
                                match pool.pop() {
                                    Some(o) => drop(std::hint::black_box(o)),
                                    None => nones += 1,
                                }
                                pops += 1;
                            }
                        }
                        (pops, nones)
                    })
                })
                .collect();
            start.wait();
            let deadline = Instant::now() + row_duration();
            while Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            stop.store(true, Ordering::Relaxed);
            workers
                .into_iter()
                .map(|w| w.join().unwrap())
                .fold((0, 0), |(p, n), (wp, wn)| (p + wp, n + wn))
        });
        eprintln!(
            "objpool, {threads} threads on {cpus} CPUs: {pops} pops, {nones} returned None, \
             nmissed {}",
            pool.nmissed()
        );
        assert_eq!(
            nones, 0,
            "{threads} threads: pops failed while objects were free"
        );
        assert_eq!(pool.nmissed(), 0);
        assert!(pops > 0);
    }
}
