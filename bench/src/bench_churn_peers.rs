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
//!
//! The ratio depends on how fast each map's writer runs, so the table also
//! gives the reader time lost per write, `(1 − churn ÷ idle) / writes per
//! second`, and splits the phases by the round trip between the two CPUs,
//! as `--bench churn` does (near / far). Where the ratio is close to 0 (the
//! locked maps) the figure only restates the writer's rate.
//!
//! `--bench churn-peers-alt` measures the same writers in paired 20 ms
//! windows inside each phase, as `--bench churn-alt` does. A writer is
//! held between operations, so arc-swap's (one clone of the whole map per
//! operation, milliseconds each) runs past the end of its windows: its
//! figures there understate its readers' loss.

use crate::addrs::{self, Workload};
use crate::churn::{
    ALTERNATION_HEADERS, Alternation, Churned, Fprobe, Gate, PAIRS, Pooled, SUMMARY_HEADERS,
    Writes, alternating, alternation_cells, alternation_cutoff, alternation_rows, churn_disjoint,
    churn_hot, churning, idle, near_cutoff, or_dash, print_alternation_table, report_idle,
    summary_cells,
};
use crate::config::Config;
use crate::impls::{self, BATCH, LookupImpl};
use crate::report;
use crate::report::md;
use crate::row::Row;
use crate::stats;

type Vals = Vec<u64>;

/// `vals` without one occurrence of `v` (the last).
fn without(vals: &[u64], v: u64) -> Vals {
    let mut out = vals.to_vec();
    let i = out.iter().rposition(|&x| x == v).expect("value present");
    out.remove(i);
    out
}

impl Churned for impls::Papaya {
    fn read(&self, addrs: &[u64]) -> u64 {
        self.batch(addrs)
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

impl Churned for impls::Scc {
    fn read(&self, addrs: &[u64]) -> u64 {
        self.batch(addrs)
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

impl Churned for impls::Dash {
    fn read(&self, addrs: &[u64]) -> u64 {
        self.batch(addrs)
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

impl Churned for impls::RwLocked {
    fn read(&self, addrs: &[u64]) -> u64 {
        self.batch(addrs)
    }
    fn insert(&self, a: u64, v: u64) -> u64 {
        Writes::insert(&mut *self.0.write(), a, v)
    }
    fn remove(&self, a: u64, v: u64) {
        Writes::remove(&mut *self.0.write(), a, v)
    }
}

impl Churned for impls::Swap {
    fn read(&self, addrs: &[u64]) -> u64 {
        self.batch(addrs)
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
    vec![
        ("fprobe", Box::new(Fprobe(impls::fprobe_index(data)))),
        ("papaya", Box::new(impls::Papaya::new(data))),
        ("scc", Box::new(impls::Scc::new(data))),
        ("dashmap", Box::new(impls::Dash::new(data))),
        ("rwlock-hashbrown", Box::new(impls::RwLocked::new(data))),
        ("arc-swap", Box::new(impls::Swap::new(data))),
    ]
}

#[derive(Clone, Copy, PartialEq)]
enum Writer {
    Disjoint,
    HotSet,
}

/// `--bench churn-peers`.
pub fn run(cfg: &Config) -> Vec<Row> {
    run_mode(cfg, false)
}

/// `--bench churn-peers-alt`.
pub fn run_alternating(cfg: &Config) -> Vec<Row> {
    run_mode(cfg, true)
}

fn run_mode(cfg: &Config, alternate: bool) -> Vec<Row> {
    let set = addrs::load(cfg.source, cfg.addrs, cfg.seed);
    let n = set.addrs.len();
    let bench = if alternate {
        "churn-peers-alt"
    } else {
        "churn-peers"
    };
    md!("## {bench}\n");
    md!(
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
        if alternate {
            let mut phases: Vec<Vec<Alternation>> = maps.iter().map(|_| Vec::new()).collect();
            for round in 0..3 * cfg.rounds.max(1) {
                for ((name, map), phases) in maps.iter().zip(&mut phases) {
                    let map = map.as_ref();
                    let read = |b: &[u64]| map.read(b);
                    let write = |gate: Gate| match writer {
                        Writer::Disjoint => churn_disjoint(&mut &*map, top, gate),
                        Writer::HotSet => churn_hot(&mut &*map, &hot, gate),
                    };
                    let a = alternating(cfg, stream, &read, &write, PAIRS);
                    cfg.progress.line(format_args!(
                        "  churn-peers-alt {variant:<8} {name:<16} round {}  reader held {:>8.2} M/s, running {:>8.2} M/s, writer {:.3} M ops/s, round trip {} ns",
                        round + 1,
                        stats::median(&a.off) / 1e6,
                        stats::median(&a.on) / 1e6,
                        a.writes / 1e6,
                        or_dash(a.round_trip, 0)
                    ));
                    phases.push(a);
                }
            }
            let all: Vec<&[Alternation]> = phases.iter().map(|p| &p[..]).collect();
            let cutoff = alternation_cutoff(&all);
            for ((name, _), p) in maps.iter().zip(&phases) {
                let mut row = vec![variant.to_string(), name.to_string()];
                row.extend(alternation_cells(p, cutoff));
                body.push(row);
                rows.extend(alternation_rows(bench, variant, n, name, p));
            }
            continue;
        }
        let mut cells: Vec<Pooled> = maps.iter().map(|_| Pooled::default()).collect();
        // Rounds outermost: every map's phases are spread over the same
        // stretch of the run, so a noisy minute hits them all.
        for round in 0..=cfg.rounds {
            for ((name, map), cell) in maps.iter().zip(&mut cells) {
                let map = map.as_ref();
                let read = |b: &[u64]| map.read(b);
                let s = idle(cfg, stream, &read);
                let label = format!("churn-peers {variant:<8} {name:<16}");
                report_idle(cfg, &label, round, &s);
                cell.idle.extend(s);
                if round == cfg.rounds {
                    continue; // idle phases bracket every churn phase
                }
                let write = |gate: Gate| match writer {
                    Writer::Disjoint => churn_disjoint(&mut &*map, top, gate),
                    Writer::HotSet => churn_hot(&mut &*map, &hot, gate),
                };
                let c = churning(cfg, stream, &read, &write);
                c.report(cfg, &label, round, "");
                cell.churn.push(c);
            }
        }
        let cutoff = near_cutoff(&cells);
        for ((name, _), p) in maps.iter().zip(&cells) {
            let churned = p.churned();
            let mut row = vec![variant.to_string(), name.to_string()];
            row.extend(p.rate_cells());
            row.push(format!("{:.4}", p.writes() / 1e6));
            row.extend(summary_cells(p, cutoff));
            body.push(row);
            for (imp, s) in [("writer idle", &p.idle), ("writer churning", &churned)] {
                rows.push(Row::rate(
                    "churn-peers",
                    variant.into(),
                    n,
                    format!("{name}, {imp}"),
                    1,
                    s,
                ));
            }
        }
    }
    if alternate {
        let mut headers = vec!["writer", "map"];
        headers.extend(ALTERNATION_HEADERS);
        print_alternation_table(bench, "a flat-out writer", n, &headers, &body);
        return rows;
    }
    report::print_table(
        &format!("churn-peers: reader M/s with a flat-out writer idle vs churning ({n} addresses)"),
        &[
            &[
                "writer",
                "map",
                "reader M/s, writer idle",
                "reader M/s, writer churning",
                "writer M ops/s",
            ][..],
            &SUMMARY_HEADERS[..],
        ]
        .concat(),
        &body,
    );
    rows
}
