//! `bench_trigger` for fprobe's userspace data structures: a multi-thread
//! throughput harness after the kernel's
//! `tools/testing/selftests/bpf/bench_trigger.c`.
//!
//! ```text
//! cargo run --release -p fprobe-bench                      # the summary (below)
//! cargo run --release -p fprobe-bench -- --quiet           # the same, no progress on stderr
//! cargo run --release -p fprobe-bench -- --bench lookup    # every lookup implementation, 1..=nproc threads
//! cargo run --release -p fprobe-bench -- --bench registration
//! cargo run --release -p fprobe-bench -- --bench churn
//! cargo run --release -p fprobe-bench -- --bench churn-alt
//! cargo run --release -p fprobe-bench -- --bench churn-rates
//! cargo run --release -p fprobe-bench -- --bench churn-peers
//! cargo run --release -p fprobe-bench -- --bench churn-peers-alt
//! cargo run --release -p fprobe-bench -- --bench kprobe-multi,kprobe-multi-all,kretprobe-multi-all
//! cargo run --release -p fprobe-bench -- --bench objpool,uretprobe-nop --threads 1,2
//! cargo run --release -p fprobe-bench -- --bench all
//! cargo run --release -p fprobe-bench -- --help
//! ```
//!
//! # The default run: a summary
//!
//! Without `--bench`, the binary runs the summary (`summary.rs`): one short
//! table for each part of the crate, in about 90 seconds on two cores and
//! about 75 lines of stdout:
//!
//! 1. index lookups, fprobe's `AddrIndex` against `hashbrown-ceiling`
//!    (unsynchronised) and the strongest concurrent peers (papaya, scc,
//!    dashmap, `RwLock<hashbrown>`), uniform and hot workloads;
//! 2. probe dispatch, `kprobe-multi-all` and `kretprobe-multi-all` against
//!    `mutex-hashbrown` and `mutex-hashbrown-shared`, uniform calls;
//! 3. the object pool against malloc and the other pools of `objpool`;
//! 4. the recent-hit cache on and off (cells of table 1's run), with an A/A
//!    control: a second fprobe index built alike (`fprobe-small-pages`, the
//!    same as fprobe below ~131,000 addresses).
//!
//! Each at 1 and 2 producer threads (or `--threads`). Every cell runs in 4
//! interleaved rounds of 1 warm-up + 3 kept 100 ms samples (or
//! `--sample-ms`, `--duration-ms`, `--rounds`); a cell shows its median,
//! `±` half the range of its rounds' medians (the run's noise) and its
//! ratio to the table's reference, marked `~` where the two cells' noise
//! covers the difference. Under each table, a line names what each
//! implementation is and one sums up the noise. The header names the CPU,
//! the date and the ELF the addresses come from (by file name).
//!
//! stdout holds only the report; stderr one progress line rewritten in
//! place (on a terminal; otherwise one line per part), none with
//! `--quiet`. `--impls`, `--workload`, `--addrs`, `--seed`, `--csv`,
//! `--svg` and `--markdown` apply to the summary as to any benchmark.
//!
//! With `--bench`, the run is what it always was: the chosen benchmarks'
//! full tables, one stderr line per cell and round (none with `--quiet`).
//!
//! Benchmarks live in a registry ([`registry::BENCHES`]): add a module with
//! a `run(&Config) -> Vec<Row>` and one line there.

mod addrs;
mod bench_churn;
mod bench_churn_peers;
mod bench_lookup;
mod bench_pools;
mod bench_probe;
mod bench_registration;
#[allow(dead_code)] // `Chained::first` is for benches/hit_cache.rs
mod chained;
mod churn;
mod compare;
mod config;
mod dispatch;
mod harness;
mod impls;
mod pools;
mod progress;
mod registry;
mod report;
mod row;
mod stats;
mod summary;
#[allow(dead_code)] // the profiler writes traces; the harness only reads them
mod trace;

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use addrs::{Source, Workload};
use config::Config;
use harness::Timing;
use progress::{Meter, Progress};
use registry::{BENCHES, impl_groups};
use report::md;
use row::Row;

