//! Registries created, dispatched through and destroyed through the C ABI,
//! many times on one thread, leave no memory behind; and the
//! `-finstrument-functions` runtime may be attached to a registry,
//! detached and attached to it again.
//!
//! The long variant is `#[ignore]`d; run it in release:
//!
//! ```sh
//! cargo test --release -p fprobe-capi --test lifecycle -- --ignored --nocapture
//! ```

use std::ffi::{c_int, c_void};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicU64, Ordering};

use fprobe_capi::*;

const ADDRS: [u64; 3] = [0x1000, 0x2000, 0x3000];
/// Resident memory a run may add.
const RSS_SLACK: u64 = 64 << 20;

/// The process's resident memory in bytes (`/proc/self/statm`).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * page_size()
}

/// The page size (`AT_PAGESZ` in `/proc/self/auxv`; this crate has no
/// `libc` dependency), 4 KiB if it cannot be read.
fn page_size() -> u64 {
    const AT_PAGESZ: u64 = 6;
    if let Ok(auxv) = std::fs::read("/proc/self/auxv") {
        for pair in auxv.chunks_exact(16) {
            let key = u64::from_ne_bytes(pair[..8].try_into().unwrap());
            let val = u64::from_ne_bytes(pair[8..].try_into().unwrap());
            if key == AT_PAGESZ {
                return val;
            }
        }
    }
    4096
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

/// Fails as soon as resident memory has grown past [`RSS_SLACK`] since
/// `start`, before a leak can exhaust the machine's memory.
fn check_rss(start: u64, registries: u64) {
    let now = rss();
    assert!(
        now <= start + RSS_SLACK,
        "resident memory grew by {:.1} MiB over {registries} registries",
        mib(now.saturating_sub(start))
    );
}

/// What the probes of one test saw.
struct Counts {
    entries: AtomicU64,
    good: AtomicU64,
    bad: AtomicU64,
}

impl Counts {
    const fn new() -> Self {
        Counts {
            entries: AtomicU64::new(0),
            good: AtomicU64::new(0),
            bad: AtomicU64::new(0),
        }
    }
}

unsafe extern "C" fn on_entry(user: *mut c_void, ctx: *mut fprobe_entry_ctx) -> c_int {
    // SAFETY: `user` is the test's `Counts`, a static.
    let c = unsafe { &*(user as *const Counts) };
    c.entries.fetch_add(1, Ordering::Relaxed);
    // SAFETY: valid for the call.
    let ctx = unsafe { &mut *ctx };
    if !ctx.data.is_null() && ctx.data_size >= 8 {
        // SAFETY: `data_size` (at least 8) writable bytes.
        unsafe {
            ctx.data
                .cast::<u64>()
                .write_unaligned(ctx.ret_addr ^ ctx.addr)
        };
    }
    0
}

unsafe extern "C" fn on_exit(user: *mut c_void, ctx: *const fprobe_exit_ctx) {
    // SAFETY: as in `on_entry`.
    let c = unsafe { &*(user as *const Counts) };
    // SAFETY: valid for the call.
    let ctx = unsafe { &*ctx };
    let good = ctx.data_size == 8
        && !ctx.data.is_null()
        // SAFETY: 8 readable bytes, written at entry.
        && unsafe { ctx.data.cast::<u64>().read_unaligned() } == ctx.ret_addr ^ ctx.addr;
    let n = if good { &c.good } else { &c.bad };
    n.fetch_add(1, Ordering::Relaxed);
}

fn probe_for(c: &'static Counts) -> fprobe_probe {
    fprobe_probe {
        entry: Some(on_entry),
        exit: Some(on_exit),
        release: None,
        user: c as *const Counts as *mut c_void,
        data_size: 8,
    }
}

/// Creates a registry, registers one probe on [`ADDRS`], dispatches `calls`
/// pairs through it and destroys it.
fn one_registry(c: &'static Counts, calls: u64) {
    let mut r = null_mut();
    // SAFETY: valid arguments throughout; `r` is live until destroyed.
    unsafe {
        assert_eq!(fprobe_registry_new(null(), &mut r), FPROBE_OK);
        let p = probe_for(c);
        let mut h = 0;
        assert_eq!(
            fprobe_register(r, &p, ADDRS.as_ptr(), null(), ADDRS.len(), &mut h),
            FPROBE_OK
        );
        for i in 0..calls {
            assert_eq!(
                fprobe_on_entry(r, ADDRS[(i % 3) as usize], i, null_mut()),
                FPROBE_OK
            );
            assert_eq!(fprobe_on_exit(r, i, null_mut()), FPROBE_OK);
        }
        let mut s = fprobe_stats::default();
        assert_eq!(fprobe_probe_stats(r, h, &mut s), FPROBE_OK);
        assert_eq!((s.hits, s.exits), (calls, calls));
        assert_eq!(fprobe_registry_destroy(r), FPROBE_OK);
    }
}

/// `n` registries one after another on this thread; checks the counts and
/// the resident memory.
fn churn(c: &'static Counts, n: u64) {
    const CALLS: u64 = 10;
    // The thread's first dispatch anywhere happens before the baseline.
    one_registry(c, CALLS);
    let start = rss();
    let mut after_1000 = start;
    for i in 0..n {
        one_registry(c, CALLS);
        if i + 1 == 1000 {
            after_1000 = rss();
        }
        if i % 100 == 99 {
            check_rss(start, i + 1);
        }
    }
    let end = rss();
    eprintln!(
        "{n} registries: RSS {:.1} MiB at start, {:.1} MiB after 1000, {:.1} MiB at the end",
        mib(start),
        mib(after_1000),
        mib(end)
    );
    let total = (n + 1) * CALLS;
    assert_eq!(c.entries.load(Ordering::Relaxed), total);
    assert_eq!(c.bad.load(Ordering::Relaxed), 0, "exits with wrong data");
    assert_eq!(c.good.load(Ordering::Relaxed), total);
    assert!(
        end <= start + RSS_SLACK,
        "resident memory grew by {:.1} MiB over {n} registries",
        mib(end.saturating_sub(start))
    );
}

#[test]
#[cfg_attr(miri, ignore)] // thousands of registries and grace periods
fn twenty_thousand_registries_leave_little_memory() {
    static COUNTS: Counts = Counts::new();
    churn(&COUNTS, 20_000);
}

#[test]
#[ignore = "long: 100,000 registries; run in release with --ignored"]
fn a_hundred_thousand_registries_leave_little_memory() {
    static COUNTS: Counts = Counts::new();
    churn(&COUNTS, 100_000);
}

/// Attach, detach, attach again on the same live registry; the probe runs
/// through the hooks after the second attach. The only test of this binary
/// that attaches the runtime (it is process-global).
#[cfg(feature = "cyg")]
#[test]
fn runtime_attaches_detaches_and_attaches_the_same_registry_again() {
    static COUNTS: Counts = Counts::new();
    let mut r = null_mut();
    // SAFETY: valid arguments throughout; `r` is live until destroyed.
    unsafe {
        assert_eq!(fprobe_registry_new(null(), &mut r), FPROBE_OK);
        let p = probe_for(&COUNTS);
        let mut h = 0;
        assert_eq!(
            fprobe_register(r, &p, ADDRS.as_ptr(), null(), ADDRS.len(), &mut h),
            FPROBE_OK
        );
        assert_eq!(fprobe_cyg_attach(r), FPROBE_OK, "first attach");
        cyg::__cyg_profile_func_enter(0x1000 as *mut c_void, 0x77 as *mut c_void);
        cyg::__cyg_profile_func_exit(0x1000 as *mut c_void, 0x77 as *mut c_void);
        assert_eq!(fprobe_cyg_detach(), FPROBE_OK);
        assert_eq!(
            fprobe_cyg_attach(r),
            FPROBE_OK,
            "attach again to the same registry"
        );
        cyg::__cyg_profile_func_enter(0x2000 as *mut c_void, 0x88 as *mut c_void);
        cyg::__cyg_profile_func_enter(0x3000 as *mut c_void, 0x99 as *mut c_void);
        cyg::__cyg_profile_func_exit(0x3000 as *mut c_void, 0x99 as *mut c_void);
        cyg::__cyg_profile_func_exit(0x2000 as *mut c_void, 0x88 as *mut c_void);
        assert_eq!(fprobe_cyg_detach(), FPROBE_OK);
        let mut s = fprobe_stats::default();
        assert_eq!(fprobe_probe_stats(r, h, &mut s), FPROBE_OK);
        assert_eq!((s.hits, s.exits), (3, 3));
        assert_eq!(COUNTS.entries.load(Ordering::Relaxed), 3);
        assert_eq!(COUNTS.bad.load(Ordering::Relaxed), 0);
        assert_eq!(COUNTS.good.load(Ordering::Relaxed), 3);
        assert_eq!(fprobe_registry_destroy(r), FPROBE_OK);
    }
}
