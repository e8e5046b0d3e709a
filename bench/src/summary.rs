//! The default run (no `--bench`): one short table for each part of the
//! crate, measured by the benchmarks `--bench lookup`, `kprobe-multi-all`,
//! `kretprobe-multi-all` and `objpool` run with fewer implementations and
//! shorter cells, so that the whole fits in two minutes on two cores.
//!
//! 1. Index lookups: fprobe against the unsynchronised ceiling and the
//!    strongest concurrent peers.
//! 2. Probe dispatch: fprobe's registry against the locked hash maps an
//!    engine would write instead.
//! 3. The object pool against malloc and the other pools.
//! 4. The recent-hit cache on and off (cells of table 1's run), beside an
//!    A/A control: a second fprobe index built alike, whose ratio to the
//!    first is nothing but the run's noise.
//!
//! The benchmarks' own tables are dropped ([`report::muted`]); their rows
//! carry each cell's per-round medians, from which every cell here shows
//! its noise (`±`, half the range of the round medians) and every ratio
//! whether that noise covers it (`~`).

use crate::addrs::{self, Workload};
use crate::config::Config;
use crate::progress::Progress;
use crate::report::{self, md};
use crate::row::Row;
use crate::{bench_lookup, bench_pools, bench_probe, stats};

/// The lookup implementations of table 1, with what each is (short forms
/// of `--help`'s descriptions).
const LOOKUP: &[(&str, &str)] = &[
    (
        "fprobe",
        "AddrIndex::get, one rcu::read_lock per 100 lookups",
    ),
    (
        "hashbrown-ceiling",
        "read-only hashbrown::HashMap, unsynchronised (a ceiling)",
    ),
    ("papaya", "papaya::HashMap, pin per lookup"),
    ("scc", "scc::HashIndex::peek_with"),
    ("dashmap", "DashMap::get"),
    (
        "rwlock-hashbrown",
        "parking_lot RwLock<hashbrown::HashMap> read per lookup",
    ),
];

/// The dispatchers of table 2.
const DISPATCH: &[(&str, &str)] = &[
    (
        "fprobe",
        "probe::Registry (RCU index, per-thread return instances)",
    ),
    (
        "mutex-hashbrown",
        "parking_lot Mutex<hashbrown::HashMap> per entry, exits off a thread-local stack",
    ),
    (
        "mutex-hashbrown-shared",
        "the same, one Arc<[handler]> for all addresses",
    ),
];

/// The pools of table 3.
const OBJPOOL: &[(&str, &str)] = &[
    ("fprobe::ObjPool", "per-thread magazines, lock-free depot"),
    (
        "treiber-freelist",
        "tagged Treiber stack (pre-2023 kretprobe)",
    ),
    ("crossbeam-arrayqueue", "ArrayQueue<Box<Obj>>"),
    ("mutex-vec", "Mutex<Vec<Box<Obj>>>"),
    (
        "box-malloc",
        "Box::new + drop per call (glibc malloc, its tcache a per-thread pool)",
    ),
];

/// The two sides of table 4 (both measured in table 1's run).
const HIT_CACHE: &[(&str, &str)] = &[
    ("fprobe", "no hit cache"),
    (
        "fprobe-hit-cache",
        "the default recent-hit cache (HitCacheConfig::new(), on only where it times faster)",
    ),
    ("fprobe-small-pages", AA_ABOUT),
];

/// Below this many addresses, fprobe's table is under 8 MiB and on 4 KiB
/// pages whatever `huge_pages` says (`AddrIndexBuilder::huge_pages`), so
/// `fprobe-small-pages` is fprobe again: an A/A control of table 4.
const AA_BELOW: usize = 131_000;

/// What `fprobe-small-pages` is below [`AA_BELOW`] addresses.
const AA_ABOUT: &str = "fprobe again, a second index built alike (below ~131,000 addresses fprobe's table is on \
     small pages too): an A/A control, its ratio is this run's noise";

/// What `fprobe-small-pages` is from [`AA_BELOW`] addresses up.
const SMALL_PAGES_ABOUT: &str = "fprobe with huge_pages(false): its table on 4 KiB pages";

