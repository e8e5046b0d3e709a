//! The kernel's trigger benchmarks in this crate's terms, in one run:
//! `kprobe-multi` (a counting probe on one address), `kprobe-multi-all` (an
//! empty probe on each of 50,000 addresses plus the counting probe on the
//! hot one), `kretprobe-multi-all` (the same with exit handlers), with and
//! without the hit cache. Each producer calls the hot function in batches
//! of 100 (entry + exit per call).
//!
//! `cargo bench --bench probe` (env `FPROBE_THREADS=1,2`, `FPROBE_RUN_MS=300`)

#[path = "common/runner.rs"]
mod runner;

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use fprobe::HitCacheConfig;
use fprobe::probe::{EntryAction, Fprobe, Registry};

const HOT: u64 = 0x40_1230;

#[derive(Clone, Copy, PartialEq)]
enum Shape {
    One,
    All,
    AllRet,
}

fn registry(shape: Shape, cache: bool, hits: &Arc<AtomicU64>) -> Registry<u64> {
    let b = Registry::<u64>::builder().capacity(50_001);
    let b = if cache {
        b.hit_cache(HitCacheConfig::default())
    } else {
        b
    };
    let reg = b.build().unwrap();
    if shape != Shape::One {
        let addrs: Vec<u64> = (0..50_000u64).map(|i| 0x50_0000 + i * 48).collect();
        reg.register(
            Fprobe::builder().entry(|_| EntryAction::Continue).build(),
            &addrs,
        )
        .unwrap();
    }
    let h = hits.clone();
    let counting = Fprobe::builder().entry(move |_| {
        // Per-producer counting is the harness's job; the probe only
        // touches its argument so the call is not optimised away.
        black_box(&h);
        EntryAction::Continue
    });
    let counting = if shape == Shape::AllRet {
        counting.data_size(8).exit(|x| {
            black_box(x.data);
        })
    } else {
        counting
    };
    reg.register(counting.build(), &[HOT]).unwrap();
    reg
}

fn run(reg: &Arc<Registry<u64>>, threads: usize, dur: Duration) -> f64 {
    let workers = (0..threads)
        .map(|_| {
            let reg = reg.clone();
            move || {
                for i in 0..100u64 {
                    reg.on_entry(black_box(HOT), i, &i);
                    reg.on_exit(i, &i);
                }
                100
            }
        })
        .collect();
    runner::throughput(workers, dur)
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let threads = runner::threads();
    let dur = runner::run_length();
    let hits = Arc::new(AtomicU64::new(0));
    let cases = [
        ("kprobe-multi", Shape::One, false),
        ("kprobe-multi-all", Shape::All, false),
        ("kretprobe-multi-all", Shape::AllRet, false),
        ("kprobe-multi-all +cache", Shape::All, true),
        ("kretprobe-multi-all +cache", Shape::AllRet, true),
    ];
    let regs: Vec<_> = cases
        .iter()
        .map(|&(_, s, c)| Arc::new(registry(s, c, &hits)))
        .collect();
    println!(
        "probe dispatch, median of 5 × {} ms, M calls/s (entry + exit per call)",
        dur.as_millis()
    );
    println!("| benchmark | threads | M/s | M/s per producer | vs kprobe-multi |");
    println!("|---|---|---|---|---|");
    for &t in &threads {
        let mut samples = vec![Vec::new(); cases.len()];
        for _ in 0..5 {
            for (i, reg) in regs.iter().enumerate() {
                samples[i].push(run(reg, t, dur));
            }
        }
        let med: Vec<f64> = samples.iter().map(|s| runner::stats::median(s)).collect();
        for (i, (name, _, _)) in cases.iter().enumerate() {
            println!(
                "| {name} | {t} | {:.2} | {:.2} | {:.2}× |",
                med[i],
                med[i] / t as f64,
                med[i] / med[0]
            );
        }
    }
}
