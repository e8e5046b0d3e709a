//! `--bench lookup`: M lookups/s per implementation, workload and producer
//! count; every implementation in the same run on the same data and the
//! same per-producer address streams.

use std::hint::black_box;
use std::sync::atomic::Ordering;

use crate::Config;
use crate::addrs;
use crate::harness::{self, Samples};
use crate::impls::{self, BATCH, Impl};
use crate::report::{self, Row};

pub fn run(cfg: &Config) -> Vec<Row> {
    let set = addrs::load(cfg.source, cfg.addrs, cfg.seed);
    let n = set.addrs.len();
    println!("## lookup\n");
    println!(
        "addresses: {n} from {}; 10% of them with 3 handlers, the rest 1\n",
        set.origin
    );
    let data = addrs::handlers(&set.addrs, cfg.seed);
    eprintln!(
        "building {} implementations over {n} addresses…",
        impls::NAMES.len()
    );
    let imps = impls::build(&data, &|name| cfg.keep_impl(name));
    let max_threads = *cfg.threads.iter().max().expect("at least one thread count");
    let mut rows = Vec::new();
    for &w in &cfg.workloads {
        let streams = addrs::streams(&set.addrs, w, max_threads, BATCH, cfg.seed);
        check_same_answers(&imps, &streams[0]);
        let mut cells: Vec<(usize, usize, Samples)> = Vec::new(); // (impl, threads, samples)
        for &t in &cfg.threads {
            let mut per_impl: Vec<Samples> = vec![Samples::default(); imps.len()];
            for round in 0..cfg.rounds {
                for (k, imp) in imps.iter().enumerate() {
                    let s =
                        harness::run_producers(t, 0, &cfg.cpus, cfg.timing, |i, counter, stop| {
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
                        });
                    eprintln!(
                        "  lookup {:<7} {t:>2}T round {}/{}  {:<24} {:>8.2} M/s{}",
                        w.name(),
                        round + 1,
                        cfg.rounds,
                        imp.name,
                        s.median() / 1e6,
                        if s.unpinned > 0 {
                            format!("  ({} producer(s) unpinned)", s.unpinned)
                        } else {
                            String::new()
                        }
                    );
                    per_impl[k].extend(s);
                }
            }
            for (k, s) in per_impl.into_iter().enumerate() {
                cells.push((k, t, s));
            }
        }
        let mut body = Vec::new();
        for (k, imp) in imps.iter().enumerate() {
            for (_, t, s) in cells.iter().filter(|c| c.0 == k) {
                let fprobe = cells
                    .iter()
                    .find(|c| imps[c.0].name == "fprobe" && c.1 == *t)
                    .map(|c| c.2.median());
                let row = Row {
                    bench: "lookup",
                    workload: w.name().into(),
                    addrs: n,
                    imp: imp.name.into(),
                    threads: *t,
                    unit: "M/s",
                    mean: s.mean() / 1e6,
                    stddev: s.stddev() / 1e6,
                    median: s.median() / 1e6,
                    samples: s.rates.len(),
                };
                body.push(vec![
                    imp.name.to_string(),
                    t.to_string(),
                    format!("{:.2} ± {:.2}", row.mean, row.stddev),
                    format!("{:.2}", row.median),
                    format!("{:.2}", row.per_thread()),
                    fprobe.map_or("–".into(), |f| format!("{:.2}×", f / s.median())),
                ]);
                rows.push(row);
            }
        }
        report::print_table(
            &format!("lookup, {} workload, {n} addresses", w.name()),
            &[
                "implementation",
                "threads",
                "M/s mean ± sd",
                "M/s median",
                "M/s per producer",
                "fprobe ÷ this (medians)",
            ],
            &body,
        );
    }
    print_targets(&rows, &cfg.threads);
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

/// The ratios issue 7 sets targets for, at 1 and 2 producers (or whatever
/// counts were run).
fn print_targets(rows: &[Row], threads: &[usize]) {
    let med = |w: &str, imp: &str, t: usize| {
        rows.iter()
            .find(|r| r.workload == w && r.imp == imp && r.threads == t)
            .map(|r| r.median)
    };
    let targets = [
        ("hashbrown-ceiling", 0.8),
        ("scc", 2.0),
        ("papaya", 2.0),
        ("fixed256", 8.0),
        ("fixed256-array", 8.0),
    ];
    let mut workloads: Vec<&str> = rows.iter().map(|r| r.workload.as_str()).collect();
    workloads.dedup();
    let mut body = Vec::new();
    for w in workloads {
        for &t in threads {
            let Some(f) = med(w, "fprobe", t) else {
                continue;
            };
            let mut row = vec![w.to_string(), t.to_string()];
            for (other, goal) in targets {
                row.push(match med(w, other, t) {
                    Some(o) => {
                        let r = f / o;
                        format!("{r:.2}× {}", if r >= goal { "met" } else { "**missed**" })
                    }
                    None => "–".into(),
                });
            }
            body.push(row);
        }
    }
    if !body.is_empty() {
        report::print_table(
            "lookup targets (fprobe median ÷ other median, same run)",
            &[
                "workload",
                "threads",
                "vs ceiling (≥ 0.8×)",
                "vs scc (≥ 2×)",
                "vs papaya (≥ 2×)",
                "vs fixed256 (≥ 8×)",
                "vs fixed256-array (≥ 8×)",
            ],
            &body,
        );
    }
}
