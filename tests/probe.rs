//! The probe layer: dispatch, pairing, misses by cause, safe unregister.

#[path = "common/stress.rs"]
mod stress;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

#[cfg(all(unix, not(miri)))]
#[path = "common/fork.rs"]
mod fork;

use fprobe::Error;
use fprobe::probe::{EntryAction, Fprobe, Registry, ignore_current_thread};

fn counter() -> Arc<AtomicU64> {
    Arc::new(AtomicU64::new(0))
}

/// Exit handler runs as `(addr, per-call data, ret_addr)`.
type ExitLog = Arc<Mutex<Vec<(u64, u64, u64)>>>;

/// A probe whose entry keeps its address as 8 bytes of per-call data and
/// whose exit logs what it was given.
fn addr_logging_probe() -> (Fprobe<()>, ExitLog) {
    let log = ExitLog::default();
    let l = log.clone();
    let probe = Fprobe::<()>::builder()
        .data_size(8)
        .entry(|e| {
            e.data.copy_from_slice(&e.addr.to_ne_bytes());
            EntryAction::Continue
        })
        .exit(move |x| {
            let data = u64::from_ne_bytes(x.data.try_into().unwrap());
            l.lock().unwrap().push((x.addr, data, x.ret_addr))
        })
        .build();
    (probe, log)
}

/// A probe with only an entry handler, which counts its runs in `hits`.
fn counting_entries(hits: &Arc<AtomicU64>) -> Fprobe<()> {
    let hits = hits.clone();
    Fprobe::builder()
        .entry(move |_| {
            hits.fetch_add(1, Ordering::Relaxed);
            EntryAction::Continue
        })
        .build()
}

/// A probe with only an exit handler, which counts its runs in `exits`.
fn counting_exits(exits: &Arc<AtomicU64>) -> Fprobe<()> {
    let exits = exits.clone();
    Fprobe::builder()
        .exit(move |_| {
            exits.fetch_add(1, Ordering::Relaxed);
        })
        .build()
}

#[test]
fn entry_exit_pairing_data_and_cookies() {
    let reg = Registry::<u64>::builder().build().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (l1, l2) = (log.clone(), log.clone());
    let probe = Fprobe::<u64>::builder()
        .data_size(8)
        .entry(move |e| {
            e.data.copy_from_slice(&(e.addr ^ *e.ctx).to_ne_bytes());
            l1.lock().unwrap().push(("entry", e.addr, e.cookie));
            EntryAction::Continue
        })
        .exit(move |x| {
            let v = u64::from_ne_bytes(x.data.try_into().unwrap());
            assert_eq!(v, x.addr ^ 7, "entry data reaches the exit handler");
            l2.lock().unwrap().push(("exit", x.addr, x.cookie));
        })
        .build();
    let h = reg
        .register_with_cookies(probe, [(0x10, 100), (0x20, 200)])
        .unwrap();
    // f(0x10) calls g(0x20) calls unprobed 0x30, then returns.
    reg.on_entry(0x10, 0, &7);
    reg.on_entry(0x20, 0, &7);
    reg.on_entry(0x30, 0, &7);
    reg.on_exit(0, &7);
    reg.on_exit(0, &7);
    reg.on_exit(0, &7);
    assert_eq!(
        *log.lock().unwrap(),
        [
            ("entry", 0x10, 100),
            ("entry", 0x20, 200),
            ("exit", 0x20, 200),
            ("exit", 0x10, 100)
        ]
    );
    let s = reg.stats(h).unwrap();
    assert_eq!((s.hits, s.exits), (2, 2));
    assert_eq!(s.missed, Default::default());
}

#[test]
fn entry_for_exit_pushes_a_frame_only_for_calls_with_an_exit_to_run() {
    let reg = Registry::<()>::builder().max_depth(4).build().unwrap();
    let (with_exit, log) = addr_logging_probe();
    let skip = Fprobe::<()>::builder()
        .data_size(8)
        .entry(|_| EntryAction::SkipExit)
        .exit(|_| panic!("skipped"))
        .build();
    let entry_only = Fprobe::<()>::builder()
        .entry(|_| EntryAction::Continue)
        .build();
    let h = reg.register(with_exit, &[0x10]).unwrap();
    reg.register(skip, &[0x20]).unwrap();
    reg.register(entry_only, &[0x30]).unwrap();
    // 0x10 → (0x20, 0x30, unprobed 0x40, each returning at once) → returns.
    // Only 0x10 keeps a frame; the others push nothing, so the one exit
    // pops 0x10's frame.
    assert!(reg.on_entry_for_exit(0x10, 0x1000, &()));
    for a in [0x20, 0x30, 0x40] {
        assert!(!reg.on_entry_for_exit(a, 0x2000, &()), "{a:#x}");
    }
    reg.on_exit(0x1000, &());
    assert_eq!(*log.lock().unwrap(), [(0x10, 0x10, 0x1000)]);
    // Deeper than the stack holds: no frame, counted, and the entry says so.
    let kept = (0..100)
        .take_while(|_| reg.on_entry_for_exit(0x10, 0, &()))
        .count();
    assert!((4..100).contains(&kept), "{kept}");
    for _ in 0..kept {
        reg.on_exit(0, &());
    }
    let st = reg.stats(h).unwrap();
    let n = kept as u64;
    assert_eq!((st.hits, st.exits, st.missed.depth), (n + 2, n + 1, 1));
    // Nothing left behind: an exit with no entry runs nothing.
    reg.on_exit(0, &());
    assert_eq!(reg.stats(h).unwrap().exits, n + 1);
}

