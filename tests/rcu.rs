//! Integration and stress tests of `fprobe::rcu`.

#[path = "common/stress.rs"]
mod stress;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

#[cfg(all(unix, not(miri)))]
#[path = "common/fork.rs"]
mod fork;

use fprobe::rcu::{self, RcuPtr};

const ALIVE: u64 = 0xA11C_E000_0000_0001;
const DEAD: u64 = 0xDEAD_DEAD_DEAD_DEAD;

/// An object that poisons itself when dropped, so a reader that touches it
/// after reclamation sees `DEAD` (or garbage) instead of `ALIVE`.
struct Poisoned {
    magic: AtomicU64,
    serial: u64,
    drops: Arc<AtomicUsize>,
}

impl Poisoned {
    fn new(serial: u64, drops: &Arc<AtomicUsize>) -> Self {
        Self {
            magic: AtomicU64::new(ALIVE),
            serial,
            drops: drops.clone(),
        }
    }
}

impl Drop for Poisoned {
    fn drop(&mut self) {
        assert_eq!(
            self.magic.swap(DEAD, Ordering::Relaxed),
            ALIVE,
            "double drop"
        );
        self.drops.fetch_add(1, Ordering::Relaxed);
    }
}

fn stress_duration() -> Duration {
    stress::duration(if cfg!(miri) { 50 } else { 1500 })
}

/// Readers dereference an object that writers replace and retire
/// continuously; every object read must still be alive, and every object
/// must be dropped exactly once.
#[test]
fn readers_never_see_reclaimed_objects() {
    let drops = Arc::new(AtomicUsize::new(0));
    let ptr = Arc::new(RcuPtr::new(Poisoned::new(0, &drops)));
    let stop = Arc::new(AtomicBool::new(false));
    let readers = if cfg!(miri) { 2 } else { 3 };
    let writers = 2;
    let start = Arc::new(Barrier::new(readers + writers + 1));
    let mut handles = Vec::new();
    for _ in 0..readers {
        let (ptr, stop, start) = (ptr.clone(), stop.clone(), start.clone());
        handles.push(std::thread::spawn(move || {
            start.wait();
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let g = rcu::read_lock();
                let obj = ptr.load(&g).expect("never null");
                let serial = obj.serial;
                for _ in 0..8 {
                    assert_eq!(
                        obj.magic.load(Ordering::Relaxed),
                        ALIVE,
                        "use after reclaim"
                    );
                    std::hint::spin_loop();
                }
                assert_eq!(obj.serial, serial);
                reads += 1;
            }
            reads
        }));
    }
    let serial = Arc::new(AtomicU64::new(1));
    for w in 0..writers {
        let (ptr, stop, start, drops, serial) = (
            ptr.clone(),
            stop.clone(),
            start.clone(),
            drops.clone(),
            serial.clone(),
        );
        handles.push(std::thread::spawn(move || {
            start.wait();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let s = serial.fetch_add(1, Ordering::Relaxed);
                if w == 0 && n % 16 == 0 {
                    // Exercise the synchronous path too.
                    let old = ptr.swap_sync(Some(Poisoned::new(s, &drops))).unwrap();
                    assert_eq!(old.magic.load(Ordering::Relaxed), ALIVE);
                } else {
                    ptr.replace(Poisoned::new(s, &drops));
                }
                n += 1;
            }
            n
        }));
    }
    start.wait();
    std::thread::sleep(stress_duration());
    stop.store(true, Ordering::Relaxed);
    let counts: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        counts.iter().all(|&c| c > 0),
        "every thread made progress: {counts:?}"
    );
    let created = serial.load(Ordering::Relaxed) as usize;
    drop(Arc::try_unwrap(ptr).ok().expect("sole owner"));
    rcu::barrier();
    assert_eq!(
        drops.load(Ordering::Relaxed),
        created,
        "every object dropped exactly once"
    );
}

#[test]
fn synchronize_waits_for_preexisting_reader() {
    let entered = Arc::new(Barrier::new(2));
    let released = Arc::new(AtomicBool::new(false));
    let (e, r) = (entered.clone(), released.clone());
    let reader = std::thread::spawn(move || {
        let g = rcu::read_lock();
        e.wait();
        std::thread::sleep(Duration::from_millis(100));
        r.store(true, Ordering::SeqCst);
        drop(g);
    });
    entered.wait();
    let t = Instant::now();
    rcu::synchronize();
    assert!(
        released.load(Ordering::SeqCst),
        "synchronize returned while a pre-existing reader was still inside"
    );
    assert!(t.elapsed() >= Duration::from_millis(50));
    reader.join().unwrap();
}

