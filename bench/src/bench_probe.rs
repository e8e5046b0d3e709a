//! `--bench kprobe-multi`, `kprobe-multi-all`, `kretprobe-multi-all`: the
//! kernel's trigger benchmarks in this crate's terms. One call = the
//! dispatcher's entry hook + exit hook for one address (a leaf function);
//! M calls/s per dispatcher (see `dispatch.rs`), same run, same streams.
//!
//! * `kprobe-multi`: one probe with an entry handler on one address; every
//!   producer calls that address (the kernel's trigger hitting one probed
//!   function).
//! * `kprobe-multi-all`: one probe attached to every address of the set;
//!   by default three runs: producers call one of them (`one`, the
//!   kernel's benchmark: the cost of a big table on a hot hit), then cycle
//!   through the set (`uniform`: each call a lookup that misses the caches,
//!   plus a dispatch) and `hot` (90% on 64 addresses).
//! * `kretprobe-multi-all`: the same probe with an exit handler and 8 bytes
//!   of per-call data, so each call also reserves and releases a return
//!   instance (a shadow-stack entry in the baselines).
//!
//! The two `-all` benchmarks also run `index-lookup`, the bare
//! `fprobe::AddrIndex::get` on the same addresses and streams, and print
//! what fprobe's dispatch costs above it per call.

use crate::report::md;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::addrs::{self, Workload};
use crate::compare::{self, Contender, Labels};
use crate::config::Config;
use crate::dispatch::{self, Dispatch, Hits};
use crate::harness::PaddedCounter;
use crate::impls::BATCH;
use crate::row::Row;
use fprobe::{AddrIndex, rcu};

/// The contender these benchmarks add to the dispatchers (`--impls`).
pub const NAMES: &[(&str, &str)] = &[(
    "index-lookup",
    "not a dispatcher: AddrIndex<u64>::get of one value at every address (insert_shared), \
     one rcu::read_lock per call (kprobe-multi-all, kretprobe-multi-all)",
)];

#[derive(Clone, Copy, PartialEq)]
enum Shape {
    One,
    All,
    AllRet,
}

pub fn run_kprobe_multi(cfg: &Config) -> Vec<Row> {
    run(cfg, Shape::One)
}

pub fn run_kprobe_multi_all(cfg: &Config) -> Vec<Row> {
    run(cfg, Shape::All)
}

pub fn run_kretprobe_multi_all(cfg: &Config) -> Vec<Row> {
    run(cfg, Shape::AllRet)
}

fn run(cfg: &Config, shape: Shape) -> Vec<Row> {
    let (bench, exit) = match shape {
        Shape::One => ("kprobe-multi", false),
        Shape::All => ("kprobe-multi-all", false),
        Shape::AllRet => ("kretprobe-multi-all", true),
    };
    let set = addrs::load(cfg.source, cfg.addrs, cfg.seed);
    let hot = addrs::hot_set(&set.addrs, cfg.seed)[0];
    let attached = if shape == Shape::One {
        vec![hot]
    } else {
        set.addrs.clone()
    };
    let n = attached.len();
    md!("## {bench}\n");
    md!(
        "one probe ({}) attached to {n} address(es) from {}; one call = entry + exit hook; \
         the handlers count every call and the producers check the counts\n",
        if exit {
            "entry + exit handler, 8 bytes of per-call data"
        } else {
            "entry handler"
        },
        set.origin
    );
    let dispatchers = dispatch::build(&attached, exit, &|name| cfg.keep_impl(name));
    // The bare lookup: one value (1) at every attached address, one record
    // for all of them, as the registry keeps its probe (`insert_shared`).
    let index = (shape != Shape::One && cfg.keep_impl(NAMES[0].0)).then(|| {
        let index = AddrIndex::<u64>::builder()
            .capacity(n)
            .build()
            .expect("valid configuration");
        index
            .insert_shared(&attached, 1)
            .expect("no address limit configured");
        index
    });
    let max_threads = *cfg.threads.iter().max().expect("at least one thread count");
    let workloads = match shape {
        Shape::One => vec![Workload::One],
        _ => cfg.workloads_or(&[Workload::One, Workload::Uniform, Workload::Hot]),
    };
    let workloads: Vec<(&str, Vec<Vec<u64>>)> = workloads
        .into_iter()
        .map(|w| {
            let s = addrs::streams(&attached, w, max_threads, BATCH, cfg.seed);
            (w.name(), s)
        })
        .collect();
    let mut rows = Vec::new();
    for (workload, streams) in &workloads {
        let streams = &streams[..];
        let mut contenders: Vec<Contender> = dispatchers
            .iter()
            .map(|(name, d)| Contender {
                name,
                producer: Box::new(move |i, counter: &PaddedCounter, stop: &AtomicBool| {
                    producer(&**d, name, exit, &streams[i], counter, stop)
                }),
            })
            .collect();
        if let Some(index) = &index {
            contenders.push(Contender {
                name: NAMES[0].0,
                producer: Box::new(move |i, counter: &PaddedCounter, stop: &AtomicBool| {
                    lookup_producer(index, &streams[i], counter, stop)
                }),
            });
        }
        let calls = match *workload {
            "one" => "every call to one address".to_string(),
            w => format!("{w} calls"),
        };
        let title = format!("{bench}, {n} address(es) attached, {calls}: M calls/s");
        let labels = Labels {
            bench,
            workload,
            addrs: n,
            title,
            reference: "fprobe",
        };
        let table = compare::run(cfg, &labels, &contenders);
        print_above_lookup(&table);
        rows.extend(table);
    }
    rows
}

