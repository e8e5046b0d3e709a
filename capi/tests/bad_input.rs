//! README.md's "Bad input" table, the rows about the C ABI: one test per
//! row (named after it), calling the functions as C would, with the result
//! and the state the row guarantees; then, for the rows the Rust API has
//! too, checks that both give the corresponding result
//! (`Error::InvalidArgument`/`InvalidConfig` ↔ `FPROBE_E_INVALID`,
//! `Error::NotFound` ↔ `FPROBE_E_NOT_FOUND`, `Error::TooManyProbes` ↔
//! `FPROBE_E_CAPACITY`, a panic that would wait for itself ↔
//! `FPROBE_E_BUSY`). The table's Rust rows, and the check that every row
//! has its test, are in `tests/bad_input.rs`.

use std::ffi::{c_int, c_void};
use std::ptr::{null, null_mut};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, Ordering};

use fprobe::Error;
use fprobe::probe::{EntryAction, Fprobe, ProbeHandle, Registry};
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use fprobe_capi::patch::*;
use fprobe_capi::*;

/// What a probe's handlers and its release callback saw. The probes'
/// `user` points at one, which the test keeps alive past the last
/// `fprobe_barrier`.
#[derive(Default)]
struct Log {
    entries: AtomicU64,
    exits: AtomicU64,
    released: AtomicU64,
}

impl Log {
    fn new() -> Arc<Log> {
        Arc::new(Log::default())
    }

    fn counts(&self) -> (u64, u64, u64) {
        (
            self.entries.load(Ordering::Relaxed),
            self.exits.load(Ordering::Relaxed),
            self.released.load(Ordering::Relaxed),
        )
    }
}

unsafe extern "C" fn log_entry(user: *mut c_void, _ctx: *mut fprobe_entry_ctx) -> c_int {
    // SAFETY: `user` is a live `Log` (see `Log`).
    let log = unsafe { &*(user as *const Log) };
    log.entries.fetch_add(1, Ordering::Relaxed);
    0
}

unsafe extern "C" fn log_exit(user: *mut c_void, _ctx: *const fprobe_exit_ctx) {
    // SAFETY: as in `log_entry`.
    let log = unsafe { &*(user as *const Log) };
    log.exits.fetch_add(1, Ordering::Relaxed);
}

unsafe extern "C" fn log_release(user: *mut c_void) {
    // SAFETY: as in `log_entry`.
    let log = unsafe { &*(user as *const Log) };
    log.released.fetch_add(1, Ordering::Relaxed);
}

/// A probe with entry, exit and release, logging into `log`.
fn probe(log: &Arc<Log>) -> fprobe_probe {
    fprobe_probe {
        entry: Some(log_entry),
        exit: Some(log_exit),
        release: Some(log_release),
        user: Arc::as_ptr(log) as *mut c_void,
        data_size: 0,
    }
}

fn new_registry(config: Option<fprobe_config>) -> *mut fprobe_registry {
    let mut r = null_mut();
    let c = config
        .as_ref()
        .map_or(null(), |c| c as *const fprobe_config);
    // SAFETY: `c` is NULL or a valid config; `r` is writable.
    assert_eq!(unsafe { fprobe_registry_new(c, &mut r) }, FPROBE_OK);
    assert!(!r.is_null());
    r
}

/// Registers `p` at `addrs`; the handle.
fn register(r: *mut fprobe_registry, p: &fprobe_probe, addrs: &[u64]) -> u64 {
    let mut h = 0;
    // SAFETY: a live registry, a valid probe, `addrs.len()` addresses.
    let rc = unsafe { fprobe_register(r, p, addrs.as_ptr(), null(), addrs.len(), &mut h) };
    assert_eq!(rc, FPROBE_OK);
    assert_ne!(h, 0);
    h
}

/// One call of `addr` (entry and exit) through the C hooks.
fn call(r: *mut fprobe_registry, addr: u64, ret_addr: u64) {
    // SAFETY: a registry handle; the context is passed through untouched.
    unsafe {
        assert_eq!(fprobe_on_entry(r, addr, ret_addr, null_mut()), FPROBE_OK);
        assert_eq!(fprobe_on_exit(r, ret_addr, null_mut()), FPROBE_OK);
    }
}

/// A probe's counters.
fn stats(r: *mut fprobe_registry, h: u64) -> fprobe_stats {
    let mut s = fprobe_stats::default();
    // SAFETY: a live registry; `s` is writable.
    assert_eq!(unsafe { fprobe_probe_stats(r, h, &mut s) }, FPROBE_OK);
    s
}

/// The registry's number of probed addresses.
fn addresses(r: *mut fprobe_registry) -> usize {
    let mut n = usize::MAX;
    // SAFETY: a live registry; `n` is writable.
    assert_eq!(unsafe { fprobe_registry_addresses(r, &mut n) }, FPROBE_OK);
    n
}

fn destroy(r: *mut fprobe_registry) {
    // SAFETY: a live registry, destroyed once.
    assert_eq!(unsafe { fprobe_registry_destroy(r) }, FPROBE_OK);
}

