//! Recent-hit cache: cached vs uncached `AddrIndex` lookups, in one run on
//! the same data; the standalone `HitCache` in front of a kprobe-style
//! chained table (40,000 probes in 4,096 buckets, 20,000 hit); and the
//! "enable 20k of 40k probes" toggle in this crate's terms.
//!
//! `cargo bench --bench hit_cache` (env `FPROBE_THREADS=1,2`, `FPROBE_RUN_MS=300`,
//! `FPROBE_ROUNDS=9`;
//! `FPROBE_TRACE=PATH` adds a real call trace, see `sqlite_trace`)

/// The kprobe table's chained hash table, shared with the harness's
/// `fixed256`.
#[path = "../bench/src/chained.rs"]
#[allow(dead_code)] // this includer stops at an address's first node
mod chained;
#[path = "common/runner.rs"]
mod runner;
/// The call-trace file format, shared with the harness and the profiler.
#[path = "../bench/src/trace.rs"]
#[allow(dead_code)] // this includer reads only
mod trace;
#[path = "common/xorshift.rs"]
mod xorshift;

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fprobe::{AddrIndex, HitCacheConfig, rcu};
use runner::stats;

/// Function-like addresses: 16-byte aligned, spread over a text segment.
fn addresses(n: usize) -> Vec<u64> {
    let mut x = 0x1234_5678_9ABC_DEF1u64;
    let mut a = 0x40_0000u64;
    (0..n)
        .map(|_| {
            a += 16 + (xorshift::next(&mut x) % 64) * 16;
            a
        })
        .collect()
}

/// How a lookup stream picks addresses.
#[derive(Clone, Copy)]
enum Trace {
    /// 90% of lookups on 64 addresses, 10% uniform.
    Hot,
    Uniform,
    /// Zipf-distributed ranks with exponent `s` (function-call frequencies
    /// are roughly so), the ranks spread over the addresses at random.
    Zipf(f64),
}

impl Trace {
    fn name(self) -> String {
        match self {
            Trace::Hot => "hot (90% on 64)".into(),
            Trace::Uniform => "uniform".into(),
            Trace::Zipf(s) => format!("Zipf({s:.1})"),
        }
    }
}

/// A lookup stream of `len` addresses of `addrs` following `trace`.
fn stream(addrs: &[u64], trace: Trace, len: usize, seed: u64) -> Vec<u64> {
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    match trace {
        Trace::Hot | Trace::Uniform => (0..len)
            .map(|_| {
                let r: u64 = rng.random();
                if matches!(trace, Trace::Hot) && r % 10 != 0 {
                    addrs[(r >> 8) as usize % 64 * (addrs.len() / 64)]
                } else {
                    addrs[(r >> 8) as usize % addrs.len()]
                }
            })
            .collect(),
        Trace::Zipf(s) => {
            // The same rank order for every stream of this address set.
            let mut by_rank = addrs.to_vec();
            by_rank.shuffle(&mut rand::rngs::StdRng::seed_from_u64(addrs.len() as u64));
            let zipf = rand_distr::Zipf::new(addrs.len() as f64, s).expect("valid Zipf");
            (0..len)
                .map(|_| by_rank[rng.sample(zipf) as usize - 1])
                .collect()
        }
    }
}

fn build(addrs: &[u64], cache: Option<HitCacheConfig>) -> AddrIndex<u64> {
    let b = AddrIndex::builder().capacity(addrs.len());
    let b = match cache {
        Some(c) => b.hit_cache(c),
        None => b,
    };
    let index = b.build().unwrap();
    // 10% of addresses get 3 handlers, as in the trigger harness.
    index
        .insert_many(addrs.iter().enumerate().flat_map(|(i, &a)| {
            let n = if i % 10 == 0 { 3 } else { 1 };
            (0..n).map(move |k| (a, a ^ k))
        }))
        .unwrap();
    index
}