fn usage() -> String {
    let mut s = String::from(
        "usage: trigger [options]\n\n\
         Without --bench: the summary, one short table per part of the crate (index lookups\n\
         against the peers, probe dispatch, the object pool, the hit cache) in about 90 s on\n\
         two cores; the other options apply to it as to any benchmark.\n\n\
         --bench NAME[,NAME]    benchmark(s) to run instead of the summary, with their full tables\n\
         \x20                      ('all' for every one)\n\
         --threads LIST         producer counts, e.g. 1,2,4,8,16 (default 1..=available_parallelism;\n\
         \x20                      the summary: 1,2)\n\
         --sample-ms MS         sampler period (default 1000; see below)\n\
         --duration-ms MS       measured time per cell and round, after warm-up (default 5000)\n\
         --warmup N             warm-up samples discarded per cell (default 1)\n\
         --rounds N             interleaved repetitions of every cell, samples pooled (default 1)\n\
         --addrs N              addresses (default 50000)\n\
         --addrs-source SRC     elf | self | synthetic (default elf: function symbols of the largest\n\
         \x20                      of libLLVM*, librustc_driver-*, libstdc++ found; else this binary)\n\
         --workload LIST        uniform,hot,one,zipf0.8,zipf1.0,zipf1.2,trace (hot = 90% of lookups on 64\n\
         \x20                      addresses, one = all on one, zipfS = Zipf(S) ranks over the set,\n\
         \x20                      trace = the call sequence in FPROBE_TRACE (sqlite profiler --record-trace);\n\
         \x20                      default uniform,hot; one,uniform,hot for the *-multi-all benchmarks;\n\
         \x20                      the summary: uniform,hot for lookups, uniform for dispatch)\n\
         --impls LIST           only these implementations (names below)\n\
         --csv PATH             one row per cell\n\
         --svg PATH             throughput vs threads per implementation (lookup bench)\n\
         --markdown PATH        the report (the Markdown tables printed on stdout) written to PATH\n\
         --seed N               address sample, handler and stream seed (default 1)\n\
         -q, --quiet            no progress on stderr (the summary's progress line, the\n\
         \x20                      benchmarks' line per cell)\n\n\
         With neither --sample-ms nor --duration-ms the run is the quick default that fits in\n\
         two minutes on two cores: 200 ms samples, 1 warm-up + 3 kept per cell, 2 rounds\n\
         (the summary: 100 ms samples, 1 warm-up + 3 kept per cell, 4 rounds).\n\n\
         benchmarks:\n",
    );
    for b in BENCHES {
        s += &format!("  {:<21}{}\n", b.name, b.about);
    }
    for (benches, names) in impl_groups() {
        s += &format!("\n{benches} implementations:\n");
        for (n, about) in names {
            s += &format!("  {n:<24}{about}\n");
        }
    }
    s
}

/// Why the command line did not give a [`Config`].
#[derive(Debug)]
enum ArgsError {
    /// `-h` / `--help`: print the usage and exit successfully.
    Help,
    /// A bad option or value: print the message and exit with status 2.
    Bad(String),
}

impl From<lexopt::Error> for ArgsError {
    fn from(e: lexopt::Error) -> Self {
        ArgsError::Bad(e.to_string())
    }
}

impl From<String> for ArgsError {
    fn from(msg: String) -> Self {
        ArgsError::Bad(msg)
    }
}

/// The value of `flag` as UTF-8.
fn text(flag: &str, v: OsString) -> Result<String, String> {
    v.into_string()
        .map_err(|v| format!("{flag}: not valid UTF-8: {v:?}"))
}

/// The value of `flag` as a non-negative integer.
fn num(flag: &str, v: OsString) -> Result<u64, String> {
    let v = text(flag, v)?;
    v.trim()
        .parse()
        .map_err(|_| format!("{flag}: not a number: {v:?}"))
}

/// The value of `flag` as a comma-separated list.
fn list<T: std::str::FromStr>(flag: &str, v: OsString) -> Result<Vec<T>, String> {
    text(flag, v)?
        .split(',')
        .map(|x| {
            x.trim()
                .parse()
                .map_err(|_| format!("{flag}: cannot parse {x:?}"))
        })
        .collect()
}

