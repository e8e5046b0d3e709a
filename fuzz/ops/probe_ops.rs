//! The one `Op` definition and model checker for `probe::Registry`, shared
//! by the cargo-fuzz targets (`fuzz/fuzz_targets/probe_ops.rs` and
//! `probe_returns.rs`), the
//! property test (`tests/probe.rs`) and the stable corpus replay
//! (`tests/fuzz_replay.rs`).
//!
//! The model knows, for every `(on_entry, on_exit)` pair the engine
//! dispatches, which entry and exit handlers must run, in which order, with
//! which cookie and per-call data, given the registrations,
//! unregistrations, enables and disables before it; and what each probe's
//! counters (`Registry::stats`: hits, exits, misses by cause, panics, calls
//! in flight) must read. Handlers log every call; the log and the counters are compared with
//! the model after every step. The registry is tiny (4 probe slots, a
//! shadow stack a few words deep) so that every miss path runs; the model
//! counts the stack's words exactly as `probe/shadow.rs` lays them out.
//! Registries are also dropped and made anew between calls, and pairing
//! reset, with calls in flight; returns taken over by an engine are
//! handed back, or said lost, as the model predicts.
//!
//! Handler panics are raised with `resume_unwind`, which skips the panic
//! hook: the fuzzer's hook aborts on any real panic, and the registry must
//! contain these ones.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use arbitrary::{Arbitrary, Unstructured};
use fprobe::Error;
use fprobe::probe::{
    EntryAction, Fprobe, ProbeHandle, ProbeStats, Registry, ignore_current_thread,
};

const MAX_PROBES: usize = 4;

/// What an entry handler does after logging its call.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Continue,
    SkipExit,
    Panic,
}

/// A probe to register.
#[derive(Arbitrary, Clone, Debug)]
pub struct ProbeSpec {
    /// `None`: no entry handler.
    entry: Option<EntryKind>,
    /// `None`: no exit handler; `Some(true)`: one that panics.
    exit: Option<bool>,
    /// Per-call data; above the registry's the registration must fail.
    data_size: u8,
    /// The handlers call this (probed or not) address themselves.
    recurse: Option<u8>,
    /// `(address, cookie)` pairs; duplicates attach twice.
    attach: Vec<(u8, u8)>,
}

/// One operation.
#[derive(Arbitrary, Clone, Debug)]
pub enum Op {
    Register(ProbeSpec),
    Unregister(u8),
    Enable(u8),
    Disable(u8),
    /// `on_entry` on the test thread.
    Entry(u8),
    /// `on_entry_for_exit` on the test thread: a frame only for a call
    /// with an exit handler to run (its answer is checked).
    EntryForExit(u8),
    /// `on_exit` on the test thread.
    Exit,
    /// A whole call (`on_entry` + `on_exit`) on a fresh thread.
    CallOnOtherThread(u8),
    Ignore(bool),
    Stats,
    /// `Registry::reset_pairing`.
    ResetPairing,
    /// Drops the registry (calls may be in flight) and makes a new one.
    Recreate,
    /// `Registry::drain` with no wait: disables the probe; the test
    /// thread's own calls in flight are not waited for, and no other
    /// thread has one, so it reports none left (it forgets the test
    /// thread's frames after a pairing reset, as a dispatch would).
    Drain(u8),
}

/// An [`Op`], or a call of an engine that takes returns over (the
/// `probe_returns` target; `probe_ops` keeps to [`Op`], so that its corpus
/// decodes as it was found).
#[derive(Arbitrary, Clone, Debug)]
pub enum Step {
    Op(Op),
    /// `on_entry_taking_return` on the test thread at address `.0` with
    /// its return address at stack address [`sp`]`(.1)` (its answer is
    /// checked).
    EntryTakingReturn(u8, u8),
    /// `on_return` at stack address [`sp`]`(.0)` (its answer is checked).
    Return(u8),
}

/// Maps a fuzzed byte to an address: a small space, with 0 and `u64::MAX`.
pub fn addr(a: u8) -> u64 {
    match a % 8 {
        0 => 0,
        1 => u64::MAX,
        n => 0x40_1000 + u64::from(n) * 16,
    }
}

/// Maps a fuzzed byte to a stack address: lower for deeper calls.
pub fn sp(s: u8) -> u64 {
    0x7fff_0000 - 16 * u64::from(s % 16)
}

