//! What `--bench churn` and `--bench churn-peers` share: the map interface
//! their writers churn, the two writers, fprobe's side of it, and one
//! measured phase (a reader with a writer idle or running).

use crate::report::md;
use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fprobe::{AddrIndex, EntryId};

use crate::config::Config;
use crate::harness::{self, Samples};
use crate::impls::BATCH;
use crate::report;
use crate::row::Row;
use crate::stats;

/// A map whose readers a churn benchmark measures and whose writer churns
/// it: `address → values`.
pub trait Churned: Sync {
    /// Looks up every address of `addrs`, returns the sum of their values.
    fn read(&self, addrs: &[u64]) -> u64;
    /// Adds value `v` to `a` (creating the address); returns what
    /// [`Churned::remove`] needs to remove exactly this value.
    fn insert(&self, a: u64, v: u64) -> u64;
    /// Removes the value `insert` returned `token` for; the address goes
    /// when its last value does.
    fn remove(&self, a: u64, token: u64);
}

/// What a writer loop needs: a shared [`Churned`] map, or a map the writer
/// owns or holds locked (the private control of `--bench churn`, the
/// `RwLock<hashbrown>` peer of `--bench churn-peers`).
pub trait Writes {
    fn insert(&mut self, a: u64, v: u64) -> u64;
    fn remove(&mut self, a: u64, token: u64);
}

impl<M: Churned + ?Sized> Writes for &M {
    fn insert(&mut self, a: u64, v: u64) -> u64 {
        Churned::insert(*self, a, v)
    }
    fn remove(&mut self, a: u64, token: u64) {
        Churned::remove(*self, a, token)
    }
}

impl Writes for hashbrown::HashMap<u64, Vec<u64>> {
    fn insert(&mut self, a: u64, v: u64) -> u64 {
        self.entry(a).or_default().push(v);
        v
    }
    fn remove(&mut self, a: u64, v: u64) {
        let vals = self.get_mut(&a).expect("inserted above");
        let i = vals.iter().rposition(|&x| x == v).expect("value present");
        vals.remove(i);
        if vals.is_empty() {
            self.remove(&a);
        }
    }
}

/// fprobe's index: `get` under one read guard per batch, `insert`,
/// `remove(addr, id)`.
pub struct Fprobe(pub AddrIndex<u64>);

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
            .remove(a, EntryId::from_u64(token))
            .expect("inserted above");
    }
}

/// When a writer loop may run its next operation: until `stop`, held while
/// `paused` is set (the alternating benchmark's "off" windows), and at most
/// `rate` operations per second of running time.
pub struct Gate<'a> {
    stop: &'a AtomicBool,
    paused: Option<&'a AtomicBool>,
    rate: f64,
    /// Start of the current run of operations, and the count at that start.
    t0: Instant,
    base: u64,
}

impl<'a> Gate<'a> {
    /// Runs until `stop`, flat out.
    pub fn new(stop: &'a AtomicBool) -> Self {
        Self {
            stop,
            paused: None,
            rate: f64::INFINITY,
            t0: Instant::now(),
            base: 0,
        }
    }

    /// Runs until `stop`, holding while `paused` is set.
    pub fn alternating(stop: &'a AtomicBool, paused: &'a AtomicBool) -> Self {
        Self {
            paused: Some(paused),
            ..Self::new(stop)
        }
    }

    /// At most `rate` operations per second while running.
    pub fn paced(mut self, rate: f64) -> Self {
        self.rate = rate;
        self
    }