/// Parses the arguments after the program name.
fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<Config, ArgsError> {
    use lexopt::prelude::*;

    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut benches = None;
    let mut threads: Option<Vec<usize>> = None;
    let (mut sample_ms, mut duration_ms, mut warmup, mut rounds) = (None, None, 1usize, None);
    let (mut addrs, mut source, mut workloads) = (50_000usize, Source::Elf, None);
    let (mut impls_filter, mut csv, mut svg, mut seed) = (None, None, None, 1u64);
    let (mut markdown, mut quiet) = (None, false);
    let mut parser = lexopt::Parser::from_args(args);
    while let Some(arg) = parser.next()? {
        match arg {
            Short('h') | Long("help") => return Err(ArgsError::Help),
            Long("bench") => {
                let v = text("--bench", parser.value()?)?;
                benches = Some(if v == "all" {
                    BENCHES.iter().collect()
                } else {
                    v.split(',')
                        .map(|n| {
                            BENCHES.iter().find(|b| b.name == n.trim()).ok_or_else(|| {
                                let known: Vec<&str> = BENCHES.iter().map(|b| b.name).collect();
                                format!(
                                    "--bench: unknown benchmark {n:?} (known: all, {})",
                                    known.join(", ")
                                )
                            })
                        })
                        .collect::<Result<_, _>>()?
                });
            }
            Long("threads") => threads = Some(list("--threads", parser.value()?)?),
            Long("sample-ms") => sample_ms = Some(num("--sample-ms", parser.value()?)?),
            Long("duration-ms") => duration_ms = Some(num("--duration-ms", parser.value()?)?),
            Long("warmup") => warmup = num("--warmup", parser.value()?)? as usize,
            Long("rounds") => rounds = Some(num("--rounds", parser.value()?)?.max(1) as usize),
            Long("addrs") => addrs = num("--addrs", parser.value()?)?.max(1) as usize,
            Long("addrs-source") => {
                source = Source::parse(&text("--addrs-source", parser.value()?)?)?
            }
            Long("workload") => {
                workloads = Some(Workload::parse(&text("--workload", parser.value()?)?)?)
            }
            Long("impls") => {
                let v: Vec<String> = list("--impls", parser.value()?)?;
                let groups = impl_groups();
                let known = |n: &str| groups.iter().any(|g| g.1.iter().any(|i| i.0 == n));
                if let Some(bad) = v.iter().find(|n| !known(n)) {
                    return Err(ArgsError::Bad(format!(
                        "--impls: unknown implementation {bad:?} (--help lists them)"
                    )));
                }
                impls_filter = Some(v);
            }
            Long("csv") => csv = Some(text("--csv", parser.value()?)?),
            Long("svg") => svg = Some(text("--svg", parser.value()?)?),
            Long("markdown") => markdown = Some(text("--markdown", parser.value()?)?),
            Long("seed") => seed = num("--seed", parser.value()?)?,
            Short('q') | Long("quiet") => quiet = true,
            _ => return Err(arg.unexpected().into()),
        }
    }
    let summary = benches.is_none();
    let benches = benches.unwrap_or_else(|| vec![&BENCHES[0]]);
    let threads = threads.unwrap_or_else(|| {
        if summary {
            (1..=ncpu.min(2)).collect()
        } else {
            (1..=ncpu).collect()
        }
    });
    if threads.is_empty() || threads.contains(&0) {
        return Err(ArgsError::Bad("--threads: counts must be ≥ 1".into()));
    }
    let quick = sample_ms.is_none() && duration_ms.is_none();
    let timing = if quick {
        Timing {
            sample: Duration::from_millis(if summary { 100 } else { 200 }),
            warmup_samples: warmup,
            samples: 3,
        }
    } else {
        let s = sample_ms.unwrap_or(1000).max(1);
        let d = duration_ms.unwrap_or(5000);
        Timing {
            sample: Duration::from_millis(s),
            warmup_samples: warmup,
            samples: (d / s).max(1) as usize,
        }
    };
    let rounds = rounds.unwrap_or(match (summary, quick) {
        (true, true) => 4,
        (false, true) => 2,
        (_, false) => 1,
    });
    let progress = match (quiet, summary) {
        (true, _) => Progress::Off,
        (false, true) => Progress::Meter(Arc::new(Meter::new())),
        (false, false) => Progress::Cells,
    };
    Ok(Config {
        summary,
        benches,
        threads,
        timing,
        rounds,
        addrs,
        source,
        workloads,
        impls: impls_filter,
        csv,
        svg,
        markdown,
        seed,
        cpus: harness::allowed_cpus(),
        progress,
    })
}

