//! loom model of the objpool's shared part through the public API: the
//! depot (`src/objpool/depot.rs`) and the magazine handshake between an
//! owner and a stealer or the teardown (`src/objpool/magazine.rs`), with
//! tiny pools (1–2 objects, magazines of 2), 2–3 threads.
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release --test loom_objpool
//! ```
//!
//! Under loom, model thread `n` uses magazine `n`; an object pushed by one
//! thread sits in its magazine until that thread pops it or another thread
//! steals it. Under loom the handshake runs `SeqCst` fences on both sides
//! (loom cannot model `membarrier(2)`). Objects and magazine slots are
//! reached through loom's `UnsafeCell`, so two users of one at once would
//! be reported as a data race; the tests also check identities explicitly.
#![cfg(loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

use fprobe::ObjPool;

fn pool(n: usize) -> ObjPool<usize> {
    ObjPool::builder().thread_cache(2).build(n, |i| i).unwrap()
}

/// Pops everything and checks that exactly the ids `0..n` come back.
fn assert_all_back(pool: &ObjPool<usize>, n: usize) {
    let mut held = Vec::new();
    while let Some(o) = pool.pop() {
        held.push(o);
    }
    let mut ids: Vec<usize> = held.iter().map(|o| **o).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..n).collect::<Vec<_>>());
}

/// One object, two threads popping and pushing it twice each: it moves
/// between their magazines by stealing, every write travels with
/// it (an unordered access would be a data race in loom's `UnsafeCell`),
/// and no update is lost.
#[test]
fn single_object_handoff() {
    loom::model(|| {
        let pool = Arc::new(pool(1));
        let pops = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (pool, pops) = (pool.clone(), pops.clone());
                thread::spawn(move || {
                    for _ in 0..2 {
                        if let Some(mut o) = pool.pop() {
                            *o += 1;
                            pops.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let o = pool.pop().expect("the object is back");
        assert_eq!(*o, pops.load(Ordering::Relaxed));
        assert!(pool.pop().is_none());
    });
}

/// Three threads each take an object and give it back twice, with
/// refills from the depot, steals from each other's magazines and
/// momentary exhaustion.
#[test]
fn three_threads_steal_and_refill() {
    loom::model(|| {
        let pool = Arc::new(pool(2));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let pool = pool.clone();
                thread::spawn(move || {
                    for _ in 0..2 {
                        drop(pool.pop());
                    }
                })
            })
            .collect();
        let a = pool.pop();
        drop(a);
        for t in threads {
            t.join().unwrap();
        }
        assert_all_back(&pool, 2);
    });
}

/// An object pushed back on one thread while another holds the rest: the
/// holder's later pops see it (steal) with its contents.
#[test]
fn transfer_between_magazines() {
    loom::model(|| {
        let pool = Arc::new(pool(2));
        let mut o = pool.pop().unwrap();
        *o += 10;
        let p = pool.clone();
        let t = thread::spawn(move || {
            drop(o); // pushed into this thread's magazine
            let again = p.pop();
            again.map(|o| *o)
        });
        let mine = pool.pop();
        let theirs = t.join().unwrap();
        // The two objects are distinct whenever both threads got one.
        if let (Some(m), Some(t)) = (&mine, theirs) {
            assert_ne!(**m, t);
        }
        drop(mine);
        let back: Vec<_> = std::iter::from_fn(|| pool.pop()).collect();
        let mut ids: Vec<usize> = back.iter().map(|o| **o).collect();
        ids.sort_unstable();
        assert_eq!(ids.len(), 2);
        assert!(ids.contains(&10) || ids.contains(&11));
    });
}

/// Counts drops in the model.
struct Tracked {
    drops: Arc<AtomicUsize>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::Relaxed);
    }
}

/// The pool is dropped while another thread returns an object: each object
/// is dropped exactly once and the memory is freed (loom checks for leaks).
#[test]
fn drop_pool_while_object_returns() {
    loom::model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        let pool = ObjPool::builder()
            .thread_cache(2)
            .build(2, move |_| Tracked { drops: d.clone() })
            .unwrap();
        let o = pool.pop().unwrap();
        let t = thread::spawn(move || drop(o));
        drop(pool);
        t.join().unwrap();
        assert_eq!(drops.load(Ordering::Relaxed), 2);
    });
}
