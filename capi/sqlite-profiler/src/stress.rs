//! `--stress-patch SECS`: every patchable function of SQLite attached and
//! detached in a loop through `fprobe-patch` while two threads run the
//! workload flat out on that copy.
//!
//! Checked: every workload result equals the plain build's; in every
//! attached window, per function, no exit without its entry and, over all
//! functions, at most as many entries without an exit as calls could be in
//! flight when the window closed (a call entered before detach and
//! returning after it has its exit skipped: `unregister` never waits for
//! a thread parked inside a call); and once the workers have stopped, a
//! last window in which they ran to the end shows entries = exits for
//! every function.

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

    /// (entries without exit, functions with an exit too many, exits
    /// with another call's data).
    fn unpaired(&self) -> (u64, usize, u64) {
        let mut open = 0;
        let mut bad = 0;
        for (e, x) in self.entries.iter().zip(&self.exits) {
            let (e, x) = (e.load(Ordering::Relaxed), x.load(Ordering::Relaxed));
            if x > e {
                bad += 1;
            } else {
                open += e - x;
            }
        }
        (open, bad, self.bad_data.load(Ordering::Relaxed))
    }

    fn calls(&self) -> u64 {
        self.entries.iter().map(|e| e.load(Ordering::Relaxed)).sum()
    }
}

/// Runs the stress for `secs` seconds; panics on any violation.
pub fn run(plain: &Lib, patch: &Lib, functions: &[u64], secs: f64, rows: i64) {
    const THREADS: usize = 2;
    // Calls one thread can have open at once: SQLite's probed call depth
    // stays far below this.
    const DEPTH_BOUND: u64 = 256;
    let expect: Vec<i64> = (0..THREADS)
        .map(|i| sqlite::workload(plain, 0x51 + i as u64, rows))
        .collect();
    let with_cookies = || functions.iter().enumerate().map(|(i, &f)| (f, i as u64));
    let stop = AtomicBool::new(false);
    let runs = AtomicU64::new(0);
    let (mut windows, mut calls, mut max_open) = (0u64, 0u64, 0u64);
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
            let t = Instant::now();
            fprobe_patch::detach(a).expect("detach");
            detach_ms.push(t.elapsed().as_secs_f64() * 1e3);
            let (open, bad, bad_data) = w.unpaired();
            assert_eq!(bad, 0, "window {windows}: an exit without its entry");
            assert_eq!(
                bad_data, 0,
                "window {windows}: an exit got another call's data"
            );
            assert!(
                open <= THREADS as u64 * DEPTH_BOUND,
                "window {windows}: {open} entries without exit, more than could be in flight"
            );
            max_open = max_open.max(open);
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
        (0, 0, 0),
        "entries = exits for every function"
    );
    println!(
        "stress: {secs} s, {windows} attach/detach windows of {} functions while {THREADS} threads \
         ran {} workloads, all results right; {calls} probed calls, at most {max_open} open at a \
         detach; attach {:.2} ms, detach {:.2} ms (medians); last window {} calls, entries = exits \
         for every function",
        functions.len(),
        runs.load(Ordering::Relaxed),
        crate::stats::median(&attach_ms),
        crate::stats::median(&detach_ms),
        w.calls()
    );
}
