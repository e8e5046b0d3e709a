//! Dispatch from a signal handler that interrupts dispatch on the same
//! thread: a storm of `SIGUSR1` delivered to a thread that dispatches
//! nested probed calls in a loop, the signal handler dispatching a probed
//! call of its own through the same registry. Every call's exit handler
//! must run once with the data its entry wrote, on both sides, and the
//! signal handler's probes must not be refused as recursion. Beside it,
//! recursion within one context (a handler calling a probed function) is
//! still refused and counted.
//!
//! The storm lasts `FPROBE_SIGNAL_SECS` seconds (2 by default):
//!
//! ```sh
//! FPROBE_SIGNAL_SECS=30 cargo test --release --test probe_signals
//! ```

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use fprobe::probe::{EntryAction, Fprobe, ProbeHandle, Registry};

#[path = "common/signal_storm.rs"]
mod signal_storm;

/// The interrupted thread's outer and inner probed functions.
const A: u64 = 0x4000;
const A_INNER: u64 = A + 16;
/// The function the signal handler calls.
const C: u64 = 0x9000;
/// Marks the return addresses of the signal handler's calls (the thread's
/// are small counters).
const SIG_RET: u64 = 1 << 63;
/// What each of C's probes mixes into its data, so that data swapped
/// between the two probes is caught.
const C_SALT: [u64; 2] = [0x1111_0000_0000_0000, 0x2222_0000_0000_0000];

/// The registry, reachable from the signal handler.
static REG: OnceLock<Registry<()>> = OnceLock::new();

// The interrupted thread's probe.
static T_ENTRIES: AtomicU64 = AtomicU64::new(0);
static T_GOOD: AtomicU64 = AtomicU64::new(0);
static T_BAD: AtomicU64 = AtomicU64::new(0);
/// Set while one of the interrupted thread's handlers runs.
static T_IN_HANDLER: AtomicBool = AtomicBool::new(false);

// The signal handler's calls and C's two probes.
static SIG_CALLS: AtomicU64 = AtomicU64::new(0);
static SIG_IN_HANDLER: AtomicU64 = AtomicU64::new(0);
static C_ENTRIES: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
static C_GOOD: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
static C_BAD: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// A little work, so that signals often land inside handlers.
#[inline(never)]
fn work() {
    let mut x = 1u64;
    for i in 0..64 {
        x = std::hint::black_box(x.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(i));
    }
    std::hint::black_box(x);
}

/// The entry address of one of the interrupted thread's calls, from its
/// return address (even: outer, odd: inner).
fn t_addr(ret_addr: u64) -> u64 {
    if ret_addr & 1 == 0 { A } else { A_INNER }
}

fn thread_probe() -> Fprobe<()> {
    Fprobe::builder()
        .data_size(8)
        .entry(|e| {
            T_IN_HANDLER.store(true, Ordering::SeqCst);
            T_ENTRIES.fetch_add(1, Ordering::Relaxed);
            work();
            e.data.copy_from_slice(&e.ret_addr.to_ne_bytes());
            work();
            T_IN_HANDLER.store(false, Ordering::SeqCst);
            EntryAction::Continue
        })
        .exit(|x| {
            T_IN_HANDLER.store(true, Ordering::SeqCst);
            work();
            let good = x.data == x.ret_addr.to_ne_bytes() && x.addr == t_addr(x.ret_addr);
            work();
            if good {
                T_GOOD.fetch_add(1, Ordering::Relaxed);
            } else {
                T_BAD.fetch_add(1, Ordering::Relaxed);
            }
            T_IN_HANDLER.store(false, Ordering::SeqCst);
        })
        .build()
}

fn signal_probe(k: usize) -> Fprobe<()> {
    Fprobe::builder()
        .data_size(8)
        .entry(move |e| {
            C_ENTRIES[k].fetch_add(1, Ordering::Relaxed);
            e.data
                .copy_from_slice(&(e.ret_addr ^ C_SALT[k]).to_ne_bytes());
            EntryAction::Continue
        })
        .exit(move |x| {
            let good = x.data == (x.ret_addr ^ C_SALT[k]).to_ne_bytes()
                && x.addr == C
                && x.ret_addr & SIG_RET != 0;
            if good {
                C_GOOD[k].fetch_add(1, Ordering::Relaxed);
            } else {
                C_BAD[k].fetch_add(1, Ordering::Relaxed);
            }
        })
        .build()
}

