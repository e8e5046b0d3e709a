//! `--bench churn-peers`: the two flat-out writers of `--bench churn`
//! (`disjoint`, `hot-set`) against every concurrent map the lookup benchmark
//! compares, each map's readers measured with its writer idle and churning,
//! phases interleaved as in `--bench churn`. One reader thread and one
//! writer thread, pinned to different CPUs where there are two.
//!
//! Every map holds `address → handlers` and every writer does the same
//! logical operations: `disjoint` adds a value to a fresh address above the
//! read set and removes the oldest once 4,096 are in; `hot-set` adds a value
//! to a hot address and removes it again, round-robin over the 64 hot
//! addresses. Each map does them its own idiomatic way:
//! * fprobe: `insert` / `remove(addr, id)` (copy-on-write record, retired
//!   after a grace period);
//! * papaya, scc `HashIndex`: copy-on-write of the address's `Vec` through
//!   `update_or_insert_with` / `compute` and `get` + `update` /
//!   `remove_entry` (their readers never wait for a writer either);
//! * dashmap, `parking_lot::RwLock<hashbrown>`: the `Vec` is changed in
//!   place under the shard's or the map's write lock, which readers wait
//!   for;
//! * arc-swap: the writer clones the whole map per operation and swaps it
//!   in (readers never wait; the writer is slow, so its rate is far lower).

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use fprobe::AddrIndex;
use hashbrown::DefaultHashBuilder;

use crate::Config;
use crate::addrs::{self, Workload};
use crate::harness::{self, Samples};
use crate::impls::{self, BATCH};
use crate::report::{self, Row};

type Vals = Vec<u64>;

/// A map whose readers the benchmark measures and whose writer churns it.
trait Churned: Sync {
    /// Looks up every address of `addrs`, returns the sum of their values.
    fn read(&self, addrs: &[u64]) -> u64;
    /// Adds value `v` to `a` (creating the address); returns what
    /// [`Churned::remove`] needs to remove exactly this value.
    fn insert(&self, a: u64, v: u64) -> u64;
    /// Removes the value `insert` returned `token` for; the address goes
    /// when its last value does.
    fn remove(&self, a: u64, token: u64);
}

/// `vals` without one occurrence of `v` (the last).
fn without(vals: &[u64], v: u64) -> Vals {
    let mut out = vals.to_vec();
    let i = out.iter().rposition(|&x| x == v).expect("value present");
    out.remove(i);
    out
}

struct Fprobe(AddrIndex<u64>);

impl Churned for Fprobe {
    fn read(&self, addrs: &[u64]) -> u64 {
        let guard = fprobe::rcu::read_lock();
        addrs
            .iter()
            .map(|&a| self.0.get(a, &guard).iter().sum::<u64>())
            .sum()
    }
    fn insert(&self, a: u64, v: u64) -> u64 {
        self.0.insert(a, v).expect("no limit").as_u64()
    }
    fn remove(&self, a: u64, token: u64) {
        self.0
            .remove(a, fprobe::EntryId::from_u64(token))
            .expect("inserted above");
    }
}

struct Papaya(papaya::HashMap<u64, Vals, DefaultHashBuilder>);

impl Churned for Papaya {
    fn read(&self, addrs: &[u64]) -> u64 {
        let m = self.0.pin();
        addrs
            .iter()
            .map(|a| m.get(a).map_or(0, |v| v.iter().sum::<u64>()))
            .sum()
    }
    fn insert(&self, a: u64, v: u64) -> u64 {
        self.0.pin().update_or_insert_with(
            a,
            |old| {
                let mut n = old.clone();
                n.push(v);
                n
            },
            || vec![v],
        );
        v
    }
    fn remove(&self, a: u64, v: u64) {
        use papaya::Operation;
        self.0.pin().compute(a, |e| match e {
            Some((_, old)) if old.len() == 1 => Operation::Remove,
            Some((_, old)) => Operation::Insert(without(old, v)),
            None => Operation::Abort(()),
        });
    }
}