/// The return address an entry with its return at `sp` hands over.
fn ret_at(sp: u64) -> u64 {
    sp ^ 0x5a5a_0000_0000
}

/// A handler call as the handlers log it and the model predicts it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Event {
    Entry {
        probe: usize,
        addr: u64,
        cookie: u64,
        data_len: usize,
    },
    Exit {
        probe: usize,
        addr: u64,
        cookie: u64,
        data_ok: bool,
    },
}

/// The per-call data an entry handler of `probe` writes at `addr`.
fn pattern(probe: usize, addr: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (addr as u8) ^ (probe as u8).wrapping_mul(31) ^ i as u8)
        .collect()
}

/// A panic payload the registry must contain.
struct DeliberatePanic;

type Log = Arc<Mutex<Vec<Event>>>;
type RegCell = Arc<Mutex<Weak<Registry<()>>>>;

/// Calls `addr` from inside a handler: the registry must count a recursion
/// miss per probe attached there and run nothing.
fn nested_call(reg: &RegCell, addr: u64) {
    let r = reg.lock().unwrap().upgrade();
    if let Some(r) = r {
        r.on_entry(addr, 0, &());
        r.on_exit(0, &());
    }
}

fn build_probe(
    id: usize,
    spec: &ProbeSpec,
    log: &Log,
    reg: &RegCell,
    alive: &Arc<AtomicUsize>,
) -> Fprobe<()> {
    let mut b = Fprobe::builder().data_size(usize::from(spec.data_size));
    let recurse = spec.recurse.map(addr);
    let token = DropToken::new(alive);
    if let Some(kind) = spec.entry {
        let (log, reg, token) = (log.clone(), reg.clone(), token.clone());
        b = b.entry(move |e| {
            let _ = &token;
            log.lock().unwrap().push(Event::Entry {
                probe: id,
                addr: e.addr,
                cookie: e.cookie,
                data_len: e.data.len(),
            });
            let p = pattern(id, e.addr, e.data.len());
            e.data.copy_from_slice(&p);
            if let Some(a) = recurse {
                nested_call(&reg, a);
            }
            match kind {
                EntryKind::Continue => EntryAction::Continue,
                EntryKind::SkipExit => EntryAction::SkipExit,
                EntryKind::Panic => std::panic::resume_unwind(Box::new(DeliberatePanic)),
            }
        });
    }
    if let Some(panics) = spec.exit {
        let (log, reg) = (log.clone(), reg.clone());
        let check_data = spec.entry.is_some();
        b = b.exit(move |x| {
            let _ = &token;
            let data_ok = !check_data || x.data == pattern(id, x.addr, x.data.len());
            log.lock().unwrap().push(Event::Exit {
                probe: id,
                addr: x.addr,
                cookie: x.cookie,
                data_ok,
            });
            if let Some(a) = recurse {
                nested_call(&reg, a);
            }
            if panics {
                std::panic::resume_unwind(Box::new(DeliberatePanic));
            }
        });
    }
    b.build()
}

