//! `--bench churn`: throughput of fprobe readers while one writer thread
//! continuously inserts and removes, as a ratio to the same readers with no
//! writer. Phases alternate idle, churn, idle, … on the same index and the
//! same reader streams; the ratio is of the pooled medians. The rounds go
//! round-robin over the variants (round 1 of every variant, then round 2,
//! …), so that the shared machine's slow stretches of a few seconds fall
//! on all variants alike, not on whichever ran its rounds then.
//!
//! `--bench churn-alt`: the same variants, measured inside each phase
//! instead of across phases. One writer thread is started per phase and
//! held and let run in turn every 20 ms ([`WINDOW`](crate::churn::WINDOW)); while held it spins,
//! so both kinds of window have the writer's CPU busy and differ only in
//! its index operations. Each running window is divided by the mean of the
//! held windows on either side, and the table gives the median of those
//! ratios. A ratio of whole phases, seconds apart, also carries whatever
//! the shared machine did in between (a host moving vCPUs, other tenants'
//! load), which can move it by more than the writer does; windows 20 ms
//! apart see the same machine, so pairing them cancels that drift (compare
//! the spin control of `--bench churn` and of `churn-alt`). Each phase (25
//! pairs, about a second) is still classed near or far by the round trip
//! around it. `--rounds N` gives 3 N phases per variant.
//!
//! `--bench churn-rates`: `churn-alt`'s `disjoint` and `hot-set` writers
//! capped at 0.5, 1, 2 and 4 M operations a second ([`SWEEP_OPS`]) and flat
//! out, with the spin control: how the readers' loss grows between a busy
//! attach/detach rate and a flood. The reader time lost per
//! write is a cost per write; the ratio is that cost times the write rate.
//!
//! Variants:
//! * `disjoint`: uniform readers over the address set; the writer churns a
//!   window of 4,096 other addresses (insert a new one, remove the oldest).
//! * `hot-set`: hot readers (90% on 64 addresses); the writer adds a value
//!   to a hot address and removes it again, round-robin over the hot set,
//!   so the records the readers hit are replaced (copy-on-write) under them.
//! * `disjoint, recycled`: `disjoint` over a pool of 65,536 other
//!   addresses taken in turn, again and again: after the first pass every
//!   insert finds its address's own tombstone (a probe attached and
//!   detached over a process's functions). `disjoint` never inserts an
//!   address twice, so its inserts claim fresh slots and the index rebuilds
//!   its table to clear the tombstones, dozens of times a second.
//! * `disjoint, small pages`: `disjoint` on an index built with
//!   `huge_pages(false)`, whose tables come from the global allocator (the
//!   writer's tombstones make the index rebuild its table many times a
//!   second, and each rebuild maps and unmaps a table of 8 MiB or more
//!   when huge pages are on). At the default 50,000 addresses the tables
//!   (2 and 4 MiB) stay below that size, so the two variants run the same
//!   index and their difference is the run's noise; from about 131,000
//!   addresses (`--addrs`) they differ.
//! * `… 10k ops/s`: the same writer paced to 10,000 operations a second (a
//!   busy attach/detach rate rather than a flood); `hot-set, 1M ops/s`
//!   paced to a million, between that and flat out.
//! * Three controls whose writer shares no memory with the reader's index,
//!   to tell a loss that comes from sharing the index apart from one that
//!   comes from sharing the machine: `control: spin` does arithmetic on the
//!   writer's CPU (no memory traffic); `control: other index` runs the
//!   `disjoint` writer flat out on a second fprobe index of the same size
//!   (its allocations, grace periods and table rebuilds compete for the
//!   caches, the memory bus and the CPUs, but no line is shared);
//!   `control: hashbrown` runs the same writer on a private
//!   `hashbrown::HashMap<u64, Vec<u64>>` of the same addresses (a writer
//!   with no reclamation and no concurrent table).
//!
//! Each churning phase also records the core-to-core round trip between
//! the reader's and the writer's CPUs, just before and just after it
//! ([`round_trip_ns`](crate::churn::round_trip_ns)). Every line the two
//! share costs the reader about half of it, and on a virtual machine it can
//! change several-fold when the host moves a vCPU (see BENCHMARKS.md). The
//! table gives the ratio over all phases, and split into phases near and
//! far (above three times the run's lowest round trip), with the reader
//! time lost per write in each.

use crate::report::md;
use std::hint::black_box;
use std::time::Instant;

use fprobe::rcu;

