//! An example engine: an in-process function profiler on fprobe's C ABI.
//!
//! It loads SQLite built with `-finstrument-functions` (see `build.rs`),
//! resolves every function symbol of that shared object from its own ELF
//! symbol table, registers one probe (entry and exit handlers, 8 bytes of
//! per-call data for the start time) on every one of them with the
//! function's index as cookie, attaches the crate's `__cyg_profile_func_*`
//! runtime, and runs a multi-threaded SQL workload. It prints a uftrace-like
//! report and the overhead of the same workload, in the same run, on:
//!
//! * `plain`: SQLite built without instrumentation;
//! * `instr, detached`: the instrumented build with the runtime detached
//!   (the cost of the compiler's hooks alone);
//! * `fprobe`: the instrumented build profiled through the crate;
//! * `locked HashMap`: the same object file with its hooks bound to a
//!   `Mutex<HashMap>` dispatcher (`baseline.rs`) calling the same handlers;
//! * `patch, detached`: SQLite built with `-fpatchable-function-entry=7,5`,
//!   nothing attached (its functions start with two nops);
//! * `patch`: that build with every patchable function attached at run
//!   time through `fprobe-patch`, the same handlers written as Rust
//!   closures (attach and detach timed);
//! * `patch-c`: the same through the C ABI (`fprobe_patch_attach`) with
//!   the very C handlers the `fprobe` mode runs.
//!
//! ```text
//! cargo run --release -p fprobe-sqlite-profiler -- [--rows N] [--threads 1,2] [--reps R] [--top K]
//!     [--handlers profile|noop] [--modes plain,detached,fprobe,hashmap,patch-detached,patch,patch-c]
//!     [--hit-cache N[,percpu]] [--stress-patch SECS] [--record-trace PATH]
//! ```
//!
//! `--stress-patch SECS` instead attaches and detaches every patchable
//! function in a loop while two threads run the workload (`stress.rs`);
//! `--record-trace PATH` runs the workload once on one thread with every
//! patchable function attached and writes the sequence of functions
//! called, one little-endian `u32` index per call, for the hit cache's
//! benchmark to replay (`FPROBE_TRACE=PATH cargo bench --bench hit_cache`).

mod baseline;
mod prof;
mod sqlite;
/// The benchmark harness's statistics, shared so that every median in the
/// repository is the same function.
#[path = "../../../bench/src/stats.rs"]
#[allow(dead_code)] // this includer uses `median` only
mod stats;
mod stress;
/// The call-trace file format, shared with its readers.
#[path = "../../../bench/src/trace.rs"]
#[allow(dead_code)] // this includer writes only
mod trace;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fprobe_capi::patch::{fprobe_patch_attach, fprobe_patch_detach, fprobe_patch_stats};
use fprobe_capi::*;
use object::{Object, ObjectSymbol, SymbolKind};

use prof::Stat;
use sqlite::Lib;

/// A function of the instrumented shared object.
struct Func {
    name: String,
    addr: u64,
}

/// Every defined, sized function symbol of the shared object at `path`,
/// one per address (aliases collapse to the first global name), at its
/// load address: `bias` plus the symbol value.
fn functions(path: &str, lib: &Lib) -> Vec<Func> {
    let data = std::fs::read(path).expect("read the shared object");
    let file = object::File::parse(&*data).expect("parse ELF");
    let mut by_addr: HashMap<u64, (String, bool)> = HashMap::new();
    let (mut open_value, mut exec_value) = (None, None);
    for s in file.symbols() {
        if s.kind() != SymbolKind::Text || !s.is_definition() || s.size() == 0 {
            continue;
        }
        let Ok(name) = s.name() else { continue };
        match name {
            "sqlite3_open" => open_value = Some(s.address()),
            "sqlite3_exec" => exec_value = Some(s.address()),
            _ => {}
        }
        let global = s.is_global();
        let e = by_addr
            .entry(s.address())
            .or_insert_with(|| (name.to_string(), global));
        if global && !e.1 {
            *e = (name.to_string(), true);
        }
    }
    let value = open_value.expect("sqlite3_open in .symtab");
    let bias = lib.sym("sqlite3_open") - value;
    // A second symbol checks the bias.
    let exec_value = exec_value.expect("sqlite3_exec in .symtab");
    assert_eq!(bias + exec_value, lib.sym("sqlite3_exec"), "load bias");
    let mut v: Vec<Func> = by_addr
        .into_iter()
        .map(|(a, (name, _))| Func {
            name,
            addr: a + bias,
        })
        .collect();
    v.sort_by_key(|f| f.addr);
    v
}