/// An engine that takes returns over gets each call's return address back
/// from `on_return`, with the exit handlers run on the entry's data;
/// frames kept deeper (a `longjmp` or an unwind went past them) end as
/// unwound, their exit handlers not run; a return whose frame is gone says
/// so; plain exits never pop such a frame, and plain frames left above one
/// end as unwound too.
#[test]
fn returns_taken_over_are_handed_back_and_recover_from_longjmp() {
    let reg = Registry::<()>::builder().build().unwrap();
    let (with_exit, log) = addr_logging_probe();
    let entry_only = Fprobe::<()>::builder()
        .entry(|_| EntryAction::Continue)
        .build();
    let h = reg.register(with_exit, &[0x10, 0x20, 0x30]).unwrap();
    reg.register(entry_only, &[0x40]).unwrap();
    let take = |log: &Mutex<Vec<_>>| std::mem::take(&mut *log.lock().unwrap());

    // Nested calls, each returning in turn; an entry-only call keeps nothing.
    assert!(reg.on_entry_taking_return(0x10, 0x1000, 0x7f00, &()));
    assert!(reg.on_entry_taking_return(0x20, 0x2000, 0x7e00, &()));
    assert!(!reg.on_entry_taking_return(0x40, 0x4000, 0x7d00, &()));
    assert_eq!(reg.on_return(0x7e00, &()), Some(0x2000));
    assert_eq!(reg.on_return(0x7f00, &()), Some(0x1000));
    assert_eq!(take(&log), [(0x20, 0x20, 0x2000), (0x10, 0x10, 0x1000)]);

    // A `longjmp` from 0x30 back into 0x10: 0x20's and 0x30's frames are
    // still there when 0x10 returns; they end without their exits.
    assert!(reg.on_entry_taking_return(0x10, 0x1000, 0x7f00, &()));
    assert!(reg.on_entry_taking_return(0x20, 0x2000, 0x7e00, &()));
    assert!(reg.on_entry_taking_return(0x30, 0x3000, 0x7d00, &()));
    assert_eq!(reg.stats(h).unwrap().in_flight, 3);
    assert_eq!(reg.on_return(0x7f00, &()), Some(0x1000));
    assert_eq!(take(&log), [(0x10, 0x10, 0x1000)]);
    let s = reg.stats(h).unwrap();
    assert_eq!(
        (s.hits, s.exits, s.missed.unwound, s.in_flight),
        (5, 3, 2, 0),
        "{s:?}"
    );

    // A return deeper than the newest kept frame has none: lost, and the
    // frame stays.
    assert!(reg.on_entry_taking_return(0x10, 0x1000, 0x7f00, &()));
    assert_eq!(reg.on_return(0x7e80, &()), None);
    assert_eq!(reg.stats(h).unwrap().in_flight, 1, "the frame stays");
    // A plain exit does not pop it.
    reg.on_exit(0x1000, &());
    assert!(take(&log).is_empty());
    // A plain entry whose exit never came, above it, ends unwound.
    reg.on_entry(0x20, 0x2000, &());
    reg.on_entry(0x50, 0x5000, &()); // unprobed: a marker
    assert_eq!(reg.stats(h).unwrap().in_flight, 2);
    assert_eq!(reg.on_return(0x7f00, &()), Some(0x1000));
    assert_eq!(take(&log), [(0x10, 0x10, 0x1000)]);
    let s = reg.stats(h).unwrap();
    assert_eq!((s.exits, s.missed.unwound, s.in_flight), (4, 3, 0), "{s:?}");
    // One above every kept frame: they are all past (unwound), and none
    // was its own.
    assert!(reg.on_entry_taking_return(0x10, 0x1000, 0x7f00, &()));
    assert_eq!(reg.on_return(0x7f80, &()), None);
    assert!(take(&log).is_empty());
    assert_eq!(reg.stats(h).unwrap().missed.unwound, 4);
    assert_eq!(reg.on_return(0x7f00, &()), None, "an empty stack");
}

/// An entry that takes its return above the frames kept before it (an
/// exception caught where no probe returns went past them) ends them as
/// unwound; one at the same stack address (a tail call) does not. The
/// engine's word and the return address stay in place in the frame until
/// its return.
#[test]
fn an_entry_above_abandoned_frames_ends_them_and_kept_returns_stay_put() {
    let reg = Registry::<()>::builder().build().unwrap();
    let (with_exit, log) = addr_logging_probe();
    let h = reg.register(with_exit, &[0x10, 0x20, 0x30]).unwrap();
    let take = |log: &Mutex<Vec<_>>| std::mem::take(&mut *log.lock().unwrap());

    // Each entry keeps a word of the engine's own; the frame holds it and
    // the return address in place. (That address is for unwinders, its
    // provenance exposed: miri's strict provenance refuses to make a
    // pointer of it, so there the entries only take their returns.)
    let keep = |addr: u64, ret: u64, sp: u64, saved: u64| {
        if cfg!(miri) {
            assert!(reg.on_entry_taking_return(addr, ret, sp, &()));
            return std::ptr::null();
        }
        let k = reg
            .on_entry_keeping_return(addr, ret, sp, saved, &())
            .unwrap();
        // SAFETY: the frame stays in place until its return.
        let k = unsafe { k.as_ref() };
        assert_eq!((k.saved, k.ret_addr, k.sp), (saved, ret, sp));
        k as *const fprobe::probe::KeptReturn
    };
    let k1 = keep(0x10, 0x1000, 0x7e00, 11);
    keep(0x20, 0x2000, 0x7d00, 22);
    // A tail call from 0x20: the same slot, its caller's frame stays.
    keep(0x30, 0x3000, 0x7d00, 33);
    if !cfg!(miri) {
        // SAFETY: 0x10's frame is still live (nothing returned).
        assert_eq!(unsafe { (*k1).saved }, 11, "unmoved by the pushes above");
    }
    assert_eq!(reg.stats(h).unwrap().missed.unwound, 0);
    // An unwind past all three, caught where no probe returns; the next
    // call is made from above them.
    assert!(reg.on_entry_taking_return(0x10, 0x1100, 0x7f00, &()));
    let s = reg.stats(h).unwrap();
    assert_eq!((s.missed.unwound, s.in_flight), (3, 1), "{s:?}");
    assert_eq!(reg.on_return(0x7f00, &()), Some(0x1100));
    assert_eq!(take(&log), [(0x10, 0x10, 0x1100)]);
    let s = reg.stats(h).unwrap();
    assert_eq!((s.hits, s.exits, s.in_flight), (4, 1, 0), "{s:?}");
}

/// Calls that did not fit on a full stack are deeper than every frame: a
/// return taken over below them ends them, and the next call that fits
/// pairs with its own exit.
#[test]
fn a_return_taken_over_ends_the_calls_that_did_not_fit() {
    let reg = Registry::<()>::builder().max_depth(2).build().unwrap();
    let exits = counter();
    let h = reg.register(counting_exits(&exits), &[0x10, 0x20]).unwrap();
    assert!(reg.on_entry_taking_return(0x10, 0x1000, 0x7f00, &()));
    // Plain calls below it until the stack is full, and more.
    for _ in 0..200 {
        reg.on_entry(0x20, 0x2000, &());
    }
    assert!(reg.stats(h).unwrap().missed.depth > 0);
    // A `longjmp` past them all into 0x10, which returns.
    assert_eq!(reg.on_return(0x7f00, &()), Some(0x1000));
    let before = exits.load(Ordering::Relaxed);
    reg.on_entry(0x20, 0x2000, &());
    reg.on_exit(0x2000, &());
    assert_eq!(
        exits.load(Ordering::Relaxed),
        before + 1,
        "its own exit ran"
    );
    assert_eq!(reg.stats(h).unwrap().in_flight, 0);
}