/// After a table: fprobe's ns per call minus the bare lookup's, from their
/// medians at 1 thread (nothing if either or 1 thread was not run).
fn print_above_lookup(table: &[Row]) {
    let ns = |imp: &str| {
        table
            .iter()
            .find(|r| r.imp == imp && r.threads == 1)
            .map(|r| 1000.0 / r.median)
    };
    if let (Some(f), Some(l)) = (ns("fprobe"), ns(NAMES[0].0)) {
        md!(
            "fprobe dispatch above the bare lookup: {:.1} ns per call (fprobe {f:.1} ns, lookup {l:.1} ns)\n",
            f - l
        );
    }
}

/// As [`producer`] for the bare lookup: the stream's addresses looked up
/// in batches until `stop`, then a check that every lookup found its value.
fn lookup_producer(
    index: &AddrIndex<u64>,
    stream: &[u64],
    counter: &PaddedCounter,
    stop: &AtomicBool,
) {
    let (mut pos, mut calls, mut sum) = (0, 0u64, 0u64);
    // Relaxed: see run_producers; polled once per batch.
    while !stop.load(Ordering::Relaxed) {
        sum += lookups(index, black_box(&stream[pos..pos + BATCH]));
        counter.add(BATCH as u64);
        calls += BATCH as u64;
        pos += BATCH;
        if pos == stream.len() {
            pos = 0;
        }
    }
    assert_eq!(sum, calls, "index-lookup: values found");
}

/// One lookup per address, each in its own read-side section as each
/// dispatch's entry is; the sum of the values found.
#[inline(never)]
fn lookups(index: &AddrIndex<u64>, addrs: &[u64]) -> u64 {
    let mut sum = 0;
    for &a in addrs {
        let guard = rcu::read_lock();
        sum += black_box(index.get(a, &guard).iter().sum::<u64>());
    }
    sum
}

/// Calls the stream's addresses in batches until `stop`, then checks that
/// the entry handlers saw every call, and warns unless the exit handlers
/// (if any) saw every return with its data intact.
fn producer(
    d: &dyn Dispatch,
    name: &str,
    exit: bool,
    stream: &[u64],
    counter: &PaddedCounter,
    stop: &AtomicBool,
) {
    let hits = Hits::default();
    let (mut pos, mut calls) = (0, 0u64);
    // Relaxed: see run_producers; polled once per batch.
    while !stop.load(Ordering::Relaxed) {
        d.calls(black_box(&stream[pos..pos + BATCH]), &hits);
        counter.add(BATCH as u64);
        calls += BATCH as u64;
        pos += BATCH;
        if pos == stream.len() {
            pos = 0;
        }
    }
    assert_eq!(hits.entries.get(), calls, "{name}: entry handler runs");
    let exits = hits.exits.get();
    if exit && exits != calls {
        // Possible only where a return instance could not be reserved
        // (fprobe counts those as missed); worth seeing, not fatal.
        eprintln!("  warning: {name}: {exits} intact exit handler runs for {calls} calls");
    }
}
