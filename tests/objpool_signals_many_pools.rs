//! Several pools on one thread under a signal storm whose handler uses yet
//! another pool: each thread finds its magazine in a pool through a
//! one-entry thread-local cache shared by all pools, and a handler that
//! looks up its own pool while the interrupted code is reading or writing
//! that cache must never leave it naming one pool with another pool's
//! magazine (which would hand objects of one pool out twice, or lose
//! them). Every object must have one holder at a time, and each pool must
//! hold exactly its own objects at the end.
//!
//! The storm lasts `FPROBE_SIGNAL_SECS` seconds (2 by default).

use std::ffi::c_int;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use fprobe::ObjPool;

#[path = "common/signal_storm.rs"]
mod signal_storm;

const OBJS: usize = 64;
/// Pools 0 and 1: the interrupted thread's; pool 2: the handler's.
static POOLS: OnceLock<[ObjPool<usize>; 3]> = OnceLock::new();
/// Set while someone holds object `i` of pool `p`.
static HELD: [[AtomicBool; OBJS]; 3] = [const { [const { AtomicBool::new(false) }; OBJS] }; 3];
static BAD: AtomicU64 = AtomicU64::new(0);
static SIGNALS: AtomicU64 = AtomicU64::new(0);

fn take(p: usize, i: usize, value: usize) {
    if i != value || HELD[p][i].swap(true, Ordering::SeqCst) {
        BAD.fetch_add(1, Ordering::Relaxed);
    }
}

fn give(p: usize, i: usize) {
    if !HELD[p][i].swap(false, Ordering::SeqCst) {
        BAD.fetch_add(1, Ordering::Relaxed);
    }
}

/// Pops and pushes one object of pool `p`; `false` when the pop failed.
fn round_trip(p: usize) -> bool {
    let pool = &POOLS.get().unwrap()[p];
    match pool.pop() {
        Some(o) => {
            take(p, o.index(), *o);
            give(p, o.index());
            drop(o);
            true
        }
        None => false,
    }
}

extern "C" fn on_sigusr1(_: c_int) {
    signal_storm::keeping_errno(|| {
        SIGNALS.fetch_add(1, Ordering::Relaxed);
        if !round_trip(2) {
            BAD.fetch_add(1, Ordering::Relaxed);
        }
    });
}

#[test]
#[cfg_attr(miri, ignore)] // signals, threads and wall-clock time
fn a_handler_on_another_pool_never_mixes_up_the_magazines() {
    let pools = POOLS.get_or_init(|| {
        std::array::from_fn(|_| {
            ObjPool::builder()
                .thread_cache(8)
                .build(OBJS, |i| i)
                .unwrap()
        })
    });
    signal_storm::install(on_sigusr1);
    let misses = signal_storm::storm_a_worker(
        // The handler must not allocate: make this thread's magazines.
        move || {
            for p in pools {
                p.prepare_thread();
            }
        },
        |stop| {
            let mut misses = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Alternating pools keeps the thread's one-entry cache
                // changing hands, so signals land inside its updates.
                for p in [0, 1] {
                    misses += u64::from(!round_trip(p));
                }
            }
            misses
        },
    );
    let signals = SIGNALS.load(Ordering::Relaxed);
    eprintln!("objpool, three pools under a signal storm: {signals} signals handled");
    assert_eq!(
        BAD.load(Ordering::Relaxed),
        0,
        "an object of some pool had two holders, or the handler's pop failed"
    );
    assert_eq!(
        misses, 0,
        "the thread's pops failed while objects were free"
    );
    assert!(
        signals > 100,
        "too few signals handled to test anything: {signals}"
    );
    for (k, p) in pools.iter().enumerate() {
        // At most a few more than OBJS, so a pool that holds another's
        // objects (or a cycle) is reported instead of draining forever.
        let all: Vec<_> = std::iter::from_fn(|| p.pop()).take(OBJS + 8).collect();
        let mut ids: Vec<usize> = all.iter().map(|o| o.index()).collect();
        ids.sort_unstable();
        assert_eq!(
            ids,
            (0..OBJS).collect::<Vec<_>>(),
            "pool {k} does not hold exactly its objects"
        );
    }
}