/// Says on stderr whether an output file was written.
fn report_written<E: std::fmt::Display>(path: &str, result: Result<(), E>) {
    match result {
        Ok(()) => eprintln!("wrote {path}"),
        Err(e) => eprintln!("cannot write {path}: {e}"),
    }
}

fn main() -> ExitCode {
    let cfg = match parse_args(std::env::args_os().skip(1)) {
        Ok(c) => c,
        Err(ArgsError::Help) => {
            print!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Err(ArgsError::Bad(msg)) => {
            eprintln!("trigger: error: {msg}");
            eprintln!("run 'trigger --help' for the options");
            return ExitCode::from(2);
        }
    };
    let t0 = Instant::now();
    let rows = if cfg.summary {
        summary::run(&cfg)
    } else {
        run_benches(&cfg)
    };
    if let Some(path) = &cfg.csv {
        report_written(path, report::write_csv(path, &rows));
    }
    if let Some(path) = &cfg.svg {
        report_written(path, report::write_svg(path, &rows));
    }
    md!(
        "finished in {:.1} s; {} at the end",
        t0.elapsed().as_secs_f64(),
        report::loadavg()
    );
    if let Some(path) = &cfg.markdown {
        report_written(path, report::write_markdown(path));
    }
    // The summary's meter said it was done before the tables.
    if let Progress::Cells = cfg.progress {
        eprintln!("done in {:.1} s", t0.elapsed().as_secs_f64());
    }
    ExitCode::SUCCESS
}

/// The `--bench` run: a header, then each benchmark's own tables.
fn run_benches(cfg: &Config) -> Vec<Row> {
    md!("# fprobe trigger benchmark");
    md!();
    md!("{}", report::machine_line(cfg));
    md!("{}", report::timing_line(cfg));
    md!();
    let mut rows = Vec::new();
    for b in &cfg.benches {
        cfg.progress.line(format_args!("== {} ==", b.name));
        rows.extend((b.run)(cfg));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Config {
        match parse_args(args.iter().map(OsString::from)) {
            Ok(c) => c,
            Err(e) => panic!("{args:?}: {e:?}"),
        }
    }

    /// No argument: the summary, its own quick timing, 1 and 2 threads,
    /// the progress meter.
    #[test]
    fn no_argument_is_the_summary() {
        let c = parse(&[]);
        let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(c.summary);
        assert_eq!(c.threads, (1..=ncpu.min(2)).collect::<Vec<_>>());
        assert_eq!(c.timing.sample, Duration::from_millis(100));
        assert_eq!((c.timing.warmup_samples, c.timing.samples), (1, 3));
        assert_eq!(c.rounds, 4);
        assert!(matches!(c.progress, Progress::Meter(_)));
        assert!(matches!(parse(&["--quiet"]).progress, Progress::Off));
        assert!(parse(&["--threads", "1", "--csv", "x.csv"]).summary);
    }

    /// `--bench`: what the run always was.
    #[test]
    fn bench_keeps_the_old_defaults() {
        let c = parse(&["--bench", "lookup"]);
        let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(!c.summary);
        assert_eq!(c.benches.len(), 1);
        assert_eq!(c.benches[0].name, "lookup");
        assert_eq!(c.threads, (1..=ncpu).collect::<Vec<_>>());
        assert_eq!(c.timing.sample, Duration::from_millis(200));
        assert_eq!((c.timing.warmup_samples, c.timing.samples), (1, 3));
        assert_eq!(c.rounds, 2);
        assert!(matches!(c.progress, Progress::Cells));
        let c = parse(&["-q", "--bench", "all", "--sample-ms", "500"]);
        assert_eq!(c.benches.len(), BENCHES.len());
        assert_eq!(c.rounds, 1);
        assert_eq!(c.timing.samples, 10);
        assert!(matches!(c.progress, Progress::Off));
    }

    #[test]
    fn bad_arguments() {
        let bad = |args: &[&str]| {
            matches!(
                parse_args(args.iter().map(OsString::from)),
                Err(ArgsError::Bad(_))
            )
        };
        assert!(bad(&["--bench", "nope"]));
        assert!(bad(&["--threads", "0"]));
        assert!(bad(&["--impls", "nope"]));
        assert!(bad(&["--quiet=yes"]));
        assert!(matches!(
            parse_args([OsString::from("--help")]),
            Err(ArgsError::Help)
        ));
    }
}
