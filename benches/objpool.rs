//! Return-instance pools under the kretprobe pattern (pop at entry, push at
//! return) and the uretprobe-nop pattern (entry + return with per-thread
//! return-instance reuse), all in one run.
//!
//! ```text
//! cargo bench --bench objpool
//! FPROBE_THREADS=1,2,4,8,16 FPROBE_BENCH_SECS=1 cargo bench --bench objpool
//! ```
//!
//! Method (after `bench_trigger.c`): N threads run the pattern in batches of
//! 100 pairs, each bumping its own counter padded to 128 bytes; the main
//! thread samples the counters after a 0.2 s warm-up and again after
//! `FPROBE_BENCH_SECS` (default 1 s). Each cell is the median of 3 runs.

#[path = "common/pools.rs"]
mod pools;

use std::hint::black_box;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pools::{KRETPROBE, Pattern, Pools, URETPROBE};

/// Objects in every pool.
const NR_OBJS: usize = 1024;
/// Pairs between counter updates.
const BATCH: u64 = 100;
const RUNS: usize = 3;

#[repr(align(128))]
struct Padded(AtomicU64);

/// Runs `p` on `threads` threads and returns total M pairs/s over the
/// measured window.
fn measure(pools: &Pools, p: Pattern, threads: usize, secs: f64) -> f64 {
    let counters: Vec<Padded> = (0..threads).map(|_| Padded(AtomicU64::new(0))).collect();
    let stop = AtomicBool::new(false);
    let start = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for c in &counters {
            let (stop, start) = (&stop, &start);
            s.spawn(move || {
                let mut state = pools.thread_state(p);
                let mut done = 0u64;
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    done += pools.pairs(p, &mut state, BATCH);
                    c.0.store(done, Ordering::Relaxed);
                }
            });
        }
        start.wait();
        let sum = || {
            counters
                .iter()
                .map(|c| c.0.load(Ordering::Relaxed))
                .sum::<u64>()
        };
        std::thread::sleep(Duration::from_millis(200));
        let (c0, t0) = (sum(), Instant::now());
        std::thread::sleep(Duration::from_secs_f64(secs));
        let (c1, t1) = (sum(), Instant::now());
        stop.store(true, Ordering::Relaxed);
        (c1 - c0) as f64 / (t1 - t0).as_secs_f64() / 1e6
    })
}

fn median(pools: &Pools, p: Pattern, threads: usize, secs: f64) -> f64 {
    let mut runs: Vec<f64> = (0..RUNS)
        .map(|_| measure(pools, p, threads, secs))
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[RUNS / 2]
}

/// Nanoseconds per call of `f`, single-threaded.
fn ns_per_call(mut f: impl FnMut() -> usize) -> f64 {
    const CALLS: usize = 10_000_000;
    let t = Instant::now();
    let mut acc = 0;
    for _ in 0..CALLS {
        acc += f();
    }
    black_box(acc);
    t.elapsed().as_nanos() as f64 / CALLS as f64
}

fn main() {
    let threads: Vec<usize> = std::env::var("FPROBE_THREADS")
        .ok()
        .map(|s| s.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2]);
    let secs: f64 = std::env::var("FPROBE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);

    // Ring selection: what a per-CPU ring choice would cost per operation.
    // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
    let getcpu = ns_per_call(|| unsafe { libc::sched_getcpu() } as usize);
    println!(
        "ring selection: sched_getcpu() {getcpu:.2} ns/call (objpool uses a thread-local slot instead)"
    );
    println!();

    let pools = Pools::new(NR_OBJS);
    let cases: Vec<(Pattern, String)> = KRETPROBE
        .iter()
        .map(|&(p, name, _)| (p, format!("kretprobe: {name}")))
        .chain(
            URETPROBE
                .iter()
                .map(|&(p, name, _)| (p, format!("uretprobe-nop: {name}"))),
        )
        .collect();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for &t in &threads {
        eprintln!("{t} thread(s):");
        for ((p, name), r) in cases.iter().zip(&mut rates) {
            let rate = median(&pools, *p, t, secs);
            eprintln!("  {name:<40} {rate:8.2} M/s");
            r.push(rate);
        }
    }

    let (objpool_missed, retinst_missed) = pools.nmissed();
    println!(
        "Total M pairs/s (M/s per thread), median of {RUNS} runs of {secs} s \
         (pops that missed, not counted: ObjPool {objpool_missed}, retinst {retinst_missed}):"
    );
    println!();
    print!("| pool |");
    for t in &threads {
        print!(" {t}T |");
    }
    println!();
    print!("|---|");
    for _ in &threads {
        print!("---|");
    }
    println!();
    for ((_, name), r) in cases.iter().zip(&rates) {
        print!("| {name} |");
        for (rate, t) in r.iter().zip(&threads) {
            print!(" {:.1} ({:.1}) |", rate, rate / *t as f64);
        }
        println!();
    }
}