struct Scc(scc::HashIndex<u64, Vals, DefaultHashBuilder>);

impl Churned for Scc {
    fn read(&self, addrs: &[u64]) -> u64 {
        addrs
            .iter()
            .map(|a| {
                self.0
                    .peek_with(a, |_, v| v.iter().sum::<u64>())
                    .unwrap_or(0)
            })
            .sum()
    }
    fn insert(&self, a: u64, v: u64) -> u64 {
        match self.0.get(&a) {
            Some(e) => {
                let mut n = e.get().clone();
                n.push(v);
                e.update(n);
            }
            None => self.0.insert(a, vec![v]).expect("single writer"),
        }
        v
    }
    fn remove(&self, a: u64, v: u64) {
        let e = self.0.get(&a).expect("inserted above");
        if e.get().len() == 1 {
            e.remove_entry();
        } else {
            let n = without(e.get(), v);
            e.update(n);
        }
    }
}

struct Dash(dashmap::DashMap<u64, Vals, DefaultHashBuilder>);

impl Churned for Dash {
    fn read(&self, addrs: &[u64]) -> u64 {
        addrs
            .iter()
            .map(|a| self.0.get(a).map_or(0, |v| v.iter().sum::<u64>()))
            .sum()
    }
    fn insert(&self, a: u64, v: u64) -> u64 {
        self.0.entry(a).or_default().push(v);
        v
    }
    fn remove(&self, a: u64, v: u64) {
        self.0.remove_if_mut(&a, |_, vals| {
            let i = vals.iter().rposition(|&x| x == v).expect("value present");
            vals.remove(i);
            vals.is_empty()
        });
    }
}

struct RwLocked(parking_lot::RwLock<hashbrown::HashMap<u64, Vals>>);

impl Churned for RwLocked {
    fn read(&self, addrs: &[u64]) -> u64 {
        addrs
            .iter()
            .map(|a| self.0.read().get(a).map_or(0, |v| v.iter().sum::<u64>()))
            .sum()
    }
    fn insert(&self, a: u64, v: u64) -> u64 {
        self.0.write().entry(a).or_default().push(v);
        v
    }
    fn remove(&self, a: u64, v: u64) {
        let mut m = self.0.write();
        let vals = m.get_mut(&a).expect("inserted above");
        let i = vals.iter().rposition(|&x| x == v).expect("value present");
        vals.remove(i);
        if vals.is_empty() {
            m.remove(&a);
        }
    }
}

struct Swap(arc_swap::ArcSwap<hashbrown::HashMap<u64, Vals>>);

impl Churned for Swap {
    fn read(&self, addrs: &[u64]) -> u64 {
        addrs
            .iter()
            .map(|a| self.0.load().get(a).map_or(0, |v| v.iter().sum::<u64>()))
            .sum()
    }
    fn insert(&self, a: u64, v: u64) -> u64 {
        self.0.rcu(|m| {
            let mut n = hashbrown::HashMap::clone(m);
            n.entry(a).or_default().push(v);
            n
        });
        v
    }
    fn remove(&self, a: u64, v: u64) {
        self.0.rcu(|m| {
            let mut n = hashbrown::HashMap::clone(m);
            let vals = without(&n[&a], v);
            if vals.is_empty() {
                n.remove(&a);
            } else {
                n.insert(a, vals);
            }
            n
        });
    }
}

/// Names of the maps, in report order (`--impls` selects among them).
pub const NAMES: &[&str] = &[
    "fprobe",
    "papaya",
    "scc",
    "dashmap",
    "rwlock-hashbrown",
    "arc-swap",
];