/// A `fprobe_stats` no call writes.
const UNWRITTEN_STATS: fprobe_stats = fprobe_stats {
    hits: 0xdead,
    exits: 0xdead,
    missed_recursion: 0xdead,
    missed_depth: 0xdead,
    missed_disabled: 0xdead,
    in_flight: 0xdead,
    missed_unwound: 0xdead,
};

/// Row: "C ABI: a NULL pointer argument" → `FPROBE_E_NULL`, nothing
/// changes, no output written. Every pointer argument of every function,
/// the others valid. (`fprobe_on_entry_taking_return`'s `kept` with a NULL
/// registry: see `taking_return_with_a_null_registry_keeps_nothing`.)
#[test]
fn row_c_null_pointer_argument_is_e_null() {
    let log = Log::new();
    let p = probe(&log);
    let r = new_registry(None);
    let h = register(r, &p, &[0x10]);
    call(r, 0x10, 1);
    let before = (addresses(r), stats(r, h), log.counts());
    let addrs = [0x20u64];
    // SAFETY: every call below passes one NULL pointer where the function
    // checks for it, and valid pointers elsewhere.
    unsafe {
        assert_eq!(fprobe_registry_new(null(), null_mut()), FPROBE_E_NULL);
        let config = fprobe_config::default();
        assert_eq!(fprobe_registry_new(&config, null_mut()), FPROBE_E_NULL);
        assert_eq!(fprobe_registry_destroy(null_mut()), FPROBE_E_NULL);

        let mut h2 = 0xdead_u64;
        let n = addrs.len();
        let a = addrs.as_ptr();
        assert_eq!(
            fprobe_register(null_mut(), &p, a, null(), n, &mut h2),
            FPROBE_E_NULL
        );
        assert_eq!(
            fprobe_register(r, null(), a, null(), n, &mut h2),
            FPROBE_E_NULL
        );
        assert_eq!(
            fprobe_register(r, &p, null(), null(), n, &mut h2),
            FPROBE_E_NULL
        );
        assert_eq!(
            fprobe_register(r, &p, a, null(), n, null_mut()),
            FPROBE_E_NULL
        );
        assert_eq!(h2, 0xdead, "no handle written");

        assert_eq!(fprobe_unregister(null_mut(), h), FPROBE_E_NULL);
        assert_eq!(fprobe_enable(null_mut(), h), FPROBE_E_NULL);
        assert_eq!(fprobe_disable(null_mut(), h), FPROBE_E_NULL);
        let mut left = 0xdead_u64;
        assert_eq!(fprobe_drain(null_mut(), h, 0, &mut left), FPROBE_E_NULL);
        assert_eq!(left, 0xdead);
        let mut s = UNWRITTEN_STATS;
        assert_eq!(fprobe_probe_stats(null_mut(), h, &mut s), FPROBE_E_NULL);
        assert_eq!(s, UNWRITTEN_STATS);
        assert_eq!(fprobe_probe_stats(r, h, null_mut()), FPROBE_E_NULL);
        let mut count = 0xdead_usize;
        assert_eq!(
            fprobe_registry_addresses(null_mut(), &mut count),
            FPROBE_E_NULL
        );
        assert_eq!(count, 0xdead);
        assert_eq!(fprobe_registry_addresses(r, null_mut()), FPROBE_E_NULL);

        assert_eq!(
            fprobe_on_entry(null_mut(), 0x10, 2, null_mut()),
            FPROBE_E_NULL
        );
        assert_eq!(fprobe_on_exit(null_mut(), 2, null_mut()), FPROBE_E_NULL);
        let mut kept = 0x5a;
        assert_eq!(
            fprobe_on_entry_taking_return(null_mut(), 0x10, 2, 0x7f00, null_mut(), &mut kept),
            FPROBE_E_NULL
        );
        assert_eq!(
            fprobe_on_entry_taking_return(r, 0x10, 2, 0x7f00, null_mut(), null_mut()),
            FPROBE_E_NULL
        );
        let mut ret = 0xdead_u64;
        assert_eq!(
            fprobe_on_return(null_mut(), 0x7f00, null_mut(), &mut ret),
            FPROBE_E_NULL
        );
        assert_eq!(ret, 0xdead);
        assert_eq!(
            fprobe_on_return(r, 0x7f00, null_mut(), null_mut()),
            FPROBE_E_NULL
        );
        assert_eq!(fprobe_reset_pairing(null_mut()), FPROBE_E_NULL);
        #[cfg(feature = "cyg")]
        assert_eq!(fprobe_cyg_attach(null_mut()), FPROBE_E_NULL);

        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            assert_eq!(fprobe_patch_prepare(null(), 1), FPROBE_E_NULL);
            assert_eq!(
                fprobe_patch_attach(null(), a, null(), n, &mut h2),
                FPROBE_E_NULL
            );
            assert_eq!(
                fprobe_patch_attach(&p, null(), null(), n, &mut h2),
                FPROBE_E_NULL
            );
            assert_eq!(
                fprobe_patch_attach(&p, a, null(), n, null_mut()),
                FPROBE_E_NULL
            );
            assert_eq!(h2, 0xdead, "no handle written");
            assert_eq!(fprobe_patch_stats(1, null_mut()), FPROBE_E_NULL);
            assert_eq!(
                fprobe_patch_functions(null_mut(), 4, &mut count),
                FPROBE_E_NULL
            );
            assert_eq!(count, 0xdead);
            let mut buf = [7u64; 4];
            assert_eq!(
                fprobe_patch_functions(buf.as_mut_ptr(), 4, null_mut()),
                FPROBE_E_NULL
            );
            assert_eq!(buf, [7; 4]);
        }
    }
    // Nothing changed: no probe registered, no handler ran, no frame kept.
    assert_eq!((addresses(r), stats(r, h), log.counts()), before);
    call(r, 0x10, 3);
    assert_eq!(stats(r, h).exits, 2);
    destroy(r);
    assert_eq!(fprobe_barrier(), FPROBE_OK);
    assert_eq!(log.counts().2, 1, "only the registered probe was released");
}

