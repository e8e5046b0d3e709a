//! One comparison table: every contender at every producer count, the
//! contenders interleaved within each round (each round starting one
//! contender further on) and the rounds' samples pooled,
//! then a markdown table with each contender's rate against the reference
//! contender's (fprobe's), same run, same data.

use std::sync::atomic::AtomicBool;

use crate::config::Config;
use crate::harness::{self, PaddedCounter, Samples};
use crate::progress::Cell;
use crate::report;
use crate::row::Row;

/// A producer body: `(producer index, its counter, stop flag)`; it loops
/// until `stop` is set, adding its operations to the counter per batch (see
/// [`harness::run_producers`]).
pub type Producer<'a> = Box<dyn Fn(usize, &PaddedCounter, &AtomicBool) + Sync + 'a>;

/// One implementation under test.
pub struct Contender<'a> {
    pub name: &'a str,
    pub producer: Producer<'a>,
}

/// What the table and its rows are labelled with.
pub struct Labels<'a> {
    /// `Row::bench`, and the first word of each progress line.
    pub bench: &'static str,
    /// `Row::workload` (`uniform`, `hot`, `one address`, `pairs`…).
    pub workload: &'a str,
    /// `Row::addrs` (0 where there are none).
    pub addrs: usize,
    pub title: String,
    /// The contender the last column divides by (absent: `–`).
    pub reference: &'a str,
}

/// Runs every contender at every `cfg.threads` count for `cfg.rounds`
/// interleaved rounds, prints the table, returns one row per cell (with the
/// median of each round in [`Row::rounds`]).
pub fn run(cfg: &Config, labels: &Labels<'_>, contenders: &[Contender<'_>]) -> Vec<Row> {
    // (contender, threads, pooled samples, median of each round)
    let mut cells: Vec<(usize, usize, Samples, Vec<f64>)> = Vec::new();
    for &t in &cfg.threads {
        let mut per: Vec<Samples> = vec![Samples::default(); contenders.len()];
        let mut round_medians: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
        for round in 0..cfg.rounds {
            // Each round starts one contender further on, so that no
            // contender always runs first (right after the implementations
            // were built, or after the previous thread count) or always
            // right after the same one.
            for i in 0..contenders.len() {
                let k = (i + round) % contenders.len();
                let c = &contenders[k];
                let cell = Cell {
                    bench: labels.bench,
                    workload: labels.workload,
                    threads: t,
                    round,
                    rounds: cfg.rounds,
                    imp: c.name,
                };
                cfg.progress.start_cell(&cell);
                let s = harness::run_producers(t, 0, &cfg.cpus, cfg.timing, &c.producer);
                cfg.progress.end_cell(&cell, &s);
                round_medians[k].push(s.median() / 1e6);
                per[k].extend(s);
            }
        }
        for (k, (s, m)) in per.into_iter().zip(round_medians).enumerate() {
            cells.push((k, t, s, m));
        }
    }
    let mut rows = Vec::new();
    let mut body = Vec::new();
    for (k, c) in contenders.iter().enumerate() {
        for (_, t, s, round_medians) in cells.iter().filter(|cell| cell.0 == k) {
            let reference = cells
                .iter()
                .find(|r| contenders[r.0].name == labels.reference && r.1 == *t)
                .map(|r| r.2.median());
            let mut row = Row::rate(
                labels.bench,
                labels.workload.into(),
                labels.addrs,
                c.name.into(),
                *t,
                s,
            );
            row.rounds = round_medians.clone();
            body.push(vec![
                c.name.to_string(),
                t.to_string(),
                format!("{:.2} ± {:.2}", row.mean, row.stddev),
                format!("{:.2}", row.median),
                format!("{:.2}", row.per_thread()),
                reference.map_or("–".into(), |f| format!("{:.2}×", f / s.median())),
            ]);
            rows.push(row);
        }
    }
    report::print_table(
        &labels.title,
        &[
            "implementation",
            "threads",
            "M/s mean ± sd",
            "M/s median",
            "M/s per producer",
            &format!("{} ÷ this (medians)", labels.reference),
        ],
        &body,
    );
    rows
}