/// Counts live handler closures, so the test can check every probe is
/// dropped once the registry is gone and the RCU has reclaimed everything.
#[derive(Clone)]
struct DropToken(#[allow(dead_code)] Arc<DropTokenInner>);
struct DropTokenInner(Arc<AtomicUsize>);

impl DropToken {
    fn new(alive: &Arc<AtomicUsize>) -> Self {
        alive.fetch_add(1, Ordering::Relaxed);
        DropToken(Arc::new(DropTokenInner(alive.clone())))
    }
}

impl Drop for DropTokenInner {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Expected counters of one probe.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counters {
    hits: u64,
    exits: u64,
    recursion: u64,
    depth: u64,
    disabled: u64,
    unwound: u64,
    panics: u64,
}

impl Counters {
    fn of(s: &ProbeStats) -> Self {
        Counters {
            hits: s.hits,
            exits: s.exits,
            recursion: s.missed.recursion,
            depth: s.missed.depth,
            disabled: s.missed.disabled,
            unwound: s.missed.unwound,
            panics: s.panics,
        }
    }
}

struct ModelProbe {
    handle: ProbeHandle,
    spec: ProbeSpec,
    alive: bool,
    /// Its registry was dropped: its handle means nothing any more.
    gone: bool,
    enabled: bool,
    counters: Counters,
}

/// One kept exit handler: its probe, address and cookie.
#[derive(Clone, Copy, Debug)]
struct Inst {
    probe: usize,
    addr: u64,
    cookie: u64,
}

/// One call on a thread's shadow stack.
struct Frame {
    /// Words it takes (its frame and the bare word above it; 0 for a bare
    /// call, which only counts in the bare word below).
    words: usize,
    /// Kept exit handlers, oldest first (none: a bare call).
    insts: Vec<Inst>,
    /// The stack address of the return it took, if any.
    sp: Option<u64>,
}

/// One thread's dispatch state.
#[derive(Default)]
struct ThreadModel {
    frames: Vec<Frame>,
    /// Index of the bare word.
    top: usize,
    /// `reset_pairing` was called since this thread's last dispatch.
    reset: bool,
    ignored: bool,
}

struct Model {
    probes: Vec<ModelProbe>,
    /// `(address, probe, cookie)` in registration order: the index's values.
    attached: Vec<(u64, usize, u64)>,
    /// Words of a thread's shadow stack.
    cap: usize,
    events: Vec<Event>,
}

/// Words a probe's return entry takes (0: no exit handler).
fn frame_words(spec: &ProbeSpec) -> usize {
    if spec.exit.is_some() {
        usize::from(spec.data_size).div_ceil(8) + 3
    } else {
        0
    }
}

impl Model {
    fn at(&self, a: u64) -> Vec<(usize, u64)> {
        self.attached
            .iter()
            .filter(|x| x.0 == a)
            .map(|x| (x.1, x.2))
            .collect()
    }

    /// A nested call from a handler: recursion misses for every probe
    /// attached there (enabled or not), nothing runs; it counts as a bare
    /// call above the caller's reservation, and ends.
    fn nested(&mut self, recurse: Option<u8>) {
        if let Some(a) = recurse {
            for (p, _) in self.at(addr(a)) {
                self.probes[p].counters.recursion += 1;
            }
        }
    }

    /// The start of a top-level dispatch on `t`: after a pairing reset,
    /// the frames above the topmost one that took a return are dropped.
    fn begin(&self, t: &mut ThreadModel) {
        if t.reset {
            let keep = t.frames.iter().rposition(|f| f.sp.is_some());
            t.frames.truncate(keep.map_or(0, |k| k + 1));
            t.top = t.frames.iter().map(|f| f.words).sum();
            t.reset = false;
        }
    }

    fn push_bare(&self, t: &mut ThreadModel) {
        t.frames.push(Frame {
            words: 0,
            insts: Vec::new(),
            sp: None,
        });
    }

    fn on_entry(&mut self, t: &mut ThreadModel, a: u64) {
        self.entry(t, a, true, None);
    }

    /// An entry; `mark`: count a bare call when nothing is kept; `sp`: the
    /// return it takes. Returns whether a frame was pushed.
    fn entry(&mut self, t: &mut ThreadModel, a: u64, mark: bool, sp: Option<u64>) -> bool {
        self.begin(t);
        if let (Some(sp), false) = (sp, t.ignored) {
            // Frames on top that took their return below this one's are of
            // calls an unwind went past (none with bare calls above).
            while t
                .frames
                .last()
                .is_some_and(|f| f.words > 0 && f.sp.is_some_and(|at| at < sp))
            {
                let frame = t.frames.pop().unwrap();
                t.top -= frame.words;
                self.end_unwound(t, frame);
            }
        }
        let at = self.at(a);
        if at.is_empty() || t.ignored {
            if mark {
                self.push_bare(t);
            }
            return false;
        }
        let header = if sp.is_some() { 5 } else { 2 };
        let need = header
            + at.iter()
                .map(|&(p, _)| frame_words(&self.probes[p].spec))
                .sum::<usize>();
        // The frame and a new bare word above the current one.
        // (Word 0 and the bottom bare word come first.)
        let reserved = need > header && t.top + need + 3 <= self.cap;
        let mut insts = Vec::new();
        let mut used = 0;
        for (p, cookie) in at {
            if !self.probes[p].enabled {
                self.probes[p].counters.disabled += 1;
                continue;
            }
            self.probes[p].counters.hits += 1;
            let spec = self.probes[p].spec.clone();
            let fw = frame_words(&spec);
            let keep = reserved && fw > 0;
            if fw > 0 && !keep {
                self.probes[p].counters.depth += 1;
            }
            let mut action = EntryKind::Continue;
            if let Some(kind) = spec.entry {
                self.events.push(Event::Entry {
                    probe: p,
                    addr: a,
                    cookie,
                    data_len: if keep { usize::from(spec.data_size) } else { 0 },
                });
                self.nested(spec.recurse);
                action = kind;
                if kind == EntryKind::Panic {
                    self.probes[p].counters.panics += 1;
                }
            }
            if keep && action == EntryKind::Continue {
                insts.push(Inst {
                    probe: p,
                    addr: a,
                    cookie,
                });
                used += fw;
            }
        }
        if insts.is_empty() {
            if mark {
                self.push_bare(t);
            }
            false
        } else {
            t.top += used + header + 1;
            t.frames.push(Frame {
                words: used + header + 1,
                insts,
                sp,
            });
            true
        }
    }

    fn on_exit(&mut self, t: &mut ThreadModel) {
        self.begin(t);
        if t.frames.last().is_some_and(|f| f.words == 0) {
            t.frames.pop(); // a bare call
            return;
        }
        if t.frames.last().is_none_or(|f| f.sp.is_some()) {
            return; // only `on_return` pops a frame that took a return
        }
        let frame = t.frames.pop().unwrap();
        t.top -= frame.words;
        self.exit_frame(t, frame);
    }

    /// `on_return(sp)`: the return address handed back.
    fn on_return(&mut self, t: &mut ThreadModel, sp: u64) -> Option<u64> {
        self.begin(t);
        loop {
            // The topmost frame; the bare calls above it are deeper still,
            // and end with it.
            let top = t.frames.iter().rposition(|f| f.words > 0)?;
            let at = t.frames[top].sp;
            if at.is_some_and(|at| at > sp) {
                return None;
            }
            t.frames.truncate(top + 1);
            let frame = t.frames.pop().unwrap();
            t.top -= frame.words;
            match at {
                Some(at) if at == sp => {
                    self.exit_frame(t, frame);
                    return Some(ret_at(at));
                }
                // A frame above of a call that never returned: a plain one,
                // or one that took its return deeper.
                _ => self.end_unwound(t, frame),
            }
        }
    }

    /// Ends a popped frame of a call an unwind went past: no exit handler
    /// runs; each probe still registered counts it (but on an ignored
    /// thread, which counts nothing).
    fn end_unwound(&mut self, t: &ThreadModel, frame: Frame) {
        if t.ignored {
            return;
        }
        for inst in frame.insts {
            if self.probes[inst.probe].alive {
                self.probes[inst.probe].counters.unwound += 1;
            }
        }
    }

    /// Runs the exits of a popped frame.
    fn exit_frame(&mut self, t: &ThreadModel, frame: Frame) {
        if t.ignored {
            return; // an ignored thread runs no handler, exits included
        }
        for inst in frame.insts.into_iter().rev() {
            let mp = &self.probes[inst.probe];
            if !mp.alive {
                continue; // unregistered since the entry
            }
            let Some(panics) = mp.spec.exit else { continue };
            let recurse = mp.spec.recurse;
            self.events.push(Event::Exit {
                probe: inst.probe,
                addr: inst.addr,
                cookie: inst.cookie,
                data_ok: true,
            });
            self.nested(recurse);
            let c = &mut self.probes[inst.probe].counters;
            if panics {
                c.panics += 1;
            } else {
                c.exits += 1;
            }
        }
    }

    fn live(&self, nth: u8) -> Option<usize> {
        let live: Vec<usize> = (0..self.probes.len())
            .filter(|&i| self.probes[i].alive)
            .collect();
        (!live.is_empty()).then(|| live[usize::from(nth) % live.len()])
    }

    fn dead(&self, nth: u8) -> Option<usize> {
        // Probes of a dropped registry are left out: their handles may
        // name live probes of the new one.
        let dead: Vec<usize> = (0..self.probes.len())
            .filter(|&i| !self.probes[i].alive && !self.probes[i].gone)
            .collect();
        (!dead.is_empty()).then(|| dead[usize::from(nth) % dead.len()])
    }
}

fn check(reg: &Registry<()>, m: &Model, me: &ThreadModel, log: &Log) {
    assert_eq!(*log.lock().unwrap(), m.events, "handler calls");
    for (i, p) in m.probes.iter().enumerate() {
        if p.gone {
            continue;
        }
        match reg.stats(p.handle) {
            Ok(s) => {
                assert!(p.alive, "stats of unregistered probe {i}");
                assert_eq!(Counters::of(&s), p.counters, "counters of probe {i}");
                // Calls of the test thread whose frame holds the probe's
                // exit (others' calls are whole); frames a pairing reset
                // dropped count until the thread's next dispatch, in the
                // real stack and in the model alike.
                let open = me
                    .frames
                    .iter()
                    .flat_map(|f| &f.insts)
                    .filter(|x| x.probe == i)
                    .count() as u64;
                assert_eq!(s.in_flight, open, "calls in flight of probe {i}");
            }
            Err(e) => {
                assert!(!p.alive, "probe {i} lost: {e}");
                assert_eq!(e, Error::NotFound);
            }
        }
    }
    let addrs: std::collections::HashSet<u64> = m.attached.iter().map(|x| x.0).collect();
    assert_eq!(reg.addresses(), addrs.len());
}

/// A registry of the run's shape, published in `cell` for nested calls.
fn new_registry(data_size: usize, max_depth: usize, cell: &RegCell) -> Arc<Registry<()>> {
    let reg = Arc::new(
        Registry::<()>::builder()
            .max_probes(MAX_PROBES)
            .max_depth(max_depth)
            .data_size(data_size)
            .build()
            .unwrap(),
    );
    *cell.lock().unwrap() = Arc::downgrade(&reg);
    reg
}

/// Runs `ops` on the calling thread against registries with `data_size`
/// bytes of per-call data and shadow stacks `max_depth` deep.
pub fn run(data_size: usize, max_depth: usize, steps: &[Step]) {
    let alive = Arc::new(AtomicUsize::new(0));
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let cell: RegCell = Arc::new(Mutex::new(Weak::new()));
    let mut reg = new_registry(data_size, max_depth, &cell);
    let mut m = Model {
        probes: Vec::new(),
        attached: Vec::new(),
        cap: (max_depth * (data_size.div_ceil(8) + 9)).max(2),
        events: Vec::new(),
    };
    let mut me = ThreadModel::default();
    for step in steps {
        let op = match step {
            Step::Op(op) => op,
            Step::EntryTakingReturn(a, s) => {
                let at = sp(*s);
                let kept = reg.on_entry_taking_return(addr(*a), ret_at(at), at, &());
                assert_eq!(
                    kept,
                    m.entry(&mut me, addr(*a), false, Some(at)),
                    "on_entry_taking_return's answer"
                );
                check(&reg, &m, &me, &log);
                continue;
            }
            Step::Return(s) => {
                let got = reg.on_return(sp(*s), &());
                assert_eq!(got, m.on_return(&mut me, sp(*s)), "on_return's answer");
                check(&reg, &m, &me, &log);
                continue;
            }
        };
        match op {
            Op::Register(spec) => {
                let id = m.probes.len();
                let probe = build_probe(id, spec, &log, &cell, &alive);
                let pairs: Vec<(u64, u64)> = spec
                    .attach
                    .iter()
                    .map(|&(a, c)| (addr(a), u64::from(c)))
                    .collect();
                let r = reg.register_with_cookies(probe, pairs.iter().copied());
                let live = m.probes.iter().filter(|p| p.alive).count();
                if usize::from(spec.data_size) > data_size {
                    assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
                } else if (spec.entry.is_none() && spec.exit.is_none()) || pairs.is_empty() {
                    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
                } else if live == MAX_PROBES {
                    assert_eq!(
                        r.err(),
                        Some(Error::TooManyProbes {
                            max_probes: MAX_PROBES
                        })
                    );
                } else {
                    let handle = r.unwrap();
                    m.probes.push(ModelProbe {
                        handle,
                        spec: spec.clone(),
                        alive: true,
                        gone: false,
                        enabled: true,
                        counters: Counters::default(),
                    });
                    m.attached
                        .extend(pairs.into_iter().map(|(a, c)| (a, id, c)));
                }
            }
            Op::Unregister(nth) => {
                if let Some(p) = m.live(*nth) {
                    reg.unregister(m.probes[p].handle).unwrap();
                    m.probes[p].alive = false;
                    m.attached.retain(|x| x.1 != p);
                    assert_eq!(reg.unregister(m.probes[p].handle), Err(Error::NotFound));
                } else if let Some(p) = m.dead(*nth) {
                    assert_eq!(reg.unregister(m.probes[p].handle), Err(Error::NotFound));
                }
            }
            Op::Enable(nth) | Op::Disable(nth) => {
                let on = matches!(op, Op::Enable(_));
                let call = |h| if on { reg.enable(h) } else { reg.disable(h) };
                if let Some(p) = m.live(*nth) {
                    call(m.probes[p].handle).unwrap();
                    m.probes[p].enabled = on;
                } else if let Some(p) = m.dead(*nth) {
                    assert_eq!(call(m.probes[p].handle), Err(Error::NotFound));
                }
            }
            Op::Entry(a) => {
                reg.on_entry(addr(*a), 0, &());
                m.on_entry(&mut me, addr(*a));
            }
            Op::EntryForExit(a) => {
                let kept = reg.on_entry_for_exit(addr(*a), 0, &());
                assert_eq!(
                    kept,
                    m.entry(&mut me, addr(*a), false, None),
                    "on_entry_for_exit's answer"
                );
            }

            Op::Exit => {
                reg.on_exit(0, &());
                m.on_exit(&mut me);
            }
            Op::CallOnOtherThread(a) => {
                let r = reg.clone();
                let k = addr(*a);
                std::thread::spawn(move || {
                    r.on_entry(k, 0, &());
                    r.on_exit(0, &());
                })
                .join()
                .unwrap();
                let mut other = ThreadModel::default();
                m.on_entry(&mut other, k);
                m.on_exit(&mut other);
            }
            Op::Ignore(on) => {
                ignore_current_thread(*on);
                me.ignored = *on;
            }
            Op::Stats => {}
            Op::ResetPairing => {
                reg.reset_pairing();
                me.reset = true;
            }
            Op::Drain(nth) => {
                let zero = std::time::Duration::ZERO;
                if let Some(p) = m.live(*nth) {
                    assert_eq!(reg.drain(m.probes[p].handle, zero), Ok(0));
                    m.probes[p].enabled = false;
                    // Drain reads the thread's own stack as a dispatch
                    // does, emptying it first after a pairing reset.
                    m.begin(&mut me);
                } else if let Some(p) = m.dead(*nth) {
                    assert_eq!(reg.drain(m.probes[p].handle, zero), Err(Error::NotFound));
                }
            }
            Op::Recreate => {
                reg = new_registry(data_size, max_depth, &cell);
                for p in &mut m.probes {
                    p.alive = false;
                    p.gone = true;
                }
                m.attached.clear();
                me = ThreadModel {
                    ignored: me.ignored,
                    ..ThreadModel::default()
                };
            }
        }
        check(&reg, &m, &me, &log);
    }
    ignore_current_thread(false);
    drop(reg);
    fprobe::rcu::barrier();
    assert_eq!(
        alive.load(Ordering::Relaxed),
        0,
        "a probe was never dropped"
    );
}

/// Decodes fuzzer bytes (registry shape, then [`Op`]s until the bytes run
/// out) and runs them on a fresh thread (so that the thread-wide `ignore`
/// flag and the recursion guard start clear).
pub fn run_bytes(data: &[u8]) {
    run_decoded(data, |u: &mut Unstructured| Op::arbitrary(u).map(Step::Op));
}

/// As [`run_bytes`], with [`Step`]s: the calls of an engine that takes
/// returns over among the others.
pub fn run_bytes_taking_returns(data: &[u8]) {
    run_decoded(data, |u: &mut Unstructured| Step::arbitrary(u));
}

fn run_decoded(
    data: &[u8],
    mut step: impl for<'a, 'b> FnMut(&'a mut Unstructured<'b>) -> arbitrary::Result<Step>,
) {
    let mut u = Unstructured::new(data);
    let data_size = 8 * usize::from(u.arbitrary::<u8>().unwrap_or(0) % 4);
    // 0 is refused by the builder (no exit could ever run): 1 instead.
    let max_depth = usize::from(u.arbitrary::<u8>().unwrap_or(0) % 5).max(1);
    let mut steps = Vec::new();
    while !u.is_empty() {
        match step(&mut u) {
            Ok(s) => steps.push(s),
            Err(_) => break,
        }
    }
    if let Err(e) = std::thread::spawn(move || run(data_size, max_depth, &steps)).join() {
        std::panic::resume_unwind(e);
    }
}