use crate::addrs::{self, Workload};
use crate::churn::{
    ALTERNATION_HEADERS, Alternation, Churned, Fprobe, Gate, PAIRS, Pooled, SUMMARY_HEADERS,
    alternating, alternation_cells, alternation_cutoff, alternation_rows, churn_disjoint,
    churn_hot, churn_recycled, churning, idle, near_cutoff, or_dash, print_alternation_table,
    report_idle, summary_cells,
};
use crate::config::Config;
use crate::impls::{self, BATCH};
use crate::report;
use crate::row::Row;
use crate::stats;

/// A writer's cap in operations per second; `None`: flat out.
type Pace = Option<f64>;

#[derive(Clone, Copy, PartialEq)]
enum Writer {
    Disjoint(Pace),
    /// `Disjoint` on the index with `huge_pages(false)`.
    DisjointSmallPages,
    /// `Disjoint` over a pool of [`RECYCLED`] addresses, again and again.
    DisjointRecycled,
    HotSet(Pace),
    /// Control: arithmetic only, on the writer's CPU.
    Spin,
    /// Control: `Disjoint` flat out on a second index.
    OtherIndex,
    /// Control: `Disjoint` flat out on a private `hashbrown::HashMap`.
    Hashbrown,
}

/// Addresses the `disjoint, recycled` writer cycles through: about as many
/// again as the read set, as if probes were attached and detached over the
/// rest of a large binary's functions.
const RECYCLED: u64 = 65_536;

/// Rate of the paced writer: a busy attach/detach workload, not a flood.
const PACED_OPS: f64 = 10_000.0;

/// A rate between the paced writer and the flat-out one (several million
/// operations a second; see BENCHMARKS.md), to show where on the way the
/// hot-set readers' loss comes.
const MILLION_OPS: f64 = 1_000_000.0;

/// The caps `--bench churn-rates` runs each writer at, below flat out.
const SWEEP_OPS: [f64; 4] = [500_000.0, 1_000_000.0, 2_000_000.0, 4_000_000.0];

/// `gate`, capped at `ops` operations a second if any.
fn pace(gate: Gate<'_>, ops: Pace) -> Gate<'_> {
    match ops {
        Some(ops) => gate.paced(ops),
        None => gate,
    }
}

/// `2M ops/s`, `500k ops/s`.
fn rate_label(ops: f64) -> String {
    if ops >= 1e6 {
        format!("{}M ops/s", ops / 1e6)
    } else {
        format!("{}k ops/s", ops / 1e3)
    }
}

/// How a variant's reader is compared with and without its writer.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Idle and churning phases of a second or so, in turn (`--bench churn`).
    Phases,
    /// The writer held and let run every [`WINDOW`](crate::churn::WINDOW) inside one phase,
    /// windows paired (`--bench churn-alt`).
    Alternating,
    /// `Alternating`, with the `disjoint` and `hot-set` writers capped at
    /// each rate of [`SWEEP_OPS`] and flat out (`--bench churn-rates`).
    Rates,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Phases => "churn",
            Mode::Alternating => "churn-alt",
            Mode::Rates => "churn-rates",
        }
    }
}

/// `--bench churn`.
pub fn run(cfg: &Config) -> Vec<Row> {
    run_mode(cfg, Mode::Phases)
}

/// `--bench churn-alt`.
pub fn run_alternating(cfg: &Config) -> Vec<Row> {
    run_mode(cfg, Mode::Alternating)
}

/// `--bench churn-rates`.
pub fn run_rates(cfg: &Config) -> Vec<Row> {
    run_mode(cfg, Mode::Rates)
}

