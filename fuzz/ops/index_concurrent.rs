//! The one `Op` definition and checker for `AddrIndex` under concurrent
//! writers, shared by the cargo-fuzz target
//! (`fuzz/fuzz_targets/index_concurrent.rs`), the property test
//! (`tests/index.rs`) and the stable corpus replay (`tests/fuzz_replay.rs`).
//!
//! The fuzzed operation sequence is dealt round-robin to 2 or 3 threads that
//! run it at once on one small, resize-happy index. Threads share the
//! address space (their records collide and are copied on write by each
//! other) but each removes only values it inserted itself, so each thread
//! can check, at every step, what the Consistency section promises it:
//!
//! * its own values inserted and not yet removed are found, in insertion
//!   order (a lookup returns every value inserted before it began);
//! * its own removed values are not found (a lookup that begins after
//!   `remove` returned never returns the removed value);
//! * every value found (anyone's) is alive and filed under its own address.
//!
//! At the end the index must hold exactly the union of the threads' live
//! values, and once it is dropped and `rcu::barrier` has run, every value
//! and every copy-on-write clone has been dropped exactly once (a live count
//! that clones increment and drops decrement ends at zero).

use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::sync::{Arc, Barrier};

use arbitrary::{Arbitrary, Unstructured};
use fprobe::{AddrIndex, EntryId, Error, rcu};

/// One operation of one thread.
#[derive(Arbitrary, Clone, Debug)]
pub enum Op {
    Insert(u8),
    InsertMany(Vec<u8>),
    /// Removes the `nth` of this thread's live values.
    Remove(u8),
    /// As `Remove`, through `take` (waits for a grace period).
    Take(u8),
    /// Checks this thread's view of one address.
    Get(u8),
    /// Iterates the whole index, checking every value.
    Iter,
    /// One value at these addresses (`insert_shared`), one id for all.
    InsertShared(Vec<u8>),
    /// Removes the value of the `nth` of this thread's live entries from
    /// every address it is still at (`remove_shared`).
    RemoveShared(u8),
}

/// The address a shared value is filed under: it is at several.
const SHARED: u64 = u64::MAX - 1;

/// Maps a fuzzed byte to an address (small space: threads collide).
pub fn addr(a: u8) -> u64 {
    match a % 16 {
        0 => 0,
        1 => u64::MAX,
        n => 0x40_0000 + u64::from(n) * 4096,
    }
}

/// A value that knows its address, its owner and whether it is alive.
#[derive(Debug)]
pub struct Val {
    addr: u64,
    owner: usize,
    serial: u32,
    alive: AtomicBool,
    live: Arc<AtomicIsize>,
}

impl Val {
    fn new(addr: u64, owner: usize, serial: u32, live: &Arc<AtomicIsize>) -> Self {
        live.fetch_add(1, Ordering::Relaxed);
        Val {
            addr,
            owner,
            serial,
            alive: AtomicBool::new(true),
            live: live.clone(),
        }
    }
}

impl Clone for Val {
    fn clone(&self) -> Self {
        assert!(
            self.alive.load(Ordering::Relaxed),
            "clone of a dropped value"
        );
        Val::new(self.addr, self.owner, self.serial, &self.live)
    }
}

