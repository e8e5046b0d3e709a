//! `--stress-patch SECS`: every patchable function of SQLite attached and
//! detached in a loop through `fprobe-patch` while two threads run the
//! workload flat out on that copy.
//!
//! Checked: every workload result equals the plain build's, and in every
//! attached window, per function, entries = exits and every exit got its
//! entry's data. Each window closes with `detach_draining`: the probe stops
//! taking entries and the calls in flight return through its exit before
//! it is detached (a plain `detach` skips their exits). A last window,
//! attached before the workers start and detached after they finish,
//! checks the same with a plain `detach`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fprobe::probe::{EntryAction, Fprobe};
use fprobe_patch::Regs;

use crate::sqlite::{self, Lib};

/// Per-function entry and exit counts of one window.
struct Window {
    entries: Vec<AtomicU64>,
    exits: Vec<AtomicU64>,
    /// Exits that got another call's data.
    bad_data: AtomicU64,
}

impl Window {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Window {
            entries: (0..n).map(|_| AtomicU64::new(0)).collect(),
            exits: (0..n).map(|_| AtomicU64::new(0)).collect(),
            bad_data: AtomicU64::new(0),
        })
    }

    /// A probe counting into this window: function `cookie`'s entry, and
    /// its exit when the data the entry wrote comes back.
    fn probe(self: &Arc<Self>) -> Fprobe<Regs> {
        let (w1, w2) = (self.clone(), self.clone());
        Fprobe::<Regs>::builder()
            .data_size(8)
            .entry(move |e| {
                // Relaxed: counts, read after the window's detach.
                w1.entries[e.cookie as usize].fetch_add(1, Ordering::Relaxed);
                e.data.copy_from_slice(&e.addr.to_ne_bytes());
                EntryAction::Continue
            })
            .exit(move |x| {
                // Relaxed: as above.
                if x.data != x.addr.to_ne_bytes() {
                    w2.bad_data.fetch_add(1, Ordering::Relaxed);
                }
                w2.exits[x.cookie as usize].fetch_add(1, Ordering::Relaxed);
            })
            .build()
    }

    /// (functions whose entries and exits differ, the first of them as
    /// (index, entries, exits), exits with another call's data).
    fn unpaired(&self) -> (usize, Option<(usize, u64, u64)>, u64) {
        let mut differ = 0;
        let mut first = None;
        for (i, (e, x)) in self.entries.iter().zip(&self.exits).enumerate() {
            let (e, x) = (e.load(Ordering::Relaxed), x.load(Ordering::Relaxed));
            if e != x {
                differ += 1;
                first.get_or_insert((i, e, x));
            }
        }
        (differ, first, self.bad_data.load(Ordering::Relaxed))
    }

    fn calls(&self) -> u64 {
        self.entries.iter().map(|e| e.load(Ordering::Relaxed)).sum()
    }
}

/// Runs the stress for `secs` seconds; panics on any violation.
pub fn run(plain: &Lib, patch: &Lib, functions: &[u64], secs: f64, rows: i64) {
    const THREADS: usize = 2;
    // How long a window's detach waits for its calls in flight: a worker's
    // calls return within microseconds unless it is preempted.
    const DRAIN: Duration = Duration::from_secs(30);
    let expect: Vec<i64> = (0..THREADS)
        .map(|i| sqlite::workload(plain, 0x51 + i as u64, rows))
        .collect();
    let with_cookies = || functions.iter().enumerate().map(|(i, &f)| (f, i as u64));
    let stop = AtomicBool::new(false);
    let runs = AtomicU64::new(0);
    let (mut windows, mut calls, mut drained_calls) = (0u64, 0u64, 0u64);
    let (mut attach_ms, mut detach_ms) = (Vec::<f64>::new(), Vec::<f64>::new());
    std::thread::scope(|s| {
        for (i, &want) in expect.iter().enumerate() {
            let (stop, runs) = (&stop, &runs);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let got = sqlite::workload(patch, 0x51 + i as u64, rows);
                    assert_eq!(got, want, "a query result changed under patching");
                    runs.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs_f64(secs) {
            let w = Window::new(functions.len());
            let t = Instant::now();
            let a = fprobe_patch::attach_with_cookies(w.probe(), with_cookies())
                .expect("attach every function");
            attach_ms.push(t.elapsed().as_secs_f64() * 1e3);
            std::thread::sleep(Duration::from_millis(2 + windows % 7));
            let in_flight = a.stats().in_flight;
            let t = Instant::now();
            let left = fprobe_patch::detach_draining(a, DRAIN).expect("detach");
            detach_ms.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(
                left, 0,
                "window {windows}: calls still in flight after {DRAIN:?}"
            );
            let (differ, first, bad_data) = w.unpaired();
            assert_eq!(
                differ, 0,
                "window {windows}: entries != exits for {differ} functions, first (function, \
                 entries, exits) {first:?}"
            );
            assert_eq!(
                bad_data, 0,
                "window {windows}: an exit got another call's data"
            );
            drained_calls += in_flight;
            calls += w.calls();
            windows += 1;
        }
        stop.store(true, Ordering::Relaxed);
    });
    // The last window: attached before the workers start, detached after
    // they finish, so every call returned inside it.
    let w = Window::new(functions.len());
    let a = fprobe_patch::attach_with_cookies(w.probe(), with_cookies()).expect("attach");
    std::thread::scope(|s| {
        for (i, &want) in expect.iter().enumerate() {
            s.spawn(move || assert_eq!(sqlite::workload(patch, 0x51 + i as u64, rows), want));
        }
    });
    fprobe_patch::detach(a).expect("detach");
    assert_eq!(
        w.unpaired(),
        (0, None, 0),
        "entries = exits for every function"
    );
    println!(
        "stress: {secs} s, {windows} attach/detach windows of {} functions while {THREADS} threads \
         ran {} workloads, all results right; {calls} probed calls, entries = exits for every \
         function in every window ({drained_calls} calls were in flight as a detach began and \
         drained); attach {:.2} ms, detach {:.2} ms with its drain (medians); last window {} \
         calls, entries = exits for every function",
        functions.len(),
        runs.load(Ordering::Relaxed),
        crate::stats::median(&attach_ms),
        crate::stats::median(&detach_ms),
        w.calls()
    );
}