    /// Waits while paused (spinning: the writer's CPU stays busy either
    /// way) and while `ops` is ahead of the rate; `false` once stopped.
    pub fn next(&mut self, ops: u64) -> bool {
        // Relaxed: stop and pause requests, polled.
        if let Some(paused) = self.paused {
            if paused.load(Ordering::Relaxed) {
                while paused.load(Ordering::Relaxed) {
                    if self.stop.load(Ordering::Relaxed) {
                        return false;
                    }
                    std::hint::spin_loop();
                }
                // The pace counts running time only: no burst to catch up
                // on the paused window.
                (self.t0, self.base) = (Instant::now(), ops);
            }
        }
        if self.rate.is_finite() {
            while (ops - self.base) as f64 > self.rate * self.t0.elapsed().as_secs_f64() {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        !self.stop.load(Ordering::Relaxed)
    }
}

/// Inserts fresh addresses above the read set (`top`) and removes the
/// oldest once 4,096 are in, while `gate` lets it; returns the number of
/// operations.
pub fn churn_disjoint(w: &mut impl Writes, top: u64, gate: Gate) -> u64 {
    churn_window(w, top, u64::MAX, gate)
}

/// [`churn_disjoint`] over a pool of `pool` addresses above the read set,
/// taken in turn and again: after the first pass every address inserted
/// has been in the map before (a probe attached and detached over a
/// process's functions, rather than over addresses never seen).
pub fn churn_recycled(w: &mut impl Writes, top: u64, pool: u64, gate: Gate) -> u64 {
    churn_window(w, top, pool, gate)
}

fn churn_window(w: &mut impl Writes, top: u64, pool: u64, mut gate: Gate) -> u64 {
    const WINDOW: usize = 4096;
    assert!(pool > WINDOW as u64, "the pool must exceed the live window");
    let mut live: VecDeque<(u64, u64)> = VecDeque::with_capacity(WINDOW + 1);
    let (base, mut i, mut ops) = ((top & !15) + 0x1000, 0u64, 0u64);
    while gate.next(ops) {
        let next = base + (i % pool) * 16;
        live.push_back((next, w.insert(next, next)));
        i += 1;
        ops += 1;
        if live.len() > WINDOW {
            let (a, token) = live.pop_front().expect("non-empty");
            w.remove(a, token);
            ops += 1;
        }
    }
    for (a, token) in live {
        w.remove(a, token);
    }
    ops
}

/// Adds a value to each hot address in turn and removes it again, while
/// `gate` lets it.
pub fn churn_hot(w: &mut impl Writes, hot: &[u64], mut gate: Gate) -> u64 {
    let (mut ops, mut k) = (0u64, 0);
    while gate.next(ops) {
        let a = hot[k];
        let token = w.insert(a, 7);
        w.remove(a, token);
        ops += 2;
        k = (k + 1) % hot.len();
    }
    ops
}

/// One phase: one reader, `read` over `stream` in batches of [`BATCH`],
/// measured by the sampler on the first CPU, while `writer` (if any) runs on
/// its own thread on the next CPU until the sampler is done. Returns the
/// reader's samples and the writer's operations per second.
fn phase(
    cfg: &Config,
    stream: &[u64],
    read: &(dyn Fn(&[u64]) -> u64 + Sync),
    writer: Option<&(dyn Fn(Gate) -> u64 + Sync)>,
) -> (Samples, f64) {
    let stop_writer = AtomicBool::new(false);
    let ops = AtomicU64::new(0);
    let t0 = Instant::now();
    let samples = std::thread::scope(|s| {
        if let Some(writer) = writer {
            let (stop_writer, ops) = (&stop_writer, &ops);
            let cpu = cfg.cpus.get(1 % cfg.cpus.len().max(1)).copied();
            s.spawn(move || {
                if let Some(cpu) = cpu {
                    harness::pin_to(cpu);
                }
                // Relaxed: read after the scope joins this thread.
                ops.store(writer(Gate::new(stop_writer)), Ordering::Relaxed);
            });
        }
        let samples = harness::run_producers(1, 0, &cfg.cpus, cfg.timing, |_, counter, stop| {
            let mut pos = 0;
            let mut acc = 0u64;
            // Relaxed: polled once per batch.
            while !stop.load(Ordering::Relaxed) {
                acc = acc.wrapping_add(read(black_box(&stream[pos..pos + BATCH])));
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

/// The reader with the writer idle: its samples.
pub fn idle(cfg: &Config, stream: &[u64], read: &(dyn Fn(&[u64]) -> u64 + Sync)) -> Samples {
    phase(cfg, stream, read, None).0
}

/// One churning phase as measured.
pub struct Churning {
    /// The reader's samples.
    pub samples: Samples,
    /// The writer's operations per second.
    pub writes: f64,
    /// Core-to-core round trip between the reader's and the writer's CPUs,
    /// in ns: the larger of the one measured just before the phase and the
    /// one just after it ([`round_trip_ns`]); `None` without two CPUs.
    pub round_trip: Option<f64>,
}

/// The reader while `writer` runs, with the round trip measured around it.
pub fn churning(
    cfg: &Config,
    stream: &[u64],
    read: &(dyn Fn(&[u64]) -> u64 + Sync),
    writer: &(dyn Fn(Gate) -> u64 + Sync),
) -> Churning {
    let before = round_trip_ns(&cfg.cpus);
    let (samples, writes) = phase(cfg, stream, read, Some(writer));
    let after = round_trip_ns(&cfg.cpus);
    Churning {
        samples,
        writes,
        round_trip: before.zip(after).map(|(b, a)| b.max(a)),
    }
}

/// Says on stderr how the reader did in an idle phase: `label` (the
/// benchmark and variant), the round (counted from 0) and the reader's
/// median rate.
pub fn report_idle(cfg: &Config, label: &str, round: usize, s: &Samples) {
    cfg.progress.line(format_args!(
        "  {label} round {}  writer idle      reader {:>8.2} M/s",
        round + 1,
        s.median() / 1e6
    ));
}

impl Churning {
    /// Says on stderr how the phase went, as [`report_idle`] does for an
    /// idle one, then the writer's rate, `extra` (empty, or more figures
    /// each led by `, `) and the round trip.
    pub fn report(&self, cfg: &Config, label: &str, round: usize, extra: &str) {
        cfg.progress.line(format_args!(
            "  {label} round {}  writer churning  reader {:>8.2} M/s, writer {:.3} M ops/s{extra}, round trip {} ns",
            round + 1,
            self.samples.median() / 1e6,
            self.writes / 1e6,
            or_dash(self.round_trip, 0)
        ));
    }
}

/// Length of one window of an alternating phase, and the part at its start
/// whose lookups are not counted (the writer stopping or starting, its
/// retirements of the window before still being reclaimed: 1 ms of
/// coalescing and a grace period).
pub const WINDOW: Duration = Duration::from_millis(20);
pub const GUARD: Duration = Duration::from_millis(3);

/// Running windows per alternating phase: about a second per phase.
pub const PAIRS: usize = 25;

/// One alternating phase: the reader's rate in every window, the writer off
/// and on in turn, with the round trip measured around the phase.
pub struct Alternation {
    /// Lookups per second of the windows with the writer held, `pairs + 1`
    /// of them: one before and one after every `on` window.
    pub off: Vec<f64>,
    /// Lookups per second of the windows with the writer running.
    pub on: Vec<f64>,
    /// The writer's operations per second of running time.
    pub writes: f64,
    /// As [`Churning::round_trip`].
    pub round_trip: Option<f64>,
}

impl Alternation {
    /// Every `on` window ÷ the mean of the two `off` windows around it.
    pub fn ratios(&self) -> impl Iterator<Item = f64> + '_ {
        self.on
            .iter()
            .enumerate()
            .map(|(i, on)| on / ((self.off[i] + self.off[i + 1]) / 2.0))
    }
}

/// One reader on the first CPU and `writer` on the next, the writer held
/// and let run in turn every [`WINDOW`]: off, on, off, …, off (`pairs` on
/// windows), after one uncounted off window while the writer thread starts.
/// The writer is started once and keeps its state (its window of live
/// addresses, its pace) across the pauses, and it spins while held, so
/// the two kinds of window differ only in its index operations; the
/// shared machine's slower drifts (a host moving vCPUs, other tenants'
/// load), which last seconds, fall on both alike.
pub fn alternating(
    cfg: &Config,
    stream: &[u64],
    read: &(dyn Fn(&[u64]) -> u64 + Sync),
    writer: &(dyn Fn(Gate) -> u64 + Sync),
    pairs: usize,
) -> Alternation {
    let before = round_trip_ns(&cfg.cpus);
    let (stop, paused) = (AtomicBool::new(false), AtomicBool::new(true));
    let (off, on, ops, on_time) = std::thread::scope(|s| {
        let writer_cpu = cfg.cpus.get(1 % cfg.cpus.len().max(1)).copied();
        let (stop, paused) = (&stop, &paused);
        let w = s.spawn(move || {
            if let Some(cpu) = writer_cpu {
                harness::pin_to(cpu);
            }
            writer(Gate::alternating(stop, paused))
        });
        let r = s.spawn(|| {
            if let Some(&cpu) = cfg.cpus.first() {
                harness::pin_to(cpu);
            }
            let (mut pos, mut acc) = (0, 0u64);
            let (mut off, mut on, mut on_time) = (Vec::new(), Vec::new(), Duration::ZERO);
            for w in 0..2 * pairs + 2 {
                // Window 0 is the uncounted start; then off, on, …, off.
                let running = w % 2 == 0 && w > 0;
                // Relaxed: the writer polls it; a window's first GUARD
                // covers the time it takes to notice.
                paused.store(!running, Ordering::Relaxed);
                let start = Instant::now();
                let (mut t, mut counted_from, mut n) = (start, None, 0u64);
                while t < start + WINDOW {
                    acc = acc.wrapping_add(read(black_box(&stream[pos..pos + BATCH])));
                    pos = (pos + BATCH) % stream.len();
                    t = Instant::now();
                    match counted_from {
                        Some(_) => n += 1,
                        None if t >= start + GUARD => counted_from = Some(t),
                        None => {}
                    }
                }
                let rate = counted_from.map_or(f64::NAN, |c| {
                    (n * BATCH as u64) as f64 / (t - c).as_secs_f64()
                });
                match (w, running) {
                    (0, _) => {}
                    (_, true) => {
                        on.push(rate);
                        on_time += t - start;
                    }
                    (_, false) => off.push(rate),
                }
            }
            // Relaxed: the scope joins the writer.
            stop.store(true, Ordering::Relaxed);
            black_box(acc);
            (off, on, on_time)
        });
        let (off, on, on_time) = r.join().expect("reader panicked");
        (off, on, w.join().expect("writer panicked"), on_time)
    });
    let after = round_trip_ns(&cfg.cpus);
    Alternation {
        off,
        on,
        writes: ops as f64 / on_time.as_secs_f64(),
        round_trip: before.zip(after).map(|(b, a)| b.max(a)),
    }
}

/// Round trips timed by [`round_trip_ns`] (after as many again unrecorded):
/// 1.3 ms at 65 ns a round trip, 6.6 ms at 330.
const ROUND_TRIPS: u64 = 20_000;

/// Time for one cache line to go from the reader's CPU (`cpus[0]`) to the
/// writer's (`cpus[1]`) and back, in ns: two threads pinned there take turns
/// to store to one line, each waiting to see the other's store. `None` with
/// fewer than two CPUs or if either thread cannot be pinned.
///
/// A reader pays about half of it for each line the writer changed under it.
/// On a virtual machine it need not be a constant: the host may place the
/// two vCPUs far apart for stretches of seconds, and the round trip grows
/// several-fold then (see BENCHMARKS.md). Every line the writer and the
/// reader share costs that much more then, so the churn benchmarks record
/// it per phase.
pub fn round_trip_ns(cpus: &[usize]) -> Option<f64> {
    #[repr(align(128))]
    struct Line(AtomicU64);
    let (&a, &b) = (cpus.first()?, cpus.get(1)?);
    let line = Line(AtomicU64::new(0));
    let pinned = [AtomicBool::new(false), AtomicBool::new(false)];
    let start = std::sync::Barrier::new(2);
    let total = 2 * ROUND_TRIPS;
    // Both threads pin themselves, meet at the barrier, and go on only if
    // both were pinned (Relaxed: the barrier orders the flags).
    let ready = |me: usize, cpu: usize| {
        pinned[me].store(harness::pin_to(cpu), Ordering::Relaxed);
        start.wait();
        pinned.iter().all(|p| p.load(Ordering::Relaxed))
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            if !ready(1, b) {
                return;
            }
            // Acquire/Release: a hand-off between two threads; the ordering is
            // not what is measured, the line's trip is.
            for i in 0..total {
                while line.0.load(Ordering::Acquire) != 2 * i + 1 {
                    std::hint::spin_loop();
                }
                line.0.store(2 * i + 2, Ordering::Release);
            }
        });
        s.spawn(|| {
            if !ready(0, a) {
                return None;
            }
            let mut t0 = Instant::now();
            for i in 0..total {
                if i == ROUND_TRIPS {
                    t0 = Instant::now();
                }
                // Acquire/Release: as in the echo loop.
                line.0.store(2 * i + 1, Ordering::Release);
                while line.0.load(Ordering::Acquire) != 2 * i + 2 {
                    std::hint::spin_loop();
                }
            }
            Some(t0.elapsed().as_nanos() as f64 / ROUND_TRIPS as f64)
        })
        .join()
        .expect("timing thread")
    })
}

/// A variant's (or a map's) phases, pooled over the rounds.
#[derive(Default)]
pub struct Pooled {
    pub idle: Samples,
    pub churn: Vec<Churning>,
}

/// How far apart the reader's and the writer's CPUs were in a churning
/// phase (see [`near_cutoff`]).
#[derive(Clone, Copy, PartialEq)]
pub enum Placement {
    Near,
    Far,
}

impl Placement {
    /// Far when the phase's round trip exceeds `cutoff`; near otherwise,
    /// and when either is unknown.
    fn of(round_trip: Option<f64>, cutoff: Option<f64>) -> Self {
        match (round_trip, cutoff) {
            (Some(rt), Some(cut)) if rt > cut => Placement::Far,
            _ => Placement::Near,
        }
    }
}

impl Pooled {
    fn placement(c: &Churning, cutoff: Option<f64>) -> Placement {
        Placement::of(c.round_trip, cutoff)
    }

    /// The churning phases' samples pooled, all of them or only those of
    /// one placement.
    fn churn_samples(&self, only: Option<(Placement, Option<f64>)>) -> Samples {
        let mut out = Samples::default();
        for c in &self.churn {
            if only.is_none_or(|(p, cut)| Self::placement(c, cut) == p) {
                out.extend(c.samples.clone());
            }
        }
        out
    }

    /// The churning samples of every phase.
    pub fn churned(&self) -> Samples {
        self.churn_samples(None)
    }

    /// Churn ÷ idle: the medians of the pooled samples.
    pub fn ratio(&self) -> f64 {
        self.churned().median() / self.idle.median()
    }

    /// Churn ÷ idle over the phases of `placement` only, and how many they
    /// are (the ratio is NaN when there are none).
    pub fn ratio_at(&self, placement: Placement, cutoff: Option<f64>) -> (f64, usize) {
        let n = self
            .churn
            .iter()
            .filter(|c| Self::placement(c, cutoff) == placement)
            .count();
        let s = self.churn_samples(Some((placement, cutoff)));
        (s.median() / self.idle.median(), n)
    }

    /// The reader's rate with the writer idle and churning, each as
    /// "mean ± sd" in M lookups/s, for a report row.
    pub fn rate_cells(&self) -> [String; 2] {
        let cell = |s: &Samples| format!("{:.2} ± {:.2}", s.mean() / 1e6, s.stddev() / 1e6);
        [cell(&self.idle), cell(&self.churned())]
    }

    /// The writer's operations per second, median over the phases.
    pub fn writes(&self) -> f64 {
        stats::median(&self.churn.iter().map(|c| c.writes).collect::<Vec<_>>())
    }

    /// The round trip, median over the phases that measured one.
    pub fn round_trip(&self) -> Option<f64> {
        let rts: Vec<f64> = self.churn.iter().filter_map(|c| c.round_trip).collect();
        (!rts.is_empty()).then(|| stats::median(&rts))
    }

    /// Reader time lost per write, in ns, median over the phases of
    /// `placement` ([`median_lost_per_write`]).
    pub fn lost_per_write(&self, placement: Placement, cutoff: Option<f64>) -> Option<f64> {
        let idle = self.idle.median();
        median_lost_per_write(
            self.churn
                .iter()
                .filter(|c| Self::placement(c, cutoff) == placement)
                .map(|c| (c.samples.median() / idle, c.writes)),
        )
    }
}

/// The round trip above which a churning phase counts as [`Placement::Far`]:
/// three times the lowest round trip measured in the run (`None` when no
/// phase measured one). That separates a host's near placements of the two
/// vCPUs from a far one several times slower; a run that never left one
/// placement counts every phase as near.
pub fn near_cutoff<'a>(pools: impl IntoIterator<Item = &'a Pooled>) -> Option<f64> {
    cutoff_above(
        pools
            .into_iter()
            .flat_map(|p| p.churn.iter().filter_map(|c| c.round_trip)),
    )
}

/// Three times the lowest of `round_trips` (`None` when there is none):
/// the far/near boundary of [`near_cutoff`] and [`alternation_cutoff`].
fn cutoff_above(round_trips: impl Iterator<Item = f64>) -> Option<f64> {
    round_trips
        .min_by(f64::total_cmp)
        .map(|lowest| 3.0 * lowest)
}

/// Reader time lost per write, in ns, median over phases given as (churn ÷
/// idle, writes per second): `(1 − ratio) / writes`. Phases whose writer
/// ran below half a million operations a second are left out, where the
/// ratio's noise of a few percent divided by the small rate would swamp
/// the figure (at 10,000 ops/s, 1% reads as 1,000 ns a write); `None`
/// when none is left.
fn median_lost_per_write(phases: impl Iterator<Item = (f64, f64)>) -> Option<f64> {
    let per_phase: Vec<f64> = phases
        .filter(|&(_, writes)| writes >= 0.5e6)
        .map(|(ratio, writes)| (1.0 - ratio) / writes * 1e9)
        .collect();
    (!per_phase.is_empty()).then(|| stats::median(&per_phase))
}

/// `x` with `digits` decimals, or "—" for `None`/NaN.
pub fn or_dash(x: Option<f64>, digits: usize) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.digits$}"),
        _ => "—".into(),
    }
}

