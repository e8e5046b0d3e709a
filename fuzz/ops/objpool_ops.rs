//! The one `Op` definition and model checker for `ObjPool`, shared by the
//! cargo-fuzz target (`fuzz/fuzz_targets/objpool_ops.rs`), the property test
//! (`tests/objpool.rs`) and the stable corpus replay (`tests/fuzz_replay.rs`).
//!
//! The model is the set of objects the test holds and the last value written
//! to each object. Checked at every step: a pop succeeds exactly when some
//! object is free (no other thread is inside the pool at that moment, so the
//! Consistency section's bound is 0: objects in the magazines of exited or
//! idle threads are stolen), never hands out an object that is held,
//! returns the value last written to it, and counts every failed pop in
//! `nmissed`. Objects are popped and dropped on other threads too (their own
//! magazines, kept after they exit), and the pool may be dropped while
//! objects are outstanding; at the end every object has been dropped exactly
//! once (drop counters).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arbitrary::{Arbitrary, Unstructured};
use fprobe::ObjPool;
use fprobe::objpool::{ObjPoolError, PoolObj};

/// One operation.
#[derive(Arbitrary, Clone, Debug)]
pub enum Op {
    /// Pop on the test thread.
    Pop,
    /// Pop on a fresh thread (its own magazine) and bring the object back.
    PopOnOtherThread,
    /// Write `value` into the `nth` held object.
    Write { nth: u8, value: u32 },
    /// Drop the `nth` held object on the test thread (push to its magazine).
    Push { nth: u8 },
    /// Drop the `nth` held object on a fresh thread (push to its magazine,
    /// which keeps the object after the thread exits).
    PushOnOtherThread { nth: u8 },
    /// Drop the pool itself; held objects stay usable.
    DropPool,
    /// Compare the pool's counters with the model.
    Check,
}

/// A pooled object that knows its index and counts its drops.
pub struct Tracked {
    id: usize,
    value: u32,
    drops: Arc<Vec<AtomicUsize>>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops[self.id].fetch_add(1, Ordering::Relaxed);
    }
}

struct Model {
    /// Last value written to each object.
    values: Vec<u32>,
    /// Failed pops so far.
    nmissed: u64,
}

fn pop_checked(
    pool: &ObjPool<Tracked>,
    held: &mut Vec<PoolObj<Tracked>>,
    m: &mut Model,
    got: Option<PoolObj<Tracked>>,
) {
    let free = pool.capacity() - held.len();
    match got {
        Some(obj) => {
            assert!(free > 0, "pop returned an object while all were held");
            assert_eq!(obj.id, obj.index(), "object at the wrong index");
            assert!(
                held.iter().all(|h| h.index() != obj.index()),
                "object {} handed out twice",
                obj.index()
            );
            assert_eq!(
                obj.value,
                m.values[obj.id],
                "lost write to object {}",
                obj.index()
            );
            held.push(obj);
        }
        None => {
            assert_eq!(free, 0, "pop failed with {free} objects free");
            m.nmissed += 1;
        }
    }
}

/// Runs `ops` on a pool of `nr_objs` objects with magazines of
/// `thread_cache` objects.
pub fn run(nr_objs: usize, thread_cache: usize, ops: &[Op]) {
    assert_eq!(
        ObjPool::builder().build(0, |_| ()).unwrap_err(),
        ObjPoolError::NoObjects
    );
    let drops: Arc<Vec<AtomicUsize>> =
        Arc::new((0..nr_objs).map(|_| AtomicUsize::new(0)).collect());
    let d = drops.clone();
    let mut pool = Some(
        ObjPool::builder()
            .thread_cache(thread_cache)
            .build(nr_objs, move |id| Tracked {
                id,
                value: 0,
                drops: d.clone(),
            })
            .unwrap(),
    );
    assert_eq!(pool.as_ref().unwrap().thread_cache(), thread_cache);
    let mut m = Model {
        values: vec![0; nr_objs],
        nmissed: 0,
    };
    let mut held: Vec<PoolObj<Tracked>> = Vec::new();
    for op in ops {
        match *op {
            Op::Pop => {
                if let Some(p) = &pool {
                    let got = p.pop();
                    pop_checked(p, &mut held, &mut m, got);
                }
            }
            Op::PopOnOtherThread => {
                if let Some(p) = &pool {
                    let got = std::thread::scope(|s| s.spawn(|| p.pop()).join().unwrap());
                    pop_checked(p, &mut held, &mut m, got);
                }
            }
            Op::Write { nth, value } => {
                if !held.is_empty() {
                    let n = usize::from(nth) % held.len();
                    held[n].value = value;
                    m.values[held[n].index()] = value;
                }
            }
            Op::Push { nth } => {
                if !held.is_empty() {
                    drop(held.swap_remove(usize::from(nth) % held.len()));
                }
            }
            Op::PushOnOtherThread { nth } => {
                if !held.is_empty() {
                    let obj = held.swap_remove(usize::from(nth) % held.len());
                    std::thread::spawn(move || drop(obj)).join().unwrap();
                }
            }
            Op::DropPool => {
                if let Some(p) = pool.take() {
                    assert_eq!(p.nmissed(), m.nmissed);
                    drop(p);
                    // Every pooled object is dropped at once, the held ones not.
                    for (i, d) in drops.iter().enumerate() {
                        let want = usize::from(held.iter().all(|h| h.index() != i));
                        assert_eq!(d.load(Ordering::Relaxed), want, "drops of object {i}");
                    }
                }
            }
            Op::Check => {
                if let Some(p) = &pool {
                    assert_eq!(p.nmissed(), m.nmissed);
                    assert_eq!(p.capacity(), nr_objs);
                }
            }
        }
    }
    if let Some(p) = &pool {
        // Everything not held can be popped, exactly once each.
        let rest: Vec<_> = std::iter::from_fn(|| p.pop()).collect();
        assert_eq!(rest.len() + held.len(), nr_objs, "objects lost");
        let mut seen: Vec<usize> = rest.iter().chain(&held).map(|o| o.index()).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), nr_objs, "an object is in two places");
        assert_eq!(p.nmissed(), m.nmissed + 1);
    }
    drop(pool);
    drop(held);
    for (i, d) in drops.iter().enumerate() {
        assert_eq!(
            d.load(Ordering::Relaxed),
            1,
            "object {i} not dropped exactly once"
        );
    }
}

/// Decodes fuzzer bytes (pool shape, then ops until the bytes run out) and
/// runs them.
pub fn run_bytes(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let nr_objs = usize::from(u.arbitrary::<u8>().unwrap_or(0) % 48) + 1;
    let thread_cache = usize::from(u.arbitrary::<u8>().unwrap_or(0) % 10);
    let mut ops = Vec::new();
    while !u.is_empty() {
        match Op::arbitrary(&mut u) {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
    run(nr_objs, thread_cache, &ops);
}