/// `--record-trace`: one workload run on one thread, every patchable
/// function attached with an entry probe that appends its index; the
/// sequence is written to `path` as little-endian `u32`s.
fn record(libs: &Libs, rows: i64, path: &std::path::Path) {
    let recorded = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u32>::new()));
    let t = recorded.clone();
    let probe = fprobe::probe::Fprobe::<fprobe_patch::Regs>::builder()
        .entry(move |e| {
            // One thread records: the lock is never contended.
            t.lock().unwrap().push(e.cookie as u32);
            fprobe::probe::EntryAction::Continue
        })
        .build();
    let a = fprobe_patch::attach_with_cookies(probe, libs.patch_funcs.iter().copied())
        .expect("attach every patchable function");
    sqlite::workload(&libs.patch, 0x9E37_79B9, rows);
    fprobe_patch::detach(a).expect("detach");
    let calls = std::mem::take(&mut *recorded.lock().unwrap());
    trace::write(path, &calls).expect("write the trace");
    let distinct = calls.iter().collect::<std::collections::HashSet<_>>().len();
    println!(
        "{} calls to {distinct} functions written to {}",
        calls.len(),
        path.display()
    );
}

/// The patchable functions of the patchable copy, each with the index of
/// the function of the same name in `funcs` as cookie, and the names of
/// those the instrumented copy does not have (clones the two compilations
/// made differently), whose cookies follow `funcs`'s.
fn patch_functions(lib: &Lib, funcs: &[Func]) -> (Vec<(u64, u64)>, Vec<String>) {
    let by_name: HashMap<&str, usize> = funcs
        .iter()
        .enumerate()
        .map(|(i, f)| (f.name.as_str(), i))
        .collect();
    let sites = fprobe_patch::sites().expect("read the loaded objects");
    let mut extra = Vec::new();
    let v: Vec<(u64, u64)> = sites
        .iter()
        .filter(|s| *s.module == *lib.path && s.layout == fprobe_patch::Layout::HotPatch)
        .map(|s| {
            let name = s.name.as_deref().unwrap_or("?");
            let cookie = match by_name.get(name) {
                Some(&i) => i,
                None => {
                    extra.push(name.to_string());
                    funcs.len() + extra.len() - 1
                }
            };
            (s.function, cookie as u64)
        })
        .collect();
    assert!(!v.is_empty(), "no patchable function in {}", lib.path);
    (v, extra)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Plain,
    Detached,
    Fprobe,
    LockedHashMap,
    PatchDetached,
    Patch,
    PatchC,
}

impl Mode {
    const ALL: [Mode; 7] = [
        Mode::Plain,
        Mode::Detached,
        Mode::Fprobe,
        Mode::LockedHashMap,
        Mode::PatchDetached,
        Mode::Patch,
        Mode::PatchC,
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain (not instrumented)",
            Mode::Detached => "instr, runtime detached",
            Mode::Fprobe => "instr, fprobe profiler",
            Mode::LockedHashMap => "instr, locked-HashMap profiler",
            Mode::PatchDetached => "patchable, nothing attached",
            Mode::Patch => "patchable, fprobe-patch profiler",
            Mode::PatchC => "patchable, same through the C ABI",
        }
    }
}

struct Libs {
    plain: Lib,
    instr: Lib,
    wrapped: Lib,
    patch: Lib,
    /// The patchable functions of `patch` and their cookies: the index of
    /// the function of the same name in the instrumented copy's list
    /// (`u64::MAX` for one it does not have), so profiles compare.
    patch_funcs: Vec<(u64, u64)>,
    /// Names of the patchable functions the instrumented copy lacks.
    patch_extra: Vec<String>,
    /// Load bias of `wrapped` minus that of `instr`: the same function is
    /// at `addr + wrapped_shift` in the wrapped copy.
    wrapped_shift: u64,
}