/// Headers of the cells [`summary_cells`] makes.
pub const SUMMARY_HEADERS: [&str; 5] = [
    "round trip ns, median (far phases)",
    "churn ÷ idle, all phases",
    "churn ÷ idle, near phases",
    "churn ÷ idle, far phases",
    "reader ns lost per write, near / far",
];

/// The placement-aware cells of one variant's row: round trip, the ratio
/// over all phases and over each placement, and the reader time lost per
/// write.
pub fn summary_cells(p: &Pooled, cutoff: Option<f64>) -> Vec<String> {
    let ratio = p.ratio();
    let (near, far) = (
        p.ratio_at(Placement::Near, cutoff),
        p.ratio_at(Placement::Far, cutoff),
    );
    let cell = |(r, n): (f64, usize)| {
        if n == 0 {
            "— (0)".to_string()
        } else {
            format!("{r:.3}× ({n})")
        }
    };
    vec![
        format!(
            "{} ({} of {})",
            or_dash(p.round_trip(), 0),
            far.1,
            p.churn.len()
        ),
        format!("{ratio:.3}×"),
        cell(near),
        cell(far),
        format!(
            "{} / {}",
            or_dash(p.lost_per_write(Placement::Near, cutoff), 1),
            or_dash(p.lost_per_write(Placement::Far, cutoff), 1)
        ),
    ]
}

