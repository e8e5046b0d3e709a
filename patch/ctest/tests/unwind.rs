//! C++ exceptions, forced unwinds (`pthread_exit`, `pthread_cancel`) and
//! `backtrace(3)` crossing functions attached with entry and exit probes
//! (`c/unwind.cpp`): the stubs' unwind information leads every walk to
//! the real callers, the calls an unwind went past end as
//! [`Missed::unwound`](fprobe::probe::Missed::unwound) without their exit
//! handlers, and the pairing of the calls after them is exact.

use std::ffi::{c_int, c_void};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use fprobe::probe::{EntryAction, Fprobe, ProbeStats};
use fprobe_patch::{Attached, Layout, Regs, attach, detach};
use fprobe_patch_ctest::cxx::*;

static ENTRIES: AtomicU64 = AtomicU64::new(0);
static EXITS: AtomicU64 = AtomicU64::new(0);
/// Exits whose per-call data is not what their entry wrote.
static BAD_DATA: AtomicU64 = AtomicU64::new(0);

fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every patchable function of the C++ target: its `extern "C"` ones and
/// the C++ ones (mangled `_Z…`: the destructor, and whatever library code
/// it instantiates).
fn every_function() -> Vec<u64> {
    let mut fs: Vec<u64> = fprobe_patch::sites()
        .unwrap()
        .into_iter()
        .filter(|s| s.module.as_ref() == "/proc/self/exe" && s.layout == Layout::HotPatch)
        .filter(|s| {
            s.name
                .as_deref()
                .is_some_and(|n| n.starts_with("pu_") || n.starts_with("_Z"))
        })
        .map(|s| s.function)
        .collect();
    fs.sort_unstable();
    fs.dedup();
    assert!(
        fs.contains(&(pu_throw_target())),
        "the C++ target is listed"
    );
    fs
}

fn pu_throw_target() -> u64 {
    pu_catch_deep as *const () as u64
}

/// Entry and exit handlers on every patchable function, with per-call data
/// (the function's address and a sequence number) that the exit checks.
/// `on_entry`/`on_exit` run for each call too (a backtrace, say).
fn attach_all(
    on_entry: impl Fn(u64) + Send + Sync + 'static,
    on_exit: impl Fn(u64) + Send + Sync + 'static,
) -> Attached {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let probe = Fprobe::<Regs>::builder()
        .data_size(16)
        .entry(move |e| {
            ENTRIES.fetch_add(1, Ordering::Relaxed);
            let seq = SEQ.fetch_add(1, Ordering::Relaxed);
            e.data[..8].copy_from_slice(&e.addr.to_ne_bytes());
            e.data[8..].copy_from_slice(&seq.to_ne_bytes());
            on_entry(e.addr);
            EntryAction::Continue
        })
        .exit(move |x| {
            EXITS.fetch_add(1, Ordering::Relaxed);
            let addr = u64::from_ne_bytes(x.data[..8].try_into().unwrap());
            let seq = u64::from_ne_bytes(x.data[8..].try_into().unwrap());
            if addr != x.addr || seq >= SEQ.load(Ordering::Relaxed) {
                BAD_DATA.fetch_add(1, Ordering::Relaxed);
            }
            on_exit(x.addr);
        })
        .build();
    attach(probe, &every_function()).unwrap()
}

fn counts() -> (u64, u64) {
    (
        ENTRIES.load(Ordering::Relaxed),
        EXITS.load(Ordering::Relaxed),
    )
}

/// The throw-free phase after a scenario: every entry has its exit, and
/// the attachment's counters agree.
fn plain_phase(a: &Attached) {
    let (s0, (e0, x0)) = (a.stats(), counts());
    // SAFETY: plain C++ code that throws nothing.
    assert_eq!(unsafe { pu_plain(black_box(8)) }, 9);
    let (s1, (e1, x1)) = (a.stats(), counts());
    assert_eq!(e1 - e0, 10, "pu_plain ×9 and pu_leaf");
    assert_eq!(
        e1 - e0,
        x1 - x0,
        "entries and exits of the throw-free phase"
    );
    assert_eq!(s1.hits - s0.hits, s1.exits - s0.exits);
    assert_eq!(s1.missed.unwound, s0.missed.unwound);
}

/// Runs `scenario`, then the throw-free phase, and checks that the calls
/// the scenario's unwinds went past (`unwound`, ended at the latest by the
/// phase's first entry) are all that is missing from the exits.
fn check(a: &Attached, what: &str, unwound: u64, scenario: impl FnOnce()) {
    let s0 = a.stats();
    let d0 = BAD_DATA.load(Ordering::Relaxed);
    scenario();
    plain_phase(a);
    let s1: ProbeStats = a.stats();
    assert_eq!(
        s1.missed.unwound - s0.missed.unwound,
        unwound,
        "{what}: unwound"
    );
    assert_eq!(
        s1.hits - s0.hits,
        s1.exits - s0.exits + unwound,
        "{what}: every hit ends in an exit or as unwound"
    );
    assert_eq!(s1.in_flight, 0, "{what}");
    assert_eq!(s1.missed.depth, 0, "{what}");
    assert_eq!(BAD_DATA.load(Ordering::Relaxed), d0, "{what}: exit data");
}