/// The NULL row's one output written on error: `*kept` of
/// `fprobe_on_entry_taking_return` is 0 (nothing kept), so that a
/// trampoline that reads it unchecked leaves the return alone.
#[test]
fn taking_return_with_a_null_registry_keeps_nothing() {
    let mut kept = 0x5a;
    // SAFETY: a NULL registry is a documented bad input; `kept` is writable.
    let rc = unsafe { fprobe_on_entry_taking_return(null_mut(), 1, 2, 3, null_mut(), &mut kept) };
    assert_eq!(rc, FPROBE_E_NULL);
    assert_eq!(kept, 0, "nothing kept");
}

/// Row: "C ABI: unknown, stale or foreign probe handle; unregister twice"
/// → `FPROBE_E_NOT_FOUND`, nothing changes (a foreign handle of the same
/// slot: `foreign_handle_of_the_same_slot_is_not_found`).
#[test]
fn row_c_unknown_stale_or_foreign_handle_is_e_not_found() {
    let (log, dead_log, other_log) = (Log::new(), Log::new(), Log::new());
    let r = new_registry(None);
    let live = register(r, &probe(&log), &[0x10]);
    let dead = register(r, &probe(&dead_log), &[0x20]);
    // SAFETY: a live registry and its probe.
    assert_eq!(unsafe { fprobe_unregister(r, dead) }, FPROBE_OK);
    let other = new_registry(None);
    let foreign = [0x1u64, 0x2, 0x3].map(|a| register(other, &probe(&other_log), &[a]))[2];
    call(r, 0x10, 1);
    let before = (addresses(r), stats(r, live), log.counts());
    let bad = [0, 12345, u64::MAX, dead, foreign, live + (2 << 16)];
    for h in bad {
        // SAFETY: live registries; the outputs are writable.
        unsafe {
            assert_eq!(fprobe_unregister(r, h), FPROBE_E_NOT_FOUND, "{h:#x}");
            assert_eq!(fprobe_enable(r, h), FPROBE_E_NOT_FOUND, "{h:#x}");
            assert_eq!(fprobe_disable(r, h), FPROBE_E_NOT_FOUND, "{h:#x}");
            let mut left = 0xdead_u64;
            assert_eq!(fprobe_drain(r, h, 0, &mut left), FPROBE_E_NOT_FOUND);
            assert_eq!(left, 0xdead, "no output written");
            let mut s = UNWRITTEN_STATS;
            assert_eq!(fprobe_probe_stats(r, h, &mut s), FPROBE_E_NOT_FOUND);
            assert_eq!(s, UNWRITTEN_STATS, "no output written");
        }
    }
    // Nothing changed, here or in the other registry.
    assert_eq!((addresses(r), stats(r, live), log.counts()), before);
    call(r, 0x10, 2);
    let s = stats(r, live);
    assert_eq!((s.hits, s.exits, s.missed_disabled), (2, 2, 0));
    assert_eq!(addresses(other), 3);
    assert_eq!(stats(other, foreign).hits, 0);
    // Unregister twice.
    // SAFETY: a live registry.
    unsafe {
        assert_eq!(fprobe_unregister(r, live), FPROBE_OK);
        assert_eq!(fprobe_unregister(r, live), FPROBE_E_NOT_FOUND);
    }
    assert_eq!(addresses(r), 0);
    // The patching runtime's handles, likewise.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    // SAFETY: the outputs are writable.
    unsafe {
        for h in [0, u64::MAX] {
            assert_eq!(fprobe_patch_detach(h), FPROBE_E_NOT_FOUND);
            let mut left = 0xdead_u64;
            assert_eq!(
                fprobe_patch_detach_draining(h, 0, &mut left),
                FPROBE_E_NOT_FOUND
            );
            assert_eq!(left, 0xdead);
            let mut s = UNWRITTEN_STATS;
            assert_eq!(fprobe_patch_stats(h, &mut s), FPROBE_E_NOT_FOUND);
            assert_eq!(s, UNWRITTEN_STATS);
        }
    }
    destroy(r);
    destroy(other);
    assert_eq!(fprobe_barrier(), FPROBE_OK);
    assert_eq!(
        (log.counts().2, dead_log.counts().2, other_log.counts().2),
        (1, 1, 3),
        "each probe released once"
    );
}