/// The `SIGUSR1` handler: one probed call of C. Async-signal-safe: atomics
/// and the registry's dispatch (the thread's state exists already).
extern "C" fn on_sigusr1(_sig: c_int) {
    signal_storm::keeping_errno(|| {
        if let Some(reg) = REG.get() {
            let n = SIG_CALLS.fetch_add(1, Ordering::Relaxed);
            if T_IN_HANDLER.load(Ordering::SeqCst) {
                SIG_IN_HANDLER.fetch_add(1, Ordering::Relaxed);
            }
            let ret = SIG_RET | n;
            reg.on_entry(C, ret, &());
            reg.on_exit(ret, &());
        }
    });
}

#[test]
#[cfg_attr(miri, ignore)] // signals, threads and wall-clock time
fn signal_storm_keeps_pairing_and_data_on_both_sides() {
    let reg = REG.get_or_init(|| Registry::builder().build().unwrap());
    let t_probe: ProbeHandle = reg.register(thread_probe(), &[A, A_INNER]).unwrap();
    let c_probes: Vec<ProbeHandle> = (0..2)
        .map(|k| reg.register(signal_probe(k), &[C]).unwrap())
        .collect();
    signal_storm::install(on_sigusr1);

    let ready = Arc::new(Barrier::new(2));
    let stop_thread = Arc::new(AtomicBool::new(false));
    let t = {
        let (ready, stop) = (ready.clone(), stop_thread.clone());
        std::thread::spawn(move || {
            let reg = REG.get().unwrap();
            fprobe::rcu::register_thread();
            // The first dispatch creates the thread's state (it allocates):
            // done before any signal arrives.
            let mut calls = 0u64;
            let mut next = 0u64;
            let mut call = || {
                let r = next;
                next += 2;
                reg.on_entry(A, r, &());
                reg.on_entry(A_INNER, r + 1, &());
                reg.on_exit(r + 1, &());
                reg.on_exit(r, &());
                calls += 1;
            };
            call();
            ready.wait();
            while !stop.load(Ordering::Relaxed) {
                call();
            }
            calls
        })
    };
    let target = {
        use std::os::unix::thread::JoinHandleExt;
        t.as_pthread_t()
    };
    let stop_sender = Arc::new(AtomicBool::new(false));
    let sender = {
        let stop = stop_sender.clone();
        std::thread::spawn(move || {
            ready.wait();
            // `target` is alive: it stops only after this thread has been
            // joined.
            signal_storm::send_while(target, || !stop.load(Ordering::Relaxed))
        })
    };
    let began = Instant::now();
    std::thread::sleep(signal_storm::duration());
    // On a loaded machine pending signals merge and few are delivered: go
    // on until the storm was one (checked below), for at most 30 s more.
    while SIG_CALLS.load(Ordering::Relaxed) < 2000
        && began.elapsed() < signal_storm::duration() + Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop_sender.store(true, Ordering::Relaxed);
    let sent = sender.join().unwrap();
    // Let a signal still pending be delivered before the thread stops.
    std::thread::sleep(Duration::from_millis(20));
    stop_thread.store(true, Ordering::Relaxed);
    let calls = t.join().unwrap();
    let elapsed = began.elapsed();

    let sig_calls = SIG_CALLS.load(Ordering::Relaxed);
    let in_handler = SIG_IN_HANDLER.load(Ordering::Relaxed);
    let (t_good, t_bad) = (
        T_GOOD.load(Ordering::Relaxed),
        T_BAD.load(Ordering::Relaxed),
    );
    let c_entries = [0, 1].map(|k| C_ENTRIES[k].load(Ordering::Relaxed));
    let c_good = [0, 1].map(|k| C_GOOD[k].load(Ordering::Relaxed));
    let c_bad = [0, 1].map(|k| C_BAD[k].load(Ordering::Relaxed));
    let t_stats = reg.stats(t_probe).unwrap();
    let c_stats: Vec<_> = c_probes.iter().map(|&h| reg.stats(h).unwrap()).collect();
    eprintln!(
        "{elapsed:?}: thread calls {calls}, exits good {t_good} bad {t_bad}; \
         signals sent {sent}, handled {sig_calls} ({in_handler} inside a handler of the \
         thread); C entries {c_entries:?}, exits good {c_good:?} bad {c_bad:?}; \
         thread probe {t_stats:?}; C probes {c_stats:?}"
    );

    // (a) The interrupted thread's calls.
    assert_eq!(T_ENTRIES.load(Ordering::Relaxed), calls * 2);
    assert_eq!(t_bad, 0, "exits of the thread with wrong data or address");
    assert_eq!(t_good, calls * 2, "exits of the thread that did not run");
    assert_eq!((t_stats.hits, t_stats.exits), (calls * 2, calls * 2));
    assert_eq!(t_stats.missed, Default::default());
    assert_eq!(t_stats.in_flight, 0, "every kept exit of the thread ended");
    // (b) The signal handler's calls.
    for k in 0..2 {
        assert_eq!(c_entries[k], sig_calls, "entries of C's probe {k}");
        assert_eq!(c_bad[k], 0, "exits of C's probe {k} with wrong data");
        assert_eq!(c_good[k], sig_calls, "exits of C's probe {k}");
        assert_eq!(
            c_stats[k].missed.recursion, 0,
            "a signal handler's call refused as recursion"
        );
        assert_eq!((c_stats[k].hits, c_stats[k].exits), (sig_calls, sig_calls));
        assert_eq!(
            c_stats[k].in_flight, 0,
            "every kept exit of C's probe {k} ended"
        );
    }
    // (c) The storm was one.
    assert!(
        sig_calls >= 2000,
        "only {sig_calls} signals delivered in {elapsed:?}"
    );
}