/// The maps, in report order, each built from `data`.
fn build(data: &[(u64, Vals)]) -> Vec<(&'static str, Box<dyn Churned>)> {
    let hb = || -> hashbrown::HashMap<u64, Vals> { data.iter().cloned().collect() };
    let papaya = papaya::HashMap::with_hasher(DefaultHashBuilder::default());
    {
        let m = papaya.pin();
        for (a, v) in data {
            m.insert(*a, v.clone());
        }
    }
    let scc = scc::HashIndex::with_hasher(DefaultHashBuilder::default());
    for (a, v) in data {
        scc.insert(*a, v.clone()).expect("distinct addresses");
    }
    let dash = dashmap::DashMap::with_hasher(DefaultHashBuilder::default());
    for (a, v) in data {
        dash.insert(*a, v.clone());
    }
    vec![
        ("fprobe", Box::new(Fprobe(impls::fprobe_index(data)))),
        ("papaya", Box::new(Papaya(papaya))),
        ("scc", Box::new(Scc(scc))),
        ("dashmap", Box::new(Dash(dash))),
        (
            "rwlock-hashbrown",
            Box::new(RwLocked(parking_lot::RwLock::new(hb()))),
        ),
        (
            "arc-swap",
            Box::new(Swap(arc_swap::ArcSwap::new(Arc::new(hb())))),
        ),
    ]
}

#[derive(Clone, Copy, PartialEq)]
enum Writer {
    Idle,
    Disjoint,
    HotSet,
}

pub fn run(cfg: &Config) -> Vec<Row> {
    let set = addrs::load(cfg.source, cfg.addrs, cfg.seed);
    let n = set.addrs.len();
    println!("## churn-peers\n");
    println!(
        "addresses: {n} from {}; 1 reader + 1 writer thread, pinned to different CPUs where \
         there are two; writers flat out; every map's idle and churning phases interleaved\n",
        set.origin
    );
    let data = addrs::handlers(&set.addrs, cfg.seed);
    let hot = addrs::hot_set(&set.addrs, cfg.seed);
    let top = *set.addrs.last().expect("non-empty set");
    let maps: Vec<_> = build(&data)
        .into_iter()
        .filter(|(name, _)| cfg.keep_impl(name))
        .collect();
    let mut rows = Vec::new();
    let mut body = Vec::new();
    for (variant, workload, writer) in [
        ("disjoint", Workload::Uniform, Writer::Disjoint),
        ("hot-set", Workload::Hot, Writer::HotSet),
    ] {
        let stream = &addrs::streams(&set.addrs, workload, 1, BATCH, cfg.seed)[0];
        let mut cells: Vec<(Samples, Samples, Vec<f64>)> = maps
            .iter()
            .map(|_| (Samples::default(), Samples::default(), Vec::new()))
            .collect();
        // Rounds outermost: every map's phases are spread over the same
        // stretch of the run, so a noisy minute hits them all.
        for round in 0..=cfg.rounds {
            for ((name, map), cell) in maps.iter().zip(&mut cells) {
                let (s, _) = phase(cfg, map.as_ref(), stream, Writer::Idle, &hot, top);
                eprintln!(
                    "  churn-peers {variant:<8} {name:<16} round {}  writer idle      reader {:>8.2} M/s",
                    round + 1,
                    s.median() / 1e6
                );
                cell.0.extend(s);
                if round == cfg.rounds {
                    continue; // idle phases bracket every churn phase
                }
                let (s, ops) = phase(cfg, map.as_ref(), stream, writer, &hot, top);
                eprintln!(
                    "  churn-peers {variant:<8} {name:<16} round {}  writer churning  reader {:>8.2} M/s, writer {:.3} M ops/s",
                    round + 1,
                    s.median() / 1e6,
                    ops / 1e6
                );
                cell.1.extend(s);
                cell.2.push(ops);
            }
        }
        for ((name, _), (idle, churn, ops)) in maps.iter().zip(&cells) {
            let ratio = churn.median() / idle.median();
            body.push(vec![
                variant.to_string(),
                name.to_string(),
                format!("{:.2} ± {:.2}", idle.mean() / 1e6, idle.stddev() / 1e6),
                format!("{:.2} ± {:.2}", churn.mean() / 1e6, churn.stddev() / 1e6),
                format!("{:.4}", harness::median(ops) / 1e6),
                format!("{ratio:.3}×"),
            ]);
            for (imp, s) in [("writer idle", idle), ("writer churning", churn)] {
                rows.push(Row {
                    bench: "churn-peers",
                    workload: variant.into(),
                    addrs: n,
                    imp: format!("{name}, {imp}"),
                    threads: 1,
                    unit: "M/s",
                    mean: s.mean() / 1e6,
                    stddev: s.stddev() / 1e6,
                    median: s.median() / 1e6,
                    samples: s.rates.len(),
                });
            }
        }
    }
    report::print_table(
        &format!("churn-peers: reader M/s with a flat-out writer idle vs churning ({n} addresses)"),
        &[
            "writer",
            "map",
            "reader M/s, writer idle",
            "reader M/s, writer churning",
            "writer M ops/s",
            "churn ÷ idle (medians)",
        ],
        &body,
    );
    rows
}