/// The stale-handle row for a handle of another registry in the same
/// slot (the first probe of two fresh registries): each registry's
/// generations start in a range of their own, so the handles differ and
/// the foreign one is not found.
#[test]
fn foreign_handle_of_the_same_slot_is_not_found() {
    let log = Log::new();
    let (a, b) = (new_registry(None), new_registry(None));
    let ha = register(a, &probe(&log), &[1]);
    let hb = register(b, &probe(&log), &[1]);
    assert_ne!(ha, hb, "handles of two registries differ");
    // SAFETY: a live registry.
    let rc = unsafe { fprobe_disable(b, ha) };
    destroy(a);
    destroy(b);
    assert_eq!(rc, FPROBE_E_NOT_FOUND, "b's own probe was disabled");
}

/// Row: "C ABI: any call on a destroyed registry (destroy twice
/// included)" → `FPROBE_E_DESTROYED` (the 16-byte handle is kept as a
/// tombstone).
#[test]
fn row_c_call_on_a_destroyed_registry_is_e_destroyed() {
    assert_eq!(std::mem::size_of::<fprobe_registry>(), 16);
    let (log, late) = (Log::new(), Log::new());
    let r = new_registry(None);
    let h = register(r, &probe(&log), &[0x10]);
    destroy(r);
    let late_probe = probe(&late);
    // SAFETY: `r` is a destroyed registry's handle (a tombstone, never
    // freed); the other arguments are valid.
    unsafe {
        assert_eq!(
            fprobe_registry_destroy(r),
            FPROBE_E_DESTROYED,
            "destroy twice"
        );
        let mut h2 = 0xdead_u64;
        let a = [0x20u64];
        assert_eq!(
            fprobe_register(r, &late_probe, a.as_ptr(), null(), 1, &mut h2),
            FPROBE_E_DESTROYED
        );
        assert_eq!(h2, 0xdead);
        assert_eq!(fprobe_unregister(r, h), FPROBE_E_DESTROYED);
        assert_eq!(fprobe_enable(r, h), FPROBE_E_DESTROYED);
        assert_eq!(fprobe_disable(r, h), FPROBE_E_DESTROYED);
        let mut left = 0xdead_u64;
        assert_eq!(fprobe_drain(r, h, 0, &mut left), FPROBE_E_DESTROYED);
        assert_eq!(left, 0xdead);
        let mut s = UNWRITTEN_STATS;
        assert_eq!(fprobe_probe_stats(r, h, &mut s), FPROBE_E_DESTROYED);
        assert_eq!(s, UNWRITTEN_STATS);
        let mut n = 0xdead_usize;
        assert_eq!(fprobe_registry_addresses(r, &mut n), FPROBE_E_DESTROYED);
        assert_eq!(n, 0xdead);
        assert_eq!(fprobe_on_entry(r, 0x10, 1, null_mut()), FPROBE_E_DESTROYED);
        assert_eq!(fprobe_on_exit(r, 1, null_mut()), FPROBE_E_DESTROYED);
        let mut kept = 9;
        assert_eq!(
            fprobe_on_entry_taking_return(r, 0x10, 1, 0x7f00, null_mut(), &mut kept),
            FPROBE_E_DESTROYED
        );
        assert_eq!(kept, 0, "documented: nothing kept");
        let mut ret = 0xdead_u64;
        assert_eq!(
            fprobe_on_return(r, 0x7f00, null_mut(), &mut ret),
            FPROBE_E_DESTROYED
        );
        assert_eq!(ret, 0xdead);
        assert_eq!(fprobe_reset_pairing(r), FPROBE_E_DESTROYED);
        #[cfg(feature = "cyg")]
        assert_eq!(fprobe_cyg_attach(r), FPROBE_E_DESTROYED);
        assert_eq!(fprobe_registry_destroy(r), FPROBE_E_DESTROYED, "and again");
    }
    assert_eq!(fprobe_barrier(), FPROBE_OK);
    assert_eq!(log.counts(), (0, 0, 1), "released once, by the destroy");
    assert_eq!(late.counts(), (0, 0, 0), "user stays the caller's");
}

