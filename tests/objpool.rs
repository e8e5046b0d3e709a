//! Functional and concurrent tests of `fprobe::ObjPool`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use fprobe::ObjPool;
use fprobe::objpool::ObjPoolError;

/// Iterations per thread in the stress tests.
const N: usize = if cfg!(miri) { 64 } else { 200_000 };
/// Threads in the stress tests.
const THREADS: usize = if cfg!(miri) { 3 } else { 4 };

#[test]
fn pop_until_exhausted_then_reuse() {
    let pool = ObjPool::builder().thread_cache(2).build(5, |i| i).unwrap();
    assert_eq!(pool.capacity(), 5);
    assert_eq!(pool.thread_cache(), 2);
    let mut held: Vec<_> = std::iter::from_fn(|| pool.pop()).collect();
    let mut ids: Vec<usize> = held.iter().map(|o| **o).collect();
    ids.sort_unstable();
    assert_eq!(ids, [0, 1, 2, 3, 4]);
    assert!(pool.pop().is_none());
    assert_eq!(pool.nmissed(), 2); // the `from_fn` stop plus the explicit one
    for o in &held {
        assert_eq!(o.index(), **o);
    }
    held.truncate(2);
    // (Collect the handles: dropping each one at once would push it back.)
    let again: Vec<_> = std::iter::from_fn(|| pool.pop()).collect();
    assert_eq!(again.len(), 3);
}

#[test]
fn writes_survive_a_round_trip() {
    for cache in [0, 1, 4] {
        let pool = ObjPool::builder()
            .thread_cache(cache)
            .build(1, |_| Vec::new())
            .unwrap();
        pool.pop().unwrap().extend_from_slice(b"hello");
        assert_eq!(&**pool.pop().unwrap(), b"hello");
    }
}

#[test]
fn builder_errors_and_defaults() {
    assert_eq!(
        ObjPool::builder().build(0, |_| ()).unwrap_err(),
        ObjPoolError::NoObjects
    );
    assert_eq!(
        ObjPool::builder()
            .thread_cache(fprobe::objpool::MAX_THREAD_CACHE + 1)
            .build(1, |_| ())
            .unwrap_err(),
        ObjPoolError::ThreadCacheTooLarge
    );
    let max = ObjPool::builder()
        .thread_cache(fprobe::objpool::MAX_THREAD_CACHE)
        .build(1, |_| ())
        .unwrap();
    assert_eq!(max.thread_cache(), fprobe::objpool::MAX_THREAD_CACHE);
    // Default: a sixteenth of the objects, between 1 and 32.
    assert_eq!(ObjPool::new(3, |_| ()).thread_cache(), 1);
    assert_eq!(ObjPool::new(256, |_| ()).thread_cache(), 16);
    assert_eq!(ObjPool::new(4096, |_| ()).thread_cache(), 32);
    assert!(!ObjPoolError::NoObjects.to_string().is_empty());
}

#[test]
#[should_panic(expected = "at least one object")]
fn new_panics_on_zero_objects() {
    let _ = ObjPool::new(0, |_| ());
}

#[test]
fn objects_move_between_threads() {
    let pool = ObjPool::builder().thread_cache(4).build(4, |i| i).unwrap();
    let held: Vec<_> = std::iter::from_fn(|| pool.pop()).collect();
    // Pushed back into another thread's magazine, popped here by stealing
    // from it after that thread exited.
    std::thread::spawn(move || drop(held)).join().unwrap();
    let back: Vec<_> = std::iter::from_fn(|| pool.pop()).collect();
    let mut ids: Vec<usize> = back.iter().map(|o| **o).collect();
    ids.sort_unstable();
    assert_eq!(ids, [0, 1, 2, 3]);
    assert_eq!(pool.nmissed(), 2); // the two `from_fn` stops
}

/// Objects sitting in the magazine of a live thread that is not inside a
/// pop or push are stolen, not missed.
#[test]
fn objects_in_an_idle_threads_magazine_are_stolen() {
    let pool = ObjPool::builder().thread_cache(8).build(8, |i| i).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (filled_tx, filled_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let pool = &pool;
        s.spawn(move || {
            // Take every object, then give them all back to this thread's
            // magazine (it holds all 8) and stay alive, idle.
            let all: Vec<_> = std::iter::from_fn(|| pool.pop()).collect();
            assert_eq!(all.len(), 8);
            drop(all);
            filled_tx.send(()).unwrap();
            rx.recv().unwrap();
        });
        filled_rx.recv().unwrap();
        let mine: Vec<_> = std::iter::from_fn(|| pool.pop()).collect();
        assert_eq!(mine.len(), 8, "pops failed while objects were free");
        tx.send(()).unwrap();
    });
}