/// One phase of `map`'s reader while `writer` runs on its own thread;
/// returns the reader samples and the writer's operations per second.
fn phase(
    cfg: &Config,
    map: &dyn Churned,
    stream: &[u64],
    writer: Writer,
    hot: &[u64],
    top: u64,
) -> (Samples, f64) {
    let stop_writer = AtomicBool::new(false);
    let ops = AtomicU64::new(0);
    let t0 = Instant::now();
    let samples = std::thread::scope(|s| {
        if writer != Writer::Idle {
            let (stop_writer, ops) = (&stop_writer, &ops);
            let cpu = cfg.cpus.get(1 % cfg.cpus.len().max(1)).copied();
            s.spawn(move || {
                if let Some(cpu) = cpu {
                    harness::pin_to(cpu);
                }
                let n = match writer {
                    Writer::Disjoint => churn_disjoint(map, top, stop_writer),
                    Writer::HotSet => churn_hot(map, hot, stop_writer),
                    Writer::Idle => unreachable!("no writer thread when idle"),
                };
                // Relaxed: read after the scope joins this thread.
                ops.store(n, Ordering::Relaxed);
            });
        }
        let samples = harness::run_producers(1, 0, &cfg.cpus, cfg.timing, |_, counter, stop| {
            let mut pos = 0;
            let mut acc = 0u64;
            // Relaxed: polled once per batch.
            while !stop.load(Ordering::Relaxed) {
                acc = acc.wrapping_add(map.read(black_box(&stream[pos..pos + BATCH])));
                counter.add(BATCH as u64);
                pos = (pos + BATCH) % stream.len();
            }
            black_box(acc);
        });
        // Relaxed: the writer polls it; the scope joins it.
        stop_writer.store(true, Ordering::Relaxed);
        samples
    });
    (
        samples,
        ops.into_inner() as f64 / t0.elapsed().as_secs_f64(),
    )
}

/// `--bench churn`'s `disjoint` writer, flat out, on any map.
fn churn_disjoint(map: &dyn Churned, top: u64, stop: &AtomicBool) -> u64 {
    const WINDOW: usize = 4096;
    let mut live: VecDeque<(u64, u64)> = VecDeque::with_capacity(WINDOW + 1);
    let (mut next, mut ops) = ((top & !15) + 0x1000, 0u64);
    // Relaxed: a stop request, polled.
    while !stop.load(Ordering::Relaxed) {
        live.push_back((next, map.insert(next, next)));
        next += 16;
        ops += 1;
        if live.len() > WINDOW {
            let (a, token) = live.pop_front().expect("non-empty");
            map.remove(a, token);
            ops += 1;
        }
    }
    for (a, token) in live {
        map.remove(a, token);
    }
    ops
}

/// `--bench churn`'s `hot-set` writer, flat out, on any map.
fn churn_hot(map: &dyn Churned, hot: &[u64], stop: &AtomicBool) -> u64 {
    let (mut ops, mut k) = (0u64, 0);
    // Relaxed: a stop request, polled.
    while !stop.load(Ordering::Relaxed) {
        let a = hot[k];
        let token = map.insert(a, 7);
        map.remove(a, token);
        ops += 2;
        k = (k + 1) % hot.len();
    }
    ops
}
