//! Pops and pushes from a signal handler that interrupts pops and pushes
//! of the same pool on the same thread: a storm of `SIGUSR1` delivered to a
//! thread that pops and pushes in a loop (holding a varying number of
//! objects), the handler popping and pushing objects of its own. Every
//! object must be held by one holder at a time (a flag per object, set
//! while held), keep what its holder wrote, and none may be lost; the
//! handler's pops must succeed whenever enough objects are free.
//!
//! The storm lasts `FPROBE_SIGNAL_SECS` seconds (2 by default).

use std::ffi::c_int;
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, OnceLock};

use fprobe::ObjPool;
use fprobe::objpool::PoolObj;

#[path = "common/signal_storm.rs"]
mod signal_storm;

const OBJS: usize = 64;
/// Most objects the interrupted thread holds at once.
const THREAD_HOLDS: usize = 24;
/// Objects the handler takes per signal.
const HANDLER_TAKES: usize = 3;

/// Each object: its index and the tag its holder wrote.
static POOL: OnceLock<ObjPool<(usize, u64)>> = OnceLock::new();
/// Set while someone holds object `i`.
static HELD: [AtomicBool; OBJS] = [const { AtomicBool::new(false) }; OBJS];
static BAD: AtomicU64 = AtomicU64::new(0);
static SIG_POPS: AtomicU64 = AtomicU64::new(0);
static SIG_MISSES: AtomicU64 = AtomicU64::new(0);
static SIGNALS: AtomicU64 = AtomicU64::new(0);

fn take(obj: &mut PoolObj<(usize, u64)>, tag: u64) {
    if obj.0 != obj.index() || HELD[obj.0].swap(true, Ordering::SeqCst) {
        BAD.fetch_add(1, Ordering::Relaxed);
    }
    obj.1 = tag;
}

fn give_back(obj: PoolObj<(usize, u64)>, tag: u64) {
    if obj.1 != tag || !HELD[obj.0].swap(false, Ordering::SeqCst) {
        BAD.fetch_add(1, Ordering::Relaxed);
    }
    drop(obj);
}

extern "C" fn on_sigusr1(_: c_int) {
    signal_storm::keeping_errno(|| {
        let pool = POOL.get().unwrap();
        let n = SIGNALS.fetch_add(1, Ordering::Relaxed);
        let tag = (1 << 63) | n;
        let mut mine: [Option<PoolObj<(usize, u64)>>; HANDLER_TAKES] = [None, None, None];
        for slot in mine.iter_mut() {
            match pool.pop() {
                Some(mut o) => {
                    take(&mut o, tag);
                    SIG_POPS.fetch_add(1, Ordering::Relaxed);
                    *slot = Some(o);
                }
                // The thread holds at most THREAD_HOLDS, the handler 3: at
                // least OBJS - 27 are free, and no other thread uses the
                // pool, so the bound on misses is 0.
                None => {
                    SIG_MISSES.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        for o in mine.into_iter().flatten() {
            give_back(o, tag);
        }
    });
}

#[test]
#[cfg_attr(miri, ignore)] // signals, threads and wall-clock time
fn signal_storm_keeps_every_object_with_one_holder() {
    let pool = POOL.get_or_init(|| {
        ObjPool::builder()
            .thread_cache(8)
            .build(OBJS, |i| (i, 0))
            .unwrap()
    });
    signal_storm::install(on_sigusr1);
    let ready = Arc::new(Barrier::new(2));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (ready, stop) = (ready.clone(), stop.clone());
        std::thread::spawn(move || {
            // The handler must not allocate: make this thread's magazine now.
            pool.prepare_thread();
            let mut held: Vec<PoolObj<(usize, u64)>> = Vec::with_capacity(THREAD_HOLDS);
            let mut tags: Vec<u64> = Vec::with_capacity(THREAD_HOLDS);
            let mut ops = 0u64;
            let mut misses = 0u64;
            let mut sent = false;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if !sent {
                    ready.wait();
                    sent = true;
                }
                // Vary the number held so that the magazine refills from
                // and flushes to the depot, under the storm too.
                let want = (i % THREAD_HOLDS as u64) as usize;
                while held.len() < want {
                    match pool.pop() {
                        Some(mut o) => {
                            take(&mut o, i);
                            held.push(o);
                            tags.push(i);
                        }
                        None => {
                            misses += 1;
                            break;
                        }
                    }
                    ops += 1;
                }
                while held.len() > want / 2 {
                    give_back(held.pop().unwrap(), tags.pop().unwrap());
                    ops += 1;
                }
                i += 1;
            }
            for (o, t) in held.into_iter().zip(tags) {
                give_back(o, t);
            }
            (ops, misses)
        })
    };
    let target = worker.as_pthread_t();
    ready.wait();
    // `worker` is alive until it is joined below.
    let sent = signal_storm::send_for_duration(target);
    stop.store(true, Ordering::Relaxed);
    let (ops, misses) = worker.join().unwrap();
    let handled = SIGNALS.load(Ordering::Relaxed);
    eprintln!(
        "objpool signal storm: {sent} signals sent, {handled} handled, {} handler pops, \
         {ops} thread pops+pushes",
        SIG_POPS.load(Ordering::Relaxed)
    );
    assert_eq!(
        BAD.load(Ordering::Relaxed),
        0,
        "an object had two holders or lost a write"
    );
    assert_eq!(
        misses, 0,
        "the thread's pops failed while objects were free"
    );
    assert_eq!(
        SIG_MISSES.load(Ordering::Relaxed),
        0,
        "the handler's pops failed while objects were free"
    );
    assert!(
        handled > 100,
        "too few signals handled to test anything: {handled}"
    );
    // Every object is back, exactly once.
    let all: Vec<_> = std::iter::from_fn(|| pool.pop()).collect();
    let mut ids: Vec<usize> = all.iter().map(|o| o.0).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..OBJS).collect::<Vec<_>>());
    assert!(HELD.iter().all(|h| !h.load(Ordering::Relaxed)));
}