/// Headers of the cells [`alternation_cells`] makes.
pub const ALTERNATION_HEADERS: [&str; 8] = [
    "reader M/s, writer held (median window)",
    "reader M/s, writer running",
    "writer M ops/s while running",
    "round trip ns, median (far phases)",
    "running ÷ held, paired windows (median)",
    "spread of the paired ratios (p25–p75)",
    "near phases / far phases",
    "reader ns lost per write, near / far",
];

/// The note printed under a table of [`alternation_cells`].
fn alternation_note() -> String {
    format!(
        "Each running window ÷ the mean of the held windows before and after it, the first \
         {} ms of every window uncounted; medians over all windows; the spread is the \
         25th–75th percentile of those ratios. Near / far phases as in --bench churn.\n",
        GUARD.as_millis()
    )
}

/// As [`near_cutoff`], over alternating phases.
pub fn alternation_cutoff(variants: &[&[Alternation]]) -> Option<f64> {
    cutoff_above(
        variants
            .iter()
            .flat_map(|v| v.iter().filter_map(|a| a.round_trip)),
    )
}

/// One variant's (or map's) cells under [`ALTERNATION_HEADERS`].
pub fn alternation_cells(phases: &[Alternation], cutoff: Option<f64>) -> Vec<String> {
    let far = |a: &Alternation| Placement::of(a.round_trip, cutoff) == Placement::Far;
    let ratios = |keep: &dyn Fn(&Alternation) -> bool| -> Vec<f64> {
        phases
            .iter()
            .filter(|a| keep(a))
            .flat_map(|a| a.ratios())
            .collect()
    };
    let all = ratios(&|_| true);
    let (near_r, far_r) = (ratios(&|a| !far(a)), ratios(&|a| far(a)));
    let n_far = phases.iter().filter(|a| far(a)).count();
    let writes = stats::median(&phases.iter().map(|a| a.writes).collect::<Vec<_>>());
    let lost = |keep: &dyn Fn(&Alternation) -> bool| {
        median_lost_per_write(
            phases
                .iter()
                .filter(|a| keep(a))
                .map(|a| (stats::median(&a.ratios().collect::<Vec<_>>()), a.writes)),
        )
    };
    let cell = |r: &[f64], n: usize| {
        if r.is_empty() {
            "— (0)".to_string()
        } else {
            let m = stats::median(r);
            format!("{m:.3}× ({n})")
        }
    };
    let rts: Vec<f64> = phases.iter().filter_map(|a| a.round_trip).collect();
    let m = stats::median(&all);
    let (held, running) = windows(phases);
    vec![
        format!("{:.2}", held.median() / 1e6),
        format!("{:.2}", running.median() / 1e6),
        format!("{:.3}", writes / 1e6),
        format!(
            "{} ({n_far} of {})",
            or_dash((!rts.is_empty()).then(|| stats::median(&rts)), 0),
            phases.len()
        ),
        format!("{m:.3}×"),
        format!(
            "{:.3}–{:.3}",
            stats::percentile(&all, 0.25),
            stats::percentile(&all, 0.75)
        ),
        format!(
            "{} / {}",
            cell(&near_r, phases.len() - n_far),
            cell(&far_r, n_far)
        ),
        format!(
            "{} / {}",
            or_dash(lost(&|a| !far(a)), 1),
            or_dash(lost(&|a| far(a)), 1)
        ),
    ]
}

