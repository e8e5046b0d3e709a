//! `--bench registration`: nanoseconds per address to register N addresses
//! (one value each) into a fresh map, one by one and in bulk; median of 9,
//! the implementations interleaved within each repetition (each repetition
//! starting one variant further on), after 2 warm-up repetitions that are
//! not counted. Every variant's clock starts before
//! its map is constructed: `AddrIndex::with_capacity` makes its table
//! resident up front (one page fault per page instead of two under the
//! inserts), and that cost belongs to the registration.
//!
//! The warm-up is there for fairness between the variants, not to flatter
//! any of them: the first repetitions of a process grow its heap (page
//! faults on fresh memory), and without it that cost would fall on
//! whichever variant runs first (fprobe's, the first in the list), making
//! its first repetitions markedly slower than every later one.

use crate::report::md;
use std::hint::black_box;
use std::time::{Duration, Instant};

use fprobe::AddrIndex;
use hashbrown::DefaultHashBuilder;

use crate::addrs;
use crate::config::Config;
use crate::report;
use crate::row::Row;
use crate::stats;

const REPS: usize = 9;
/// Repetitions of every variant run before the counted ones, not counted.
const WARMUP: usize = 2;

type Variant = (&'static str, fn(&[u64]) -> Duration);

const VARIANTS: &[Variant] = &[
    ("fprobe insert, one by one (from empty)", |a| {
        let t = Instant::now();
        let m = AddrIndex::new();
        for &x in a {
            m.insert(x, x).expect("no limit");
        }
        finish(t, m)
    }),
    ("fprobe insert, one by one (from empty, small pages)", |a| {
        let t = Instant::now();
        let m = AddrIndex::builder()
            .huge_pages(false)
            .build()
            .expect("valid");
        for &x in a {
            m.insert(x, x).expect("no limit");
        }
        finish(t, m)
    }),
    ("fprobe insert, one by one (presized)", |a| {
        let t = Instant::now();
        let m = AddrIndex::with_capacity(a.len());
        for &x in a {
            m.insert(x, x).expect("no limit");
        }
        finish(t, m)
    }),
    ("fprobe insert_many, bulk (from empty)", |a| {
        let t = Instant::now();
        let m = AddrIndex::new();
        m.insert_many(a.iter().map(|&x| (x, x))).expect("no limit");
        finish(t, m)
    }),
    ("hashbrown insert (unsynchronised)", |a| {
        let t = Instant::now();
        let mut m = hashbrown::HashMap::new();
        for &x in a {
            m.insert(x, vec![x]);
        }
        finish(t, m)
    }),
    ("dashmap insert", |a| {
        let t = Instant::now();
        let m = dashmap::DashMap::with_hasher(DefaultHashBuilder::default());
        for &x in a {
            m.insert(x, vec![x]);
        }
        finish(t, m)
    }),
    ("papaya insert (one pin for all)", |a| {
        let t = Instant::now();
        let m = papaya::HashMap::with_hasher(DefaultHashBuilder::default());
        {
            let p = m.pin();
            for &x in a {
                p.insert(x, vec![x]);
            }
        }
        finish(t, m)
    }),
    ("scc HashIndex insert", |a| {
        let t = Instant::now();
        let m = scc::HashIndex::with_hasher(DefaultHashBuilder::default());
        for &x in a {
            let _ = m.insert(x, vec![x]);
        }
        finish(t, m)
    }),
];

/// Elapsed time; the map is dropped after the clock stops, and so is the
/// clean-up it leaves behind, so that no variant pays for the one before
/// it: fprobe's tables retired by resizes are freed (`rcu::barrier`), and a
/// 64 KiB allocation makes glibc consolidate the freed small chunks now
/// (it does that on the next large request, which would otherwise fall in
/// the next variant's timed region).
fn finish<M>(t: Instant, m: M) -> Duration {
    let d = t.elapsed();
    black_box(&m);
    drop(m);
    fprobe::rcu::barrier();
    black_box(vec![0u8; 1 << 16]);
    d
}

pub fn run(cfg: &Config) -> Vec<Row> {
    let set = addrs::load(cfg.source, cfg.addrs, cfg.seed);
    let a = &set.addrs;
    let n = a.len();
    md!("## registration\n");
    md!(
        "addresses: {n} from {}, one value each, in address order; median of {REPS} (interleaved), after {WARMUP} uncounted repetitions\n",
        set.origin
    );
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); VARIANTS.len()];
    for _ in 0..WARMUP {
        for (_, f) in VARIANTS {
            black_box(f(a));
        }
    }
    for rep in 0..REPS {
        // Each repetition starts one variant further on, so that every
        // variant runs in every position (the first after the previous
        // repetition's last map was dropped, …) about equally often.
        for j in 0..VARIANTS.len() {
            let k = (j + rep) % VARIANTS.len();
            let (name, f) = &VARIANTS[k];
            let d = f(a);
            let per = d.as_nanos() as f64 / n as f64;
            cfg.progress.line(format_args!(
                "  registration rep {}/{REPS}  {name:<40} {per:>8.1} ns/addr",
                rep + 1
            ));
            ns[k].push(per);
        }
    }
    let mut rows = Vec::new();
    let mut body = Vec::new();
    for ((name, _), v) in VARIANTS.iter().zip(&ns) {
        let (m, mean, sd) = (stats::median(v), stats::mean(v), stats::stddev(v));
        let total_ms = m * n as f64 / 1e6;
        body.push(vec![
            name.to_string(),
            format!("{m:.1}"),
            format!("{mean:.1} ± {sd:.1}"),
            format!("{total_ms:.2}"),
        ]);
        rows.push(Row {
            bench: "registration",
            workload: "register".into(),
            addrs: n,
            imp: name.to_string(),
            threads: 1,
            unit: "ns/addr",
            mean,
            stddev: sd,
            median: m,
            samples: v.len(),
            rounds: Vec::new(),
        });
    }
    report::print_table(
        &format!("registration of {n} addresses (one thread)"),
        &[
            "implementation",
            "ns/addr median",
            "ns/addr mean ± sd",
            "ms total (median)",
        ],
        &body,
    );
    rows
}