/// Row: "C ABI: probe with no handler, no address (`n` 0), `data_size` too
/// large, config out of range" → `FPROBE_E_INVALID`, nothing registered or
/// built; `user` stays the caller's (no release call). Also the registry
/// builder row's "(C ABI: 0 in a config field means its default)".
#[test]
fn row_c_invalid_probe_or_config_is_e_invalid() {
    let log = Log::new();
    let r = new_registry(None);
    let addrs = [0x10u64, 0x20];
    let refused = |p: &fprobe_probe, a: *const u64, n: usize| {
        let mut h = 0xdead_u64;
        // SAFETY: a live registry; `a` is NULL or points to `n` addresses.
        let rc = unsafe { fprobe_register(r, p, a, null(), n, &mut h) };
        assert_eq!(h, 0xdead, "no handle written");
        rc
    };
    let mut no_handler = probe(&log);
    no_handler.entry = None;
    no_handler.exit = None;
    assert_eq!(refused(&no_handler, addrs.as_ptr(), 2), FPROBE_E_INVALID);
    assert_eq!(refused(&no_handler, null(), 0), FPROBE_E_INVALID);
    assert_eq!(refused(&probe(&log), null(), 0), FPROBE_E_INVALID, "n 0");
    assert_eq!(refused(&probe(&log), addrs.as_ptr(), 0), FPROBE_E_INVALID);
    for data_size in [65, 4097, 1 << 20, usize::MAX] {
        let p = fprobe_probe {
            data_size,
            ..probe(&log)
        };
        assert_eq!(
            refused(&p, addrs.as_ptr(), 2),
            FPROBE_E_INVALID,
            "{data_size}"
        );
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let mut h = 0xdead_u64;
        // SAFETY: a valid probe and one address; `h` is writable.
        let rc = unsafe { fprobe_patch_attach(&no_handler, addrs.as_ptr(), null(), 1, &mut h) };
        assert_eq!((rc, h), (FPROBE_E_INVALID, 0xdead));
    }
    // Nothing registered; the probe's `user` stays the caller's.
    assert_eq!(addresses(r), 0);
    call(r, 0x10, 1);
    destroy(r);
    assert_eq!(fprobe_barrier(), FPROBE_OK);
    assert_eq!(log.counts(), (0, 0, 0), "no handler ran, no release call");

    // Configurations out of range: nothing built.
    let c = fprobe_config::default;
    let bad = [
        fprobe_config {
            max_probes: 65537,
            ..c()
        },
        fprobe_config {
            data_size: 4097,
            ..c()
        },
        fprobe_config {
            max_depth: usize::MAX,
            ..c()
        },
        fprobe_config {
            data_size: 4096,
            max_depth: 40_000, // a shadow stack over 128 MiB
            ..c()
        },
        fprobe_config {
            capacity: usize::MAX,
            ..c()
        },
        fprobe_config {
            hit_cache_entries: 100,
            ..c()
        },
        fprobe_config {
            hit_cache_entries: 8,
            ..c()
        },
        fprobe_config {
            hit_cache_entries: 1 << 17,
            hit_cache_per_cpu: 1,
            ..c()
        },
    ];
    for config in bad {
        let mut out = null_mut();
        // SAFETY: a valid config; `out` is writable.
        let rc = unsafe { fprobe_registry_new(&config, &mut out) };
        assert_eq!(rc, FPROBE_E_INVALID, "{config:?}");
        assert!(out.is_null(), "no registry written: {config:?}");
    }

    // 0 in a field means its default: 256 probes, 64 bytes of data.
    let defaults = Log::new();
    let r = new_registry(Some(c()));
    let p64 = fprobe_probe {
        data_size: 64,
        ..probe(&defaults)
    };
    let p65 = fprobe_probe {
        data_size: 65,
        ..probe(&defaults)
    };
    for a in 0..256u64 {
        register(r, &p64, &[0x1000 + a]);
    }
    let mut h = 0;
    // SAFETY: a live registry, valid probes, one address.
    unsafe {
        let a = [0x9000u64];
        assert_eq!(
            fprobe_register(r, &p65, a.as_ptr(), null(), 1, &mut h),
            FPROBE_E_INVALID
        );
        assert_eq!(
            fprobe_register(r, &p64, a.as_ptr(), null(), 1, &mut h),
            FPROBE_E_CAPACITY
        );
    }
    assert_eq!(addresses(r), 256);
    destroy(r);
    assert_eq!(fprobe_barrier(), FPROBE_OK);
    assert_eq!(defaults.counts().2, 256, "the registered ones only");
}

/// Records the statuses of the calls a handler makes that would wait for
/// itself.
struct Waiter {
    registry: AtomicPtr<fprobe_registry>,
    handle: AtomicU64,
    /// Per handler (entry, exit): `fprobe_unregister`,
    /// `fprobe_registry_destroy`, `fprobe_barrier`, `fprobe_drain`,
    /// `fprobe_cyg_detach`.
    rcs: [[AtomicI32; 5]; 2],
}

/// The calls of [`Waiter`], from the handler `which` (0 entry, 1 exit).
///
/// # Safety
///
/// `user` is a live `Waiter` whose registry is live.
unsafe fn try_to_wait(user: *mut c_void, which: usize) {
    // SAFETY: the caller's contract.
    let w = unsafe { &*(user as *const Waiter) };
    let r = w.registry.load(Ordering::Relaxed);
    let h = w.handle.load(Ordering::Relaxed);
    let rcs = &w.rcs[which];
    // SAFETY: a live registry; a NULL `left_out` is allowed.
    unsafe {
        rcs[0].store(fprobe_unregister(r, h), Ordering::Relaxed);
        rcs[1].store(fprobe_registry_destroy(r), Ordering::Relaxed);
        rcs[2].store(fprobe_barrier(), Ordering::Relaxed);
        rcs[3].store(fprobe_drain(r, h, 0, null_mut()), Ordering::Relaxed);
    }
    #[cfg(feature = "cyg")]
    rcs[4].store(fprobe_cyg_detach(), Ordering::Relaxed);
    #[cfg(not(feature = "cyg"))]
    rcs[4].store(FPROBE_E_BUSY, Ordering::Relaxed);
}