/// Width the explanation lines are wrapped to.
const WIDTH: usize = 120;

/// One measured part: the benchmarks run, on which implementations.
struct Measure {
    /// Its name on the progress line.
    name: &'static str,
    runs: &'static [fn(&Config) -> Vec<Row>],
    /// The implementations to run (before `--impls`).
    imps: Vec<&'static str>,
    /// `None`: the benchmark takes no workload (objpool).
    workloads: Option<Vec<Workload>>,
}

impl Measure {
    /// `cfg` for this part: its implementations (those `--impls` keeps)
    /// and workloads; `None` if `--impls` keeps none.
    fn config(&self, cfg: &Config) -> Option<Config> {
        let imps: Vec<String> = self
            .imps
            .iter()
            .filter(|n| cfg.keep_impl(n))
            .map(|n| n.to_string())
            .collect();
        (!imps.is_empty()).then(|| Config {
            impls: Some(imps),
            workloads: self.workloads.clone(),
            ..cfg.clone()
        })
    }

    /// Cells × rounds this part measures under `cfg`.
    fn cell_rounds(&self, cfg: &Config) -> usize {
        self.config(cfg).map_or(0, |c| {
            let imps = c.impls.as_ref().map_or(0, Vec::len);
            let workloads = self.workloads.as_ref().map_or(1, Vec::len);
            self.runs.len() * imps * workloads * c.threads.len() * c.rounds
        })
    }
}