/// A handler that calls probed functions, its own and another probe's, in
/// plain code: those nested probes do not run and each nested call is
/// counted as recursion; the outer calls pair with their own data.
#[test]
fn recursion_within_one_context_is_refused_and_pairing_survives() {
    const P: u64 = 0x100;
    const Q: u64 = 0x200;
    let n = if cfg!(miri) { 5 } else { 1000 };
    let reg = Arc::new(Registry::<()>::builder().build().unwrap());
    let weak = Arc::downgrade(&reg);
    let weak2 = weak.clone();
    let p_good = Arc::new(AtomicU64::new(0));
    let p_bad = Arc::new(AtomicU64::new(0));
    let (pg, pb) = (p_good.clone(), p_bad.clone());
    let outer = Fprobe::builder()
        .data_size(8)
        .entry(move |e| {
            e.data.copy_from_slice(&e.ret_addr.to_ne_bytes());
            let reg = weak.upgrade().unwrap();
            // Itself, then another probe's function.
            reg.on_entry(P, 0xdead, &());
            reg.on_exit(0xdead, &());
            reg.on_entry(Q, 0xbeef, &());
            reg.on_exit(0xbeef, &());
            EntryAction::Continue
        })
        .exit(move |x| {
            let reg = weak2.upgrade().unwrap();
            reg.on_entry(Q, 0xf00d, &());
            reg.on_exit(0xf00d, &());
            if x.data == x.ret_addr.to_ne_bytes() && x.addr == P {
                pg.fetch_add(1, Ordering::Relaxed);
            } else {
                pb.fetch_add(1, Ordering::Relaxed);
            }
        })
        .build();
    let q_runs = Arc::new(AtomicU64::new(0));
    let (q1, q2) = (q_runs.clone(), q_runs.clone());
    let inner = Fprobe::builder()
        .data_size(8)
        .entry(move |_| {
            q1.fetch_add(1, Ordering::Relaxed);
            EntryAction::Continue
        })
        .exit(move |_| {
            q2.fetch_add(1, Ordering::Relaxed);
        })
        .build();
    let hp = reg.register(outer, &[P]).unwrap();
    let hq = reg.register(inner, &[Q]).unwrap();
    for i in 0..n {
        reg.on_entry(P, 0x1_0000 + i, &());
        reg.on_exit(0x1_0000 + i, &());
    }
    let (sp, sq) = (reg.stats(hp).unwrap(), reg.stats(hq).unwrap());
    assert_eq!(q_runs.load(Ordering::Relaxed), 0, "a nested probe ran");
    assert_eq!(
        p_bad.load(Ordering::Relaxed),
        0,
        "outer exits with wrong data"
    );
    assert_eq!(p_good.load(Ordering::Relaxed), n);
    assert_eq!(
        (sp.hits, sp.exits, sp.missed.recursion),
        (n, n, n),
        "{sp:?}"
    );
    assert_eq!(
        (sq.hits, sq.exits, sq.missed.recursion),
        (0, 0, 2 * n),
        "{sq:?}"
    );
    // Outside a handler the inner probe runs as usual.
    reg.on_entry(Q, 1, &());
    reg.on_exit(1, &());
    assert_eq!(q_runs.load(Ordering::Relaxed), 2);
    let sq = reg.stats(hq).unwrap();
    assert_eq!((sq.hits, sq.exits), (1, 1));
}