/// A pairing reset keeps the frames of calls whose return was taken (they
/// still return through their engine) and drops the plain frames above.
#[test]
fn a_pairing_reset_keeps_returns_taken_over() {
    let reg = Registry::<()>::builder().build().unwrap();
    let exits = counter();
    let h = reg.register(counting_exits(&exits), &[0x10, 0x20]).unwrap();
    reg.on_entry(0x20, 0x2000, &()); // plain, below: kept with the rest
    assert!(reg.on_entry_taking_return(0x10, 0x1000, 0x7f00, &()));
    reg.on_entry(0x20, 0x2000, &()); // plain, above: dropped
    assert_eq!(reg.stats(h).unwrap().in_flight, 3);
    reg.reset_pairing();
    reg.on_entry(0x30, 0, &()); // the next dispatch forgets
    reg.on_exit(0, &());
    assert_eq!(reg.stats(h).unwrap().in_flight, 2);
    assert_eq!(reg.on_return(0x7f00, &()), Some(0x1000));
    reg.on_exit(0x2000, &());
    let s = reg.stats(h).unwrap();
    assert_eq!((s.exits, s.in_flight), (2, 0), "{s:?}");
    assert_eq!(exits.load(Ordering::Relaxed), 2);
}

/// A pairing reset made inside a handler, followed by a dispatch nested in
/// that handler: the nested dispatch cannot empty the stack (the outer
/// call's frame is being built) and must not treat it as current either,
/// so the next outermost dispatch still forgets the outer call.
#[test]
fn a_pairing_reset_inside_a_handler_is_applied_by_the_next_outer_dispatch() {
    static REG: std::sync::OnceLock<Registry<()>> = std::sync::OnceLock::new();
    let reg = REG.get_or_init(|| Registry::<()>::builder().build().unwrap());
    let exits = counter();
    let e = exits.clone();
    let probe = Fprobe::<()>::builder()
        .entry(|e| {
            if e.addr != 0x10 {
                return EntryAction::Continue;
            }
            let reg = REG.get().unwrap();
            reg.reset_pairing();
            // Unprobed: a dispatch all the same, nested in this one.
            reg.on_entry(0x30, 0, &());
            reg.on_exit(0, &());
            EntryAction::Continue
        })
        .exit(move |_| {
            e.fetch_add(1, Ordering::Relaxed);
        })
        .build();
    let h = reg.register(probe, &[0x10, 0x20]).unwrap();
    reg.on_entry(0x10, 0, &());
    assert_eq!(reg.stats(h).unwrap().in_flight, 1, "kept, in the old epoch");
    reg.on_exit(0, &());
    let s = reg.stats(h).unwrap();
    assert_eq!(
        (exits.load(Ordering::Relaxed), s.exits, s.in_flight),
        (0, 0, 0),
        "the exit's dispatch forgot the call: {s:?}"
    );
    // The thread is in the new epoch now: calls pair again.
    reg.on_entry(0x20, 0, &());
    reg.on_exit(0, &());
    let s = reg.stats(h).unwrap();
    assert_eq!(
        (exits.load(Ordering::Relaxed), s.exits, s.in_flight),
        (1, 1, 0),
        "{s:?}"
    );
}

#[test]
fn several_probes_on_one_address_run_in_registration_order() {
    let reg = Registry::<()>::builder().build().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for i in 0..3 {
        let (o1, o2) = (order.clone(), order.clone());
        let p = Fprobe::builder()
            .entry(move |_| {
                o1.lock().unwrap().push(i);
                if i == 1 {
                    EntryAction::SkipExit
                } else {
                    EntryAction::Continue
                }
            })
            .exit(move |_| o2.lock().unwrap().push(10 + i))
            .build();
        handles.push(reg.register(p, &[0x40]).unwrap());
    }
    reg.on_entry(0x40, 0, &());
    reg.on_exit(0, &());
    // Exits newest first; probe 1 asked to skip its exit.
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 12, 10]);
}

#[test]
fn register_is_all_or_nothing() {
    let reg = Registry::<()>::builder()
        .max_probes(2)
        .data_size(16)
        .build()
        .unwrap();
    let hits = counter();
    let too_big = Fprobe::<()>::builder().data_size(17).exit(|_| {}).build();
    assert!(matches!(
        reg.register(too_big, &[1]),
        Err(Error::InvalidConfig(_))
    ));
    let a = reg.register(counting_entries(&hits), &[1, 2, 3]).unwrap();
    reg.register(counting_entries(&hits), &[4]).unwrap();
    assert!(matches!(
        reg.register(counting_entries(&hits), &[5, 6]),
        Err(Error::TooManyProbes { max_probes: 2 })
    ));
    assert_eq!(
        reg.addresses(),
        4,
        "the failed registration left nothing behind"
    );
    reg.on_entry(5, 0, &());
    reg.on_exit(0, &());
    assert_eq!(hits.load(Ordering::Relaxed), 0);
    reg.unregister(a).unwrap();
    assert_eq!(reg.unregister(a), Err(Error::NotFound), "unregister twice");
    assert_eq!(reg.stats(a), Err(Error::NotFound));
    reg.register(counting_entries(&hits), &[5, 6]).unwrap();
    assert_eq!(reg.addresses(), 3);
}

#[test]
fn enable_disable_counts_disabled_hits() {
    let reg = Registry::<()>::builder().build().unwrap();
    let hits = counter();
    let h = reg.register(counting_entries(&hits), &[9]).unwrap();
    reg.disable(h).unwrap();
    for _ in 0..3 {
        reg.on_entry(9, 0, &());
        reg.on_exit(0, &());
    }
    reg.enable(h).unwrap();
    reg.on_entry(9, 0, &());
    reg.on_exit(0, &());
    assert_eq!(hits.load(Ordering::Relaxed), 1);
    let s = reg.stats(h).unwrap();
    assert_eq!((s.hits, s.missed.disabled), (1, 3));
}

#[test]
fn recursion_from_a_handler_is_counted_not_followed() {
    let reg = Arc::new(Registry::<()>::builder().build().unwrap());
    let r2 = Arc::downgrade(&reg);
    let depth = counter();
    let d2 = depth.clone();
    let h = reg
        .register(
            Fprobe::builder()
                .entry(move |_| {
                    d2.fetch_add(1, Ordering::Relaxed);
                    // The handler calls a probed function.
                    let reg = r2.upgrade().unwrap();
                    reg.on_entry(0x77, 0, &());
                    reg.on_exit(0, &());
                    EntryAction::Continue
                })
                .exit(|_| {})
                .build(),
            &[0x77],
        )
        .unwrap();
    reg.on_entry(0x77, 0, &());
    reg.on_exit(0, &());
    assert_eq!(depth.load(Ordering::Relaxed), 1);
    let s = reg.stats(h).unwrap();
    assert_eq!((s.hits, s.exits, s.missed.recursion), (1, 1, 1));
}

