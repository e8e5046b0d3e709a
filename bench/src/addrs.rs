//! Address sets (function symbols of a large ELF, this binary, or a
//! synthetic layout) and per-producer lookup streams.

use std::path::{Path, PathBuf};

use object::{Object, ObjectSymbol, SymbolKind};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Largest ELF among the known big shared libraries, else this binary.
    Elf,
    /// This binary (`/proc/self/exe`).
    SelfExe,
    /// Function-like layout: 16-byte aligned starts, gaps of 16..=1024 bytes.
    Synthetic,
}

impl Source {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "elf" => Ok(Self::Elf),
            "self" => Ok(Self::SelfExe),
            "synthetic" => Ok(Self::Synthetic),
            _ => Err(format!("unknown --addrs-source {s:?} (elf|self|synthetic)")),
        }
    }
}

/// A deduplicated address set and where it came from.
pub struct AddrSet {
    pub addrs: Vec<u64>,
    pub origin: String,
}

/// Up to `n` distinct addresses from `source`; a fixed seed picks which, so
/// every run (and every implementation in a run) sees the same set.
pub fn load(source: Source, n: usize, seed: u64) -> AddrSet {
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut all, origin) = match source {
        Source::Synthetic => (
            synthetic(n, &mut rng),
            format!("synthetic layout ({n} functions)"),
        ),
        Source::SelfExe => elf_or_synthetic(&[PathBuf::from("/proc/self/exe")], n, &mut rng),
        Source::Elf => {
            let mut c = elf_candidates();
            c.push(PathBuf::from("/proc/self/exe"));
            elf_or_synthetic(&c, n, &mut rng)
        }
    };
    if all.len() > n {
        all.shuffle(&mut rng);
        all.truncate(n);
        all.sort_unstable();
    }
    AddrSet { addrs: all, origin }
}

fn synthetic(n: usize, rng: &mut StdRng) -> Vec<u64> {
    let mut a = 0x5555_5540_0000u64;
    (0..n)
        .map(|_| {
            a += rng.random_range(1..=64u64) * 16;
            a
        })
        .collect()
}

/// Big ELF files likely present, largest first.
fn elf_candidates() -> Vec<PathBuf> {
    let mut found = Vec::new();
    for dir in ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"] {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("libLLVM") || name.starts_with("libstdc++.so") {
                    found.push(e.path());
                }
            }
        }
    }
    if let Ok(out) = std::process::Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
    {
        let lib = Path::new(String::from_utf8_lossy(&out.stdout).trim()).join("lib");
        if let Ok(rd) = std::fs::read_dir(&lib) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("librustc_driver-") && name.ends_with(".so") {
                    found.push(e.path());
                }
            }
        }
    }
    let size = |p: &PathBuf| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    found.sort_by_key(|p| std::cmp::Reverse(size(p)));
    found.dedup_by(|a, b| std::fs::canonicalize(&*a).ok() == std::fs::canonicalize(&*b).ok());
    found
}

/// Function symbols (static and dynamic tables) of the first candidate that
/// has at least `n`, else of the one with the most; synthetic if none parse.
fn elf_or_synthetic(cands: &[PathBuf], n: usize, rng: &mut StdRng) -> (Vec<u64>, String) {
    let mut best: Option<(Vec<u64>, String)> = None;
    for p in cands {
        let Some(addrs) = function_symbols(p) else {
            continue;
        };
        let origin = format!(
            "{} ({} distinct function symbols)",
            file_name(p),
            addrs.len()
        );
        let enough = addrs.len() >= n;
        if best.as_ref().is_none_or(|(b, _)| addrs.len() > b.len()) {
            best = Some((addrs, origin));
        }
        if enough {
            break;
        }
    }
    best.filter(|(a, _)| !a.is_empty()).unwrap_or_else(|| {
        (
            synthetic(n, rng),
            format!("synthetic layout ({n} functions; no ELF readable)"),
        )
    })
}

/// What a report names `path` by: its file name (a local directory says
/// nothing about the symbols and differs between machines), or `this
/// binary` for `/proc/self/exe`.
fn file_name(path: &Path) -> String {
    if path == Path::new("/proc/self/exe") {
        return "this binary".into();
    }
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

fn function_symbols(path: &Path) -> Option<Vec<u64>> {
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let mut addrs: Vec<u64> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.address() != 0)
        .map(|s| s.address())
        .collect();
    addrs.sort_unstable();
    addrs.dedup();
    Some(addrs)
}

