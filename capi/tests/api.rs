//! The C ABI called as C would call it: every bad-input path returns its
//! documented code and changes nothing; destroy is safe under concurrent
//! dispatch; release callbacks run exactly once.

use std::ffi::{CStr, c_int, c_void};
use std::ptr::{null, null_mut};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering};

use fprobe_capi::*;

fn new_registry() -> *mut fprobe_registry {
    let mut r = null_mut();
    // SAFETY: valid out pointer.
    assert_eq!(unsafe { fprobe_registry_new(null(), &mut r) }, FPROBE_OK);
    r
}

struct Counts {
    entries: AtomicU64,
    exits: AtomicU64,
    released: AtomicU64,
    /// Status of an `fprobe_unregister` attempted from inside a handler.
    nested_rc: AtomicI32,
    registry: AtomicPtr<fprobe_registry>,
    handle: AtomicU64,
}

fn counts() -> Arc<Counts> {
    Arc::new(Counts {
        entries: AtomicU64::new(0),
        exits: AtomicU64::new(0),
        released: AtomicU64::new(0),
        nested_rc: AtomicI32::new(1),
        registry: AtomicPtr::new(null_mut()),
        handle: AtomicU64::new(0),
    })
}

unsafe extern "C" fn on_entry(user: *mut c_void, ctx: *mut fprobe_entry_ctx) -> c_int {
    // SAFETY: `user` is the `Counts` registered with the probe.
    let c = unsafe { &*(user as *const Counts) };
    c.entries.fetch_add(1, Ordering::Relaxed);
    // SAFETY: valid for the call.
    let ctx = unsafe { &mut *ctx };
    if !ctx.data.is_null() {
        // SAFETY: `data_size` bytes, unaligned.
        unsafe { ctx.data.cast::<u64>().write_unaligned(ctx.addr ^ 0x5a5a) };
    }
    let r = c.registry.load(Ordering::Relaxed);
    if !r.is_null() {
        // SAFETY: the registry under test.
        let rc = unsafe { fprobe_unregister(r, c.handle.load(Ordering::Relaxed)) };
        c.nested_rc.store(rc, Ordering::Relaxed);
    }
    0
}

unsafe extern "C" fn on_exit(user: *mut c_void, ctx: *const fprobe_exit_ctx) {
    // SAFETY: as in `on_entry`.
    let c = unsafe { &*(user as *const Counts) };
    // SAFETY: valid for the call; 8 bytes written at entry.
    let ctx = unsafe { &*ctx };
    assert_eq!(ctx.data_size, 8);
    // SAFETY: as above.
    let v = unsafe { ctx.data.cast::<u64>().read_unaligned() };
    assert_eq!(v, ctx.addr ^ 0x5a5a);
    c.exits.fetch_add(1, Ordering::Relaxed);
}

unsafe extern "C" fn on_release(user: *mut c_void) {
    // SAFETY: the `Arc<Counts>` leaked for the probe; reclaimed here, once.
    let c = unsafe { Arc::from_raw(user as *const Counts) };
    c.released.fetch_add(1, Ordering::Relaxed);
}

fn probe_for(c: &Arc<Counts>) -> fprobe_probe {
    fprobe_probe {
        entry: Some(on_entry),
        exit: Some(on_exit),
        release: Some(on_release),
        user: Arc::into_raw(c.clone()) as *mut c_void,
        data_size: 8,
    }
}

/// A fresh registry with [`probe_for`]'s probe registered at `addr`: the
/// registry, the probe's counts and its handle.
fn registry_with_probe_at(addr: u64) -> (*mut fprobe_registry, Arc<Counts>, u64) {
    let r = new_registry();
    let c = counts();
    let p = probe_for(&c);
    let mut h = 0;
    // SAFETY: a live registry, a valid probe and one address.
    let rc = unsafe { fprobe_register(r, &p, &addr, null(), 1, &mut h) };
    assert_eq!(rc, FPROBE_OK);
    (r, c, h)
}