/// Interleaved rounds per row (each runs every index once):
/// `FPROBE_ROUNDS`, 9 by default.
fn rounds() -> usize {
    std::env::var("FPROBE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(9)
}

/// The median of the rounds' ratios `x[i] / base[i]` (a round's runs are
/// adjacent, so they share the machine's drift).
fn median_ratio(x: &[f64], base: &[f64]) -> f64 {
    stats::median(&x.iter().zip(base).map(|(x, b)| x / b).collect::<Vec<_>>())
}

/// One index of each configuration the table compares, on one address set.
struct Indexes {
    plain: Arc<AddrIndex<u64>>,
    /// A second uncached index built the same way: its ratio to `plain`
    /// is how far two identical indexes differ here (placement, noise).
    plain_again: Arc<AddrIndex<u64>>,
    cached: Arc<AddrIndex<u64>>,
    per_cpu: Arc<AddrIndex<u64>>,
    always: Arc<AddrIndex<u64>>,
    /// A standalone cache in front of `plain` holding each address's
    /// answer (here the sum of its values) inline: a hit reads no line
    /// of the index. Always on, and with the default switch.
    inline: Arc<fprobe::HitCache<u64>>,
    inline_switched: Arc<fprobe::HitCache<u64>>,
}

impl Indexes {
    fn new(addrs: &[u64]) -> Self {
        Indexes {
            plain: Arc::new(build(addrs, None)),
            plain_again: Arc::new(build(addrs, None)),
            cached: Arc::new(build(addrs, Some(HitCacheConfig::default()))),
            per_cpu: Arc::new(build(addrs, Some(HitCacheConfig::default().per_cpu(true)))),
            always: Arc::new(build(
                addrs,
                Some(HitCacheConfig::default().adaptive(false)),
            )),
            inline: Arc::new(
                fprobe::HitCache::new(HitCacheConfig::default().adaptive(false)).unwrap(),
            ),
            inline_switched: Arc::new(fprobe::HitCache::new(HitCacheConfig::default()).unwrap()),
        }
    }

    /// Measures one table row: `streams`, one per thread.
    fn row(&self, label: &str, trace: &str, streams: &[Arc<Vec<u64>>], run: Duration) {
        let before = self.cached.hit_cache_stats().unwrap();
        let (mut u, mut c, mut p, mut a) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut b, mut i, mut iw) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds() {
            // Interleaved, so drift on a shared machine hits all, and in an
            // order rotated every round, so that no configuration always
            // runs first (or right after the same one).
            for k in 0..7 {
                match (k + round) % 7 {
                    0 => u.push(throughput(&self.plain, streams, run)),
                    1 => b.push(throughput(&self.plain_again, streams, run)),
                    2 => c.push(throughput(&self.cached, streams, run)),
                    3 => p.push(throughput(&self.per_cpu, streams, run)),
                    4 => a.push(throughput(&self.always, streams, run)),
                    5 => i.push(inline_throughput(&self.plain, &self.inline, streams, run)),
                    _ => iw.push(inline_throughput(
                        &self.plain,
                        &self.inline_switched,
                        streams,
                        run,
                    )),
                }
            }
        }
        let after = self.cached.hit_cache_stats().unwrap();
        let hits = after.hits - before.hits;
        let through = hits + after.misses - before.misses;
        let ratio = |x: &[f64]| median_ratio(x, &u);
        let (rc, rp, ra, rb) = (ratio(&c), ratio(&p), ratio(&a), ratio(&b));
        let (ri, riw) = (ratio(&i), ratio(&iw));
        let (u, c, p, a) = (
            stats::median(&u),
            stats::median(&c),
            stats::median(&p),
            stats::median(&a),
        );
        println!(
            "| {label} | {trace} | {} | {u:.1} | {c:.1} | {rc:.2}× | {} | {} | {:.1}% | {p:.1} | {rp:.2}× | {a:.1} | {ra:.2}× | {ri:.2}× | {riw:.2}× | {rb:.2}× |",
            streams.len(),
            after.trials - before.trials,
            if after.enabled { "on" } else { "off" },
            100.0 * hits as f64 / through.max(1) as f64,
        );
    }
}

/// A real call trace: `FPROBE_TRACE=PATH`, the sequence of functions of
/// the SQLite profiler's workload (one little-endian `u32` index per call,
/// `cargo run --release -p fprobe-sqlite-profiler -- --record-trace PATH`),
/// replayed over an index holding every function of the trace's object.
/// Each thread replays it from its own offset.
fn sqlite_trace(threads: &[usize], run: Duration) {
    let Some(path) = std::env::var_os("FPROBE_TRACE") else {
        println!(
            "\nSQLite trace: skipped (record one with `cargo run --release -p \
             fprobe-sqlite-profiler -- --record-trace PATH`, then set FPROBE_TRACE=PATH)"
        );
        return;
    };
    let calls = trace::read(path.as_ref()).expect("read FPROBE_TRACE");
    assert!(
        calls.len() > 1000,
        "FPROBE_TRACE holds {} calls",
        calls.len()
    );
    let functions = *calls.iter().max().unwrap() as usize + 1;
    let addrs = addresses(functions);
    let indexes = Indexes::new(&addrs);
    let sequence: Vec<u64> = calls.iter().map(|&i| addrs[i as usize]).collect();
    for &t in threads {
        let streams: Vec<_> = (0..t)
            .map(|i| {
                let at = i * sequence.len() / t;
                Arc::new([&sequence[at..], &sequence[..at]].concat())
            })
            .collect();
        indexes.row(
            &functions.to_string(),
            &format!("SQLite trace ({} calls)", calls.len()),
            &streams,
            run,
        );
    }
}

