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

mod common;

use std::hint::black_box;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use fprobe::ObjPool;
use fprobe::retinst::{ProbeRef, RetInstPool, ReturnStack};

use common::{MutexPool, Obj, TreiberFreelist};

/// Objects in every pool.
const NR_OBJS: usize = 1024;
/// Pairs between counter updates.
const BATCH: u64 = 100;
const RUNS: usize = 3;

#[repr(align(128))]
struct Padded(AtomicU64);

/// Runs `op` on `threads` threads (each with its own state from `init`)
/// and returns total M pairs/s over the measured window.
fn measure<S, I, O>(threads: usize, secs: f64, init: &I, op: &O) -> f64
where
    I: Fn() -> S + Sync,
    O: Fn(&mut S) + Sync,
{
    let counters: Vec<Padded> = (0..threads).map(|_| Padded(AtomicU64::new(0))).collect();
    let stop = AtomicBool::new(false);
    let start = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for c in &counters {
            let (stop, start) = (&stop, &start);
            s.spawn(move || {
                let mut state = init();
                let mut done = 0u64;
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..BATCH {
                        op(&mut state);
                    }
                    done += BATCH;
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

fn median<S, I, O>(threads: usize, secs: f64, init: &I, op: &O) -> f64
where
    I: Fn() -> S + Sync,
    O: Fn(&mut S) + Sync,
{
    let mut runs: Vec<f64> = (0..RUNS)
        .map(|_| measure(threads, secs, init, op))
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[RUNS / 2]
}

#[inline(always)]
fn touch(o: &mut Obj) {
    o[0] = o[0].wrapping_add(1);
    black_box(o);
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

    let objpool = ObjPool::new(NR_OBJS, |_| [0u64; 8]);
    let treiber = TreiberFreelist::new(NR_OBJS);
    let mutex = MutexPool::new(NR_OBJS);
    let queue = ArrayQueue::new(NR_OBJS);
    for _ in 0..NR_OBJS {
        queue.push(Box::new([0u64; 8])).unwrap();
    }
    let retinst = RetInstPool::builder()
        .instances(NR_OBJS)
        .data_size(64)
        .build()
        .unwrap();
    let probe = ProbeRef {
        id: 1,
        generation: 1,
    };

    #[derive(Default)]
    struct Row {
        name: &'static str,
        rates: Vec<f64>,
    }
    let mut rows: Vec<Row> = Vec::new();
    let mut cell = |name: &'static str, rate: f64| {
        match rows.iter_mut().find(|r| r.name == name) {
            Some(r) => r.rates.push(rate),
            None => rows.push(Row {
                name,
                rates: vec![rate],
            }),
        }
        eprintln!("  {name:<40} {rate:8.2} M/s");
    };

    for &t in &threads {
        eprintln!("{t} thread(s):");
        let none = || ();
        cell(
            "kretprobe: fprobe::ObjPool",
            median(t, secs, &none, &|_: &mut ()| {
                let mut o = objpool.pop().unwrap();
                touch(&mut o);
            }),
        );
        cell(
            "kretprobe: Treiber freelist (tagged)",
            median(t, secs, &none, &|_: &mut ()| {
                let i = treiber.pop().unwrap();
                // SAFETY: index `i` is ours until pushed back.
                touch(unsafe { &mut *treiber.obj(i) });
                treiber.push(i);
            }),
        );
        cell(
            "kretprobe: Mutex<Vec>",
            median(t, secs, &none, &|_: &mut ()| {
                let mut b = mutex.0.lock().unwrap().pop().unwrap();
                touch(&mut b);
                mutex.0.lock().unwrap().push(b);
            }),
        );
        cell(
            "kretprobe: crossbeam ArrayQueue",
            median(t, secs, &none, &|_: &mut ()| {
                let mut b = queue.pop().unwrap();
                touch(&mut b);
                queue.push(b).unwrap();
            }),
        );
        cell(
            "kretprobe: Box alloc/free (glibc malloc)",
            median(t, secs, &none, &|_: &mut ()| {
                // `black_box` on the value: `Box::new([0; 8])` would become
                // `calloc`, which bypasses glibc's tcache (3x slower here).
                let mut b = black_box(Box::new(black_box([0u64; 8])));
                touch(&mut b);
                drop(black_box(b));
            }),
        );
        let stack = || retinst.register_thread();
        cell(
            "uretprobe-nop: retinst (per-thread reuse)",
            median(t, secs, &stack, &|s: &mut ReturnStack| {
                let data = s.push(probe, 0x401000, 16).unwrap();
                data[0] = data[0].wrapping_add(1);
                let ri = s.pop().unwrap();
                black_box(ri.data()[0]);
            }),
        );
        /// What a return instance holds, allocated per call.
        struct BoxedRi {
            probe: ProbeRef,
            addr: u64,
            data: [u8; 64],
        }
        cell(
            "uretprobe-nop: Box alloc/free per call",
            median(t, secs, &none, &|_: &mut ()| {
                let mut ri = black_box(Box::new(black_box(BoxedRi {
                    probe,
                    addr: 0x401000,
                    data: [0; 64],
                })));
                ri.data[0] = ri.data[0].wrapping_add(1);
                black_box((ri.probe, ri.addr, ri.data[0]));
                drop(black_box(ri));
            }),
        );
    }

    println!("Total M pairs/s (M/s per thread), median of {RUNS} runs of {secs} s:");
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
    for r in &rows {
        print!("| {} |", r.name);
        for (rate, t) in r.rates.iter().zip(&threads) {
            print!(" {:.1} ({:.1}) |", rate, rate / *t as f64);
        }
        println!();
    }
}
