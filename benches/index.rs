//! Single-thread lookup latency of `fprobe::AddrIndex` against hashbrown
//! (the unsynchronised ceiling), papaya, scc and dashmap, as the number of
//! addresses grows: 1k, 50k, 1M synthetic function-like addresses, 10% of
//! them with 3 handlers. One iteration = one lookup of the next address of a
//! pre-shuffled stream, summing its handlers.
//!
//! `cargo bench --bench index`

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use fprobe::{AddrIndex, rcu};
use hashbrown::DefaultHashBuilder;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// `(address, handlers)`: 16-byte aligned starts 16..=1024 bytes apart.
fn layout(n: usize) -> Vec<(u64, Vec<u64>)> {
    let mut rng = StdRng::seed_from_u64(n as u64);
    let mut a = 0x5555_5540_0000u64;
    (0..n)
        .map(|_| {
            a += rng.random_range(1..=64u64) * 16;
            let k = if rng.random_ratio(1, 10) { 3 } else { 1 };
            (a, (0..k).map(|_| rng.random_range(0..1u64 << 32)).collect())
        })
        .collect()
}

/// A stream of random addresses of the set, a power of two long.
fn stream(data: &[(u64, Vec<u64>)]) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(7);
    let len = (data.len() * 2).next_power_of_two().clamp(1 << 12, 1 << 21);
    (0..len)
        .map(|_| data[rng.random_range(0..data.len())].0)
        .collect()
}

/// Runs `lookup` on successive stream addresses, one per iteration.
fn bench_stream(b: &mut criterion::Bencher<'_>, s: &[u64], mut lookup: impl FnMut(u64) -> u64) {
    let mask = s.len() - 1;
    let mut i = 0;
    b.iter(|| {
        i = (i + 1) & mask;
        lookup(black_box(s[i]))
    })
}

fn lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("index_lookup");
    g.measurement_time(Duration::from_secs(1));
    g.warm_up_time(Duration::from_millis(300));
    for n in [1_000usize, 50_000, 1_000_000] {
        let data = layout(n);
        let s = stream(&data);

        let index = AddrIndex::new();
        index
            .insert_many(
                data.iter()
                    .flat_map(|(a, vs)| vs.iter().map(move |v| (*a, *v))),
            )
            .unwrap();
        g.bench_with_input(
            BenchmarkId::new("fprobe::AddrIndex::lookup", n),
            &s,
            |b, s| {
                bench_stream(b, s, |a| {
                    index.lookup(a, |v| v.iter().sum::<u64>()).unwrap_or(0)
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("fprobe::AddrIndex::get(held guard)", n),
            &s,
            |b, s| {
                let guard = rcu::read_lock();
                bench_stream(b, s, |a| index.get(a, &guard).iter().sum::<u64>())
            },
        );
        drop(index);

        let hb: hashbrown::HashMap<u64, Vec<u64>> = data.iter().cloned().collect();
        g.bench_with_input(BenchmarkId::new("hashbrown(ceiling)", n), &s, |b, s| {
            bench_stream(b, s, |a| hb.get(&a).map_or(0, |v| v.iter().sum::<u64>()))
        });
        drop(hb);

        let pa = papaya::HashMap::with_hasher(DefaultHashBuilder::default());
        for (a, v) in &data {
            pa.pin().insert(*a, v.clone());
        }
        g.bench_with_input(BenchmarkId::new("papaya(pin per lookup)", n), &s, |b, s| {
            bench_stream(b, s, |a| {
                pa.pin().get(&a).map_or(0, |v| v.iter().sum::<u64>())
            })
        });
        drop(pa);

        let sc = scc::HashIndex::with_hasher(DefaultHashBuilder::default());
        for (a, v) in &data {
            let _ = sc.insert(*a, v.clone());
        }
        g.bench_with_input(
            BenchmarkId::new("scc::HashIndex::peek_with", n),
            &s,
            |b, s| {
                bench_stream(b, s, |a| {
                    sc.peek_with(&a, |_, v| v.iter().sum::<u64>()).unwrap_or(0)
                })
            },
        );
        drop(sc);

        let dm = dashmap::DashMap::with_hasher(DefaultHashBuilder::default());
        for (a, v) in &data {
            dm.insert(*a, v.clone());
        }
        g.bench_with_input(BenchmarkId::new("dashmap", n), &s, |b, s| {
            bench_stream(b, s, |a| dm.get(&a).map_or(0, |v| v.iter().sum::<u64>()))
        });
    }
    g.finish();
}

criterion_group!(benches, lookup);
criterion_main!(benches);