unsafe extern "C" fn waiting_entry(user: *mut c_void, _ctx: *mut fprobe_entry_ctx) -> c_int {
    // SAFETY: `user` is the test's `Waiter`.
    unsafe { try_to_wait(user, 0) };
    0
}

unsafe extern "C" fn waiting_exit(user: *mut c_void, _ctx: *const fprobe_exit_ctx) {
    // SAFETY: as in `waiting_entry`.
    unsafe { try_to_wait(user, 1) };
}

/// Row: "C ABI: `fprobe_unregister`/`fprobe_registry_destroy`/`fprobe_barrier`
/// from a handler; `fprobe_cyg_attach` while attached" → `FPROBE_E_BUSY`,
/// nothing changes. (Also `fprobe_drain` and `fprobe_cyg_detach` from a
/// handler, documented as `FPROBE_E_BUSY` too.) The only test of this
/// binary that attaches the `-finstrument-functions` runtime.
#[test]
fn row_c_call_that_would_wait_for_itself_is_e_busy() {
    let r = new_registry(None);
    let w = Waiter {
        registry: AtomicPtr::new(r),
        handle: AtomicU64::new(0),
        rcs: Default::default(),
    };
    let p = fprobe_probe {
        entry: Some(waiting_entry),
        exit: Some(waiting_exit),
        release: None,
        user: &w as *const Waiter as *mut c_void,
        data_size: 0,
    };
    let h = register(r, &p, &[0x10]);
    w.handle.store(h, Ordering::Relaxed);
    call(r, 0x10, 1);
    for (which, rcs) in ["entry", "exit"].iter().zip(&w.rcs) {
        let rcs: Vec<c_int> = rcs.iter().map(|rc| rc.load(Ordering::Relaxed)).collect();
        assert_eq!(rcs, [FPROBE_E_BUSY; 5], "from the {which} handler");
    }
    // Nothing changed: registered, enabled, the registry alive.
    let s = stats(r, h);
    assert_eq!(
        (s.hits, s.exits, s.missed_disabled, s.in_flight),
        (1, 1, 0, 0)
    );
    assert_eq!(addresses(r), 1);
    w.registry.store(null_mut(), Ordering::Relaxed); // the calls now get NULL
    call(r, 0x10, 2);
    assert_eq!(stats(r, h).exits, 2);
    destroy(r);
    assert_eq!(fprobe_barrier(), FPROBE_OK); // no handler of `w` runs any more

    #[cfg(feature = "cyg")]
    {
        use fprobe_capi::cyg::{__cyg_profile_func_enter, __cyg_profile_func_exit};
        use std::ptr::without_provenance_mut;
        let (log1, log2) = (Log::new(), Log::new());
        let r1 = new_registry(None);
        let r2 = new_registry(None);
        let h1 = register(r1, &probe(&log1), &[0x4000]);
        let h2 = register(r2, &probe(&log2), &[0x4000]);
        // SAFETY: live registries; the hooks are called as compiled code
        // would call them.
        unsafe {
            assert_eq!(fprobe_cyg_attach(r1), FPROBE_OK);
            assert_eq!(fprobe_cyg_attach(r2), FPROBE_E_BUSY);
            assert_eq!(fprobe_cyg_attach(r1), FPROBE_E_BUSY, "attached already");
            // Nothing changed: the hooks still dispatch to the first.
            let (f, site) = (without_provenance_mut(0x4000), without_provenance_mut(0x77));
            __cyg_profile_func_enter(f, site);
            __cyg_profile_func_exit(f, site);
        }
        assert_eq!(fprobe_cyg_detach(), FPROBE_OK);
        assert_eq!((stats(r1, h1).exits, stats(r2, h2).hits), (1, 0));
        destroy(r1);
        destroy(r2);
        assert_eq!(fprobe_barrier(), FPROBE_OK);
        assert_eq!((log1.counts(), log2.counts()), ((1, 1, 1), (0, 0, 1)));
    }
}

