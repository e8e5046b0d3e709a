//! Signal handlers running patched code: a thread calls patched functions
//! with exit probes flat out while another interrupts it with SIGUSR1 as
//! fast as it can; the handler calls patched functions too. Every result
//! and every exit's data must be right, and every call the handler makes
//! must run its probes (a signal handler is a context of its own).
//! `FPROBE_SIGNAL_SECS` sets the length (default 1 s).

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use fprobe::probe::{EntryAction, Fprobe};
use fprobe_patch::{Regs, attach, detach};
use fprobe_patch_ctest::*;

static SIGNALS: AtomicU64 = AtomicU64::new(0);
static IN_HANDLER_HITS: AtomicU64 = AtomicU64::new(0);
static BAD: AtomicU64 = AtomicU64::new(0);

std::thread_local! {
    static IN_SIGNAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Patched calls one signal makes: `pt_add` once, `pt_fib(5)` (15 calls).
const CALLS_PER_SIGNAL: u64 = 16;

extern "C" fn on_signal(_: libc::c_int) {
    IN_SIGNAL.with(|f| f.set(true));
    // SAFETY: plain C functions; the probes touch atomics only.
    let ok = unsafe { pt_add(black_box(20), 22) } == 42 && unsafe { pt_fib(black_box(5)) } == 5;
    if !ok {
        BAD.fetch_add(1, Ordering::Relaxed);
    }
    IN_SIGNAL.with(|f| f.set(false));
    SIGNALS.fetch_add(1, Ordering::Relaxed);
}

#[test]
fn signal_handlers_running_patched_code_keep_pairing_and_run_their_probes() {
    let secs: f64 = std::env::var("FPROBE_SIGNAL_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let probe = Fprobe::<Regs>::builder()
        .data_size(16)
        .entry(|e| {
            if IN_SIGNAL.with(|f| f.get()) {
                IN_HANDLER_HITS.fetch_add(1, Ordering::Relaxed);
            }
            // What the exit must get back: the call's two first arguments.
            e.data[..8].copy_from_slice(&e.ctx.arg(0).to_ne_bytes());
            e.data[8..].copy_from_slice(&e.ctx.arg(1).to_ne_bytes());
            EntryAction::Continue
        })
        .exit(|x| {
            let a0 = u64::from_ne_bytes(x.data[..8].try_into().unwrap());
            let a1 = u64::from_ne_bytes(x.data[8..].try_into().unwrap());
            let r = x.ctx.ret();
            let ok = if x.addr == addr("pt_add") {
                r as u32 == (a0 as u32).wrapping_add(a1 as u32)
            } else if x.addr == addr("pt_loop") {
                r == a0 * (a0 + 1) / 2
            } else {
                true
            };
            if !ok {
                BAD.fetch_add(1, Ordering::Relaxed);
            }
        })
        .build();
    let fs = [addr("pt_add"), addr("pt_loop"), addr("pt_fib")];
    let a = attach(probe, &fs).unwrap();

    // SAFETY: installs a handler for SIGUSR1, which this test owns.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(Barrier::new(2));
    let (stop2, ready2) = (stop.clone(), ready.clone());
    let worker = std::thread::spawn(move || {
        // No allocation in the signal handler's probed calls.
        fprobe_patch::prepare_thread();
        ready2.wait();
        let mut loops = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            // SAFETY: a plain C function.
            if unsafe { pt_loop(black_box(1000)) } != 500_500 {
                BAD.fetch_add(1, Ordering::Relaxed);
            }
            loops += 1;
        }
        loops
    });
    let target = {
        use std::os::unix::thread::JoinHandleExt;
        worker.as_pthread_t()
    };
    ready.wait();
    let t0 = Instant::now();
    let mut sent = 0u64;
    while t0.elapsed() < Duration::from_secs_f64(secs) {
        // SAFETY: the worker is alive until joined below.
        assert_eq!(unsafe { libc::pthread_kill(target, libc::SIGUSR1) }, 0);
        sent += 1;
        std::thread::yield_now();
    }
    stop.store(true, Ordering::Relaxed);
    let loops = worker.join().unwrap();
    let st = a.stats();
    detach(a).unwrap();
    let signals = SIGNALS.load(Ordering::Relaxed);
    println!(
        "{secs} s: {sent} signals sent, {signals} handled, {loops} loops; probe hits {}, exits {}, \
         recursion {}, depth {}",
        st.hits, st.exits, st.missed.recursion, st.missed.depth,
    );
    assert!(signals > 0 && loops > 0);
    assert_eq!(BAD.load(Ordering::Relaxed), 0, "wrong results or exit data");
    assert_eq!(st.exits, st.hits, "every probed call paired with its exit");
    assert_eq!(
        IN_HANDLER_HITS.load(Ordering::Relaxed),
        signals * CALLS_PER_SIGNAL,
        "every patched call in the handler ran its probe"
    );
    assert_eq!(st.missed.recursion, 0);
}