#[test]
fn depth_overflow_is_counted_and_pairing_survives() {
    // Three nested calls with a full-size return probe fit (the stack has
    // room for 3 × (8 data words + 8) = 48 words; a frame takes 13), and
    // markers of the deeper calls fill the rest; beyond that calls are
    // only counted. Every deeper call still runs its entry handler.
    let reg = Registry::<()>::builder()
        .data_size(64)
        .max_depth(3)
        .build()
        .unwrap();
    let entries = counter();
    let e1 = entries.clone();
    let h = reg
        .register(
            Fprobe::builder()
                .data_size(64)
                .entry(move |e| {
                    e1.fetch_add(1, Ordering::Relaxed);
                    if !e.data.is_empty() {
                        e.data.fill(e.ret_addr as u8);
                    }
                    EntryAction::Continue
                })
                .exit(|x| assert!(x.data.iter().all(|&b| b == x.ret_addr as u8)))
                .build(),
            &[1],
        )
        .unwrap();
    for depth in 0..20u64 {
        reg.on_entry(1, depth, &());
    }
    for depth in (0..20u64).rev() {
        reg.on_exit(depth, &());
    }
    let s = reg.stats(h).unwrap();
    assert_eq!(entries.load(Ordering::Relaxed), 20);
    assert_eq!((s.hits, s.exits, s.missed.depth), (20, 3, 17), "{s:?}");
    // Pairing survived: a fresh call works normally.
    reg.on_entry(1, 9, &());
    reg.on_exit(9, &());
    assert_eq!(reg.stats(h).unwrap().exits, 4);
}

#[test]
fn panicking_handlers_are_contained() {
    let reg = Registry::<()>::builder().build().unwrap();
    let ok = counter();
    let bad = reg
        .register(
            Fprobe::builder()
                .entry(|e| {
                    if e.addr == 2 {
                        panic!("entry handler panic (expected by the test)");
                    }
                    EntryAction::Continue
                })
                .exit(|_| panic!("exit handler panic (expected by the test)"))
                .build(),
            &[1, 2],
        )
        .unwrap();
    let good = reg.register(counting_entries(&ok), &[1, 2]).unwrap();
    for a in [1, 2, 1] {
        reg.on_entry(a, 0, &());
        reg.on_exit(0, &());
    }
    assert_eq!(ok.load(Ordering::Relaxed), 3, "other probes keep running");
    let s = reg.stats(bad).unwrap();
    assert_eq!(s.panics, 3, "1 entry + 2 exit panics: {s:?}");
    assert_eq!(s.in_flight, 0, "a panicked exit has returned: {s:?}");
    assert_eq!(reg.stats(good).unwrap().panics, 0);
    reg.unregister(bad).unwrap();
    reg.unregister(good).unwrap();
}

/// Threads sit inside entry and exit handlers while the probe is
/// unregistered: unregister waits for them, and no handler runs after it
/// returns. A thread parked between entry and exit does not block it.
#[test]
fn unregister_while_threads_are_inside() {
    let reg = Arc::new(Registry::<()>::builder().build().unwrap());
    let inside = Arc::new(AtomicUsize::new(0));
    let dead = Arc::new(AtomicBool::new(false));
    let late = counter();
    let (i1, i2, d1, d2, l1, l2) = (
        inside.clone(),
        inside.clone(),
        dead.clone(),
        dead.clone(),
        late.clone(),
        late.clone(),
    );
    let probe = Fprobe::builder()
        .entry(move |_| {
            if d1.load(Ordering::SeqCst) {
                l1.fetch_add(1, Ordering::SeqCst);
            }
            i1.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1));
            i1.fetch_sub(1, Ordering::SeqCst);
            EntryAction::Continue
        })
        .exit(move |_| {
            if d2.load(Ordering::SeqCst) {
                l2.fetch_add(1, Ordering::SeqCst);
            }
            i2.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1));
            i2.fetch_sub(1, Ordering::SeqCst);
        })
        .build();
    let h = reg.register(probe, &[0x100, 0x200]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(4));
    let mut workers = Vec::new();
    for t in 0..2u64 {
        let (reg, stop, start) = (reg.clone(), stop.clone(), start.clone());
        workers.push(std::thread::spawn(move || {
            start.wait();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                reg.on_entry(0x100 + 0x100 * (t % 2), 0, &());
                reg.on_exit(0, &());
                n += 1;
            }
            n
        }));
    }
    // A thread parked between entry and exit.
    let parked_in = Arc::new(Barrier::new(2));
    let release = Arc::new(Barrier::new(2));
    let parked = {
        let (reg, start, parked_in, release) = (
            reg.clone(),
            start.clone(),
            parked_in.clone(),
            release.clone(),
        );
        std::thread::spawn(move || {
            start.wait();
            reg.on_entry(0x100, 0, &());
            parked_in.wait();
            release.wait(); // parked "inside the function"
            reg.on_exit(0, &());
        })
    };
    start.wait();
    parked_in.wait();
    std::thread::sleep(Duration::from_millis(30));
    let t = Instant::now();
    reg.unregister(h).unwrap();
    dead.store(true, Ordering::SeqCst);
    assert_eq!(
        inside.load(Ordering::SeqCst),
        0,
        "a handler still running after unregister"
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "unregister took {:?}",
        t.elapsed()
    );
    std::thread::sleep(Duration::from_millis(30));
    release.wait();
    parked.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        assert!(w.join().unwrap() > 0);
    }
    assert_eq!(
        late.load(Ordering::SeqCst),
        0,
        "a handler ran after unregister returned"
    );
}

/// One call of `addr` (entry, then exit) on a new thread.
fn call_on_a_thread(reg: &Arc<Registry<()>>, addr: u64) -> std::thread::JoinHandle<()> {
    let reg = reg.clone();
    std::thread::spawn(move || {
        reg.on_entry(addr, 0, &());
        reg.on_exit(0, &());
    })
}