/// Total M lookups/s of one thread per stream, for `run`: each thread
/// looks its stream up 100 addresses at a time with `batch`, which returns
/// a digest of the answers.
fn batches<F>(streams: &[Arc<Vec<u64>>], run: Duration, batch: F) -> f64
where
    F: Fn(&[u64]) -> u64 + Clone + Send + 'static,
{
    let workers = streams
        .iter()
        .map(|s| {
            let (s, batch) = (s.clone(), batch.clone());
            let mut at = 0;
            move || {
                black_box(batch(&s[at..at + 100]));
                at = (at + 100) % (s.len() - 100);
                100
            }
        })
        .collect();
    runner::throughput(workers, run)
}

/// The sum of `values`, the answer the index rows compute.
fn sum(values: &[u64]) -> u64 {
    values.iter().fold(0u64, |x, v| x.wrapping_add(*v))
}

/// Total M lookups/s of `index` (one read-side section per batch).
fn throughput(index: &Arc<AddrIndex<u64>>, streams: &[Arc<Vec<u64>>], run: Duration) -> f64 {
    let index = index.clone();
    batches(streams, run, move |addrs| {
        let g = rcu::read_lock();
        addrs.iter().fold(0u64, |d, &a| {
            d.wrapping_add(sum(index.get(black_box(a), &g)))
        })
    })
}

/// [`throughput`] through a standalone cache in front of `index` holding
/// each address's answer (the sum of its values) inline.
fn inline_throughput(
    index: &Arc<AddrIndex<u64>>,
    cache: &Arc<fprobe::HitCache<u64>>,
    streams: &[Arc<Vec<u64>>],
    run: Duration,
) -> f64 {
    let (index, cache) = (index.clone(), cache.clone());
    batches(streams, run, move |addrs| {
        let g = rcu::read_lock();
        addrs.iter().fold(0u64, |d, &a| {
            let a = black_box(a);
            d.wrapping_add(cache.lookup(a, || sum(index.get(a, &g))))
        })
    })
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let threads = runner::threads();
    let run = runner::run_length();
    println!(
        "hit cache: median of {} interleaved rounds × {} ms (ratios: median of the rounds' ratios), M lookups/s (total over threads); cache = {} B/thread",
        rounds(),
        run.as_millis(),
        HitCacheConfig::default().bytes_per_thread()
    );
    println!(
        "| addresses | trace | threads | uncached | cached | cached/uncached | trials | switch at the end | hit rate through the cache | per-CPU cached | per-CPU/uncached | always on | always on/uncached | answer inline, always on/uncached | answer inline, switched/uncached | 2nd uncached index/uncached |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for n in [50_000usize, 1_000_000] {
        let addrs = addresses(n);
        let traces = [
            Trace::Zipf(0.8),
            Trace::Zipf(1.0),
            Trace::Zipf(1.2),
            Trace::Hot,
            Trace::Uniform,
        ];
        let indexes = Indexes::new(&addrs);
        for trace in traces {
            for &t in &threads {
                let streams: Vec<_> = (0..t)
                    .map(|i| Arc::new(stream(&addrs, trace, 1 << 22, 77 + i as u64)))
                    .collect();
                indexes.row(&n.to_string(), &trace.name(), &streams, run);
            }
        }
    }
    sqlite_trace(&threads, run);
    chained_table(&threads, run);
    toggle_experiment();
}

/// The kernel's kprobe table (`kprobe_table`): 4,096 hash-list buckets
/// (`KPROBE_HASH_BITS` = 12) of linked nodes, one per probe, each holding
/// its probe number; a lookup stops at the address's node, as
/// `get_kprobe` does. The nodes are allocated in random order, so a chain
/// walk touches lines scattered over the heap.
type KprobeTable = chained::Chained<u32, 12>;

fn kprobe_table(addrs: &[u64]) -> KprobeTable {
    use rand::SeedableRng;
    use rand::seq::SliceRandom;
    let mut order: Vec<usize> = (0..addrs.len()).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(3));
    KprobeTable::new(order.into_iter().map(|i| (addrs[i], i as u32)))
}