/// Row: "C ABI: `fprobe_patch_functions(NULL, 0, &n)` (sizing)" →
/// `FPROBE_OK`, the count in `n`; nothing else written.
#[test]
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[cfg_attr(miri, ignore)] // reads the loaded objects' files
fn row_c_patch_functions_sizing_call_writes_only_the_count() {
    let mut n = usize::MAX;
    // SAFETY: the sizing call: NULL and 0, `n` writable.
    let rc = unsafe { fprobe_patch_functions(null_mut(), 0, &mut n) };
    assert_eq!(rc, FPROBE_OK);
    assert_ne!(n, usize::MAX, "the count written");
    // The count is the list's length: a buffer of `n` takes them all and
    // the slot after it is left alone.
    let mut buf = vec![0xdead_u64; n + 1];
    let mut m = usize::MAX;
    // SAFETY: `buf` holds `n` writable values (and one more).
    let rc = unsafe { fprobe_patch_functions(buf.as_mut_ptr(), n, &mut m) };
    assert_eq!(rc, FPROBE_OK);
    assert_eq!(m, n);
    assert_eq!(buf[n], 0xdead);
    assert!(buf[..n].iter().all(|&f| f != 0xdead));
}

// --------------------------------------------- the Rust API and the C ABI

/// One registration through each API, with the same settings: the Rust
/// result and the C status.
fn both_register(
    rust: &Registry<()>,
    rust_probe: Fprobe<()>,
    c: *mut fprobe_registry,
    c_probe: &fprobe_probe,
    addrs: &[u64],
) -> (Result<ProbeHandle, Error>, c_int) {
    let mut h = 0xdead_u64;
    let a = if addrs.is_empty() {
        null()
    } else {
        addrs.as_ptr()
    };
    // SAFETY: a live registry, a valid probe, `addrs.len()` addresses.
    let rc = unsafe { fprobe_register(c, c_probe, a, null(), addrs.len(), &mut h) };
    if rc != FPROBE_OK {
        assert_eq!(h, 0xdead);
    }
    (rust.register(rust_probe, addrs), rc)
}

/// Rows in both APIs: a probe with no handler, with no address, with a
/// `data_size` above the registry's, and one beyond `max_probes`:
/// `InvalidArgument`, `InvalidArgument`, `InvalidConfig` and
/// `TooManyProbes` in Rust; `FPROBE_E_INVALID` for the first three and
/// `FPROBE_E_CAPACITY` in C.
#[test]
fn rust_and_c_agree_on_bad_registrations() {
    let log = Log::new();
    let rust = Registry::<()>::builder()
        .max_probes(1)
        .data_size(16)
        .build()
        .unwrap();
    let c = new_registry(Some(fprobe_config {
        max_probes: 1,
        data_size: 16,
        ..Default::default()
    }));
    let entry = || Fprobe::builder().entry(|_| EntryAction::Continue).build();

    let no_handler = fprobe_probe {
        entry: None,
        exit: None,
        ..probe(&log)
    };
    let (r, rc) = both_register(&rust, Fprobe::builder().build(), c, &no_handler, &[1]);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    assert_eq!(rc, FPROBE_E_INVALID);

    let (r, rc) = both_register(&rust, entry(), c, &probe(&log), &[]);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    assert_eq!(rc, FPROBE_E_INVALID);

    let big = fprobe_probe {
        data_size: 17,
        ..probe(&log)
    };
    let rust_big = Fprobe::builder().data_size(17).exit(|_| {}).build();
    let (r, rc) = both_register(&rust, rust_big, c, &big, &[1]);
    assert!(matches!(r, Err(Error::InvalidConfig(_))), "{r:?}");
    assert_eq!(rc, FPROBE_E_INVALID);

    // None of those took the one slot.
    let (r, rc) = both_register(&rust, entry(), c, &probe(&log), &[1]);
    let (rust_handle, c_status) = (r.unwrap(), rc);
    assert_eq!(c_status, FPROBE_OK);
    let (r, rc) = both_register(&rust, entry(), c, &probe(&log), &[2]);
    assert_eq!(r, Err(Error::TooManyProbes { max_probes: 1 }));
    assert_eq!(rc, FPROBE_E_CAPACITY);
    assert_eq!((rust.addresses(), addresses(c)), (1, 1));
    rust.unregister(rust_handle).unwrap();
    destroy(c);
    assert_eq!(fprobe_barrier(), FPROBE_OK);
    assert_eq!(log.counts().2, 1, "only the registered C probe released");
}