#[test]
fn null_pointers_are_errors() {
    // SAFETY: every call below is a documented bad-input path.
    unsafe {
        assert_eq!(fprobe_registry_new(null(), null_mut()), FPROBE_E_NULL);
        assert_eq!(fprobe_registry_destroy(null_mut()), FPROBE_E_NULL);
        assert_eq!(fprobe_unregister(null_mut(), 1), FPROBE_E_NULL);
        assert_eq!(fprobe_enable(null_mut(), 1), FPROBE_E_NULL);
        assert_eq!(fprobe_on_entry(null_mut(), 1, 2, null_mut()), FPROBE_E_NULL);
        assert_eq!(fprobe_on_exit(null_mut(), 2, null_mut()), FPROBE_E_NULL);
        assert_eq!(fprobe_cyg_attach(null_mut()), FPROBE_E_NULL);
        let r = new_registry();
        let c = counts();
        let p = probe_for(&c);
        let mut h = 0;
        assert_eq!(
            fprobe_register(r, &p, null(), null(), 3, &mut h),
            FPROBE_E_NULL
        );
        assert_eq!(
            fprobe_register(r, &p, [1u64].as_ptr(), null(), 1, null_mut()),
            FPROBE_E_NULL
        );
        assert_eq!(fprobe_probe_stats(r, 1, null_mut()), FPROBE_E_NULL);
        assert_eq!(fprobe_registry_addresses(r, null_mut()), FPROBE_E_NULL);
        let mut n = 9;
        assert_eq!(fprobe_registry_addresses(r, &mut n), FPROBE_OK);
        assert_eq!(n, 0, "failed registrations left nothing behind");
        assert_eq!(fprobe_registry_destroy(r), FPROBE_OK);
        assert_eq!(fprobe_barrier(), FPROBE_OK);
        assert_eq!(
            c.released.load(Ordering::Relaxed),
            0,
            "user stays the caller's"
        );
        drop(Arc::from_raw(p.user as *const Counts));
    }
}

#[test]
fn bad_config_and_probe_are_invalid() {
    // SAFETY: documented bad-input paths.
    unsafe {
        let mut r = null_mut();
        let cfg = fprobe_config {
            max_probes: 100_000,
            ..Default::default()
        };
        assert_eq!(fprobe_registry_new(&cfg, &mut r), FPROBE_E_INVALID);
        assert!(r.is_null(), "no output on error");
        let cfg = fprobe_config {
            hit_cache_entries: 100, // not a power of two
            ..Default::default()
        };
        assert_eq!(fprobe_registry_new(&cfg, &mut r), FPROBE_E_INVALID);
        assert!(r.is_null());
        for per_cpu in [0, 1] {
            let cfg = fprobe_config {
                hit_cache_entries: 64,
                hit_cache_per_cpu: per_cpu,
                ..Default::default()
            };
            assert_eq!(fprobe_registry_new(&cfg, &mut r), FPROBE_OK);
            let c = counts();
            let p = probe_for(&c);
            let mut h = 0;
            assert_eq!(
                fprobe_register(r, &p, [9u64].as_ptr(), null(), 1, &mut h),
                FPROBE_OK
            );
            for _ in 0..3 {
                fprobe_on_entry(r, 9, 1, null_mut());
                fprobe_on_exit(r, 1, null_mut());
            }
            assert_eq!(c.exits.load(Ordering::Relaxed), 3, "per-CPU {per_cpu}");
            assert_eq!(fprobe_registry_destroy(r), FPROBE_OK);
            r = null_mut();
        }
        let r = new_registry();
        let c = counts();
        let mut p = probe_for(&c);
        p.data_size = 1 << 20;
        let mut h = 0;
        assert_eq!(
            fprobe_register(r, &p, [1u64].as_ptr(), null(), 1, &mut h),
            FPROBE_E_INVALID
        );
        assert_eq!(h, 0);
        p.data_size = 8;
        // No address: refused, as in Rust (`Error::InvalidArgument`).
        assert_eq!(
            fprobe_register(r, &p, null(), null(), 0, &mut h),
            FPROBE_E_INVALID
        );
        assert_eq!(h, 0);
        p.entry = None;
        p.exit = None;
        assert_eq!(
            fprobe_register(r, &p, [1u64].as_ptr(), null(), 1, &mut h),
            FPROBE_E_INVALID
        );
        assert_eq!(fprobe_registry_destroy(r), FPROBE_OK);
        drop(Arc::from_raw(p.user as *const Counts));
    }
}