fn run_mode(cfg: &Config, mode: Mode) -> Vec<Row> {
    let set = addrs::load(cfg.source, cfg.addrs, cfg.seed);
    let n = set.addrs.len();
    let readers = 1;
    md!("## {}\n", mode.name());
    md!(
        "addresses: {n} from {}; {readers} reader (fprobe get, one read_lock per 100) + 1 writer thread, \
         pinned to different CPUs where there are two; \
         every remove retires the old record to fprobe's reclaimer thread (a third thread), \
         whose grace periods use membarrier(2) when available (membarrier here: {})\n",
        set.origin,
        rcu::stats().membarrier
    );
    let data = addrs::handlers(&set.addrs, cfg.seed);
    let index = Fprobe(impls::fprobe_index(&data));
    let other = Fprobe(impls::fprobe_index(&data));
    let small = Fprobe(impls::fprobe_index_with(
        &data,
        fprobe::AddrIndex::builder().huge_pages(false),
    ));
    let private: hashbrown::HashMap<u64, Vec<u64>> = data.iter().cloned().collect();
    let hot = addrs::hot_set(&set.addrs, cfg.seed);
    let top = *set.addrs.last().expect("non-empty set");
    let paced = |name: &str, ops: f64| format!("{name}, {}", rate_label(ops));
    let variants: Vec<(String, Workload, Writer)> = if mode == Mode::Rates {
        let mut v = Vec::new();
        for (name, workload, writer) in [
            (
                "disjoint",
                Workload::Uniform,
                Writer::Disjoint as fn(Pace) -> Writer,
            ),
            ("hot-set", Workload::Hot, Writer::HotSet),
        ] {
            for ops in SWEEP_OPS {
                v.push((paced(name, ops), workload, writer(Some(ops))));
            }
            v.push((name.to_string(), workload, writer(None)));
        }
        v.push(("control: spin".into(), Workload::Uniform, Writer::Spin));
        v
    } else {
        vec![
            ("disjoint".into(), Workload::Uniform, Writer::Disjoint(None)),
            (
                "disjoint, recycled".into(),
                Workload::Uniform,
                Writer::DisjointRecycled,
            ),
            (
                "disjoint, small pages".into(),
                Workload::Uniform,
                Writer::DisjointSmallPages,
            ),
            (
                paced("disjoint", PACED_OPS),
                Workload::Uniform,
                Writer::Disjoint(Some(PACED_OPS)),
            ),
            ("hot-set".into(), Workload::Hot, Writer::HotSet(None)),
            (
                paced("hot-set", MILLION_OPS),
                Workload::Hot,
                Writer::HotSet(Some(MILLION_OPS)),
            ),
            (
                paced("hot-set", PACED_OPS),
                Workload::Hot,
                Writer::HotSet(Some(PACED_OPS)),
            ),
            ("control: spin".into(), Workload::Uniform, Writer::Spin),
            (
                "control: other index".into(),
                Workload::Uniform,
                Writer::OtherIndex,
            ),
            (
                "control: hashbrown".into(),
                Workload::Uniform,
                Writer::Hashbrown,
            ),
        ]
    };
    let stream_of = |w| addrs::streams(&set.addrs, w, readers, BATCH, cfg.seed).swap_remove(0);
    let (uniform, hot_stream) = (stream_of(Workload::Uniform), stream_of(Workload::Hot));
    /// One variant's phases, pooled over the rounds, and the writer's
    /// effect on the reclaimer and the table.
    #[derive(Default)]
    struct Variant {
        phases: Pooled,
        alternations: Vec<Alternation>,
        gps: Vec<f64>,
        tables: Vec<f64>,
    }
    let mut pooled: Vec<Variant> = variants.iter().map(|_| Variant::default()).collect();
    // Round-robin: every round runs each variant's idle and churn phases in
    // turn, so a slow stretch of the shared machine lands on every variant
    // alike instead of on whichever ran its rounds then.
    // Alternating: three phases per round (each has its own off windows).
    let rounds = match mode {
        Mode::Phases => cfg.rounds + 1,
        Mode::Alternating | Mode::Rates => 3 * cfg.rounds.max(1),
    };
    for round in 0..rounds {
        for ((variant, workload, writer), p) in variants.iter().zip(&mut pooled) {
            let (variant, workload, writer) = (variant.as_str(), *workload, *writer);
            let stream = if workload == Workload::Hot {
                &hot_stream
            } else {
                &uniform
            };
            // The index the reader reads, and the one the writer writes
            // (another index for the `other index` control).
            let read_from = if writer == Writer::DisjointSmallPages {
                &small
            } else {
                &index
            };
            let written = if writer == Writer::OtherIndex {
                &other
            } else {
                read_from
            };
            let read = |b: &[u64]| read_from.read(b);
            let write = |gate: Gate| match writer {
                Writer::Disjoint(ops) => churn_disjoint(&mut &*written, top, pace(gate, ops)),
                Writer::DisjointSmallPages | Writer::OtherIndex => {
                    churn_disjoint(&mut &*written, top, gate)
                }
                Writer::DisjointRecycled => churn_recycled(&mut &*written, top, RECYCLED, gate),
                Writer::HotSet(ops) => churn_hot(&mut &*written, &hot, pace(gate, ops)),
                Writer::Hashbrown => churn_disjoint(&mut private.clone(), top, gate),
                Writer::Spin => spin(gate),
            };
            let (gp0, rs0, t0) = (
                rcu::stats().reclaim_grace_periods,
                written.0.stats().resizes,
                Instant::now(),
            );
            if mode != Mode::Phases {
                let a = alternating(cfg, stream, &read, &write, PAIRS);
                let secs = t0.elapsed().as_secs_f64();
                p.gps
                    .push((rcu::stats().reclaim_grace_periods - gp0) as f64 / secs);
                p.tables
                    .push((written.0.stats().resizes - rs0) as f64 / secs);
                cfg.progress.line(format_args!(
                    "  {} {variant:<8} round {}  reader off {:>8.2} M/s, on {:>8.2} M/s, paired on ÷ off {:.3}, writer {:.3} M ops/s, round trip {} ns",
                    mode.name(),
                    round + 1,
                    stats::median(&a.off) / 1e6,
                    stats::median(&a.on) / 1e6,
                    stats::median(&a.ratios().collect::<Vec<_>>()),
                    a.writes / 1e6,
                    or_dash(a.round_trip, 0)
                ));
                p.alternations.push(a);
                continue;
            }
            let s = idle(cfg, stream, &read);
            let label = format!("churn {variant:<8}");
            report_idle(cfg, &label, round, &s);
            p.phases.idle.extend(s);
            if round == cfg.rounds {
                continue; // idle phases bracket every churn phase
            }
            let (gp0, rs0, t0) = (
                rcu::stats().reclaim_grace_periods,
                written.0.stats().resizes,
                Instant::now(),
            );
            let c = churning(cfg, stream, &read, &write);
            let secs = t0.elapsed().as_secs_f64();
            let gp = (rcu::stats().reclaim_grace_periods - gp0) as f64 / secs;
            let rs = (written.0.stats().resizes - rs0) as f64 / secs;
            c.report(
                cfg,
                &label,
                round,
                &format!(", {gp:.0} grace periods/s, {rs:.0} tables/s"),
            );
            p.gps.push(gp);
            p.tables.push(rs);
            p.phases.churn.push(c);
        }
    }
    if mode != Mode::Phases {
        let phases: Vec<&[Alternation]> = pooled.iter().map(|v| &v.alternations[..]).collect();
        let cutoff = alternation_cutoff(&phases);
        let headers: Vec<&str> = std::iter::once("variant")
            .chain(ALTERNATION_HEADERS)
            .chain(["reclaimer grace periods/s", "tables attached/s"])
            .collect();
        let mut rows = Vec::new();
        let mut body = Vec::new();
        for ((variant, _, _), v) in variants.iter().zip(&pooled) {
            let mut cells = vec![variant.clone()];
            cells.extend(alternation_cells(&v.alternations, cutoff));
            cells.push(format!("{:.0}", stats::median(&v.gps)));
            cells.push(format!("{:.0}", stats::median(&v.tables)));
            body.push(cells);
            rows.extend(alternation_rows(
                mode.name(),
                variant,
                n,
                "fprobe",
                &v.alternations,
            ));
        }
        print_alternation_table(mode.name(), "writer", n, &headers, &body);
        return rows;
    }
    let mut rows = Vec::new();
    let mut body = Vec::new();
    let cutoff = near_cutoff(pooled.iter().map(|v| &v.phases));
    for ((variant, _, _), v) in variants.iter().zip(&pooled) {
        let (p, churned) = (&v.phases, v.phases.churned());
        let mut cells = vec![variant.clone()];
        cells.extend(p.rate_cells());
        cells.extend([
            format!("{:.3}", p.writes() / 1e6),
            format!("{:.0}", stats::median(&v.gps)),
            format!("{:.0}", stats::median(&v.tables)),
        ]);
        cells.extend(summary_cells(p, cutoff));
        body.push(cells);
        for (imp, s) in [
            ("fprobe, writer idle", &p.idle),
            ("fprobe, writer churning", &churned),
        ] {
            rows.push(Row::rate(
                "churn",
                variant.clone(),
                n,
                imp.into(),
                readers,
                s,
            ));
        }
    }
    report::print_table(
        &format!("churn: reader M/s with a writer idle vs churning ({n} addresses)"),
        &[
            &[
                "variant",
                "reader M/s, writer idle",
                "reader M/s, writer churning",
                "writer M ops/s (insert or remove)",
                "reclaimer grace periods/s",
                "tables attached/s",
            ][..],
            &SUMMARY_HEADERS[..],
        ]
        .concat(),
        &body,
    );
    rows
}

/// Control: integer arithmetic in registers while the gate lets it;
/// returns 0 (no index operations).
fn spin(mut gate: Gate) -> u64 {
    let mut x = 1u64;
    while gate.next(0) {
        for _ in 0..1024 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        x = black_box(x);
    }
    0
}