/// Rows in both APIs: a stale handle (unregistered, twice, never issued,
/// or another registry's) is `Error::NotFound` in Rust and
/// `FPROBE_E_NOT_FOUND` in C.
#[test]
fn rust_and_c_agree_on_stale_handles() {
    let log = Log::new();
    let rust = Registry::<()>::builder().build().unwrap();
    let c = new_registry(None);
    let entry = || Fprobe::builder().entry(|_| EntryAction::Continue).build();
    let rust_handles = [
        rust.register(entry(), &[1]).unwrap(),
        rust.register(entry(), &[2]).unwrap(),
    ];
    let c_handles = [
        register(c, &probe(&log), &[1]),
        register(c, &probe(&log), &[2]),
    ];
    // Each registry's handles name nothing in the other.
    assert_eq!(
        rust.disable(ProbeHandle::from_bits(c_handles[0])),
        Err(Error::NotFound)
    );
    // SAFETY: a live registry.
    let rc = unsafe { fprobe_disable(c, rust_handles[0].to_bits()) };
    assert_eq!(rc, FPROBE_E_NOT_FOUND);
    rust.unregister(rust_handles[1]).unwrap();
    // SAFETY: a live registry and its probe.
    assert_eq!(unsafe { fprobe_unregister(c, c_handles[1]) }, FPROBE_OK);
    for bits in [c_handles[1], 0, u64::MAX, 12345] {
        let h = ProbeHandle::from_bits(bits);
        let rust_results = [
            rust.unregister(h),
            rust.enable(h),
            rust.disable(h),
            rust.stats(h).map(|_| ()),
        ];
        let mut s = fprobe_stats::default();
        // SAFETY: a live registry; `s` is writable.
        let c_results = unsafe {
            [
                fprobe_unregister(c, bits),
                fprobe_enable(c, bits),
                fprobe_disable(c, bits),
                fprobe_probe_stats(c, bits, &mut s),
            ]
        };
        assert_eq!(rust_results, [Err(Error::NotFound); 4], "{bits:#x}");
        assert_eq!(c_results, [FPROBE_E_NOT_FOUND; 4], "{bits:#x}");
    }
    assert_eq!((rust.addresses(), addresses(c)), (1, 1));
    destroy(c);
    assert_eq!(fprobe_barrier(), FPROBE_OK);
    assert_eq!(log.counts().2, 2);
}

/// Rows in both APIs: registry settings out of range are
/// `Error::InvalidConfig` in Rust and `FPROBE_E_INVALID` in C (0 in a C
/// field means its default, so the Rust zeros have no C counterpart).
#[test]
fn rust_and_c_agree_on_registry_config() {
    let cases = [
        (65537, 0, 0, 0),
        (0, 4097, 0, 0),
        (0, 4096, 40_000, 0),
        (0, 0, 0, 100),
        (0, 0, 0, 1 << 17),
    ];
    for (max_probes, data_size, max_depth, hit_cache_entries) in cases {
        let config = fprobe_config {
            max_probes,
            data_size,
            max_depth,
            hit_cache_entries,
            ..Default::default()
        };
        let mut b = Registry::<()>::builder();
        if max_probes != 0 {
            b = b.max_probes(max_probes);
        }
        if data_size != 0 {
            b = b.data_size(data_size);
        }
        if max_depth != 0 {
            b = b.max_depth(max_depth);
        }
        if hit_cache_entries != 0 {
            b = b.hit_cache(fprobe::HitCacheConfig::default().entries(hit_cache_entries));
        }
        assert!(
            matches!(b.build(), Err(Error::InvalidConfig(_))),
            "{config:?}"
        );
        let mut out = null_mut();
        // SAFETY: a valid config; `out` is writable.
        let rc = unsafe { fprobe_registry_new(&config, &mut out) };
        assert_eq!(rc, FPROBE_E_INVALID, "{config:?}");
        assert!(out.is_null());
    }
}

/// Rows in both APIs: unregistering from a handler panics in Rust (the
/// handler's panic is contained and counted) and is `FPROBE_E_BUSY` in C;
/// in both the probe stays registered.
#[test]
fn rust_and_c_agree_on_unregister_from_a_handler() {
    use std::sync::OnceLock;
    static RUST: OnceLock<(Registry<()>, OnceLock<ProbeHandle>)> = OnceLock::new();
    let (rust, handle) =
        RUST.get_or_init(|| (Registry::builder().build().unwrap(), OnceLock::new()));
    let h = rust
        .register(
            Fprobe::builder()
                .entry(|_| {
                    let (reg, h) = RUST.get().unwrap();
                    let _ = reg.unregister(*h.get().unwrap());
                    EntryAction::Continue
                })
                .build(),
            &[0x10],
        )
        .unwrap();
    handle.set(h).unwrap();
    rust.on_entry(0x10, 1, &());
    rust.on_exit(1, &());
    let s = rust.stats(h).unwrap();
    assert_eq!((s.hits, s.panics), (1, 1), "the panic was contained");
    assert!(
        rust.first_panic(h)
            .unwrap()
            .unwrap()
            .contains("Registry::unregister")
    );
    assert_eq!(rust.addresses(), 1, "still registered");

    let c = new_registry(None);
    let w = Waiter {
        registry: AtomicPtr::new(c),
        handle: AtomicU64::new(0),
        rcs: Default::default(),
    };
    let p = fprobe_probe {
        entry: Some(waiting_entry),
        exit: None,
        release: None,
        user: &w as *const Waiter as *mut c_void,
        data_size: 0,
    };
    let ch = register(c, &p, &[0x10]);
    w.handle.store(ch, Ordering::Relaxed);
    call(c, 0x10, 1);
    assert_eq!(w.rcs[0][0].load(Ordering::Relaxed), FPROBE_E_BUSY);
    assert_eq!(
        (stats(c, ch).hits, addresses(c)),
        (1, 1),
        "still registered"
    );
    destroy(c);
    assert_eq!(fprobe_barrier(), FPROBE_OK);
    rust.unregister(h).unwrap();
}