#[test]
fn capacity_is_reported() {
    // SAFETY: valid arguments.
    unsafe {
        let mut r = null_mut();
        let cfg = fprobe_config {
            max_probes: 2,
            ..Default::default()
        };
        assert_eq!(fprobe_registry_new(&cfg, &mut r), FPROBE_OK);
        let c = counts();
        let mut hs = Vec::new();
        for i in 0..3u64 {
            let p = probe_for(&c);
            let mut h = 0;
            let rc = fprobe_register(r, &p, [0x100 + i].as_ptr(), null(), 1, &mut h);
            if i < 2 {
                assert_eq!(rc, FPROBE_OK);
                hs.push(h);
            } else {
                assert_eq!(rc, FPROBE_E_CAPACITY);
                drop(Arc::from_raw(p.user as *const Counts));
            }
        }
        // Unregistering frees a slot.
        assert_eq!(fprobe_unregister(r, hs[0]), FPROBE_OK);
        let p = probe_for(&c);
        let mut h = 0;
        assert_eq!(
            fprobe_register(r, &p, [0x200].as_ptr(), null(), 1, &mut h),
            FPROBE_OK
        );
        assert_ne!(h, hs[0], "a reused slot gets a new handle");
        assert_eq!(fprobe_enable(r, hs[0]), FPROBE_E_NOT_FOUND);
        assert_eq!(fprobe_registry_destroy(r), FPROBE_OK);
        assert_eq!(fprobe_barrier(), FPROBE_OK);
        assert_eq!(c.released.load(Ordering::Relaxed), 3);
    }
}

#[test]
fn dispatch_enable_disable_stats_and_nested_unregister() {
    // SAFETY: valid arguments.
    unsafe {
        let r = new_registry();
        let c = counts();
        let p = probe_for(&c);
        let addrs = [0x1000u64, 0x2000];
        let mut h = 0;
        assert_eq!(
            fprobe_register(r, &p, addrs.as_ptr(), null(), 2, &mut h),
            FPROBE_OK
        );
        assert_ne!(h, 0);
        for a in [0x1000, 0x2000, 0x3000] {
            assert_eq!(fprobe_on_entry(r, a, 7, null_mut()), FPROBE_OK);
            assert_eq!(fprobe_on_exit(r, 7, null_mut()), FPROBE_OK);
        }
        assert_eq!(fprobe_disable(r, h), FPROBE_OK);
        fprobe_on_entry(r, 0x1000, 7, null_mut());
        fprobe_on_exit(r, 7, null_mut());
        assert_eq!(fprobe_enable(r, h), FPROBE_OK);
        let mut s = fprobe_stats::default();
        assert_eq!(fprobe_probe_stats(r, h, &mut s), FPROBE_OK);
        assert_eq!((s.hits, s.exits, s.missed_disabled), (2, 2, 1));
        // A handler that tries to unregister gets BUSY and nothing changes.
        c.registry.store(r, Ordering::Relaxed);
        c.handle.store(h, Ordering::Relaxed);
        fprobe_on_entry(r, 0x1000, 7, null_mut());
        fprobe_on_exit(r, 7, null_mut());
        c.registry.store(null_mut(), Ordering::Relaxed);
        assert_eq!(c.nested_rc.load(Ordering::Relaxed), FPROBE_E_BUSY);
        assert_eq!(fprobe_probe_stats(r, h, &mut s), FPROBE_OK);
        assert_eq!((s.hits, s.exits), (3, 3));
        let msg = CStr::from_ptr(fprobe_strerror(FPROBE_E_BUSY));
        assert!(!msg.to_bytes().is_empty());
        assert_eq!(fprobe_registry_destroy(r), FPROBE_OK);
        assert_eq!(fprobe_barrier(), FPROBE_OK);
        assert_eq!(c.released.load(Ordering::Relaxed), 1);
    }
}

