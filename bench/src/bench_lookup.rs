//! `--bench lookup`: M lookups/s per implementation, workload and producer
//! count; every implementation in the same run on the same data and the
//! same per-producer address streams.

use crate::report::md;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::addrs::{self, Workload};
use crate::compare::{self, Contender, Labels};
use crate::config::Config;
use crate::harness::PaddedCounter;
use crate::impls::{self, BATCH, Impl};
use crate::report;
use crate::row::Row;

pub fn run(cfg: &Config) -> Vec<Row> {
    let set = addrs::load(cfg.source, cfg.addrs, cfg.seed);
    let n = set.addrs.len();
    md!("## lookup\n");
    md!(
        "addresses: {n} from {}; 10% of them with 3 handlers, the rest 1\n",
        set.origin
    );
    let data = addrs::handlers(&set.addrs, cfg.seed);
    cfg.progress.line(format_args!(
        "building {} implementations over {n} addresses…",
        impls::NAMES.len()
    ));
    let imps = impls::build(&data, &|name| cfg.keep_impl(name));
    let max_threads = *cfg.threads.iter().max().expect("at least one thread count");
    let mut rows = Vec::new();
    for w in cfg.workloads_or(&[Workload::Uniform, Workload::Hot]) {
        let streams = addrs::streams(&set.addrs, w, max_threads, BATCH, cfg.seed);
        check_same_answers(&imps, &streams[0]);
        let streams = &streams;
        let contenders: Vec<Contender> = imps
            .iter()
            .map(|imp| Contender {
                name: imp.name,
                producer: Box::new(move |i, counter: &PaddedCounter, stop: &AtomicBool| {
                    let stream = &streams[i];
                    let mut pos = 0;
                    let mut acc = 0u64;
                    // Relaxed: see run_producers; polled once per batch.
                    while !stop.load(Ordering::Relaxed) {
                        let batch = black_box(&stream[pos..pos + BATCH]);
                        acc = acc.wrapping_add(imp.map.batch(batch));
                        counter.add(BATCH as u64);
                        pos += BATCH;
                        if pos == stream.len() {
                            pos = 0;
                        }
                    }
                    black_box(acc);
                }),
            })
            .collect();
        let labels = Labels {
            bench: "lookup",
            workload: w.name(),
            addrs: n,
            title: format!("lookup, {} workload, {n} addresses", w.name()),
            reference: "fprobe",
        };
        rows.extend(compare::run(cfg, &labels, &contenders));
    }
    print_ratios(&rows, &cfg.threads);
    rows
}

/// Every implementation must find the same handlers for the same stream
/// (its first 10,000 lookups: the fixed tables are slow at 1M addresses).
fn check_same_answers(imps: &[Impl], stream: &[u64]) {
    let stream = &stream[..stream.len().min(100 * BATCH)];
    let sums: Vec<(&str, u64)> = imps
        .iter()
        .map(|i| {
            (
                i.name,
                stream
                    .chunks(BATCH)
                    .map(|b| i.map.batch(b))
                    .fold(0u64, u64::wrapping_add),
            )
        })
        .collect();
    if let Some((first, s0)) = sums.first() {
        for (name, s) in &sums {
            assert_eq!(
                s, s0,
                "{name} and {first} disagree on the handler sum of the same stream"
            );
        }
    }
}

/// One table over every workload: fprobe's median ÷ each other
/// implementation's median at the same producer count, same run, same
/// address streams (the per-workload tables give the same ratio one
/// implementation per line; this one puts them side by side).
fn print_ratios(rows: &[Row], threads: &[usize]) {
    let med = |w: &str, imp: &str, t: usize| {
        rows.iter()
            .find(|r| r.workload == w && r.imp == imp && r.threads == t)
            .map(|r| r.median)
    };
    let mut others: Vec<&str> = Vec::new();
    let mut workloads: Vec<&str> = Vec::new();
    for r in rows {
        if r.imp != "fprobe" && !others.contains(&r.imp.as_str()) {
            others.push(&r.imp);
        }
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    let mut body = Vec::new();
    for w in workloads {
        for &t in threads {
            let Some(f) = med(w, "fprobe", t) else {
                continue;
            };
            let mut row = vec![w.to_string(), t.to_string()];
            for other in &others {
                row.push(med(w, other, t).map_or("–".into(), |o| format!("{:.2}×", f / o)));
            }
            body.push(row);
        }
    }
    if !body.is_empty() && !others.is_empty() {
        let headers: Vec<String> = ["workload".to_string(), "threads".to_string()]
            .into_iter()
            .chain(others.iter().map(|o| format!("÷ {o}")))
            .collect();
        let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
        report::print_table(
            "lookup: fprobe median ÷ other median, same run",
            &headers,
            &body,
        );
    }
}