/// Runs the summary and prints it; returns every measured row (for
/// `--csv`).
pub fn run(cfg: &Config) -> Vec<Row> {
    let lookup_workloads = cfg.workloads_or(&[Workload::Uniform, Workload::Hot]);
    let dispatch_workloads = cfg.workloads_or(&[Workload::Uniform]);
    let measures = [
        Measure {
            name: "lookup",
            runs: &[bench_lookup::run],
            imps: names(LOOKUP)
                .chain(names(HIT_CACHE).filter(|n| !names(LOOKUP).any(|l| l == *n)))
                .collect(),
            workloads: Some(lookup_workloads.clone()),
        },
        Measure {
            name: "dispatch",
            runs: &[
                bench_probe::run_kprobe_multi_all,
                bench_probe::run_kretprobe_multi_all,
            ],
            imps: names(DISPATCH).collect(),
            workloads: Some(dispatch_workloads.clone()),
        },
        Measure {
            name: "objpool",
            runs: &[bench_pools::run_objpool],
            imps: names(OBJPOOL).collect(),
            workloads: None,
        },
    ];

    let set = addrs::load(cfg.source, cfg.addrs, cfg.seed);
    header(cfg, &set);

    if let Progress::Meter(m) = &cfg.progress {
        m.plan(
            measures
                .iter()
                .map(|p| (p.name.to_string(), p.cell_rounds(cfg)))
                .collect(),
        );
    }
    let mut rows = Vec::new();
    for (k, measure) in measures.iter().enumerate() {
        if let Progress::Meter(m) = &cfg.progress {
            m.part(k);
        }
        if let Some(part_cfg) = measure.config(cfg) {
            for run in measure.runs {
                rows.extend(report::muted(|| run(&part_cfg)));
            }
        }
    }
    // The progress line gives way before the tables reach the terminal.
    if let Progress::Meter(m) = &cfg.progress {
        m.finish();
    }

    let n = set.addrs.len();
    let columns = |bench: &'static str, workloads: &[Workload], with_bench: bool| {
        let mut cols = Vec::new();
        for w in workloads {
            for &t in &cfg.threads {
                let label = match (with_bench, workloads.len()) {
                    (true, 1) => format!("{bench} {t}T"),
                    (true, _) => format!("{bench} {} {t}T", w.name()),
                    (false, _) => format!("{} {t}T", w.name()),
                };
                cols.push(Column {
                    label,
                    bench,
                    workload: w.name().to_string(),
                    threads: t,
                });
            }
        }
        cols
    };

    md!("## 1. Index lookups (M lookups/s)");
    para(&format!(
        "find one of {n} addresses, sum its handlers (10% have 3, the rest 1); uniform: all \
         addresses equally likely; hot: 90% of lookups on 64"
    ));
    md!();
    part(
        &rows,
        LOOKUP,
        &columns("lookup", &lookup_workloads, false),
        "fprobe",
    );

    md!("## 2. Probe dispatch (M calls/s)");
    para(&format!(
        "one probe on all {n} addresses, called in {} order; a call = entry + exit hook; \
         kretprobe-multi-all adds an exit handler and 8 bytes of data per call (a return instance)",
        dispatch_workloads
            .iter()
            .map(|w| w.name())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    md!();
    let mut dispatch_columns = Vec::new();
    for bench in ["kprobe-multi-all", "kretprobe-multi-all"] {
        dispatch_columns.extend(columns(bench, &dispatch_workloads, true));
    }
    part(&rows, DISPATCH, &dispatch_columns, "fprobe");

    md!("## 3. Object pool (M pairs/s)");
    para(
        "kretprobe pattern: pop an object at entry, touch its 64 bytes, push it back at return; 1024 \
         objects, all producers",
    );
    md!();
    let pool_columns: Vec<Column> = cfg
        .threads
        .iter()
        .map(|&t| Column {
            label: format!("{t}T"),
            bench: "objpool",
            workload: "pairs".into(),
            threads: t,
        })
        .collect();
    part(&rows, OBJPOOL, &pool_columns, OBJPOOL[0].0);

    md!("## 4. Recent-hit cache (M lookups/s, cells of table 1's run)");
    para(
        "the same index, data and streams with the hit cache off (fprobe) and on; below 1× the \
         cache pays",
    );
    md!();
    let mut hit_cache = HIT_CACHE.to_vec();
    if n >= AA_BELOW {
        hit_cache[2].1 = SMALL_PAGES_ABOUT;
    }
    part(
        &rows,
        &hit_cache,
        &columns("lookup", &lookup_workloads, false),
        "fprobe",
    );

    md!(
        "full tables: --bench lookup | kprobe-multi-all,kretprobe-multi-all | objpool; all \
         benchmarks and names: --help"
    );
    rows
}

/// The names of `list`.
fn names(list: &'static [(&'static str, &'static str)]) -> impl Iterator<Item = &'static str> {
    list.iter().map(|&(n, _)| n)
}

/// Title, what a comparison means here, the machine, date and addresses,
/// how cells were timed and how to read one.
fn header(cfg: &Config, set: &addrs::AddrSet) {
    let (model, listed) = report::cpu_model();
    let avail = std::thread::available_parallelism().map_or(0, |n| n.get());
    let listed = if listed > 0 && listed != avail {
        format!(" ({listed} listed in /proc/cpuinfo)")
    } else {
        String::new()
    };
    let t = cfg.timing;
    let threads: Vec<String> = cfg.threads.iter().map(usize::to_string).collect();
    md!("# fprobe trigger: summary");
    md!();
    para(
        "Comparisons are ratios within this run (same data, implementations interleaved), not rates \
         across runs.",
    );
    md!();
    md!(
        "machine: {model}, {avail} CPUs available{listed}; {} at the start",
        report::loadavg()
    );
    md!("date: {}", report::utc_now());
    md!(
        "addresses: {} function addresses of {}",
        set.addrs.len(),
        set.origin
    );
    para(&format!(
        "timing: {} producer threads (T), pinned; per cell {} interleaved rounds of {} warm-up + {} \
         kept {} ms samples",
        threads.join(", "),
        cfg.rounds,
        t.warmup_samples,
        t.samples,
        t.sample.as_millis()
    ));
    para(
        "a cell: median rate; ±: half the range of the cell's round medians (its noise); (r×): first \
         row ÷ this row, above 1× the first is faster; ~: |r − 1| within the sum of the two cells' ± \
         (a tie)",
    );
    md!();
}

/// One column of a table: the cells of one benchmark, workload and
/// producer count.
struct Column {
    label: String,
    bench: &'static str,
    workload: String,
    threads: usize,
}

/// Half the range of `row`'s round medians as a fraction of its median;
/// `None` with fewer than two rounds.
fn spread(row: &Row) -> Option<f64> {
    if row.rounds.len() < 2 || !row.median.is_finite() || row.median <= 0.0 {
        return None;
    }
    let lo = row.rounds.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = row.rounds.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((hi - lo) / 2.0 / row.median)
}

/// A rate with three significant figures (two decimals below 10).
fn rate(x: f64) -> String {
    match x {
        x if x >= 100.0 => format!("{x:.0}"),
        x if x >= 10.0 => format!("{x:.1}"),
        x => format!("{x:.2}"),
    }
}

/// A spread as `±4.2%` (`±12%` from 10% up).
fn percent(s: f64) -> String {
    let p = s * 100.0;
    if p >= 10.0 {
        format!("±{p:.0}%")
    } else {
        format!("±{p:.1}%")
    }
}

/// A table's cells with their noise: what [`part`] prints and sums up.
struct Table {
    header: Vec<String>,
    body: Vec<Vec<String>>,
    /// (spread, "implementation, column") of every cell with one.
    spreads: Vec<(f64, String)>,
    /// (ratios, of which ties).
    ratios: (usize, usize),
}

/// Rows `imps` × `columns` of `rows`: each cell the median, its spread,
/// and its ratio to `reference`'s cell of the same column.
fn table(rows: &[Row], imps: &[(&str, &str)], columns: &[Column], reference: &str) -> Table {
    let find = |imp: &str, c: &Column| {
        rows.iter().find(|r| {
            r.bench == c.bench && r.workload == c.workload && r.threads == c.threads && r.imp == imp
        })
    };
    let mut t = Table {
        header: std::iter::once("implementation".to_string())
            .chain(columns.iter().map(|c| c.label.clone()))
            .collect(),
        body: Vec::new(),
        spreads: Vec::new(),
        ratios: (0, 0),
    };
    for &(imp, _) in imps {
        let mut line = vec![imp.to_string()];
        for c in columns {
            let Some(row) = find(imp, c) else {
                line.push("–".into());
                continue;
            };
            let mut cell = rate(row.median);
            let s = spread(row);
            if let Some(s) = s {
                cell += &format!(" {}", percent(s));
                t.spreads.push((s, format!("{imp}, {}", c.label)));
            }
            if let Some(base) = find(reference, c).filter(|_| imp != reference) {
                let r = base.median / row.median;
                let tie = match (s, spread(base)) {
                    (Some(a), Some(b)) => (r - 1.0).abs() <= a + b,
                    _ => false,
                };
                t.ratios.0 += 1;
                t.ratios.1 += usize::from(tie);
                cell += &format!(" ({}{r:.2}×)", if tie { "~" } else { "" });
            }
            line.push(cell);
        }
        if line.iter().skip(1).any(|c| c != "–") {
            t.body.push(line);
        }
    }
    t
}

/// Prints one part's table, what its implementations are, and its noise.
fn part(rows: &[Row], imps: &[(&str, &str)], columns: &[Column], reference: &str) {
    let t = table(rows, imps, columns, reference);
    if t.body.is_empty() {
        md!("(not run: --impls kept none of its implementations)");
        md!();
        return;
    }
    print_aligned(&t.header, &t.body);
    md!();
    let shown: Vec<String> = imps
        .iter()
        .filter(|(n, _)| t.body.iter().any(|l| l[0] == *n))
        .map(|(n, about)| format!("{n}: {about}"))
        .collect();
    para(&format!("{}.", shown.join("; ")));
    para(&noise_line(&t));
    md!();
}

/// The table's noise in one sentence.
fn noise_line(t: &Table) -> String {
    if t.spreads.is_empty() {
        return "noise: not measured (one round per cell; --rounds 3 or more shows it)".into();
    }
    let values: Vec<f64> = t.spreads.iter().map(|s| s.0).collect();
    let (worst, at) = t
        .spreads
        .iter()
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .expect("not empty");
    let mut s = format!(
        "noise: rounds spread {} typical, {} at worst ({at})",
        percent(stats::median(&values)),
        percent(*worst)
    );
    if t.ratios.0 > 0 {
        s += &format!("; {} of {} ratios are ties (~)", t.ratios.1, t.ratios.0);
    }
    s
}

/// A Markdown table with its columns padded to one width, so that it
/// reads as well on a terminal as rendered.
fn print_aligned(header: &[String], body: &[Vec<String>]) {
    let width = |i: usize| {
        std::iter::once(&header[i])
            .chain(body.iter().map(|l| &l[i]))
            .map(|c| c.chars().count())
            .max()
            .unwrap_or(0)
            .max(3)
    };
    let widths: Vec<usize> = (0..header.len()).map(width).collect();
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, &w))| {
                let pad = " ".repeat(w - c.chars().count());
                if i == 0 {
                    format!("{c}{pad}")
                } else {
                    format!("{pad}{c}")
                }
            })
            .collect();
        format!("| {} |", padded.join(" | "))
    };
    md!("{}", line(header));
    let rule: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            if i == 0 {
                "-".repeat(w)
            } else {
                format!("{}:", "-".repeat(w - 1))
            }
        })
        .collect();
    md!("| {} |", rule.join(" | "));
    for l in body {
        md!("{}", line(l));
    }
}

