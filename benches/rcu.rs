//! RCU read side, grace periods and reclamation, against the read guards of
//! the crates users would pick instead, in the same run.
//!
//! `cargo bench --bench rcu`

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use fprobe::rcu::{self, RcuPtr};
use seize::Guard as _;

fn read_side(c: &mut Criterion) {
    let mut g = c.benchmark_group("read_side");
    g.measurement_time(Duration::from_secs(2));
    g.warm_up_time(Duration::from_millis(500));

    // Enter + leave, nothing else. Guards are dropped, not black-boxed:
    // every implementation's enter/leave writes memory the compiler must keep.
    g.bench_function("fprobe::rcu::read_lock", |b| {
        b.iter(|| drop(rcu::read_lock()))
    });
    g.bench_function("fprobe::rcu::read_lock(nested)", |b| {
        let _outer = rcu::read_lock();
        b.iter(|| drop(rcu::read_lock()))
    });
    g.bench_function("crossbeam_epoch::pin", |b| {
        b.iter(|| drop(crossbeam_epoch::pin()))
    });
    let collector = seize::Collector::new();
    g.bench_function("seize::Collector::enter", |b| {
        b.iter(|| drop(black_box(&collector).enter()))
    });

    // Enter, load a protected pointer, read through it, leave.
    let ours = RcuPtr::new(42u64);
    g.bench_function("load/fprobe::RcuPtr", |b| {
        b.iter(|| {
            let guard = rcu::read_lock();
            *black_box(&ours).load(&guard).unwrap()
        })
    });
    let epoch = crossbeam_epoch::Atomic::new(42u64);
    g.bench_function("load/crossbeam_epoch::Atomic", |b| {
        b.iter(|| {
            let guard = crossbeam_epoch::pin();
            // SAFETY: (bench) the pointer is never freed during the bench.
            *unsafe { black_box(&epoch).load(Ordering::Acquire, &guard).deref() }
        })
    });
    let seized = AtomicPtr::new(Box::into_raw(Box::new(42u64)));
    g.bench_function("load/seize::Guard::protect", |b| {
        b.iter(|| {
            let guard = collector.enter();
            let p = guard.protect(black_box(&seized), Ordering::Acquire);
            // SAFETY: (bench) the pointer is never freed during the bench.
            unsafe { *p }
        })
    });
    let swap = arc_swap::ArcSwap::from_pointee(42u64);
    g.bench_function("load/arc_swap::ArcSwap::load", |b| {
        b.iter(|| **black_box(&swap).load())
    });
    let cell = rcu_cell::RcuCell::new(42u64);
    g.bench_function("load/rcu_cell::RcuCell::read", |b| {
        b.iter(|| *black_box(&cell).read().unwrap())
    });
    g.finish();
    // SAFETY: (bench) allocated above with Box::into_raw, no longer used.
    drop(unsafe { Box::from_raw(seized.load(Ordering::Relaxed)) });
    // SAFETY: (bench) no other thread uses `epoch`.
    drop(unsafe { epoch.into_owned() });
}

/// Idle reader threads: registered with RCU, looping in and out of short
/// read-side sections, so `synchronize` has records to scan and readers to
/// wait for.
fn with_readers<R>(n: usize, f: impl FnOnce() -> R) -> R {
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    drop(black_box(rcu::read_lock()));
                    std::thread::sleep(Duration::from_micros(100));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(10));
    let r = f();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    r
}

fn grace_periods(c: &mut Criterion) {
    let mut g = c.benchmark_group("synchronize");
    g.measurement_time(Duration::from_secs(2));
    for readers in [0usize, 1, 4] {
        with_readers(readers, || {
            g.bench_function(format!("{readers}_idle_readers"), |b| {
                b.iter(rcu::synchronize)
            });
        });
    }
    g.finish();
}

fn reclamation(c: &mut Criterion) {
    let mut g = c.benchmark_group("reclamation");
    g.measurement_time(Duration::from_secs(2));
    // Retire + eventual drop of a 64-byte object, amortised: each iteration
    // retires 1024 objects and the batch ends with a barrier.
    g.bench_function("retire_1024_then_barrier", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                for i in 0..1024u64 {
                    rcu::retire(Box::new([i; 8]));
                }
                rcu::barrier();
            }
            t.elapsed()
        })
    });
    let p = RcuPtr::new([0u64; 8]);
    g.bench_function("RcuPtr::replace", |b| {
        b.iter(|| p.replace([1u64; 8]));
    });
    g.finish();
    rcu::barrier();
}

criterion_group!(benches, read_side, grace_periods, reclamation);
criterion_main!(benches);