#[test]
fn exceptions_cross_probed_frames_and_end_the_calls_they_skip() {
    let _s = serial();
    let a = attach_all(|_| {}, |_| {});
    plain_phase(&a);
    for _ in 0..20 {
        let dtors = unsafe { pu_dtors() };
        // SAFETY (every call below): C++ functions that catch what they
        // throw.
        // pu_throw_deep ×6 thrown through, each frame's destructor run.
        check(&a, "catch", 6, || {
            assert_eq!(unsafe { pu_catch_deep(black_box(5)) }, 1)
        });
        assert_eq!(unsafe { pu_dtors() } - dtors, 6);
        // pu_throw_deep ×6 and pu_rethrow.
        check(&a, "rethrow", 7, || {
            assert_eq!(unsafe { pu_catch_rethrow(black_box(5)) }, 1)
        });
        // pu_throw_deep ×4, ×4 and ×2.
        check(&a, "nested", 10, || {
            assert_eq!(unsafe { pu_nested(black_box(3)) }, 111)
        });
        // pu_thrower and its probed caller.
        check(&a, "probed caller", 2, || {
            assert_eq!(unsafe { pu_catch_thrower(black_box(42), 1) }, 42)
        });
        // pu_thrower only: its caller has no probe.
        check(&a, "unprobed caller", 1, || {
            assert_eq!(unsafe { pu_catch_thrower(black_box(43), 0) }, 43)
        });
        // Caught where no probe returns: the next probed call made from
        // higher on the stack (here, beside the catcher's) ends the 6
        // calls; one made from deeper could not tell them from its
        // callers' and leaves them for later.
        check(&a, "unprobed catcher", 6, || {
            assert_eq!(unsafe { pu_catch_unprobed(black_box(5)) }, 1);
            assert_eq!(unsafe { pu_leaf(black_box(1)) }, 2);
        });
    }
    detach(a).unwrap();
}

#[test]
fn pthread_exit_and_cancel_unwind_through_probed_frames() {
    let _s = serial();
    let a = attach_all(|_| {}, |_| {});
    for cancel in [0, 1] {
        for _ in 0..10 {
            let (s0, dtors) = (a.stats(), unsafe { pu_dtors() });
            // SAFETY: a C++ thread of its own, joined before it returns.
            let r = unsafe { pu_run_thread(cancel, black_box(6)) };
            assert_eq!(r, if cancel == 1 { -1 } else { 7 });
            // Every frame's destructor ran: the forced unwind crossed them.
            assert_eq!(unsafe { pu_dtors() } - dtors, 7);
            assert_eq!(a.stats().missed.depth, s0.missed.depth);
            plain_phase(&a);
        }
    }
    detach(a).unwrap();
}

unsafe extern "C" {
    fn backtrace(buffer: *mut *mut c_void, size: c_int) -> c_int;
}

const FRAMES: usize = 64;

/// Which backtrace a handler takes: 0 none, 1 at pu_bt_leaf's entry, 2 at
/// its exit.
static TRACE_IN: AtomicU64 = AtomicU64::new(0);
static TRACED: AtomicBool = AtomicBool::new(false);
static HANDLER_TRACE: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn trace_here() -> Vec<usize> {
    let mut buf = [std::ptr::null_mut::<c_void>(); FRAMES];
    // SAFETY: `buf` holds FRAMES pointers.
    let n = unsafe { backtrace(buf.as_mut_ptr(), FRAMES as c_int) };
    buf[..n as usize].iter().map(|p| *p as usize).collect()
}

fn handler_trace(addr: u64, when: u64) {
    if addr == pu_bt_leaf as *const () as u64 && TRACE_IN.load(Ordering::Relaxed) == when {
        *HANDLER_TRACE.lock().unwrap() = trace_here();
        TRACED.store(true, Ordering::Relaxed);
    }
}

/// pu_bt_top → pu_bt_mid → pu_bt_leaf → backtrace(3), from one call site.
#[inline(never)]
fn trace_from_c() -> Vec<usize> {
    let mut buf = [std::ptr::null_mut::<c_void>(); FRAMES];
    // SAFETY: `buf` holds FRAMES pointers.
    let n = unsafe { pu_bt_top(buf.as_mut_ptr(), FRAMES as c_int) };
    black_box(buf[..n as usize].iter().map(|p| *p as usize).collect())
}

/// Whether `want` appears in `trace` in order (other frames between).
fn in_order(trace: &[usize], want: &[usize]) -> bool {
    let mut it = trace.iter();
    want.iter().all(|w| it.any(|t| t == w))
}