/// Every held window and every running window of `phases`, pooled.
fn windows(phases: &[Alternation]) -> (Samples, Samples) {
    let pool = |kind: fn(&Alternation) -> &[f64]| Samples {
        rates: phases
            .iter()
            .flat_map(|a| kind(a).iter().copied())
            .collect(),
        unpinned: 0,
    };
    (pool(|a| &a.off), pool(|a| &a.on))
}

/// The CSV rows of one variant's (or map's) alternating phases: its held
/// and its running windows, as `"{imp}, writer held"` and `"{imp}, writer
/// running"`.
pub fn alternation_rows(
    bench: &'static str,
    variant: &str,
    addrs: usize,
    imp: &str,
    phases: &[Alternation],
) -> [Row; 2] {
    let (held, running) = windows(phases);
    [("writer held", held), ("writer running", running)].map(|(kind, s)| {
        Row::rate(
            bench,
            variant.into(),
            addrs,
            format!("{imp}, {kind}"),
            1,
            &s,
        )
    })
}

/// Prints an alternating benchmark's table, titled after `bench` and what
/// its writer is, and the note on how its ratios are made.
pub fn print_alternation_table(
    bench: &str,
    writer: &str,
    addrs: usize,
    headers: &[&str],
    body: &[Vec<String>],
) {
    report::print_table(
        &format!(
            "{bench}: reader M/s in {} ms windows, {writer} held and running in turn ({addrs} addresses)",
            WINDOW.as_millis()
        ),
        headers,
        body,
    );
    md!("{}", alternation_note());
}