/// An exit handler runs outside any RCU read-side section: unregister
/// (and `on_return`'s engines, through the same count) must still wait
/// for it, and drop the probe, with what it owns, only after it returned;
/// from inside a handler, unregister refuses to wait for itself.
#[test]
fn unregister_waits_for_a_running_exit_handler() {
    struct Owned(Arc<AtomicBool>, Arc<AtomicBool>);
    impl Drop for Owned {
        fn drop(&mut self) {
            assert!(
                self.1.load(Ordering::SeqCst),
                "the probe was dropped while its exit handler ran"
            );
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let reg = Arc::new(Registry::<()>::builder().build().unwrap());
    let (dropped, done) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let inside = Arc::new(Barrier::new(2));
    let (d, i) = (done.clone(), inside.clone());
    let probe = Fprobe::builder()
        .exit(move |_| {
            assert!(fprobe::probe::in_handler());
            i.wait();
            std::thread::sleep(Duration::from_millis(200));
            d.store(true, Ordering::SeqCst);
        })
        .owns(Owned(dropped.clone(), done.clone()))
        .build();
    let h = reg.register(probe, &[0x100]).unwrap();
    let caller = call_on_a_thread(&reg, 0x100);
    inside.wait();
    let t = Instant::now();
    reg.unregister(h).unwrap();
    assert!(
        done.load(Ordering::SeqCst),
        "unregister returned after {:?}, while the exit handler ran",
        t.elapsed()
    );
    assert!(
        dropped.load(Ordering::SeqCst),
        "the probe is dropped by now"
    );
    caller.join().unwrap();

    // From inside an exit handler of the same registry: a panic, not a
    // wait for itself (caught by the dispatch, counted as a panic).
    let r2 = reg.clone();
    let refused = Arc::new(AtomicBool::new(false));
    let f = refused.clone();
    let h2 = reg
        .register(
            Fprobe::builder()
                .exit(move |_| {
                    let other = r2
                        .register(Fprobe::builder().exit(|_| {}).build(), &[0x300])
                        .unwrap();
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        r2.unregister(other)
                    }));
                    f.store(r.is_err(), Ordering::SeqCst);
                })
                .build(),
            &[0x200],
        )
        .unwrap();
    reg.on_entry(0x200, 0, &());
    reg.on_exit(0, &());
    assert!(
        refused.load(Ordering::SeqCst),
        "unregister inside an exit handler must panic"
    );
    reg.unregister(h2).unwrap();
}

/// A thread sits inside an exit handler when the process forks: in the
/// child, where that thread does not exist, unregister must not wait for
/// it.
#[cfg(all(unix, not(miri)))]
#[test]
fn fork_child_does_not_wait_for_exits_of_threads_that_did_not_survive() {
    if fork::left_out_under_qemu_user(
        "fork_child_does_not_wait_for_exits_of_threads_that_did_not_survive",
    ) {
        return;
    }
    let reg = Arc::new(Registry::<()>::builder().build().unwrap());
    let inside = Arc::new(Barrier::new(2));
    let stop = Arc::new(AtomicBool::new(false));
    let _release = fork::SetOnDrop(stop.clone());
    let (i, s) = (inside.clone(), stop.clone());
    reg.register(
        Fprobe::builder()
            .exit(move |_| {
                i.wait();
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
            .build(),
        &[0x100],
    )
    .unwrap();
    let other = reg.register(counting_exits(&counter()), &[0x200]).unwrap();
    let caller = call_on_a_thread(&reg, 0x100);
    inside.wait();
    // SAFETY: (test) the child only unregisters a probe and calls _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = reg.unregister(other).is_ok();
        // SAFETY: (test) plain libc process call.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    assert!(pid > 0);
    let status = fork::wait_child(
        pid,
        Duration::from_secs(20),
        "child hung in unregister, waiting for a thread that did not survive the fork",
    );
    assert!(fork::exited_cleanly(status));
    stop.store(true, Ordering::Relaxed);
    caller.join().unwrap();
    reg.unregister(other).unwrap();
}

/// An address re-registered by a new probe while an old call is in flight:
/// the old call's exit must not reach the new probe.
#[test]
fn address_and_slot_reuse_after_unregister() {
    let reg = Registry::<()>::builder().max_probes(1).build().unwrap();
    let old_exits = counter();
    let new_exits = counter();
    let (o, n) = (old_exits.clone(), new_exits.clone());
    let a = reg
        .register(
            Fprobe::builder()
                .exit(move |_| {
                    o.fetch_add(1, Ordering::Relaxed);
                })
                .build(),
            &[5],
        )
        .unwrap();
    reg.on_entry(5, 0, &()); // call in flight under probe A
    reg.unregister(a).unwrap();
    // Same slot (max_probes 1), same address.
    let b = reg
        .register(
            Fprobe::builder()
                .exit(move |_| {
                    n.fetch_add(1, Ordering::Relaxed);
                })
                .build(),
            &[5],
        )
        .unwrap();
    reg.on_exit(0, &()); // the old call returns
    assert_eq!(old_exits.load(Ordering::Relaxed), 0);
    assert_eq!(
        new_exits.load(Ordering::Relaxed),
        0,
        "old call's exit reached the new probe"
    );
    reg.on_entry(5, 0, &());
    reg.on_exit(0, &());
    assert_eq!(new_exits.load(Ordering::Relaxed), 1);
    assert_eq!(reg.stats(b).unwrap().exits, 1);
}

/// Regression (found by the `probe_ops` fuzz model): counters are kept per
/// slot, and a probe registered in a reused slot used to report the hits,
/// misses and panics of every earlier probe of that slot as its own.
#[test]
fn probe_in_a_reused_slot_starts_from_zero() {
    let reg = Registry::<()>::builder().max_probes(1).build().unwrap();
    let probe = || {
        Fprobe::builder()
            .entry(|_| EntryAction::Continue)
            .exit(|_| {})
            .build()
    };
    let a = reg.register(probe(), &[5]).unwrap();
    reg.disable(a).unwrap();
    reg.on_entry(5, 0, &()); // disabled miss
    reg.on_exit(0, &());
    reg.enable(a).unwrap();
    for _ in 0..3 {
        reg.on_entry(5, 0, &());
        reg.on_exit(0, &());
    }
    // Counts of a thread that has exited are folded into the registry.
    std::thread::scope(|s| {
        s.spawn(|| {
            reg.on_entry(5, 0, &());
            reg.on_exit(0, &());
        });
    });
    let sa = reg.stats(a).unwrap();
    assert_eq!((sa.hits, sa.exits, sa.missed.disabled), (4, 4, 1));
    reg.unregister(a).unwrap();
    let b = reg.register(probe(), &[5, 6]).unwrap(); // same slot
    let sb = reg.stats(b).unwrap();
    assert_eq!(sb, Default::default(), "inherited the old probe's counters");
    reg.on_entry(6, 0, &());
    reg.on_exit(0, &());
    let sb = reg.stats(b).unwrap();
    assert_eq!((sb.hits, sb.exits, sb.missed.disabled), (1, 1, 0));
}

#[test]
fn ignored_thread_runs_no_probes_but_keeps_pairing() {
    let reg = Registry::<()>::builder().build().unwrap();
    let n = counter();
    let n2 = n.clone();
    reg.register(
        Fprobe::builder()
            .exit(move |_| {
                n2.fetch_add(1, Ordering::Relaxed);
            })
            .build(),
        &[1],
    )
    .unwrap();
    reg.on_entry(1, 0, &());
    ignore_current_thread(true);
    reg.on_entry(1, 0, &());
    reg.on_exit(0, &());
    ignore_current_thread(false);
    reg.on_exit(0, &());
    assert_eq!(n.load(Ordering::Relaxed), 1);
}

#[test]
fn counters_survive_thread_exit() {
    let reg = Arc::new(Registry::<()>::builder().build().unwrap());
    let h = reg
        .register(
            Fprobe::builder().entry(|_| EntryAction::Continue).build(),
            &[3],
        )
        .unwrap();
    for _ in 0..4 {
        let reg = reg.clone();
        std::thread::spawn(move || {
            for _ in 0..100 {
                reg.on_entry(3, 0, &());
                reg.on_exit(0, &());
            }
        })
        .join()
        .unwrap();
    }
    assert_eq!(reg.stats(h).unwrap().hits, 400);
}

#[test]
fn dispatch_inside_a_callers_read_section_pairs_like_the_plain_calls() {
    let registry = Registry::<()>::builder().build().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (le, lx) = (log.clone(), log.clone());
    let probe = Fprobe::builder()
        .data_size(8)
        .entry(move |c| {
            c.data.copy_from_slice(&c.addr.to_ne_bytes());
            le.lock().unwrap().push(("in", c.addr));
            EntryAction::Continue
        })
        .exit(move |c| {
            assert_eq!(c.data, &c.addr.to_ne_bytes());
            lx.lock().unwrap().push(("out", c.addr));
        })
        .build();
    let h = registry.register(probe, &[0x10, 0x20]).unwrap();
    {
        let guard = fprobe::rcu::read_lock();
        registry.on_entry_in(&guard, 0x10, 1, &());
        registry.on_entry(0x20, 2, &()); // the two forms mix freely
        registry.on_entry_in(&guard, 0x30, 3, &()); // not probed
        registry.on_exit_in(&guard, 3, &());
        registry.on_exit_in(&guard, 2, &());
        registry.on_exit(1, &());
    }
    assert_eq!(
        *log.lock().unwrap(),
        [("in", 0x10), ("in", 0x20), ("out", 0x20), ("out", 0x10)]
    );
    let s = registry.stats(h).unwrap();
    assert_eq!((s.hits, s.exits), (2, 2));
}

// ------------------------------------------------------------ model check

#[path = "../fuzz/ops/probe_ops.rs"]
mod probe_ops;

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: if cfg!(miri) { 4 } else { 128 }, ..Default::default() })]
    /// The fuzz target's operations and model checker, fed by proptest.
    #[test]
    fn matches_dispatch_model(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..if cfg!(miri) { 128 } else { 1024 })) {
        probe_ops::run_bytes(&bytes);
    }

    /// The same with an engine's returns taken over among the calls.
    #[test]
    fn matches_dispatch_model_taking_returns(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..if cfg!(miri) { 128 } else { 1024 })) {
        probe_ops::run_bytes_taking_returns(&bytes);
    }
}