/// What one run produced.
struct Run {
    wall: Duration,
    checksum: i64,
    /// Per-function totals (profiled modes).
    stats: Vec<Stat>,
    /// The probe's counters (fprobe mode).
    probe: Option<fprobe_stats>,
    /// Registration time of all functions (fprobe mode), or the attach
    /// time (patch mode).
    register: Duration,
    /// Detach time (patch mode).
    detach: Duration,
}

fn workload_threads(lib: &Lib, threads: usize, rows: i64) -> (Duration, i64) {
    let t0 = Instant::now();
    let sum = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|i| s.spawn(move || sqlite::workload(lib, 0x9E37_79B9 + i as u64, rows)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .fold(0i64, i64::wrapping_add)
    });
    (t0.elapsed(), sum)
}

/// The handlers both dispatchers call.
#[derive(Clone, Copy)]
struct Handlers {
    entry: fprobe_entry_fn,
    exit: fprobe_exit_fn,
    /// The no-op pair (the patch mode builds its Rust twin).
    noop: bool,
}

impl Handlers {
    /// The C ABI's probe of these handlers, with 8 bytes of per-call data.
    fn c_probe(self) -> fprobe_probe {
        fprobe_probe {
            entry: self.entry,
            exit: self.exit,
            release: None,
            user: std::ptr::null_mut(),
            data_size: 8,
        }
    }
}

/// `--hit-cache N[,percpu]`: the registry's hit cache (entries, per-CPU).
static HIT_CACHE: std::sync::OnceLock<(usize, std::ffi::c_int)> = std::sync::OnceLock::new();