/// Prints `text` wrapped at [`WIDTH`] columns.
fn para(text: &str) {
    for line in wrap(text, WIDTH) {
        md!("{line}");
    }
}

/// `text` in lines of at most `width` characters, broken at spaces (a
/// longer word gets a line of its own).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(imp: &str, median: f64, rounds: &[f64]) -> Row {
        Row {
            bench: "lookup",
            workload: "uniform".into(),
            addrs: 10,
            imp: imp.into(),
            threads: 1,
            unit: "M/s",
            mean: median,
            stddev: 0.0,
            median,
            samples: rounds.len(),
            rounds: rounds.to_vec(),
        }
    }

    /// Every implementation the summary names is one the benchmarks know.
    #[test]
    fn names_are_known() {
        let groups = crate::registry::impl_groups();
        for list in [LOOKUP, DISPATCH, OBJPOOL, HIT_CACHE] {
            for (n, _) in list {
                assert!(
                    groups.iter().any(|g| g.1.iter().any(|i| i.0 == *n)),
                    "{n} is no implementation"
                );
            }
        }
    }

    #[test]
    fn spread_is_half_the_round_range() {
        assert_eq!(spread(&row("a", 10.0, &[9.0, 11.0, 10.0])), Some(0.1));
        assert_eq!(spread(&row("a", 10.0, &[10.0])), None);
        assert_eq!(spread(&row("a", 0.0, &[0.0, 0.0])), None);
    }

    #[test]
    fn ratios_and_ties() {
        let rows = [
            row("fprobe", 10.0, &[9.5, 10.5]),
            row("close", 9.5, &[9.0, 10.0]),
            row("far", 5.0, &[4.9, 5.1]),
        ];
        let cols = [Column {
            label: "uniform 1T".into(),
            bench: "lookup",
            workload: "uniform".into(),
            threads: 1,
        }];
        let imps = [("fprobe", ""), ("close", ""), ("far", ""), ("absent", "")];
        let t = table(&rows, &imps, &cols, "fprobe");
        assert_eq!(t.body.len(), 3, "a row with no cell is left out");
        assert_eq!(t.body[0][1], "10.0 ±5.0%");
        assert_eq!(t.body[1][1], "9.50 ±5.3% (~1.05×)");
        assert_eq!(t.body[2][1], "5.00 ±2.0% (2.00×)");
        assert_eq!(t.ratios, (2, 1));
        assert!(noise_line(&t).contains("±5.3% at worst (close, uniform 1T)"));
    }

    #[test]
    fn wraps_at_spaces() {
        assert_eq!(wrap("aa bb cc", 5), ["aa bb", "cc"]);
        assert_eq!(wrap("abcdefg h", 3), ["abcdefg", "h"]);
        assert!(wrap("  ", 10).is_empty());
    }
}