/// `stats` read while calls run: the counters are not one atomic snapshot,
/// but exits never exceed hits, on any thread count. Three dispatchers on
/// a 2-CPU machine get preempted between entry and exit, and the reader
/// between its loads, so a snapshot that loaded hits before exits shows
/// more exits than hits within a few hundred milliseconds.
#[test]
fn stats_read_during_dispatch_never_show_more_exits_than_hits() {
    let run = stress::duration(500);
    let reg = Arc::new(Registry::<()>::builder().build().unwrap());
    let probe = Fprobe::<()>::builder()
        .entry(|_| EntryAction::Continue)
        .exit(|_| {})
        .build();
    let h = reg.register(probe, &[0x40]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let dispatchers: Vec<_> = (0..3)
        .map(|_| {
            let (reg, stop) = (reg.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    reg.on_entry(0x40, 0, &());
                    reg.on_exit(0, &());
                }
            })
        })
        .collect();
    let deadline = Instant::now() + run;
    let mut reads = 0u64;
    let mut bad = None;
    while Instant::now() < deadline && bad.is_none() {
        let s = reg.stats(h).unwrap();
        if s.exits > s.hits {
            bad = Some(s);
        }
        reads += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for d in dispatchers {
        d.join().unwrap();
    }
    assert_eq!(bad, None, "after {reads} reads");
    let s = reg.stats(h).unwrap();
    assert_eq!(s.hits, s.exits, "quiet: every call returned");
}

/// `in_flight` counts calls between an entry that kept an exit and its
/// return, whatever the return did (ran, skipped as recursion or for an
/// ignored thread, forgotten by a pairing reset).
#[test]
fn in_flight_counts_open_calls_until_they_end() {
    let reg = Registry::<()>::builder().build().unwrap();
    let with_exit = Fprobe::builder().data_size(8).exit(|_| {}).build();
    let h = reg.register(with_exit, &[0x10, 0x20]).unwrap();
    let entry_only = reg
        .register(
            Fprobe::builder().entry(|_| EntryAction::Continue).build(),
            &[0x10],
        )
        .unwrap();
    let in_flight = |h| reg.stats(h).unwrap().in_flight;
    reg.on_entry(0x10, 0, &());
    reg.on_entry(0x20, 0, &());
    reg.on_entry(0x30, 0, &()); // unprobed
    assert_eq!((in_flight(h), in_flight(entry_only)), (2, 0));
    reg.on_exit(0, &());
    reg.on_exit(0, &());
    assert_eq!(in_flight(h), 1);
    ignore_current_thread(true);
    reg.on_exit(0, &());
    ignore_current_thread(false);
    let s = reg.stats(h).unwrap();
    assert_eq!(
        (s.in_flight, s.exits),
        (0, 1),
        "an ignored exit ends the call: {s:?}"
    );

    reg.on_entry(0x20, 0, &());
    reg.on_entry(0x10, 0, &());
    assert_eq!(in_flight(h), 2);
    reg.reset_pairing();
    assert_eq!(in_flight(h), 2, "forgotten at the thread's next dispatch");
    reg.on_entry(0x30, 0, &());
    assert_eq!(in_flight(h), 0, "the reset forgot both calls");
    reg.on_exit(0, &());
    assert_eq!(reg.stats(h).unwrap().exits, 1);
}

