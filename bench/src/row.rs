//! One measured cell of a benchmark: what every benchmark returns and
//! every output (tables, CSV, SVG) reads.

use crate::harness::Samples;

/// One measured cell.
#[derive(Clone, Debug)]
pub struct Row {
    pub bench: &'static str,
    /// Workload or variant (`uniform`, `hot`, `one-by-one`, `churn-disjoint`…).
    pub workload: String,
    pub addrs: usize,
    pub imp: String,
    pub threads: usize,
    /// `M/s` or `ns/addr`.
    pub unit: &'static str,
    pub mean: f64,
    pub stddev: f64,
    pub median: f64,
    pub samples: usize,
    /// The median of each interleaved round, in `unit` (empty where the
    /// benchmark has no such rounds): how far one run of the cell moves
    /// from the next.
    pub rounds: Vec<f64>,
}

impl Row {
    /// A throughput row (M/s) from a cell's samples.
    pub fn rate(
        bench: &'static str,
        workload: String,
        addrs: usize,
        imp: String,
        threads: usize,
        s: &Samples,
    ) -> Row {
        Row {
            bench,
            workload,
            addrs,
            imp,
            threads,
            unit: "M/s",
            mean: s.mean() / 1e6,
            stddev: s.stddev() / 1e6,
            median: s.median() / 1e6,
            samples: s.rates.len(),
            rounds: Vec::new(),
        }
    }

    /// Per producer (throughput rows only).
    pub fn per_thread(&self) -> f64 {
        self.mean / self.threads as f64
    }
}