fn run(libs: &Libs, funcs: &[Func], h: Handlers, mode: Mode, threads: usize, rows: i64) -> Run {
    let hit_cache = *HIT_CACHE.get_or_init(|| (0, 0));
    let mut out = Run {
        wall: Duration::ZERO,
        checksum: 0,
        stats: Vec::new(),
        probe: None,
        register: Duration::ZERO,
        detach: Duration::ZERO,
    };
    match mode {
        Mode::Plain => (out.wall, out.checksum) = workload_threads(&libs.plain, threads, rows),
        Mode::Detached => (out.wall, out.checksum) = workload_threads(&libs.instr, threads, rows),
        Mode::Fprobe => {
            let cfg = fprobe_config {
                capacity: funcs.len(),
                data_size: 8,
                max_depth: 256,
                hit_cache_entries: hit_cache.0,
                hit_cache_per_cpu: hit_cache.1,
                ..Default::default()
            };
            let mut r = std::ptr::null_mut();
            // SAFETY: valid pointers.
            assert_eq!(unsafe { fprobe_registry_new(&cfg, &mut r) }, FPROBE_OK);
            let addrs: Vec<u64> = funcs.iter().map(|f| f.addr).collect();
            let cookies: Vec<u64> = (0..funcs.len() as u64).collect();
            let probe = h.c_probe();
            let mut handle = 0;
            let t0 = Instant::now();
            // SAFETY: `addrs` and `cookies` hold `len` values each.
            let rc = unsafe {
                fprobe_register(
                    r,
                    &probe,
                    addrs.as_ptr(),
                    cookies.as_ptr(),
                    addrs.len(),
                    &mut handle,
                )
            };
            out.register = t0.elapsed();
            assert_eq!(rc, FPROBE_OK);
            // SAFETY: a live registry.
            assert_eq!(unsafe { fprobe_cyg_attach(r) }, FPROBE_OK);
            (out.wall, out.checksum) = workload_threads(&libs.instr, threads, rows);
            assert_eq!(fprobe_cyg_detach(), FPROBE_OK);
            let mut s = fprobe_stats::default();
            // SAFETY: a live registry and handle.
            assert_eq!(unsafe { fprobe_probe_stats(r, handle, &mut s) }, FPROBE_OK);
            out.probe = Some(s);
            // SAFETY: a live registry, destroyed once.
            assert_eq!(unsafe { fprobe_registry_destroy(r) }, FPROBE_OK);
            out.stats = prof::take_totals();
        }
        Mode::LockedHashMap => {
            let mut map: HashMap<u64, Vec<baseline::Handler>> = HashMap::new();
            for (i, f) in funcs.iter().enumerate() {
                map.entry(f.addr.wrapping_add(libs.wrapped_shift))
                    .or_default()
                    .push(baseline::Handler {
                        entry: h.entry,
                        exit: h.exit,
                        cookie: i as u64,
                    });
            }
            baseline::install(map);
            (out.wall, out.checksum) = workload_threads(&libs.wrapped, threads, rows);
            baseline::uninstall();
            out.stats = prof::take_totals();
        }
        Mode::PatchDetached => {
            (out.wall, out.checksum) = workload_threads(&libs.patch, threads, rows);
        }
        Mode::Patch => {
            let probe = fprobe::probe::Fprobe::<fprobe_patch::Regs>::builder().data_size(8);
            let probe = if h.noop {
                probe
                    .entry(|_| fprobe::probe::EntryAction::Continue)
                    .exit(|_| {})
            } else {
                probe
                    .entry(|e| match prof::enter(e.cookie, e.data.len() >= 8) {
                        Some(start) => {
                            e.data[..8].copy_from_slice(&start.to_ne_bytes());
                            fprobe::probe::EntryAction::Continue
                        }
                        None => fprobe::probe::EntryAction::SkipExit,
                    })
                    .exit(|x| {
                        let start = u64::from_ne_bytes(x.data[..8].try_into().expect("8 bytes"));
                        prof::leave(x.cookie, start);
                    })
            };
            let t0 = Instant::now();
            let a =
                fprobe_patch::attach_with_cookies(probe.build(), libs.patch_funcs.iter().copied())
                    .expect("attach every patchable function");
            out.register = t0.elapsed();
            (out.wall, out.checksum) = workload_threads(&libs.patch, threads, rows);
            let st = a.stats();
            let t1 = Instant::now();
            fprobe_patch::detach(a).expect("detach");
            out.detach = t1.elapsed();
            out.probe = Some(fprobe_stats::from(st));
            out.stats = prof::take_totals();
        }
        Mode::PatchC => {
            let probe = h.c_probe();
            let (fs, cookies): (Vec<u64>, Vec<u64>) = libs.patch_funcs.iter().copied().unzip();
            let mut handle = 0;
            let t0 = Instant::now();
            // SAFETY: `fs` and `cookies` hold `len` values each.
            let rc = unsafe {
                fprobe_patch_attach(&probe, fs.as_ptr(), cookies.as_ptr(), fs.len(), &mut handle)
            };
            out.register = t0.elapsed();
            assert_eq!(rc, FPROBE_OK, "attach every patchable function");
            (out.wall, out.checksum) = workload_threads(&libs.patch, threads, rows);
            let mut st = fprobe_stats::default();
            // SAFETY: a live handle.
            assert_eq!(unsafe { fprobe_patch_stats(handle, &mut st) }, FPROBE_OK);
            let t1 = Instant::now();
            assert_eq!(fprobe_patch_detach(handle), FPROBE_OK);
            out.detach = t1.elapsed();
            out.probe = Some(st);
            out.stats = prof::take_totals();
        }
    }
    out
}

/// The command line.
struct Options {
    rows: i64,
    reps: usize,
    top: usize,
    threads: Vec<usize>,
    modes: Vec<Mode>,
    /// `--handlers noop`: handlers that do nothing, to measure the
    /// dispatchers alone (default `profile`).
    noop: bool,
    /// `--hit-cache N[,percpu]`: entries per cache (0: none), per CPU.
    hit_cache: (usize, bool),
    /// `--stress-patch SECS`: run the patching stress instead (`stress.rs`).
    stress_patch: Option<f64>,
    /// `--record-trace PATH`: write the call trace instead (`record_trace`).
    record_trace: Option<std::path::PathBuf>,
}