/// `drain` waits for a call in flight on another thread and runs its exit;
/// it times out on a thread parked inside a call and says how many are
/// left; it does not wait for the caller's own open calls.
#[test]
fn drain_waits_for_calls_in_flight() {
    let reg = Registry::<()>::builder().build().unwrap();
    let exits = counter();
    let h = reg.register(counting_exits(&exits), &[0x10]).unwrap();
    let (entered, release) = (Barrier::new(2), Barrier::new(2));
    std::thread::scope(|s| {
        s.spawn(|| {
            reg.on_entry(0x10, 0, &());
            entered.wait();
            release.wait();
            std::thread::sleep(Duration::from_millis(20));
            reg.on_exit(0, &());
        });
        entered.wait();
        // The caller's own open call is not waited for.
        reg.on_entry(0x10, 0, &());
        let t = Instant::now();
        assert_eq!(reg.drain(h, Duration::from_millis(30)).unwrap(), 1);
        assert!(
            t.elapsed() >= Duration::from_millis(30),
            "timed out, not earlier"
        );
        assert_eq!(exits.load(Ordering::Relaxed), 0);
        // Disabled: a new entry keeps nothing.
        reg.on_entry(0x10, 0, &());
        reg.on_exit(0, &());
        assert_eq!(reg.stats(h).unwrap().missed.disabled, 1);
        release.wait();
        assert_eq!(reg.drain(h, Duration::from_secs(60)).unwrap(), 0);
        assert_eq!(
            exits.load(Ordering::Relaxed),
            1,
            "the parked call's exit ran"
        );
        reg.on_exit(0, &());
        assert_eq!(
            exits.load(Ordering::Relaxed),
            2,
            "and so does the caller's own"
        );
    });
    assert_eq!(reg.stats(h).unwrap().in_flight, 0);
    reg.unregister(h).unwrap();
    assert!(matches!(reg.drain(h, Duration::ZERO), Err(Error::NotFound)));
}

/// The engine context C handlers are given: the address of this value.
struct CCtx(u64);

// SAFETY: `ByAddress` makes no claim on the layout.
unsafe impl fprobe::probe::CEngineCtx for CCtx {
    const REPR: fprobe::probe::CEngineRepr = fprobe::probe::CEngineRepr::ByAddress;
}

/// What the C handlers below saw, by call: (addr, cookie, engine value,
/// data the exit got).
type CLog = Mutex<Vec<(u64, u64, u64, u64)>>;

unsafe extern "C" fn c_entry(
    _user: *mut std::ffi::c_void,
    ctx: *mut fprobe::probe::CEntryContext,
) -> std::ffi::c_int {
    // SAFETY: dispatch passes a valid context for the call.
    let c = unsafe { &mut *ctx };
    assert_eq!(c.data_size, 8);
    // SAFETY: `data_size` writable bytes at `data`.
    unsafe { c.data.cast::<u64>().write_unaligned(c.addr ^ c.cookie) };
    // Calls on odd cookies skip their exit.
    if c.cookie % 2 == 1 {
        fprobe::probe::C_SKIP_EXIT
    } else {
        0
    }
}

unsafe extern "C" fn c_exit(user: *mut std::ffi::c_void, ctx: *const fprobe::probe::CExitContext) {
    // SAFETY: `user` is the test's `CLog`, alive while the probe is; the
    // context is valid for the call.
    let (log, c) = unsafe { (&*user.cast::<CLog>(), &*ctx) };
    // SAFETY: the engine context is a `CCtx` (`CEngineCtx` above), and
    // `data_size` bytes lie at `data`.
    let (engine, data) = unsafe {
        (
            (*c.engine_ctx.cast::<CCtx>()).0,
            c.data.cast::<u64>().read_unaligned(),
        )
    };
    assert_eq!(c.data_size, 8);
    log.lock().unwrap().push((c.addr, c.cookie, engine, data));
}

#[test]
fn c_handlers_see_their_contexts_and_data_and_the_owned_value_outlives_them() {
    static LOG: CLog = Mutex::new(Vec::new());
    let dropped = Arc::new(AtomicBool::new(false));
    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let registry = Registry::<CCtx>::builder().build().unwrap();
    let user = (&raw const LOG).cast_mut().cast();
    // SAFETY: both functions take any thread; `user` is a static.
    let probe = unsafe {
        Fprobe::<CCtx>::builder()
            .data_size(8)
            .entry_c(c_entry, user)
            .exit_c(c_exit, user)
    }
    .owns(SetOnDrop(dropped.clone()))
    .build();
    let h = registry
        .register_with_cookies(probe, [(0x1000, 4), (0x2000, 7)])
        .unwrap();
    registry.on_entry(0x1000, 0x10, &CCtx(11));
    registry.on_entry(0x2000, 0x20, &CCtx(12));
    registry.on_exit(0x20, &CCtx(13));
    registry.on_exit(0x10, &CCtx(14));
    // Only the even cookie's exit ran, with the entry's data and the
    // exit's own engine context.
    assert_eq!(*LOG.lock().unwrap(), [(0x1000, 4, 14, 0x1000 ^ 4)]);
    let s = registry.stats(h).unwrap();
    assert_eq!((s.hits, s.exits, s.in_flight), (2, 1, 0));
    assert!(!dropped.load(Ordering::SeqCst));
    registry.unregister(h).unwrap();
    assert!(dropped.load(Ordering::SeqCst), "dropped with the probe");
}

