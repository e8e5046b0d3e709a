//! `--bench objpool`, `uretprobe-nop`: return-instance pools per call, M
//! pairs/s (get an instance at entry, give it back at return), every
//! contender in the same run. The pools and baselines are in `pools.rs`.
//!
//! * `objpool`: the kretprobe pattern over a shared pool of 1,024 64-byte
//!   objects: `fprobe::ObjPool` vs the Treiber freelist it replaces in the
//!   kernel, crossbeam `ArrayQueue`, `Mutex<Vec>`, and plain malloc/free.
//! * `uretprobe-nop`: the uprobes pattern, per-thread return-instance reuse
//!   (`fprobe::retinst`) vs a `Box` per call.
//!
//! `objpool` also times `sched_getcpu(3)`, what a per-CPU pool without rseq
//! would pay to find its CPU on every operation (`ObjPool`'s magazines are
//! per thread: one thread-local load finds them).

use crate::report::md;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::compare::{self, Contender, Labels};
use crate::config::Config;
use crate::harness::PaddedCounter;
use crate::impls::BATCH;
use crate::pools::{KRETPROBE, Pattern, Pools, URETPROBE};
use crate::row::Row;

/// Objects in every pool.
const NR_OBJS: usize = 1024;

pub fn run_objpool(cfg: &Config) -> Vec<Row> {
    md!("## objpool\n");
    md!(
        "kretprobe pattern: pop at entry, touch the 64-byte object, push at return; \
         {NR_OBJS} objects per pool, shared by all producers\n"
    );
    let rows = run(cfg, "objpool", KRETPROBE);
    md!(
        "per-CPU selection: sched_getcpu() {:.2} ns/call (objpool finds its per-thread magazine with a thread-local load)\n",
        sched_getcpu_ns()
    );
    rows
}

/// Nanoseconds per `sched_getcpu(3)` call, single-threaded, over 10 M calls.
fn sched_getcpu_ns() -> f64 {
    const CALLS: u32 = 10_000_000;
    let t = Instant::now();
    let mut acc = 0i64;
    for _ in 0..CALLS {
        // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
        acc += i64::from(unsafe { libc::sched_getcpu() });
    }
    black_box(acc);
    t.elapsed().as_nanos() as f64 / f64::from(CALLS)
}

pub fn run_uretprobe_nop(cfg: &Config) -> Vec<Row> {
    md!("## uretprobe-nop\n");
    md!(
        "uprobes pattern: reserve a return instance (probe, address, 16 of 64 data bytes) \
         at entry, write it, release it at return\n"
    );
    run(cfg, "uretprobe-nop", URETPROBE)
}

fn run(cfg: &Config, bench: &'static str, cases: &[(Pattern, &'static str, &str)]) -> Vec<Row> {
    let pools = Pools::new(NR_OBJS);
    let pools = &pools;
    let contenders: Vec<Contender> = cases
        .iter()
        .filter(|(_, name, _)| cfg.keep_impl(name))
        .map(|&(p, name, _)| Contender {
            name,
            producer: Box::new(move |_, counter: &PaddedCounter, stop: &AtomicBool| {
                let mut state = pools.thread_state(p);
                // Relaxed: see run_producers; polled once per batch.
                while !stop.load(Ordering::Relaxed) {
                    counter.add(pools.pairs(p, &mut state, BATCH as u64));
                }
            }),
        })
        .collect();
    let labels = Labels {
        bench,
        workload: "pairs",
        addrs: 0,
        title: format!("{bench}: M pairs/s (entry + return)"),
        reference: cases[0].1,
    };
    let rows = compare::run(cfg, &labels, &contenders);
    let (objpool, retinst) = pools.nmissed();
    let missed = if bench == "objpool" { objpool } else { retinst };
    md!(
        "{}: {missed} calls found no instance (not counted above)\n",
        cases[0].1
    );
    rows
}