#[test]
fn synchronize_does_not_wait_for_new_or_exited_threads() {
    // Threads that registered and exited must not stall grace periods.
    for _ in 0..8 {
        std::thread::spawn(|| drop(rcu::read_lock()))
            .join()
            .unwrap();
    }
    let t = Instant::now();
    rcu::synchronize();
    assert!(t.elapsed() < Duration::from_secs(5));
    let s = rcu::stats();
    assert!(s.records_in_use <= s.records);
}

#[test]
fn records_are_reused_by_later_threads() {
    for _ in 0..64 {
        std::thread::spawn(|| drop(rcu::read_lock()))
            .join()
            .unwrap();
    }
    // 64 sequential threads need far fewer than 64 records (other tests run
    // concurrently, so allow slack).
    assert!(rcu::stats().records < 48, "{:?}", rcu::stats());
}

#[test]
fn nesting_keeps_outer_protection() {
    let drops = Arc::new(AtomicUsize::new(0));
    let ptr = RcuPtr::new(Poisoned::new(1, &drops));
    let outer = rcu::read_lock();
    let obj = ptr.load(&outer).unwrap();
    {
        let inner = rcu::read_lock();
        assert!(rcu::in_read_section());
        drop(inner);
    }
    assert!(rcu::in_read_section());
    // A grace period on another thread must still wait for `outer`.
    replace_while_held(&ptr, obj, &drops, || drop(outer));
    assert!(!rcu::in_read_section());
}

/// Replaces `ptr`'s object `obj`, which a section of this thread still
/// holds: a grace period on another thread waits, `obj` stays alive, until
/// `end` ends that section; then the old object is freed.
fn replace_while_held(
    ptr: &RcuPtr<Poisoned>,
    obj: *const Poisoned,
    drops: &Arc<AtomicUsize>,
    end: impl FnOnce(),
) {
    ptr.replace(Poisoned::new(2, drops));
    let waiter = std::thread::spawn(rcu::barrier);
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: the caller's section still holds `obj` (and `drops` shows it
    // was not freed); `end` has not run yet.
    assert_eq!(unsafe { (*obj).magic.load(Ordering::Relaxed) }, ALIVE);
    assert_eq!(drops.load(Ordering::Relaxed), 0);
    end();
    waiter.join().unwrap();
    assert_eq!(drops.load(Ordering::Relaxed), 1);
}

#[test]
fn guards_may_drop_out_of_order() {
    let drops = Arc::new(AtomicUsize::new(0));
    let ptr = RcuPtr::new(Poisoned::new(1, &drops));
    let a = rcu::read_lock();
    let b = rcu::read_lock();
    let obj = ptr.load(&b).unwrap();
    drop(a); // `b` still protects `obj`
    assert!(rcu::in_read_section());
    replace_while_held(&ptr, obj, &drops, || drop(b));
}

#[test]
#[should_panic(expected = "inside a read-side critical section")]
fn synchronize_inside_read_section_panics() {
    let _g = rcu::read_lock();
    rcu::synchronize();
}

#[test]
fn call_rcu_and_barrier() {
    let hits = Arc::new(AtomicUsize::new(0));
    for _ in 0..1000 {
        let h = hits.clone();
        rcu::call_rcu(move || {
            h.fetch_add(1, Ordering::Relaxed);
        });
    }
    rcu::barrier();
    assert_eq!(hits.load(Ordering::Relaxed), 1000);
}

#[test]
fn panicking_destructor_is_contained() {
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("boom (expected by the test)");
        }
    }
    let before = rcu::stats().destructor_panics;
    rcu::retire(Box::new(Bomb));
    rcu::barrier();
    assert!(rcu::stats().destructor_panics > before);
    // The reclaimer survived.
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    rcu::call_rcu(move || r.store(true, Ordering::Relaxed));
    rcu::barrier();
    assert!(ran.load(Ordering::Relaxed));
}

#[test]
fn read_lock_from_thread_local_destructor() {
    // A thread-local destructor that runs after the RCU's own exit handler
    // still gets a working (transient) read-side section.
    struct LateReader(Arc<AtomicBool>);
    impl Drop for LateReader {
        fn drop(&mut self) {
            let g = rcu::read_lock();
            drop(g);
            self.0.store(true, Ordering::SeqCst);
        }
    }
    thread_local! {
        static LATE: std::cell::RefCell<Option<LateReader>> = const { std::cell::RefCell::new(None) };
    }
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        LATE.with(|l| *l.borrow_mut() = Some(LateReader(d)));
        drop(rcu::read_lock());
    })
    .join()
    .unwrap();
    assert!(done.load(Ordering::SeqCst));
    rcu::synchronize();
}