/// Inputs that would make a registration or a registry do nothing useful
/// are refused with a typed error, and use up nothing: the probe slot of a
/// refused registration stays free.
#[test]
fn degenerate_inputs_are_refused_and_use_nothing() {
    assert!(matches!(
        Registry::<()>::builder().max_depth(0).build(),
        Err(Error::InvalidConfig(_))
    ));
    let reg = Registry::<()>::builder().max_probes(1).build().unwrap();
    let entry_only = || {
        Fprobe::<()>::builder()
            .entry(|_| EntryAction::Continue)
            .build()
    };
    assert!(matches!(
        reg.register(entry_only(), &[]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        reg.register_with_cookies(entry_only(), std::iter::empty()),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        reg.register(Fprobe::<()>::builder().data_size(8).build(), &[0x1000]),
        Err(Error::InvalidArgument(_))
    ));
    // The one slot is still free.
    let h = reg.register(entry_only(), &[0x1000]).unwrap();
    assert_eq!(
        reg.register(entry_only(), &[0x2000]),
        Err(Error::TooManyProbes { max_probes: 1 })
    );
    reg.unregister(h).unwrap();
}

/// A panicking handler is counted on every call and its first message kept
/// for `first_panic`, for entry and exit handlers alike.
#[test]
fn first_panic_of_entry_and_exit_handlers_is_kept() {
    let reg = Registry::<()>::builder().build().unwrap();
    let entry = reg
        .register(
            Fprobe::builder()
                .entry(|e| panic!("entry at {:#x}", e.addr))
                .build(),
            &[0x10],
        )
        .unwrap();
    let exit = reg
        .register(
            Fprobe::builder().exit(|_| panic!("exit handler")).build(),
            &[0x20],
        )
        .unwrap();
    assert_eq!(reg.first_panic(exit).unwrap(), None);
    for _ in 0..3 {
        for a in [0x10, 0x20] {
            reg.on_entry(a, 0, &());
            reg.on_exit(0, &());
        }
    }
    assert_eq!(reg.stats(entry).unwrap().panics, 3);
    assert_eq!(reg.stats(exit).unwrap().panics, 3);
    let first = reg.first_panic(entry).unwrap().unwrap();
    assert!(first.starts_with("entry at 0x10"), "{first}");
    assert!(first.contains("probe.rs"), "where it was raised: {first}");
    let first = reg.first_panic(exit).unwrap().unwrap();
    assert!(first.starts_with("exit handler"), "{first}");
    reg.unregister(entry).unwrap();
    assert_eq!(reg.first_panic(entry), Err(Error::NotFound));
}

/// A handler's panic whose payload panics again when dropped stays inside
/// the dispatch, entry and exit alike: counted once, the thread's
/// dispatch ended (no section left open), later calls paired as usual.
#[test]
fn a_panic_payload_that_panics_on_drop_stays_contained() {
    struct PanicsOnDrop;
    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            panic!("the payload's drop");
        }
    }
    let reg = Registry::<()>::builder().build().unwrap();
    let entry = reg
        .register(
            Fprobe::builder()
                .entry(|_| std::panic::panic_any(PanicsOnDrop))
                .build(),
            &[0x10],
        )
        .unwrap();
    let exit = reg
        .register(
            Fprobe::builder()
                .exit(|_| std::panic::panic_any(PanicsOnDrop))
                .build(),
            &[0x20],
        )
        .unwrap();
    let (probe, log) = addr_logging_probe();
    let logged = reg.register(probe, &[0x30]).unwrap();
    for _ in 0..3 {
        for a in [0x10, 0x20, 0x30] {
            reg.on_entry(a, 0x500, &());
            assert!(!fprobe::rcu::in_read_section(), "entry left a section open");
            reg.on_exit(0x500, &());
            assert!(!fprobe::rcu::in_read_section(), "exit left a section open");
        }
    }
    assert_eq!(reg.stats(entry).unwrap().panics, 3);
    assert_eq!(reg.stats(exit).unwrap().panics, 3);
    assert_eq!(
        (
            reg.stats(exit).unwrap().hits,
            reg.stats(exit).unwrap().in_flight
        ),
        (3, 0)
    );
    assert_eq!(*log.lock().unwrap(), vec![(0x30, 0x30, 0x500); 3]);
    for h in [entry, exit, logged] {
        reg.unregister(h).unwrap();
    }
}

/// A hook's own dispatch section: held dispatches run in it (entries and
/// exits pair as usual), it is a read-side section, a second one cannot
/// open inside it, and a handler's nested dispatch still nests.
#[test]
fn dispatch_sections_held_by_a_hook() {
    use fprobe::probe::DispatchSection;
    let reg = Arc::new(Registry::<()>::builder().build().unwrap());
    let (probe, log) = addr_logging_probe();
    let h = reg.register(probe, &[0x10, 0x20]).unwrap();
    {
        let mut s = DispatchSection::enter().expect("no dispatch runs");
        assert!(fprobe::rcu::in_read_section());
        assert!(DispatchSection::enter().is_none(), "one at a time");
        reg.on_entry_held(&mut s, 0x10, 0x500, &());
        // Nested in the held section: the plain method nests.
        reg.on_entry(0x20, 0x600, &());
        reg.on_exit(0x600, &());
    }
    assert!(!fprobe::rcu::in_read_section());
    {
        let mut s = DispatchSection::enter_for_exit().unwrap();
        reg.on_exit_held(&mut s, 0x500, &());
    }
    let st = reg.stats(h).unwrap();
    assert_eq!((st.hits, st.exits, st.missed.recursion), (1, 1, 1));
    assert_eq!(*log.lock().unwrap(), vec![(0x10, 0x10, 0x500)]);
    reg.unregister(h).unwrap();
}

/// A held dispatch borrows its section mutably, so a handler cannot
/// dispatch in the hook's section again: an engine that keeps the section
/// where a handler can reach it (a thread-local `RefCell`) gets a borrow
/// panic in the handler, caught and counted as the handler's, and the
/// other registry's probe never runs as a second outermost dispatch.
#[test]
fn a_handler_cannot_dispatch_in_its_hooks_section_again() {
    use fprobe::probe::DispatchSection;
    use std::cell::RefCell;
    thread_local! {
        static SECTION: RefCell<Option<DispatchSection>> = const { RefCell::new(None) };
    }
    let inner = Arc::new(Registry::<()>::builder().build().unwrap());
    let inner_runs = counter();
    let hi = inner
        .register(counting_entries(&inner_runs), &[0x20])
        .unwrap();
    let outer = Registry::<()>::builder().build().unwrap();
    let reg = inner.clone();
    let ho = outer
        .register(
            Fprobe::builder()
                .entry(move |_| {
                    SECTION.with(|s| {
                        let mut s = s.borrow_mut();
                        reg.on_entry_held(s.as_mut().unwrap(), 0x20, 0x600, &());
                    });
                    EntryAction::Continue
                })
                .build(),
            &[0x10],
        )
        .unwrap();
    SECTION.with(|s| *s.borrow_mut() = DispatchSection::enter());
    SECTION.with(|s| {
        let mut s = s.borrow_mut();
        outer.on_entry_held(s.as_mut().unwrap(), 0x10, 0x500, &());
        outer.on_exit_held(s.as_mut().unwrap(), 0x500, &());
    });
    SECTION.with(|s| *s.borrow_mut() = None);
    assert!(!fprobe::rcu::in_read_section());
    let so = outer.stats(ho).unwrap();
    assert_eq!((so.hits, so.panics), (1, 1), "{so:?}");
    assert_eq!(inner_runs.load(Ordering::Relaxed), 0);
    // The inner registry dispatches as before afterwards.
    inner.on_entry(0x20, 0x600, &());
    inner.on_exit(0x600, &());
    assert_eq!(inner_runs.load(Ordering::Relaxed), 1);
    inner.unregister(hi).unwrap();
    outer.unregister(ho).unwrap();
}
