//! What a run is asked to do: the [`Config`] the command line sets, and
//! the [`BenchDef`] of each benchmark it names.

use crate::addrs::{Source, Workload};
use crate::harness::Timing;
use crate::progress::Progress;
use crate::row::Row;

/// One registered benchmark.
pub struct BenchDef {
    pub name: &'static str,
    pub about: &'static str,
    pub run: fn(&Config) -> Vec<Row>,
}

impl std::fmt::Debug for BenchDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Everything the command line sets.
#[derive(Clone, Debug)]
pub struct Config {
    /// No `--bench`: the summary runs (`benches` is then unused).
    pub summary: bool,
    pub benches: Vec<&'static BenchDef>,
    pub threads: Vec<usize>,
    pub timing: Timing,
    /// Each cell is run this many times, interleaved with the other
    /// implementations, and the samples pooled.
    pub rounds: usize,
    pub addrs: usize,
    pub source: Source,
    /// `--workload`, if given; each benchmark has its own default.
    pub workloads: Option<Vec<Workload>>,
    pub impls: Option<Vec<String>>,
    pub csv: Option<String>,
    pub svg: Option<String>,
    /// `--markdown`: the report (stdout) written to this file as well.
    pub markdown: Option<String>,
    pub seed: u64,
    /// CPUs producers are pinned to, round-robin.
    pub cpus: Vec<usize>,
    /// What stderr shows while the run measures.
    pub progress: Progress,
}

impl Config {
    /// `--workload`, else `default`.
    pub fn workloads_or(&self, default: &[Workload]) -> Vec<Workload> {
        self.workloads.clone().unwrap_or_else(|| default.to_vec())
    }

    pub fn keep_impl(&self, name: &str) -> bool {
        self.impls
            .as_ref()
            .is_none_or(|v| v.iter().any(|n| n == name))
    }
}