/// An engine that takes returns over gets each return address back, with
/// the exits run on the entries' data; bad pointers, a return with no kept
/// frame and a destroyed registry are errors.
#[test]
fn returns_taken_over_through_the_c_abi() {
    // SAFETY: valid arguments, and documented bad-input paths.
    unsafe {
        let (r, c, _) = registry_with_probe_at(0x1000);
        let mut kept = 9;
        let mut ret = 0u64;
        assert_eq!(
            fprobe_on_entry_taking_return(r, 0x1000, 0x500, 0x7f00, null_mut(), &mut kept),
            FPROBE_OK
        );
        assert_eq!(kept, 1);
        // Unprobed: nothing kept, the return is left alone.
        assert_eq!(
            fprobe_on_entry_taking_return(r, 0x3000, 0x600, 0x7e00, null_mut(), &mut kept),
            FPROBE_OK
        );
        assert_eq!(kept, 0);
        assert_eq!(fprobe_on_return(r, 0x7f00, null_mut(), &mut ret), FPROBE_OK);
        assert_eq!(ret, 0x500);
        assert_eq!(c.exits.load(Ordering::Relaxed), 1);
        assert_eq!(
            fprobe_on_return(r, 0x7f00, null_mut(), &mut ret),
            FPROBE_E_NOT_FOUND
        );
        assert_eq!(
            fprobe_on_entry_taking_return(r, 0x1000, 0x500, 0x7f00, null_mut(), null_mut()),
            FPROBE_E_NULL
        );
        assert_eq!(
            fprobe_on_return(r, 0x7f00, null_mut(), null_mut()),
            FPROBE_E_NULL
        );
        assert_eq!(
            fprobe_on_entry_taking_return(null_mut(), 1, 2, 3, null_mut(), &mut kept),
            FPROBE_E_NULL
        );
        assert_eq!(fprobe_registry_destroy(r), FPROBE_OK);
        kept = 9;
        assert_eq!(
            fprobe_on_entry_taking_return(r, 0x1000, 0x500, 0x7f00, null_mut(), &mut kept),
            FPROBE_E_DESTROYED
        );
        assert_eq!(kept, 0);
        assert_eq!(
            fprobe_on_return(r, 0x7f00, null_mut(), &mut ret),
            FPROBE_E_DESTROYED
        );
        assert_eq!(fprobe_barrier(), FPROBE_OK);
        assert_eq!(c.released.load(Ordering::Relaxed), 1);
    }
}

/// A registry pointer that may cross threads (the ABI is thread-safe).
#[derive(Clone, Copy)]
struct Shared(*mut fprobe_registry);
// SAFETY: every ABI function may be called from any thread.
unsafe impl Send for Shared {}

#[test]
fn destroy_while_threads_dispatch() {
    let r = new_registry();
    let shared = Shared(r);
    let c = counts();
    let p = probe_for(&c);
    let mut h = 0;
    // SAFETY: valid arguments.
    let rc = unsafe { fprobe_register(r, &p, [0x42u64].as_ptr(), null(), 1, &mut h) };
    assert_eq!(rc, FPROBE_OK);
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let r = { shared }.0;
                let mut destroyed = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: a registry handle (never freed).
                    let a = unsafe { fprobe_on_entry(r, 0x42, 1, null_mut()) };
                    // SAFETY: as above.
                    let b = unsafe { fprobe_on_exit(r, 1, null_mut()) };
                    for rc in [a, b] {
                        assert!(rc == FPROBE_OK || rc == FPROBE_E_DESTROYED, "{rc}");
                        destroyed += u64::from(rc == FPROBE_E_DESTROYED);
                    }
                }
                destroyed
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(50));
    // SAFETY: the registry under test.
    assert_eq!(unsafe { fprobe_registry_destroy(r) }, FPROBE_OK);
    std::thread::sleep(std::time::Duration::from_millis(20));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        assert!(t.join().unwrap() > 0, "threads saw the destruction");
    }
    assert_eq!(fprobe_barrier(), FPROBE_OK);
    assert_eq!(c.released.load(Ordering::Relaxed), 1);
    assert!(c.entries.load(Ordering::Relaxed) > 0);
}