impl Drop for Val {
    fn drop(&mut self) {
        assert!(self.alive.swap(false, Ordering::Relaxed), "dropped twice");
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One thread's live values: `(address, id, serial)` in insertion order.
type Live = Vec<(u64, EntryId, u32)>;

fn check_get(index: &AddrIndex<Val>, k: u64, me: usize, live: &Live, removed: &[(u64, EntryId)]) {
    let g = rcu::read_lock();
    let (ids, vals) = index.get_with_ids(k, &g);
    assert_eq!(ids.len(), vals.len());
    for v in vals {
        assert!(
            v.alive.load(Ordering::Relaxed),
            "reader saw a dropped value"
        );
        assert!(
            v.addr == k || v.addr == SHARED,
            "value under the wrong address"
        );
    }
    // Own live values at k: all present, in insertion order.
    let mine: Vec<u32> = vals
        .iter()
        .filter(|v| v.owner == me)
        .map(|v| v.serial)
        .collect();
    let want: Vec<u32> = live.iter().filter(|x| x.0 == k).map(|x| x.2).collect();
    assert_eq!(mine, want, "thread {me}: own values at {k:#x}");
    for (ra, rid) in removed {
        if *ra == k {
            assert!(!ids.contains(rid), "removed value still visible");
        }
    }
}

fn worker(index: &AddrIndex<Val>, me: usize, ops: &[Op], live_count: &Arc<AtomicIsize>) -> Live {
    let mut live: Live = Vec::new();
    let mut removed: Vec<(u64, EntryId)> = Vec::new();
    let mut serial = 0u32;
    for op in ops {
        match op {
            Op::Insert(a) => {
                let k = addr(*a);
                let id = index
                    .insert(k, Val::new(k, me, serial, live_count))
                    .unwrap();
                live.push((k, id, serial));
                serial += 1;
            }
            Op::InsertMany(addrs) => {
                let items: Vec<(u64, Val)> = addrs
                    .iter()
                    .take(16)
                    .enumerate()
                    .map(|(i, a)| {
                        let k = addr(*a);
                        (k, Val::new(k, me, serial + i as u32, live_count))
                    })
                    .collect();
                let keys: Vec<u64> = items.iter().map(|x| x.0).collect();
                let ids = index.insert_many(items).unwrap();
                assert_eq!(ids.len(), keys.len());
                for (k, id) in keys.into_iter().zip(ids) {
                    live.push((k, id, serial));
                    serial += 1;
                }
            }
            Op::Remove(nth) | Op::Take(nth) => {
                if live.is_empty() {
                    continue;
                }
                let (k, id, s) = live.remove(usize::from(*nth) % live.len());
                if matches!(op, Op::Take(_)) {
                    let v = index.take(k, id).unwrap();
                    assert!(
                        v.addr == k || v.addr == SHARED,
                        "took another address's value"
                    );
                    assert_eq!((v.owner, v.serial), (me, s));
                } else {
                    index.remove(k, id).unwrap();
                }
                assert_eq!(index.remove(k, id), Err(Error::NotFound), "removed twice");
                removed.push((k, id));
                check_get(index, k, me, &live, &removed);
            }
            Op::Get(a) => check_get(index, addr(*a), me, &live, &removed),
            Op::Iter => {
                let g = rcu::read_lock();
                for (k, vals) in index.iter(&g) {
                    for v in vals {
                        assert!(
                            v.alive.load(Ordering::Relaxed),
                            "iterator saw a dropped value"
                        );
                        assert!(
                            v.addr == k || v.addr == SHARED,
                            "value under the wrong address"
                        );
                    }
                }
            }
            Op::InsertShared(addrs) => {
                let mut keys: Vec<u64> = addrs.iter().take(16).map(|a| addr(*a)).collect();
                let id = index
                    .insert_shared(&keys, Val::new(SHARED, me, serial, live_count))
                    .unwrap();
                keys.sort_unstable();
                keys.dedup();
                for k in keys {
                    live.push((k, id, serial));
                }
                serial += 1;
            }
            Op::RemoveShared(nth) => {
                if live.is_empty() {
                    continue;
                }
                let id = live[usize::from(*nth) % live.len()].1;
                let keys: Vec<u64> = live.iter().filter(|x| x.1 == id).map(|x| x.0).collect();
                // An address without it, too: not counted.
                let mut with_other = keys.clone();
                with_other.push(addr(nth.wrapping_add(7)));
                assert_eq!(
                    index.remove_shared(&with_other, id),
                    keys.len(),
                    "remove_shared count"
                );
                live.retain(|x| x.1 != id);
                for &k in &keys {
                    removed.push((k, id));
                }
                for &k in &keys {
                    check_get(index, k, me, &live, &removed);
                }
            }
        }
    }
    live
}

/// Deals `ops` round-robin to `threads` threads, runs them at once, then
/// checks the index against the union of what each thread kept.
pub fn run(threads: usize, ops: &[Op]) {
    let live_count = Arc::new(AtomicIsize::new(0));
    let index: AddrIndex<Val> = AddrIndex::builder()
        .min_slots(8)
        .auto_shrink(true)
        .stripes(2)
        .build()
        .unwrap();
    let start = Barrier::new(threads);
    let kept: Vec<Live> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let mine: Vec<Op> = ops.iter().skip(t).step_by(threads).cloned().collect();
                let (index, start, live_count) = (&index, &start, &live_count);
                s.spawn(move || {
                    start.wait();
                    worker(index, t, &mine, live_count)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    // Quiescent now: the index is exactly the union of the live values.
    let g = rcu::read_lock();
    let mut want: Vec<(u64, usize, u32)> = kept
        .iter()
        .enumerate()
        .flat_map(|(t, l)| l.iter().map(move |x| (x.0, t, x.2)))
        .collect();
    want.sort_unstable();
    let mut seen: Vec<(u64, usize, u32)> = index
        .iter(&g)
        .flat_map(|(k, vals)| vals.iter().map(move |v| (k, v.owner, v.serial)))
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, want, "final contents");
    for (t, l) in kept.iter().enumerate() {
        for (k, id, _) in l {
            assert!(
                index.get_with_ids(*k, &g).0.contains(id),
                "thread {t}: value lost"
            );
        }
    }
    drop(g);
    assert_eq!(index.len(), want.len());
    let mut addrs: Vec<u64> = want.iter().map(|x| x.0).collect();
    addrs.dedup();
    assert_eq!(index.len_addrs(), addrs.len());
    drop(index);
    rcu::barrier();
    assert_eq!(
        live_count.load(Ordering::Relaxed),
        0,
        "values leaked or dropped twice"
    );
}

/// Decodes fuzzer bytes (thread count, then ops until the bytes run out)
/// and runs them.
pub fn run_bytes(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let threads = 2 + usize::from(u.arbitrary::<u8>().unwrap_or(0) % 2);
    let mut ops = Vec::new();
    while !u.is_empty() {
        match Op::arbitrary(&mut u) {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
    run(threads, &ops);
}