#[cfg(all(unix, not(miri)))]
#[test]
fn read_section_nested_from_signal_handler() {
    use std::sync::atomic::AtomicU32;
    static HANDLED: AtomicU32 = AtomicU32::new(0);
    extern "C" fn handler(_: libc::c_int) {
        let g = rcu::read_lock();
        drop(g);
        HANDLED.fetch_add(1, Ordering::Relaxed);
    }
    rcu::register_thread();
    // SAFETY: (test) installs a handler that only touches RCU's read side
    // (async-signal-safe once the thread is registered) and an atomic.
    // SAFETY: (test) plain libc process/thread calls with valid arguments.
    unsafe {
        libc::signal(libc::SIGUSR1, handler as *const () as libc::sighandler_t);
    }
    // SAFETY: (test) plain libc process/thread calls with valid arguments.
    let me = unsafe { libc::pthread_self() };
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let me_id = me as usize;
    let kicker = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            // SAFETY: (test) plain libc process/thread calls with valid arguments.
            unsafe { libc::pthread_kill(me_id as libc::pthread_t, libc::SIGUSR1) };
            std::thread::sleep(Duration::from_micros(50));
        }
    });
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(300) {
        let g = rcu::read_lock();
        assert!(rcu::in_read_section());
        drop(g);
        assert!(!rcu::in_read_section());
    }
    stop.store(true, Ordering::Relaxed);
    kicker.join().unwrap();
    assert!(HANDLED.load(Ordering::Relaxed) > 0);
    assert!(!rcu::in_read_section());
    rcu::synchronize(); // would hang if a handler had left the word active
}

#[cfg(all(unix, not(miri)))]
#[test]
fn fork_child_can_synchronize() {
    if fork::left_out_under_qemu_user("fork_child_can_synchronize") {
        return;
    }
    // A parent thread sits inside a read-side section at the fork; the child
    // must not wait for it.
    let entered = Arc::new(Barrier::new(2));
    let stop = Arc::new(AtomicBool::new(false));
    let _release = fork::SetOnDrop(stop.clone());
    let (e, s) = (entered.clone(), stop.clone());
    let reader = std::thread::spawn(move || {
        let g = rcu::read_lock();
        e.wait();
        while !s.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(g);
    });
    entered.wait();
    // SAFETY: (test) the child only calls RCU functions and _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        rcu::synchronize();
        rcu::retire(Box::new(5u64));
        rcu::barrier();
        // SAFETY: (test) plain libc process/thread calls with valid arguments.
        unsafe { libc::_exit(0) };
    }
    assert!(pid > 0);
    let status = fork::wait_child(
        pid,
        Duration::from_secs(20),
        "child hung in synchronize after fork",
    );
    assert!(fork::exited_cleanly(status));
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
}

/// Sustained churn: retired memory must stay bounded. `#[ignore]`d (it runs
/// for `FPROBE_CHURN_SECS`, 60 by default); `.ci/run` runs it.
#[test]
#[ignore]
fn churn_memory_stays_bounded() {
    let secs: u64 = std::env::var("FPROBE_CHURN_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let drops = Arc::new(AtomicUsize::new(0));
    let ptr = Arc::new(RcuPtr::new(Poisoned::new(0, &drops)));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (ptr, stop) = (ptr.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let g = rcu::read_lock();
                assert_eq!(ptr.load(&g).unwrap().magic.load(Ordering::Relaxed), ALIVE);
            }
        })
    };
    let t = Instant::now();
    let (mut created, mut max_pending) = (1usize, 0usize);
    while t.elapsed() < Duration::from_secs(secs) {
        for _ in 0..1024 {
            ptr.replace(Poisoned::new(created as u64, &drops));
            created += 1;
        }
        let live = created - drops.load(Ordering::Relaxed);
        max_pending = max_pending.max(live);
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    let s = rcu::stats();
    println!(
        "churn: {secs} s, {created} objects retired, max live (pending + current) {max_pending}, \
         grace periods {}, {:.1} objects per grace period",
        s.reclaim_grace_periods,
        s.reclaimed as f64 / s.reclaim_grace_periods.max(1) as f64
    );
    assert!(
        max_pending <= 2 * 65536 + 2048,
        "retired memory grew beyond the back-pressure bound: {max_pending}"
    );
    drop(Arc::try_unwrap(ptr).ok().unwrap());
    rcu::barrier();
    assert_eq!(drops.load(Ordering::Relaxed), created);
}