#[test]
fn runtime_never_left_attached_to_a_destroyed_registry() {
    // The only test of this binary that attaches the -finstrument-functions
    // runtime (it is process-global).
    let iterations = if cfg!(miri) { 3 } else { 300 };
    for _ in 0..iterations {
        let r = Shared(new_registry());
        let attacher = std::thread::spawn(move || {
            let r = { r }.0;
            // SAFETY: a registry handle (never freed).
            unsafe { fprobe_cyg_attach(r) }
        });
        // SAFETY: the registry under test.
        assert_eq!(unsafe { fprobe_registry_destroy(r.0) }, FPROBE_OK);
        let rc = attacher.join().unwrap();
        assert!(rc == FPROBE_OK || rc == FPROBE_E_DESTROYED, "{rc}");
        // Whatever the interleaving, the runtime is free again.
        let fresh = new_registry();
        // SAFETY: a live registry.
        assert_eq!(unsafe { fprobe_cyg_attach(fresh) }, FPROBE_OK);
        // SAFETY: as above.
        assert_eq!(unsafe { fprobe_cyg_attach(fresh) }, FPROBE_E_BUSY);
        assert_eq!(fprobe_cyg_detach(), FPROBE_OK);
        // SAFETY: as above.
        assert_eq!(unsafe { fprobe_registry_destroy(fresh) }, FPROBE_OK);
    }
}

/// `fprobe_drain` waits for a call in flight on another thread and runs
/// its exit; with no wait it reports the call left and the caller's own
/// open call is not counted; `in_flight` follows.
#[test]
fn drain_waits_for_calls_in_flight() {
    // SAFETY: valid arguments; the registry outlives the scoped thread.
    unsafe {
        let (r, c, h) = registry_with_probe_at(0x1000);
        let shared = Shared(r);
        let (entered, release) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        let (e, rl) = (&entered, &release);
        std::thread::scope(|s| {
            s.spawn(move || {
                let r = shared;
                assert_eq!(fprobe_on_entry(r.0, 0x1000, 7, null_mut()), FPROBE_OK);
                e.wait();
                rl.wait();
                assert_eq!(fprobe_on_exit(r.0, 7, null_mut()), FPROBE_OK);
            });
            entered.wait();
            // The caller's own open call is not waited for.
            assert_eq!(fprobe_on_entry(r, 0x1000, 7, null_mut()), FPROBE_OK);
            let mut st = fprobe_stats::default();
            assert_eq!(fprobe_probe_stats(r, h, &mut st), FPROBE_OK);
            assert_eq!(st.in_flight, 2);
            let mut left = 9;
            assert_eq!(fprobe_drain(r, h, 0, &mut left), FPROBE_OK);
            assert_eq!(left, 1, "the other thread's call");
            release.wait();
            assert_eq!(fprobe_drain(r, h, 60_000, &mut left), FPROBE_OK);
            assert_eq!(left, 0);
            assert_eq!(c.exits.load(Ordering::Relaxed), 1, "its exit ran");
            assert_eq!(fprobe_on_exit(r, 7, null_mut()), FPROBE_OK);
            assert_eq!(fprobe_probe_stats(r, h, &mut st), FPROBE_OK);
            assert_eq!((st.exits, st.in_flight), (2, 0));
        });
        assert_eq!(
            fprobe_drain(r, h, 0, null_mut()),
            FPROBE_OK,
            "left_out may be NULL"
        );
        assert_eq!(fprobe_unregister(r, h), FPROBE_OK);
        assert_eq!(fprobe_drain(r, h, 0, null_mut()), FPROBE_E_NOT_FOUND);
        assert_eq!(fprobe_drain(null_mut(), h, 0, null_mut()), FPROBE_E_NULL);
        assert_eq!(fprobe_registry_destroy(r), FPROBE_OK);
        assert_eq!(fprobe_barrier(), FPROBE_OK);
        assert_eq!(c.released.load(Ordering::Relaxed), 1);
    }
}