/// The kpcache setting: 40,000 probes in a 4,096-bucket chained table
/// (chains of about 10), 20,000 of them hit; the same lookup streams
/// straight to the table and through a standalone [`fprobe::HitCache`]
/// holding the answer (the probe number) in its entries.
fn chained_table(threads: &[usize], run: Duration) {
    println!();
    println!(
        "| chained table, 40,000 in 4,096 buckets, 20,000 hit | threads | table alone | through the cache (switched) | ratio | always on | ratio | switch at the end | hit rate |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let addrs = addresses(40_000);
    let table = Arc::new(kprobe_table(&addrs));
    let hit: Vec<u64> = addrs.iter().step_by(2).copied().collect();
    for trace in [Trace::Zipf(1.0), Trace::Uniform] {
        for &t in threads {
            let streams: Vec<_> = (0..t)
                .map(|i| Arc::new(stream(&hit, trace, 1 << 22, 91 + i as u64)))
                .collect();
            let switched = Arc::new(fprobe::HitCache::<u32>::new(HitCacheConfig::new()).unwrap());
            let always = Arc::new(
                fprobe::HitCache::<u32>::new(HitCacheConfig::new().adaptive(false)).unwrap(),
            );
            let (mut plain, mut sw, mut al) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..rounds() {
                plain.push(chained_throughput(&table, None, &streams, run));
                sw.push(chained_throughput(&table, Some(&switched), &streams, run));
                al.push(chained_throughput(&table, Some(&always), &streams, run));
            }
            let (rw, ra) = (median_ratio(&sw, &plain), median_ratio(&al, &plain));
            let (p, w, a) = (
                stats::median(&plain),
                stats::median(&sw),
                stats::median(&al),
            );
            let st = switched.stats();
            let sa = always.stats();
            println!(
                "| {} | {t} | {p:.1} | {w:.1} | {rw:.2}× | {a:.1} | {ra:.2}× | {} | {:.1}% |",
                trace.name(),
                if st.enabled { "on" } else { "off" },
                100.0 * sa.hits as f64 / (sa.hits + sa.misses).max(1) as f64
            );
        }
    }
}

/// Total M lookups/s of the chained table, through `cache` when given.
fn chained_throughput(
    table: &Arc<KprobeTable>,
    cache: Option<&Arc<fprobe::HitCache<u32>>>,
    streams: &[Arc<Vec<u64>>],
    run: Duration,
) -> f64 {
    let (table, cache) = (table.clone(), cache.cloned());
    batches(streams, run, move |addrs| {
        addrs.iter().fold(0u64, |d, &a| {
            let a = black_box(a);
            // The probe at `a`, `u32::MAX` for none.
            let get = || table.first(a).copied().unwrap_or(u32::MAX);
            let p = match &cache {
                Some(c) => c.lookup(a, get),
                None => get(),
            };
            d.wrapping_add(u64::from(p))
        })
    })
}

/// The kpcache seed measured the time to enable 20k of 40k probes. Here:
/// remove and re-insert the values of 20,000 of 40,000 registered addresses
/// while a reader hammers the hot ones, cached vs uncached.
fn toggle_experiment() {
    println!();
    println!("| toggle 20,000 of 40,000 entries, 1 reader running | uncached | cached |");
    println!("|---|---|---|");
    let addrs = addresses(40_000);
    let mut row = Vec::new();
    let mut reads = Vec::new();
    for cache in [None, Some(HitCacheConfig::default())] {
        let index = Arc::new(build(&addrs, cache));
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let reader = {
            let (index, stop, count, s) = (
                index.clone(),
                stop.clone(),
                count.clone(),
                stream(&addrs, Trace::Hot, 1 << 16, 5),
            );
            std::thread::spawn(move || {
                // Counted per 256 lookups, so a toggle shorter than one
                // pass over the stream still counts what ran meanwhile.
                let mut n = 0;
                'run: loop {
                    for chunk in s.chunks(256) {
                        if stop.load(Ordering::Relaxed) {
                            break 'run;
                        }
                        for &a in chunk {
                            black_box(index.lookup(a, |v| v.len()));
                        }
                        n += chunk.len() as u64;
                    }
                }
                count.store(n, Ordering::Relaxed);
            })
        };
        let t = Instant::now();
        let g = rcu::read_lock();
        let victims: Vec<(u64, fprobe::EntryId, u64)> = addrs
            .iter()
            .step_by(2)
            .map(|&a| {
                let (ids, vals) = index.get_with_ids(a, &g);
                (a, ids[0], vals[0])
            })
            .collect();
        drop(g);
        for &(a, id, _) in &victims {
            index.remove(a, id).unwrap();
        }
        for &(a, _, v) in &victims {
            index.insert(a, v).unwrap();
        }
        let dt = t.elapsed();
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
        row.push(format!("{:.1} ms", dt.as_secs_f64() * 1e3));
        reads.push(count.load(Ordering::Relaxed) as f64 / dt.as_secs_f64() / 1e6);
    }
    println!("| time to toggle | {} | {} |", row[0], row[1]);
    println!(
        "| reader meanwhile, M lookups/s | {:.1} | {:.1} |",
        reads[0], reads[1]
    );
}