/// Every object is held by at most one thread at a time and none is lost:
/// each id's flag is set exactly while someone holds the object.
#[test]
fn stress_no_loss_no_duplication() {
    const OBJS: usize = 16;
    let pool = ObjPool::builder()
        .thread_cache(4)
        .build(OBJS, |i| (i, 0usize))
        .unwrap();
    let held_flags: Vec<AtomicBool> = (0..OBJS).map(|_| AtomicBool::new(false)).collect();
    let misses = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (pool, flags, misses) = (&pool, &held_flags, &misses);
            s.spawn(move || {
                let mut mine = Vec::with_capacity(8);
                for i in 0..N {
                    // Hold a varying number of objects so that magazines
                    // drain and overflow, threads steal, and the pool
                    // sometimes runs dry.
                    let want = 1 + (i * 7 + t) % 6;
                    while mine.len() < want {
                        match pool.pop() {
                            Some(mut o) => {
                                let id = o.0;
                                assert!(
                                    !flags[id].swap(true, Ordering::AcqRel),
                                    "object {id} popped twice"
                                );
                                o.1 = t;
                                mine.push(o);
                            }
                            None => {
                                misses.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                    let keep = (i * 3 + t) % 3;
                    while mine.len() > keep {
                        let o = mine.pop().unwrap();
                        assert_eq!(o.1, t, "object {} changed while held", o.0);
                        assert!(
                            flags[o.0].swap(false, Ordering::AcqRel),
                            "object {} pushed while not held",
                            o.0
                        );
                        drop(o);
                    }
                }
                for o in mine.drain(..) {
                    assert!(flags[o.0].swap(false, Ordering::AcqRel));
                }
            });
        }
    });
    // All objects are back: exactly OBJS distinct ids.
    let back: Vec<_> = std::iter::from_fn(|| pool.pop()).collect();
    let mut ids: Vec<usize> = back.iter().map(|o| o.0).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..OBJS).collect::<Vec<_>>());
    assert_eq!(pool.nmissed() as usize, misses.load(Ordering::Relaxed) + 1);
}

/// Counts drops of its values.
struct Tracked {
    id: usize,
    drops: Arc<Vec<AtomicUsize>>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops[self.id].fetch_add(1, Ordering::Relaxed);
    }
}

fn tracked_pool(n: usize) -> (ObjPool<Tracked>, Arc<Vec<AtomicUsize>>) {
    let drops: Arc<Vec<AtomicUsize>> = Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect());
    let d = drops.clone();
    let pool = ObjPool::builder()
        .thread_cache(2)
        .build(n, move |id| Tracked {
            id,
            drops: d.clone(),
        })
        .unwrap();
    (pool, drops)
}

fn assert_each_dropped_once(drops: &[AtomicUsize]) {
    for (id, d) in drops.iter().enumerate() {
        assert_eq!(d.load(Ordering::Relaxed), 1, "object {id}");
    }
}

#[test]
fn drop_pool_with_objects_outstanding() {
    let (pool, drops) = tracked_pool(8);
    let a = pool.pop().unwrap();
    let b = pool.pop().unwrap();
    drop(pool);
    // The 6 pooled objects are gone; the outstanding ones are still alive.
    assert_eq!(
        drops
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .sum::<usize>(),
        6
    );
    assert_eq!(drops[a.id].load(Ordering::Relaxed), 0);
    drop(a);
    std::thread::spawn(move || drop(b)).join().unwrap(); // the last one frees the pool
    assert_each_dropped_once(&drops);
}

#[test]
fn drop_pool_while_other_threads_return_objects() {
    let rounds = if cfg!(miri) { 4 } else { 200 };
    for _ in 0..rounds {
        let (pool, drops) = tracked_pool(6);
        let held: Vec<_> = (0..4).map(|_| pool.pop().unwrap()).collect();
        let start = Arc::new(std::sync::Barrier::new(3));
        let mut it = held.into_iter();
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let mine: Vec<_> = it.by_ref().take(2).collect();
                let start = start.clone();
                std::thread::spawn(move || {
                    start.wait();
                    drop(mine);
                })
            })
            .collect();
        start.wait();
        drop(pool);
        for w in workers {
            w.join().unwrap();
        }
        assert_each_dropped_once(&drops);
    }
}

// ------------------------------------------------------------ model check

#[path = "../fuzz/ops/objpool_ops.rs"]
mod objpool_ops;

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: if cfg!(miri) { 4 } else { 128 }, ..Default::default() })]
    /// The fuzz target's operations and model checker, fed by proptest.
    #[test]
    fn matches_pool_model(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..if cfg!(miri) { 128 } else { 1024 })) {
        objpool_ops::run_bytes(&bytes);
    }
}