/// Handlers of each address: 10% of addresses get 3, the rest 1 (the
/// values are arbitrary u64s the lookup sums).
pub fn handlers(addrs: &[u64], seed: u64) -> Vec<(u64, Vec<u64>)> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x4a4e);
    addrs
        .iter()
        .map(|&a| {
            let k = if rng.random_ratio(1, 10) { 3 } else { 1 };
            (a, (0..k).map(|_| rng.random_range(0..1u64 << 32)).collect())
        })
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Every lookup picks an address uniformly.
    Uniform,
    /// 90% of lookups on 64 addresses, 10% uniform.
    Hot,
    /// Every lookup on one address (the first of the hot set): the kernel's
    /// trigger calling one probed function.
    One,
    /// Zipf-distributed ranks (function-call frequencies are roughly so)
    /// with exponent `s / 10` (0.8, 1.0 or 1.2), the ranks spread over the
    /// addresses at random.
    Zipf(u8),
    /// A real call sequence: the file `FPROBE_TRACE` names, one
    /// little-endian `u32` function index per call (`cargo run --release -p
    /// fprobe-sqlite-profiler -- --record-trace PATH`: SQLite's workload),
    /// function `i` played by address `i` of the set.
    Trace,
}

impl Workload {
    pub fn parse(s: &str) -> Result<Vec<Self>, String> {
        s.split(',')
            .map(|w| match w.trim() {
                "uniform" => Ok(Self::Uniform),
                "hot" => Ok(Self::Hot),
                "one" => Ok(Self::One),
                "zipf0.8" => Ok(Self::Zipf(8)),
                "zipf1.0" => Ok(Self::Zipf(10)),
                "zipf1.2" => Ok(Self::Zipf(12)),
                "trace" if std::env::var_os("FPROBE_TRACE").is_some() => Ok(Self::Trace),
                "trace" => Err(
                    "workload trace: set FPROBE_TRACE=PATH to a trace recorded by \
                     `cargo run --release -p fprobe-sqlite-profiler -- --record-trace PATH`"
                        .to_string(),
                ),
                _ => Err(format!(
                    "unknown workload {w:?} (uniform|hot|one|zipf0.8|zipf1.0|zipf1.2|trace)"
                )),
            })
            .collect()
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Uniform => "uniform",
            Self::Hot => "hot",
            Self::One => "one",
            Self::Zipf(8) => "zipf0.8",
            Self::Zipf(10) => "zipf1.0",
            Self::Zipf(_) => "zipf1.2",
            Self::Trace => "trace",
        }
    }
}

/// Number of hot addresses of [`Workload::Hot`].
pub const HOT_ADDRS: usize = 64;

/// The hot set of [`Workload::Hot`] for this seed.
pub fn hot_set(addrs: &[u64], seed: u64) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x407);
    addrs
        .choose_multiple(&mut rng, HOT_ADDRS.min(addrs.len()))
        .copied()
        .collect()
}

/// One lookup stream per producer: a different random sequence each, long
/// enough not to fit a cache for big sets (2 per address, 64Ki..2Mi), a
/// multiple of the batch.
pub fn streams(
    addrs: &[u64],
    workload: Workload,
    producers: usize,
    batch: usize,
    seed: u64,
) -> Vec<Vec<u64>> {
    let len = (addrs.len() * 2).clamp(1 << 16, 1 << 21) / batch * batch;
    if workload == Workload::Trace {
        return trace_streams(addrs, producers, len);
    }
    let hot = hot_set(addrs, seed);
    // Zipf: the distribution and one rank order for every producer.
    let zipf = match workload {
        Workload::Zipf(s) => {
            let mut by_rank = addrs.to_vec();
            by_rank.shuffle(&mut StdRng::seed_from_u64(seed ^ 0x21bf));
            let z =
                rand_distr::Zipf::new(addrs.len() as f64, f64::from(s) / 10.0).expect("valid Zipf");
            Some((z, by_rank))
        }
        _ => None,
    };
    (0..producers)
        .map(|p| {
            let mut rng = StdRng::seed_from_u64(seed.wrapping_add(1 + p as u64));
            (0..len)
                .map(|_| match (workload, &zipf) {
                    (Workload::Hot, _) if rng.random_ratio(9, 10) => {
                        hot[rng.random_range(0..hot.len())]
                    }
                    (Workload::One, _) => hot[0],
                    (_, Some((z, by_rank))) => by_rank[rng.sample(z) as usize - 1],
                    _ => addrs[rng.random_range(0..addrs.len())],
                })
                .collect()
        })
        .collect()
}

/// [`Workload::Trace`]: each producer replays `len` calls of the trace from
/// its own offset (wrapping around).
fn trace_streams(addrs: &[u64], producers: usize, len: usize) -> Vec<Vec<u64>> {
    let path = std::env::var_os("FPROBE_TRACE").expect("checked by Workload::parse");
    let calls: Vec<usize> = crate::trace::read(path.as_ref())
        .unwrap_or_else(|e| {
            panic!(
                "FPROBE_TRACE {}: {e}",
                std::path::Path::new(&path).display()
            )
        })
        .into_iter()
        .map(|i| i as usize)
        .collect();
    assert!(!calls.is_empty(), "FPROBE_TRACE holds no call");
    let functions = calls.iter().max().expect("not empty") + 1;
    assert!(
        functions <= addrs.len(),
        "the trace calls {functions} functions, the set has {} addresses",
        addrs.len()
    );
    (0..producers)
        .map(|p| {
            let at = p * calls.len() / producers;
            (0..len)
                .map(|k| addrs[calls[(at + k) % calls.len()]])
                .collect()
        })
        .collect()
}