const USAGE: &str = "usage: fprobe-sqlite-profiler [--rows N] [--threads 1,2] [--reps R] [--top K]
    [--handlers profile|noop] [--modes plain,detached,fprobe,hashmap,patch-detached,patch,patch-c]
    [--hit-cache N[,percpu]] [--stress-patch SECS] [--record-trace PATH]";

/// Why the command line gave no [`Options`].
enum ArgsError {
    /// `-h` / `--help`: print the usage and exit successfully.
    Help,
    /// A bad option or value: print the message and exit with status 2.
    Bad(String),
}

impl From<String> for ArgsError {
    fn from(msg: String) -> Self {
        ArgsError::Bad(msg)
    }
}

impl From<lexopt::Error> for ArgsError {
    fn from(e: lexopt::Error) -> Self {
        ArgsError::Bad(e.to_string())
    }
}

/// Parses the arguments after the program name.
fn parse_options(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Options, ArgsError> {
    use lexopt::prelude::*;

    fn value<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
        v.trim()
            .parse()
            .map_err(|_| format!("{flag}: cannot parse {v:?}"))
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut o = Options {
        rows: 20_000,
        reps: 3,
        top: 25,
        threads: if cores > 1 { vec![1, cores] } else { vec![1] },
        modes: Mode::ALL.to_vec(),
        noop: false,
        hit_cache: (0, false),
        stress_patch: None,
        record_trace: None,
    };
    let mut parser = lexopt::Parser::from_args(args);
    let text = |p: &mut lexopt::Parser, flag: &str| -> Result<String, ArgsError> {
        Ok(p.value()?
            .into_string()
            .map_err(|v| format!("{flag}: not valid UTF-8: {v:?}"))?)
    };
    while let Some(arg) = parser.next()? {
        match arg {
            Short('h') | Long("help") => return Err(ArgsError::Help),
            Long("rows") => o.rows = value("--rows", text(&mut parser, "--rows")?)?,
            Long("reps") => o.reps = value::<usize>("--reps", text(&mut parser, "--reps")?)?.max(1),
            Long("top") => o.top = value("--top", text(&mut parser, "--top")?)?,
            Long("threads") => {
                o.threads = text(&mut parser, "--threads")?
                    .split(',')
                    .map(|t| value("--threads", t.to_string()))
                    .collect::<Result<_, String>>()?;
                if o.threads.is_empty() || o.threads.contains(&0) {
                    return Err(ArgsError::Bad("--threads: counts must be ≥ 1".into()));
                }
            }
            Long("modes") => {
                o.modes = text(&mut parser, "--modes")?
                    .split(',')
                    .map(|m| match m.trim() {
                        "plain" => Ok(Mode::Plain),
                        "detached" => Ok(Mode::Detached),
                        "fprobe" => Ok(Mode::Fprobe),
                        "hashmap" => Ok(Mode::LockedHashMap),
                        "patch-detached" => Ok(Mode::PatchDetached),
                        "patch" => Ok(Mode::Patch),
                        "patch-c" => Ok(Mode::PatchC),
                        other => Err(format!(
                            "--modes: unknown mode {other:?} (plain, detached, fprobe, hashmap, \
                             patch-detached, patch, patch-c)"
                        )),
                    })
                    .collect::<Result<_, String>>()?;
            }
            Long("handlers") => {
                o.noop = match text(&mut parser, "--handlers")?.as_str() {
                    "noop" => true,
                    "profile" => false,
                    other => {
                        return Err(format!("--handlers: {other:?} is not profile or noop").into());
                    }
                }
            }
            Long("hit-cache") => {
                let v = text(&mut parser, "--hit-cache")?;
                let (n, mode) = v.split_once(',').unwrap_or((&v, ""));
                let percpu = match mode {
                    "" => false,
                    "percpu" => true,
                    other => return Err(format!("--hit-cache: {other:?} is not percpu").into()),
                };
                o.hit_cache = (value("--hit-cache", n.to_string())?, percpu);
            }
            Long("record-trace") => o.record_trace = Some(parser.value()?.into()),
            Long("stress-patch") => {
                o.stress_patch = Some(value(
                    "--stress-patch",
                    text(&mut parser, "--stress-patch")?,
                )?)
            }
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(o)
}

fn report(funcs: &[Func], stats: &[Stat], ticks_per_ns: f64, top: usize) {
    let mut idx: Vec<usize> = (0..stats.len()).filter(|&i| stats[i].calls > 0).collect();
    idx.sort_by_key(|&i| std::cmp::Reverse(stats[i].calls));
    let ms = |t: u64| t as f64 / ticks_per_ns / 1e6;
    println!(
        "  {:>12}  {:>12}  {:>12}  {:>10}  Function",
        "Total (ms)", "Self (ms)", "Calls", "ns/call"
    );
    println!(
        "  {:=>12}  {:=>12}  {:=>12}  {:=>10}  {:=<30}",
        "", "", "", "", ""
    );
    for &i in idx.iter().take(top) {
        let s = stats[i];
        println!(
            "  {:>12.2}  {:>12.2}  {:>12}  {:>10.1}  {}",
            ms(s.total),
            ms(s.self_),
            s.calls,
            s.total as f64 / ticks_per_ns / s.calls as f64,
            funcs[i].name
        );
    }
}

fn main() {
    let Options {
        rows,
        reps,
        top,
        threads,
        modes,
        noop,
        hit_cache: (entries, percpu),
        stress_patch,
        record_trace,
    } = match parse_options(std::env::args_os().skip(1)) {
        Ok(o) => o,
        Err(ArgsError::Help) => {
            println!("{USAGE}");
            return;
        }
        Err(ArgsError::Bad(msg)) => {
            eprintln!("fprobe-sqlite-profiler: error: {msg}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let _ = HIT_CACHE.set((entries, std::ffi::c_int::from(percpu)));
    // SQLite is plain SysV C built without -pg, with
    // -fpatchable-function-entry on the command line (build.rs), which
    // turns GCC's interprocedural register allocation off (Clang has it
    // off anyway): every function may keep only its argument and return
    // registers (fprobe-patch's docs say when that holds).
    fprobe_patch::set_argument_only_saves(fprobe_patch::ArgumentOnlySaves::Everywhere);
    let handlers = if noop {
        Handlers {
            entry: Some(prof::noop_entry),
            exit: Some(prof::noop_exit),
            noop: true,
        }
    } else {
        Handlers {
            entry: Some(prof::on_entry),
            exit: Some(prof::on_exit),
            noop: false,
        }
    };
    let mut libs = Libs {
        plain: Lib::load(env!("FPROBE_SQLITE_PLAIN")),
        instr: Lib::load(env!("FPROBE_SQLITE_INSTR")),
        wrapped: Lib::load(env!("FPROBE_SQLITE_WRAPPED")),
        patch: Lib::load(env!("FPROBE_SQLITE_PATCH")),
        patch_funcs: Vec::new(),
        patch_extra: Vec::new(),
        wrapped_shift: 0,
    };
    // Same object file, so the same symbol values: the copies differ by
    // their load bias only.
    libs.wrapped_shift = libs
        .wrapped
        .sym("sqlite3_open")
        .wrapping_sub(libs.instr.sym("sqlite3_open"));
    assert_eq!(
        libs.instr
            .sym("sqlite3_exec")
            .wrapping_add(libs.wrapped_shift),
        libs.wrapped.sym("sqlite3_exec")
    );
    // Each copy initialises itself (sqlite3_initialize) on first use: do
    // that outside the measured runs, with nothing attached.
    for lib in [&libs.plain, &libs.instr, &libs.wrapped, &libs.patch] {
        sqlite::workload(lib, 1, 100);
    }
    let funcs = functions(&libs.instr.path, &libs.instr);
    (libs.patch_funcs, libs.patch_extra) = patch_functions(&libs.patch, &funcs);
    if let Some(path) = record_trace {
        record(&libs, rows, &path);
        return;
    }
    if let Some(secs) = stress_patch {
        let fs: Vec<u64> = libs.patch_funcs.iter().map(|&(f, _)| f).collect();
        stress::run(&libs.plain, &libs.patch, &fs, secs, rows);
        return;
    }
    // What the process's first attach would do besides patching (read
    // the objects, make the stubs), done and timed ahead.
    let prepare_ms = modes
        .iter()
        .any(|m| matches!(m, Mode::Patch | Mode::PatchC))
        .then(|| {
            let fs: Vec<u64> = libs.patch_funcs.iter().map(|&(f, _)| f).collect();
            let t0 = Instant::now();
            fprobe_patch::prepare(&fs).expect("prepare every patchable function");
            t0.elapsed().as_secs_f64() * 1e3
        });
    prof::NFUNCS.store(
        funcs.len() + libs.patch_extra.len(),
        std::sync::atomic::Ordering::Relaxed,
    );
    let tpn = prof::calibrate(100);
    println!(
        "SQLite amalgamation, {} functions probed (every sized function symbol of {})",
        funcs.len(),
        libs.instr.path.rsplit('/').next().unwrap()
    );
    println!(
        "workload: per thread, {rows} rows inserted, an index, 200 range aggregates, 7 joins, an UPDATE, a LIKE scan; {reps} runs per cell, median; {cores} cores"
    );

    let mut last_fprobe: Option<Run> = None;
    let mut last_patch: Option<Run> = None;
    let mut last_map_calls = 0u64;
    for &t in &threads {
        let mut walls: HashMap<&'static str, Vec<f64>> = HashMap::new();
        let mut checksum = None;
        let mut calls = 0u64;
        let mut patch_calls = 0u64;
        let mut reg_ms = Vec::new();
        let (mut attach_ms, mut detach_ms) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            for mode in Mode::ALL {
                if !modes.contains(&mode) {
                    continue;
                }
                let r = run(&libs, &funcs, handlers, mode, t, rows);
                match checksum {
                    None => checksum = Some(r.checksum),
                    Some(c) => assert_eq!(c, r.checksum, "{mode:?}: same results"),
                }
                walls
                    .entry(mode.name())
                    .or_default()
                    .push(r.wall.as_secs_f64());
                if mode == Mode::Fprobe {
                    let p = r.probe.expect("probe stats");
                    if !noop {
                        calls = r.stats.iter().map(|s| s.calls).sum();
                        assert_eq!(p.hits, calls, "every call reached the handler once");
                    } else {
                        calls = p.hits;
                    }
                    reg_ms.push(r.register.as_secs_f64() * 1e3);
                    last_fprobe = Some(r);
                } else if matches!(mode, Mode::Patch | Mode::PatchC) {
                    let p = r.probe.expect("probe stats");
                    let seen = if noop {
                        p.hits
                    } else {
                        r.stats.iter().map(|s| s.calls).sum()
                    };
                    if mode == Mode::PatchC && modes.contains(&Mode::Patch) {
                        assert_eq!(seen, patch_calls, "both patch modes saw every call");
                    }
                    patch_calls = seen;
                    assert_eq!(
                        p.hits, patch_calls,
                        "every patched call reached the handler once"
                    );
                    assert_eq!(
                        p.exits, p.hits,
                        "every patched call returned through its exit"
                    );
                    attach_ms.push(r.register.as_secs_f64() * 1e3);
                    detach_ms.push(r.detach.as_secs_f64() * 1e3);
                    last_patch = Some(r);
                } else if mode == Mode::LockedHashMap {
                    last_map_calls = r.stats.iter().map(|s| s.calls).sum();
                    if modes.contains(&Mode::Fprobe) && !noop {
                        assert_eq!(last_map_calls, calls, "both dispatchers saw every call");
                    }
                }
            }
        }
        let med = |m: Mode| walls.get(m.name()).map_or(f64::NAN, |v| stats::median(v));
        let plain = med(Mode::Plain);
        let map = med(Mode::LockedHashMap);
        println!();
        println!(
            "threads: {t}; probed calls per run: {calls} (locked-HashMap run: {last_map_calls}); register {} functions: {:.2} ms (median)",
            funcs.len(),
            stats::median(&reg_ms)
        );
        println!(
            "  {:<32} {:>10} {:>11} {:>13} {:>12}",
            "build / dispatcher", "wall (ms)", "vs plain", "ns/call extra", "vs HashMap"
        );
        for mode in Mode::ALL {
            let w = med(mode);
            let c = match mode {
                Mode::PatchDetached | Mode::Patch | Mode::PatchC => patch_calls,
                _ => calls,
            };
            let per_call = if matches!(mode, Mode::Plain) || c == 0 {
                "-".to_string()
            } else {
                // Extra wall time per probed call, per thread.
                format!("{:.1}", (w - plain) * 1e9 * t as f64 / c as f64)
            };
            println!(
                "  {:<32} {:>10.1} {:>10.2}x {:>13} {:>11.2}x",
                mode.name(),
                w * 1e3,
                w / plain,
                per_call,
                w / map
            );
        }
        if !attach_ms.is_empty() {
            println!(
                "  patch: {} functions attached in {:.2} ms (at most {:.2}; prepared ahead in \
                 {:.2} ms: objects read, stubs made), detached in {:.2} ms (medians, the detach's \
                 grace period included); {patch_calls} calls per run",
                libs.patch_funcs.len(),
                stats::median(&attach_ms),
                attach_ms.iter().copied().fold(0.0, f64::max),
                prepare_ms.unwrap_or(f64::NAN),
                stats::median(&detach_ms)
            );
        }
    }

    if let Some(r) = last_fprobe.filter(|_| !noop) {
        let p = r.probe.unwrap();
        println!();
        println!(
            "probe counters (last fprobe run): hits {}, exits {}, missed: recursion {}, depth {}, disabled {}",
            p.hits, p.exits, p.missed_recursion, p.missed_depth, p.missed_disabled
        );
        let hit = r.stats.iter().filter(|s| s.calls > 0).count();
        println!(
            "profile (last fprobe run): {hit} of {} probed functions called; top {top} by calls:",
            funcs.len()
        );
        report(&funcs, &r.stats, tpn, top);
        if let Some(pr) = last_patch.as_ref() {
            compare(&funcs, &libs.patch_extra, &r.stats, &pr.stats);
        }
    }
}

/// The two builds' per-function call counts side by side: the
/// instrumented build's hooks run in inlined copies too, the patched
/// build's entries only for real calls, so a function the compiler
/// inlined somewhere counts more calls there.
fn compare(funcs: &[Func], extra: &[String], instr: &[Stat], patch: &[Stat]) {
    let calls = |s: &[Stat], i: usize| s.get(i).map_or(0, |s| s.calls);
    let (mut same, mut fewer, mut more, mut both) = (0, 0, 0, 0);
    let mut worst: Vec<(u64, u64, &str)> = Vec::new();
    for (i, f) in funcs.iter().enumerate() {
        let (a, b) = (calls(instr, i), calls(patch, i));
        if a == 0 && b == 0 {
            continue;
        }
        both += 1;
        match b.cmp(&a) {
            std::cmp::Ordering::Equal => same += 1,
            std::cmp::Ordering::Less => fewer += 1,
            std::cmp::Ordering::Greater => more += 1,
        }
        if a != b {
            worst.push((a, b, &f.name));
        }
    }
    let only_patch: u64 = (0..extra.len())
        .map(|k| calls(patch, funcs.len() + k))
        .sum();
    worst.sort_by_key(|&(a, b, _)| std::cmp::Reverse(a.abs_diff(b)));
    println!();
    println!(
        "patched vs instrumented build, per function (last runs): {both} functions called; \
         {same} with the same count, {fewer} with fewer calls patched (inlined where the \
         instrumented build still counts them), {more} with more; {only_patch} calls to {} \
         functions only the patched build has; largest differences:",
        extra.len()
    );
    for (a, b, name) in worst.iter().take(5) {
        println!("  {name}: instrumented {a}, patched {b}");
    }
    // The instrumented build counts every call, inlined or not; the
    // patched one can only miss calls, never invent them.
    assert_eq!(
        more, 0,
        "a function had more real calls patched than calls instrumented"
    );
}