#[test]
fn backtraces_from_probed_functions_and_handlers_name_the_real_callers() {
    let _s = serial();
    // Unprobed: pu_bt_leaf's own address, then the return addresses in
    // pu_bt_mid, pu_bt_top and trace_from_c (after the frames of a
    // sanitizer's interceptor, if any).
    let truth = trace_from_c();
    // Within the first `len` bytes of `f` (the C functions are small;
    // trace_from_c, instrumented by a sanitizer, may not be).
    let within_n = |pc: usize, f: *const (), len: usize| pc > f as usize && pc < f as usize + len;
    let within = |pc: usize, f: *const ()| within_n(pc, f, 256);
    let leaf = truth
        .iter()
        .position(|&pc| within(pc, pu_bt_leaf as *const ()))
        .unwrap_or_else(|| panic!("no pu_bt_leaf in {truth:x?}"));
    assert!(truth.len() >= leaf + 4, "{truth:x?}");
    let callers = &truth[leaf..leaf + 4];
    assert!(within(callers[0], pu_bt_leaf as *const ()), "{truth:x?}");
    assert!(within(callers[1], pu_bt_mid as *const ()), "{truth:x?}");
    assert!(within(callers[2], pu_bt_top as *const ()), "{truth:x?}");
    assert!(
        within_n(callers[3], trace_from_c as *const (), 4096),
        "{truth:x?}"
    );

    let a = attach_all(|f| handler_trace(f, 1), |f| handler_trace(f, 2));
    for _ in 0..10 {
        // From inside the probed function: the stubs appear as frames of
        // their own, between the real callers.
        let t = trace_from_c();
        assert!(in_order(&t, callers), "{t:x?} lacks {callers:x?}");
        assert!(t.len() <= truth.len() + 3, "{t:x?}");
        // From inside the entry and the exit handler of pu_bt_leaf: the
        // handler's frames, the trampoline, the stub, then its callers.
        for when in [1, 2] {
            TRACE_IN.store(when, Ordering::Relaxed);
            TRACED.store(false, Ordering::Relaxed);
            trace_from_c();
            TRACE_IN.store(0, Ordering::Relaxed);
            assert!(TRACED.load(Ordering::Relaxed));
            let h = HANDLER_TRACE.lock().unwrap().clone();
            assert!(
                in_order(&h, &callers[1..]),
                "{when}: {h:x?} lacks {callers:x?}"
            );
        }
    }
    let st = a.stats();
    assert_eq!(st.hits, st.exits);
    detach(a).unwrap();
}

/// Exceptions one round of [`workload`] throws and catches: `pu_catch_deep`
/// 1, `pu_catch_rethrow` 2 (the throw and the rethrow), `pu_nested` 4,
/// `pu_catch_thrower` 1.
const THROWS_PER_ROUND: u64 = 8;

/// Calls of probed functions an unwind goes past in one round, its
/// `pu_catch_thrower` aside (2 with the probed caller, 1 without): 6, 7
/// and 10 (as in `exceptions_cross_probed_frames_and_end_the_calls_they_skip`).
const UNWOUND_PER_ROUND: u64 = 6 + 7 + 10;

/// `rounds` rounds of throwing and catching across probed frames; returns
/// a digest of what every catcher returned.
fn workload(rounds: u64) -> u64 {
    let mut digest = 0u64;
    for i in 0..rounds {
        // SAFETY (every call): C++ functions that catch what they throw.
        let r = unsafe {
            [
                pu_catch_deep(black_box(5)),
                pu_catch_rethrow(black_box(5)),
                pu_nested(black_box(3)),
                pu_catch_thrower(black_box((i % 1000) as i32), (i % 2) as i32),
            ]
        };
        for v in r {
            digest = digest.wrapping_mul(0x100_0000_01b3).wrapping_add(v as u64);
        }
    }
    digest
}

/// The C++ workload throws and catches `FPROBE_UNWIND_EXCEPTIONS`
/// exceptions (100,000 by default) with every patchable function probed
/// on entry and exit, and its catchers return what they return without
/// probes; then a throw-free phase pairs every entry with its exit.
#[test]
fn a_hundred_thousand_exceptions_give_the_results_they_give_without_probes() {
    let _s = serial();
    let exceptions: u64 = std::env::var("FPROBE_UNWIND_EXCEPTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let rounds = exceptions.div_ceil(THROWS_PER_ROUND);
    let without = workload(rounds);
    let a = attach_all(|_| {}, |_| {});
    let (s0, d0) = (a.stats(), BAD_DATA.load(Ordering::Relaxed));
    let with = workload(rounds);
    plain_phase(&a);
    let s1 = a.stats();
    assert_eq!(with, without, "what the catchers returned");
    let odd = rounds / 2;
    let unwound = rounds * UNWOUND_PER_ROUND + odd * 2 + (rounds - odd);
    assert_eq!(s1.missed.unwound - s0.missed.unwound, unwound);
    assert_eq!(s1.hits - s0.hits, s1.exits - s0.exits + unwound);
    assert_eq!((s1.in_flight, s1.missed.depth), (0, 0));
    assert_eq!(BAD_DATA.load(Ordering::Relaxed), d0, "exit data");
    eprintln!(
        "{} exceptions across probed frames: {} probed calls, {} exits, {unwound} unwound",
        rounds * THROWS_PER_ROUND,
        s1.hits - s0.hits,
        s1.exits - s0.exits
    );
    detach(a).unwrap();
}
