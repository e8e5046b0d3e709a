//! Tests of `fprobe::AddrIndex`: API behaviour, a model-based property
//! test, adversarial address sets and a concurrent stress test.

#[path = "common/stress.rs"]
mod stress;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use fprobe::{AddrIndex, EntryId, Error, rcu};
use proptest::prelude::*;

fn small() -> AddrIndex<u64> {
    AddrIndex::builder()
        .min_slots(8)
        .stripes(4)
        .hash_seed(7)
        .build()
        .unwrap()
}

#[test]
fn insert_get_remove_take() {
    let index = small();
    let a = index.insert(0x1000, 1).unwrap();
    let b = index.insert(0x1000, 2).unwrap();
    let c = index.insert(0x1000, 1).unwrap(); // same value twice: two ids
    assert!(a != b && b != c && a != c);
    {
        let g = rcu::read_lock();
        assert_eq!(index.get(0x1000, &g), &[1, 2, 1]);
        let (ids, vals) = index.get_with_ids(0x1000, &g);
        assert_eq!(ids, &[a, b, c]);
        assert_eq!(vals, &[1, 2, 1]);
        assert!(index.get(0x2000, &g).is_empty());
    }
    assert_eq!((index.len(), index.len_addrs()), (3, 1));
    index.remove(0x1000, b).unwrap();
    assert_eq!(index.lookup(0x1000, |v| v.to_vec()), Some(vec![1, 1]));
    assert_eq!(index.take(0x1000, c).unwrap(), 1);
    assert_eq!(index.remove(0x1000, b), Err(Error::NotFound));
    assert_eq!(index.remove(0x2000, a), Err(Error::NotFound));
    assert_eq!(index.take(0x1000, c), Err(Error::NotFound));
    index.remove(0x1000, a).unwrap();
    assert!(!index.contains(0x1000));
    assert!(index.is_empty());
    assert_eq!(index.len(), 0);
}

#[test]
fn id_of_another_address_is_not_found_and_changes_nothing() {
    let index = small();
    let a = index.insert(1, 10).unwrap();
    index.insert(2, 20).unwrap();
    assert_eq!(index.remove(2, a), Err(Error::NotFound));
    assert_eq!(index.lookup(1, |v| v.to_vec()), Some(vec![10]));
    assert_eq!(index.lookup(2, |v| v.to_vec()), Some(vec![20]));
    assert_eq!(
        index.remove(1, EntryId::from_u64(u64::MAX)),
        Err(Error::NotFound)
    );
}

#[test]
fn address_zero_and_max_are_ordinary_keys() {
    let index = small();
    for a in [0u64, u64::MAX, 1] {
        index.insert(a, a).unwrap();
    }
    for a in [0u64, u64::MAX, 1] {
        assert_eq!(index.lookup(a, |v| v.to_vec()), Some(vec![a]));
    }
    // Through a few resizes, too.
    let n = if cfg!(miri) { 100 } else { 2000u64 };
    index.insert_many((2..n).map(|a| (a, a))).unwrap();
    for a in [0u64, u64::MAX, 1, n - 1] {
        assert_eq!(index.lookup(a, |v| v[0]), Some(a));
    }
    let g = rcu::read_lock();
    assert_eq!(index.iter(&g).count() as u64, n + 1);
}

#[test]
fn max_addresses_is_enforced_and_hands_values_back() {
    let index = AddrIndex::builder().max_addresses(3).build().unwrap();
    for a in 0..3u64 {
        index.insert(a, format!("v{a}")).unwrap();
    }
    // More values for an existing address are fine.
    index.insert(1, "again".to_string()).unwrap();
    let err = index.insert(99, "refused".to_string()).unwrap_err();
    assert_eq!(err.error, Error::CapacityExceeded { max_addresses: 3 });
    assert_eq!(err.into_value(), "refused");
    assert!(!index.contains(99));
    assert_eq!(index.len_addrs(), 3);
}

/// Every way an address loses its last value gives its place under the
/// limit back (the limit keeps its own count; the per-stripe counts are
/// checked through `len_addrs`).
#[test]
fn max_addresses_counts_every_removal() {
    let index = AddrIndex::builder().max_addresses(2).build().unwrap();
    let a = index.insert(10, 'a').unwrap();
    let a2 = index.insert(10, 'A').unwrap();
    let b = index.insert(20, 'b').unwrap();
    assert!(index.insert(30, 'c').is_err());
    // Removing one of two values keeps the address.
    index.remove(10, a).unwrap();
    assert!(index.insert(30, 'c').is_err());
    index.remove(10, a2).unwrap();
    assert_eq!(index.len_addrs(), 1);
    let c = index.insert(30, 'c').unwrap();
    assert!(index.insert(40, 'd').is_err());
    assert_eq!(index.take(20, b), Ok('b'));
    index.insert(40, 'd').unwrap();
    assert!(index.insert(50, 'e').is_err());
    assert_eq!(index.remove_addr(40), 1);
    index.insert(50, 'e').unwrap();
    assert!(index.insert(60, 'f').is_err());
    index.clear();
    assert_eq!(index.len_addrs(), 0);
    index.insert(60, 'f').unwrap();
    index.insert(70, 'g').unwrap();
    assert!(index.insert(80, 'h').is_err());
    assert_eq!(index.len_addrs(), 2);
    assert_eq!(index.remove(30, c), Err(Error::NotFound));
}

/// Growth doubles the table each time: 64 slots to 131,072 for 50,000
/// addresses is 11 resizes, whatever the stripe count (a table sized on
/// the live count alone while writers held unspent claim credits grew to
/// the same size first, 23 resizes).
#[test]
#[cfg_attr(miri, ignore = "50k inserts are too slow under miri")]
fn growth_from_empty_doubles_each_time() {
    for stripes in [1, 8, 64, 1024] {
        let index = AddrIndex::builder().stripes(stripes).build().unwrap();
        for a in 1..=50_000u64 {
            index.insert(a * 64, a).unwrap();
        }
        let s = index.stats();
        assert_eq!(
            (s.home_slots, s.resizes),
            (131_072, 11),
            "{stripes} stripes: {s:?}"
        );
    }
}

/// A writer that keeps adding new addresses and removing old ones fills the
/// table with tombstones; each table that replaces it must take at least
/// `live / 2` new claims before it is replaced in turn, so the migrations
/// cost at most about 2 moved keys per new address. 15,000 live keys is
/// the case the 50%-load sizing got worst: 32,768 slots, room for 1,384
/// claims, 71 tables for 100,000 new addresses instead of at most 14.
#[test]
#[cfg_attr(miri, ignore = "115k inserts are too slow under miri")]
fn tombstone_churn_resizes_are_amortised() {
    const LIVE: u64 = 15_000;
    const NEW: u64 = 100_000;
    let index = AddrIndex::builder().stripes(4).build().unwrap();
    let mut live = std::collections::VecDeque::new();
    for a in 1..=LIVE {
        live.push_back((a * 16, index.insert(a * 16, a).unwrap()));
    }
    let before = index.stats().resizes;
    for a in LIVE + 1..=LIVE + NEW {
        live.push_back((a * 16, index.insert(a * 16, a).unwrap()));
        let (old, id) = live.pop_front().unwrap();
        index.remove(old, id).unwrap();
    }
    let s = index.stats();
    assert_eq!(s.addresses, LIVE as usize);
    let bound = NEW / (LIVE / 2) + 1;
    assert!(
        s.resizes - before <= bound,
        "{} tables for {NEW} new addresses at {LIVE} live (bound {bound}): {s:?}",
        s.resizes - before
    );
    // Never more than twice what 50% load needs.
    assert!(s.home_slots <= 65_536, "{s:?}");
}

/// Migration with many stripes (a step takes every stripe lock, and its
/// budget grows to 4 slots per stripe) under writers on every stripe:
/// nothing lost, nothing kept that was removed, counts exact.
#[test]
#[cfg_attr(miri, ignore = "20k inserts with 1024 stripes are too slow under miri")]
fn many_stripes_migrate_under_concurrent_writers() {
    let index = AddrIndex::builder()
        .stripes(1024)
        .min_slots(8)
        .build()
        .unwrap();
    let threads = 4u64;
    let per = 5_000u64;
    std::thread::scope(|s| {
        for t in 0..threads {
            let index = &index;
            s.spawn(move || {
                let mut ids = Vec::new();
                for i in 0..per {
                    let a = (t * per + i + 1) * 16;
                    ids.push((a, index.insert(a, a).unwrap()));
                }
                // Remove every other address again, while the others grow.
                for &(a, id) in ids.iter().step_by(2) {
                    index.remove(a, id).unwrap();
                }
            });
        }
    });
    assert_eq!(index.len_addrs() as u64, threads * per / 2);
    assert_eq!(index.len() as u64, threads * per / 2);
    for n in 0..threads * per {
        let a = (n + 1) * 16;
        let expect = if (n % per) % 2 == 0 {
            None
        } else {
            Some(vec![a])
        };
        assert_eq!(index.lookup(a, |v| v.to_vec()), expect, "address {a:#x}");
    }
    // It grew from 8 slots to at least 32,768 while the threads ran.
    let s = index.stats();
    assert!(s.resizes >= 12, "{s:?}");
}

#[test]
fn insert_many_is_all_or_nothing() {
    let index = AddrIndex::builder().max_addresses(100).build().unwrap();
    index.insert_many((0..90u64).map(|a| (a, a))).unwrap();
    let before: Vec<_> = {
        let g = rcu::read_lock();
        let mut v: Vec<_> = index.iter(&g).map(|(a, v)| (a, v.to_vec())).collect();
        v.sort();
        v
    };
    // 20 new addresses do not fit: nothing changes, everything comes back.
    let batch: Vec<(u64, u64)> = (80..110u64).map(|a| (a, a + 1000)).collect();
    let err = index.insert_many(batch.clone()).unwrap_err();
    assert_eq!(err.error, Error::CapacityExceeded { max_addresses: 100 });
    assert_eq!(err.values, batch);
    let after: Vec<_> = {
        let g = rcu::read_lock();
        let mut v: Vec<_> = index.iter(&g).map(|(a, v)| (a, v.to_vec())).collect();
        v.sort();
        v
    };
    assert_eq!(before, after);
    // A batch that fits goes in, in input order per address.
    let ids = index
        .insert_many(vec![(5, 1), (200, 2), (5, 3), (201, 4)])
        .unwrap();
    assert_eq!(ids.len(), 4);
    assert_eq!(index.lookup(5, |v| v.to_vec()), Some(vec![5, 1, 3]));
    index.remove(5, ids[2]).unwrap();
    assert_eq!(index.lookup(5, |v| v.to_vec()), Some(vec![5, 1]));
}

/// A batch that repeats addresses (many values on one, a few on others,
/// one address that already had values) keeps every address's values in
/// input order after the existing ones, with ids that remove exactly them.
#[test]
fn insert_many_with_repeated_addresses_keeps_input_order() {
    let index = AddrIndex::builder().min_slots(8).build().unwrap();
    let old = index.insert(7, u64::MAX).unwrap();
    let n = if cfg!(miri) { 60 } else { 3000 };
    let batch: Vec<(u64, u64)> = (0..n)
        .map(|i| match i % 3 {
            0 => (7, i),             // the existing address
            1 => (1000 + i % 10, i), // ten addresses, many values each
            _ => (100_000 + i, i),   // fresh, once each
        })
        .collect();
    let ids = index.insert_many(batch.clone()).unwrap();
    let mut want: std::collections::HashMap<u64, Vec<u64>> = Default::default();
    want.entry(7).or_default().push(u64::MAX);
    for &(a, v) in &batch {
        want.entry(a).or_default().push(v);
    }
    for (a, vals) in &want {
        assert_eq!(
            index.lookup(*a, |v| v.to_vec()).as_ref(),
            Some(vals),
            "address {a}"
        );
    }
    assert_eq!(index.len(), n as usize + 1);
    // Every id names its own value.
    for ((a, v), id) in batch.iter().zip(&ids) {
        assert_eq!(index.take(*a, *id), Ok(*v));
    }
    assert_eq!(index.take(7, old), Ok(u64::MAX));
    assert!(index.is_empty());
}

#[test]
fn insert_many_rollback_after_concurrent_fill() {
    rollback_after_concurrent_fill(false);
}

/// The same inside a read-side section of the inserting thread, where the
/// rollback cannot wait for a grace period (it hands back clones).
#[test]
fn insert_many_rollback_inside_a_read_section() {
    rollback_after_concurrent_fill(true);
}

fn rollback_after_concurrent_fill(in_read_section: bool) {
    // The mid-way failure path: the limit leaves room for the batch and
    // `k` more. Another thread waits until the batch is a quarter in, then
    // inserts `2k` single addresses: the batch has passed its up-front
    // check and runs out of places midway (unless it finishes first), and
    // must then leave nothing behind. `k` is small because a single insert
    // waits while the batch holds its stripe (runs of up to 1,024 keys).
    let (rounds, n, k) = if cfg!(miri) {
        (2, 40u64, 2)
    } else {
        (20, 20_000u64, 4)
    };
    let mut midway = 0;
    for round in 0..rounds {
        let index = Arc::new(
            AddrIndex::builder()
                .max_addresses((n + k) as usize)
                .min_slots(8)
                .build()
                .unwrap(),
        );
        let done = Arc::new(AtomicBool::new(false));
        let start = Arc::new(Barrier::new(2));
        let (i2, d2, s2) = (index.clone(), done.clone(), start.clone());
        let other = std::thread::spawn(move || {
            s2.wait();
            while !d2.load(Ordering::Relaxed) && (i2.len() as u64) < n / 4 {
                std::hint::spin_loop();
            }
            (0..2 * k)
                .filter(|a| i2.insert(1_000_000 + a, round).is_ok())
                .count()
        });
        let batch: Vec<(u64, u64)> = (0..n).map(|a| (a, a)).collect();
        start.wait();
        let guard = in_read_section.then(rcu::read_lock);
        let bulk = index.insert_many(batch.clone());
        drop(guard);
        done.store(true, Ordering::Relaxed);
        let singles = other.join().unwrap();
        match bulk {
            Ok(ids) => {
                assert_eq!(ids.len() as u64, n);
                assert_eq!(index.len_addrs(), n as usize + singles);
            }
            Err(e) => {
                let mut back = e.values;
                back.sort();
                assert_eq!(back, batch, "every value handed back");
                assert_eq!(index.len_addrs(), singles);
                for a in 0..n {
                    assert!(!index.contains(a), "rolled-back address {a} still present");
                }
                midway += 1;
            }
        }
    }
    // How often the race went the intended way (not asserted: the
    // scheduler decides).
    println!("{midway} of {rounds} rounds rolled back midway");
}

#[test]
fn builder_rejects_bad_configuration() {
    let bad = [
        AddrIndex::<u8>::builder().min_slots(0).build().err(),
        AddrIndex::<u8>::builder().min_slots(100).build().err(),
        AddrIndex::<u8>::builder().stripes(3).build().err(),
        AddrIndex::<u8>::builder().max_addresses(0).build().err(),
        AddrIndex::<u8>::builder()
            .capacity(10)
            .max_addresses(5)
            .build()
            .err(),
        AddrIndex::<u8>::builder()
            .capacity(usize::MAX)
            .build()
            .err(),
    ];
    for e in bad {
        assert!(matches!(e, Some(Error::InvalidConfig(_))), "{e:?}");
    }
}

/// A value whose `clone` panics midway through a bulk insert (adding to
/// addresses that already have values copies them): the batch is undone,
/// the panic reaches the caller, the index keeps exactly what it had, and
/// every value is dropped exactly once.
#[test]
fn insert_many_undone_when_a_clone_panics() {
    use std::cell::Cell;
    thread_local! {
        /// Clones left before one panics (`usize::MAX`: never).
        static CLONES_LEFT: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    #[derive(Debug)]
    struct Fragile(u64, Arc<AtomicUsize>);
    impl Clone for Fragile {
        fn clone(&self) -> Self {
            let left = CLONES_LEFT.get();
            if left == 0 {
                CLONES_LEFT.set(usize::MAX);
                panic!("clone of {} refused", self.0);
            }
            CLONES_LEFT.set(left.saturating_sub(1));
            self.1.fetch_add(1, Ordering::Relaxed); // +1 live
            Fragile(self.0, self.1.clone())
        }
    }
    impl Drop for Fragile {
        fn drop(&mut self) {
            self.1.fetch_sub(1, Ordering::Relaxed);
        }
    }
    let live = Arc::new(AtomicUsize::new(0));
    let mk = |v: u64| {
        live.fetch_add(1, Ordering::Relaxed);
        Fragile(v, live.clone())
    };
    let index = AddrIndex::builder().min_slots(8).build().unwrap();
    let old = if cfg!(miri) { 20 } else { 200u64 };
    for a in 0..old {
        index.insert(a, mk(a)).unwrap();
    }
    // New addresses and a second value for every old one, interleaved so
    // that every stripe run holds both; the clone of the old values fails
    // halfway through them.
    let batch: Vec<(u64, Fragile)> = (0..old)
        .flat_map(|a| [(1_000_000 + a, mk(a)), (a, mk(a))])
        .collect();
    CLONES_LEFT.set(old as usize / 2);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| index.insert_many(batch)));
    CLONES_LEFT.set(usize::MAX);
    assert!(r.is_err(), "the clone's panic reaches the caller");
    assert_eq!(
        (index.len(), index.len_addrs()),
        (old as usize, old as usize)
    );
    for a in 0..old {
        assert_eq!(index.lookup(a, |v| v.len()), Some(1), "address {a}");
        assert!(!index.contains(1_000_000 + a), "new address {a} stayed");
    }
    rcu::barrier();
    assert_eq!(
        live.load(Ordering::Relaxed),
        old as usize,
        "each value dropped once"
    );
    drop(index);
    rcu::barrier();
    assert_eq!(live.load(Ordering::Relaxed), 0);
}

/// A value whose destructor panics, dropped with the index: the panic
/// reaches whoever drops the index, and every other value (its record's
/// neighbour included) is still dropped, once.
#[test]
fn a_panicking_destructor_does_not_stop_the_others() {
    #[derive(Debug)]
    struct Tick(u64, Arc<AtomicUsize>);
    impl Clone for Tick {
        fn clone(&self) -> Self {
            self.1.fetch_add(1, Ordering::Relaxed);
            Tick(self.0, self.1.clone())
        }
    }
    impl Drop for Tick {
        fn drop(&mut self) {
            self.1.fetch_sub(1, Ordering::Relaxed);
            if self.0 == 13 {
                panic!("destructor of 13");
            }
        }
    }
    let live = Arc::new(AtomicUsize::new(0));
    let mk = |v: u64| {
        live.fetch_add(1, Ordering::Relaxed);
        Tick(v, live.clone())
    };
    let index = AddrIndex::builder().min_slots(8).build().unwrap();
    for a in 0..50u64 {
        index.insert(a, mk(a)).unwrap();
    }
    index.insert(13, mk(99)).unwrap(); // a neighbour in 13's record
    rcu::barrier(); // the copy-on-write's old record: dropped, no panic
    assert_eq!(live.load(Ordering::Relaxed), 51);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(index)));
    assert!(r.is_err(), "the destructor's panic reaches the caller");
    assert_eq!(live.load(Ordering::Relaxed), 0, "every value dropped");
}

#[test]
fn clear_and_drop_release_every_value() {
    #[derive(Debug)]
    struct Counted(Arc<AtomicUsize>);
    impl Clone for Counted {
        fn clone(&self) -> Self {
            self.0.fetch_add(1, Ordering::Relaxed); // +1 live
            Counted(self.0.clone())
        }
    }
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }
    let live = Arc::new(AtomicUsize::new(0));
    let mk = |live: &Arc<AtomicUsize>| {
        live.fetch_add(1, Ordering::Relaxed);
        Counted(live.clone())
    };
    let index = AddrIndex::builder().min_slots(8).build().unwrap();
    for a in 0..500u64 {
        index.insert(a % 97, mk(&live)).unwrap();
    }
    let ids = index
        .insert_many((0..300u64).map(|a| (a, mk(&live))))
        .unwrap();
    for (a, id) in (0..300u64).zip(&ids).step_by(3) {
        index.remove(a, *id).unwrap();
    }
    index.clear();
    rcu::barrier();
    assert_eq!(live.load(Ordering::Relaxed), 0, "clear dropped everything");
    for a in 0..200u64 {
        index.insert(a, mk(&live)).unwrap();
    }
    drop(index);
    rcu::barrier();
    assert_eq!(live.load(Ordering::Relaxed), 0, "drop released everything");
}

#[test]
fn resizes_grow_and_shrink() {
    let index = AddrIndex::builder()
        .min_slots(8)
        .auto_shrink(true)
        .build()
        .unwrap();
    let mut ids = Vec::new();
    let n = if cfg!(miri) { 600 } else { 5000u64 };
    for a in 0..n {
        ids.push(index.insert(a * 7919, a).unwrap());
    }
    let grown = index.stats();
    assert!(
        grown.home_slots >= n as usize && grown.resizes > 5,
        "{grown:?}"
    );
    for (a, id) in (0..n).zip(&ids).skip(100) {
        index.remove(a * 7919, *id).unwrap();
    }
    for a in 0..100u64 {
        assert_eq!(index.lookup(a * 7919, |v| v[0]), Some(a));
    }
    let shrunk = index.stats();
    assert!(
        shrunk.home_slots <= grown.home_slots / 4,
        "{grown:?} -> {shrunk:?}"
    );
}

/// Adversarial layouts must probe like random keys: all multiples of 4096,
/// every word of one 64 KiB range, and a strided set, against pseudo-random
/// addresses of the same count. Checked for 24 fixed seeds and one random
/// one, so a hash that is bad for some seeds fails deterministically: a
/// one-round folded multiply, bad for the strided set with 9% of seeds,
/// fails here on every run.
#[test]
#[cfg_attr(miri, ignore = "50k-address tables are too slow under miri")]
fn adversarial_address_sets_hash_well() {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let random: Vec<u64> = (0..50_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        })
        .collect();
    let sets: [(&str, Vec<u64>); 3] = [
        ("page-aligned", (1..=50_000u64).map(|i| i << 12).collect()),
        (
            "one 64 KiB range",
            (0..16_384u64).map(|i| 0x7f00_0000_0000 + i * 4).collect(),
        ),
        ("stride 2^20", (1..=20_000u64).map(|i| i << 20).collect()),
    ];
    let build = |seed: Option<u64>| {
        let b = AddrIndex::<()>::builder();
        match seed {
            Some(s) => b.hash_seed(s),
            None => b,
        }
        .build()
        .unwrap()
    };
    let seeds = (0..24u64)
        .map(|i| Some(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
        .chain([None]);
    for seed in seeds {
        let baseline = {
            let index = build(seed);
            index.insert_many(random.iter().map(|&a| (a, ()))).unwrap();
            index.stats()
        };
        for (name, addrs) in &sets {
            let index = build(seed);
            index.insert_many(addrs.iter().map(|&a| (a, ()))).unwrap();
            let s = index.stats();
            assert!(
                s.mean_probe <= 2.0 * baseline.mean_probe.max(0.5),
                "{name}, seed {seed:?}: {s:?} vs random {baseline:?}"
            );
            assert!(
                s.longest_probe < 4 * baseline.longest_probe.max(32),
                "{name}, seed {seed:?}: {s:?}"
            );
            assert_eq!(s.rehashes, 0, "{name}, seed {seed:?}: {s:?}");
        }
    }
}

#[test]
#[cfg_attr(miri, ignore = "50k-address tables are too slow under miri")]
fn memory_per_address_at_50k() {
    let index = AddrIndex::<usize>::with_capacity(50_000);
    index
        .insert_many((0..50_000u64).map(|a| (0x40_0000 + a * 48, a as usize)))
        .unwrap();
    let s = index.stats();
    println!("50k single-value addresses: {s:?}");
    // The aim was 64 bytes; growth at 50% load (see `GROW_AT`) costs the
    // table 42 bytes per address here, the record 24 (+ malloc's 8).
    assert!(s.bytes_per_address <= 80.0, "{s:?}");
    assert!(s.load_factor <= 0.5, "{s:?}");
}

// ------------------------------------------------------------ model check

#[path = "../fuzz/ops/index_ops.rs"]
mod index_ops;

proptest! {
    #![proptest_config(ProptestConfig { cases: if cfg!(miri) { 4 } else { 128 }, ..ProptestConfig::default() })]
    /// The fuzz target's operations and model checker, fed by proptest.
    #[test]
    fn matches_hashmap_model(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        index_ops::run_bytes(&bytes);
    }
}

#[path = "../fuzz/ops/index_concurrent.rs"]
mod index_concurrent;

proptest! {
    #![proptest_config(ProptestConfig { cases: if cfg!(miri) { 2 } else { 64 }, ..ProptestConfig::default() })]
    /// The concurrent fuzz target's operations and checks, fed by proptest.
    #[test]
    fn concurrent_writers_match_their_own_views(bytes in prop::collection::vec(any::<u8>(), 0..if cfg!(miri) { 128 } else { 2048 })) {
        index_concurrent::run_bytes(&bytes);
    }
}

// --------------------------------------------------------------- stress

fn stress_duration() -> Duration {
    stress::duration(if cfg!(miri) { 50 } else { 1500 })
}

/// Value whose drop is counted and that poisons itself, so a reader that
/// sees a dropped value notices.
#[derive(Debug)]
struct Tracked {
    key: u64,
    serial: u64,
    alive: AtomicBool,
    drops: Arc<Vec<AtomicUsize>>,
}

impl Clone for Tracked {
    fn clone(&self) -> Self {
        // Clones are copies made by copy-on-write; they share the serial
        // and are not counted (only originals are, see `Drop`).
        Tracked {
            key: self.key,
            serial: self.serial | 1 << 63,
            alive: AtomicBool::new(true),
            drops: self.drops.clone(),
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        assert!(self.alive.swap(false, Ordering::Relaxed), "dropped twice");
        if self.serial >> 63 == 0 {
            self.drops[self.serial as usize].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Writers insert and remove values on their own keys (many resizes: the
/// table starts at 8 slots), readers check that every value they see is
/// alive and belongs to the key, and that values known to be present are
/// found. At the end every value was dropped exactly once.
#[test]
fn concurrent_stress() {
    const WRITERS: usize = 3;
    const READERS: usize = 3;
    const KEYS_PER_WRITER: u64 = if cfg!(miri) { 16 } else { 512 };
    const MAX_SERIALS: usize = if cfg!(miri) { 1 << 12 } else { 1 << 22 };
    let drops: Arc<Vec<AtomicUsize>> =
        Arc::new((0..MAX_SERIALS).map(|_| AtomicUsize::new(0)).collect());
    let index = Arc::new(
        AddrIndex::builder()
            .min_slots(8)
            .auto_shrink(true)
            .stripes(4)
            .build()
            .unwrap(),
    );
    // A permanent key every reader must always find.
    let pinned = Tracked {
        key: u64::MAX - 1,
        serial: 0,
        alive: AtomicBool::new(true),
        drops: drops.clone(),
    };
    index.insert(u64::MAX - 1, pinned).unwrap();
    let serial = Arc::new(AtomicUsize::new(1));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(WRITERS + READERS + 1));
    let mut writers = Vec::new();
    for w in 0..WRITERS as u64 {
        let (index, serial, stop, start, drops) = (
            index.clone(),
            serial.clone(),
            stop.clone(),
            start.clone(),
            drops.clone(),
        );
        writers.push(std::thread::spawn(move || {
            start.wait();
            let mut live: Vec<(u64, EntryId)> = Vec::new();
            let mut rng = w.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut ops = 0u64;
            while !stop.load(Ordering::Relaxed) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let key = w << 32 | (rng % KEYS_PER_WRITER);
                if live.len() < 600 && rng % 3 != 0 {
                    let s = serial.fetch_add(1, Ordering::Relaxed);
                    if s >= MAX_SERIALS {
                        break;
                    }
                    let v = Tracked {
                        key,
                        serial: s as u64,
                        alive: AtomicBool::new(true),
                        drops: drops.clone(),
                    };
                    if rng % 7 == 0 {
                        let ids = index.insert_many([(key, v)]).unwrap();
                        live.push((key, ids[0]));
                    } else {
                        live.push((key, index.insert(key, v).unwrap()));
                    }
                } else if !live.is_empty() {
                    let (key, id) = live.swap_remove((rng as usize / 3) % live.len());
                    if rng % 11 == 0 {
                        let v = index.take(key, id).unwrap();
                        assert_eq!(v.key, key);
                    } else {
                        index.remove(key, id).unwrap();
                    }
                    // Removed: a lookup that starts now must not see it.
                    let g = rcu::read_lock();
                    let (ids, _) = index.get_with_ids(key, &g);
                    assert!(!ids.contains(&id), "removed value still visible");
                }
                // Everything this writer believes present is present.
                if ops % 64 == 0 {
                    let g = rcu::read_lock();
                    for (key, id) in &live {
                        assert!(index.get_with_ids(*key, &g).0.contains(id), "lost value");
                    }
                }
                ops += 1;
            }
            for (key, id) in live {
                index.remove(key, id).unwrap();
            }
            ops
        }));
    }
    let mut readers = Vec::new();
    for r in 0..READERS as u64 {
        let (index, stop, start) = (index.clone(), stop.clone(), start.clone());
        readers.push(std::thread::spawn(move || {
            start.wait();
            let mut rng = (r + 17).wrapping_mul(0xD1B5_4A32_D192_ED03) | 1;
            let mut seen = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let g = rcu::read_lock();
                for _ in 0..64 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let key = ((rng % WRITERS as u64) << 32) | ((rng >> 20) % KEYS_PER_WRITER);
                    for v in index.get(key, &g) {
                        assert!(
                            v.alive.load(Ordering::Relaxed),
                            "reader saw a dropped value"
                        );
                        assert_eq!(v.key, key, "value under the wrong key");
                        seen += 1;
                    }
                }
                assert_eq!(index.get(u64::MAX - 1, &g).len(), 1, "pinned key lost");
                if rng % 256 == 0 {
                    for (k, vals) in index.iter(&g) {
                        for v in vals {
                            assert_eq!(v.key, k);
                            assert!(v.alive.load(Ordering::Relaxed));
                        }
                    }
                }
            }
            seen
        }));
    }
    start.wait();
    std::thread::sleep(stress_duration());
    stop.store(true, Ordering::Relaxed);
    let ops: Vec<u64> = writers.into_iter().map(|h| h.join().unwrap()).collect();
    let seen: Vec<u64> = readers.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        ops.iter().all(|&o| o > 0) && (cfg!(miri) || seen.iter().sum::<u64>() > 0),
        "{ops:?} {seen:?}"
    );
    let stats = index.stats();
    assert!(cfg!(miri) || stats.resizes > 0);
    assert_eq!(index.len_addrs(), 1, "{stats:?}");
    drop(Arc::try_unwrap(index).ok().unwrap());
    rcu::barrier();
    let n = serial.load(Ordering::Relaxed);
    for (s, d) in drops.iter().take(n).enumerate() {
        assert_eq!(
            d.load(Ordering::Relaxed),
            1,
            "value {s} dropped {} times",
            d.load(Ordering::Relaxed)
        );
    }
    println!("stress: writer ops {ops:?}, reader values seen {seen:?}, {stats:?}");
}

#[test]
fn readers_see_permanent_keys_through_resizes() {
    permanent_keys_through_resizes(3000, true);
}

/// The same with large tables (256k to 512k slots; the 8 MiB ones on huge
/// pages where the kernel has them: `huge_pages` is on by default),
/// grown by one-by-one inserts (incremental migration into mapped
/// tables) and shrunk again: a reader that touched a table after its
/// mapping was returned would fault.
#[test]
#[cfg_attr(
    miri,
    ignore = "half a million slots per table are too slow under miri"
)]
fn readers_see_permanent_keys_through_huge_table_resizes() {
    permanent_keys_through_resizes(150_000, false);
}

/// Keys inserted before the readers start are found on every lookup while
/// a writer grows the table with `churn` more keys (in bulk or one by one)
/// and shrinks it again by removing them.
fn permanent_keys_through_resizes(churn: u64, bulk: bool) {
    let index = Arc::new(
        AddrIndex::builder()
            .min_slots(8)
            .auto_shrink(true)
            .build()
            .unwrap(),
    );
    for k in 0..64u64 {
        index.insert(k * 1_000_003, k).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (index, stop) = (index.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for k in 0..64u64 {
                        assert_eq!(
                            index.lookup(k * 1_000_003, |v| v[0]),
                            Some(k),
                            "permanent key {k} missed"
                        );
                        n += 1;
                    }
                }
                n
            })
        })
        .collect();
    let t = Instant::now();
    let (mut cycles, mut largest) = (0, 0);
    while cycles == 0 || t.elapsed() < stress_duration() {
        let ids: Vec<_> = if bulk {
            index
                .insert_many((0..churn).map(|a| (1 << 40 | a, a)))
                .unwrap()
        } else {
            (0..churn)
                .map(|a| index.insert(1 << 40 | a, a).unwrap())
                .collect()
        };
        largest = largest.max(index.stats().home_slots);
        for (a, id) in (0..churn).zip(ids) {
            index.remove(1 << 40 | a, id).unwrap();
        }
        cycles += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    let s = index.stats();
    assert!(s.resizes >= 1, "{s:?}");
    assert!(
        largest >= churn as usize * 2,
        "largest table {largest} slots"
    );
    // Shrunk back below the churn: the large tables were retired (and
    // freed after their grace periods) while the readers ran.
    assert!(s.home_slots < churn as usize, "{s:?}");
}

/// A value that counts its live copies (clones included).
#[derive(Debug)]
struct Copies(u64, Arc<AtomicUsize>);

impl Copies {
    fn new(v: u64, live: &Arc<AtomicUsize>) -> Self {
        live.fetch_add(1, Ordering::Relaxed);
        Copies(v, live.clone())
    }
}

impl Clone for Copies {
    fn clone(&self) -> Self {
        Copies::new(self.0, &self.1)
    }
}

impl Drop for Copies {
    fn drop(&mut self) {
        self.1.fetch_sub(1, Ordering::Relaxed);
    }
}

#[test]
fn a_shared_insert_is_one_record_for_all_its_addresses() {
    let n = if cfg!(miri) { 200 } else { 5_000u64 };
    let addrs: Vec<u64> = (0..n).map(|a| 0x40_0000 + a * 16).collect();
    let shared = AddrIndex::builder().capacity(n as usize).build().unwrap();
    let private = AddrIndex::builder().capacity(n as usize).build().unwrap();
    let id = shared.insert_shared(&addrs, [7u64; 3]).unwrap();
    private
        .insert_many(addrs.iter().map(|&a| (a, [7u64; 3])))
        .unwrap();
    assert_eq!((shared.len(), shared.len_addrs()), (n as usize, n as usize));
    {
        let g = rcu::read_lock();
        for &a in &addrs {
            let (ids, vals) = shared.get_with_ids(a, &g);
            assert_eq!((ids, vals), (&[id][..], &[[7u64; 3]][..]), "at {a:#x}");
        }
    }
    // The tables are alike; the records are one against `n`.
    let (s, p) = (shared.stats(), private.stats());
    let per_record = (p.memory_bytes - s.memory_bytes) / (n as usize - 1);
    assert!(
        per_record >= 40,
        "a private record costs {per_record} bytes ({} shared, {} private)",
        s.memory_bytes,
        p.memory_bytes
    );
    // A second value on the same addresses: one record holding both
    // replaces the first, and removing it leaves one record again.
    let second = shared.insert_shared(&addrs, [8u64; 3]).unwrap();
    let both = shared.stats().memory_bytes;
    assert!(
        both > s.memory_bytes && both - s.memory_bytes < per_record,
        "two values: {both} bytes, one: {}",
        s.memory_bytes
    );
    assert_eq!(
        shared.lookup(addrs[9], |v| v.to_vec()),
        Some(vec![[7; 3], [8; 3]])
    );
    assert_eq!(shared.remove_shared(&addrs, second), n as usize);
    assert_eq!(shared.stats().memory_bytes, s.memory_bytes);
    assert_eq!(shared.remove_shared(&addrs, id), n as usize);
    assert!(shared.is_empty());
    assert_eq!(shared.remove_shared(&addrs, id), 0, "removed twice");
}

#[test]
fn shared_records_keep_every_address_its_values() {
    let index = small();
    // Addresses 1..=4 hold different values first; 5..=8 none.
    let own: Vec<EntryId> = (1..=4u64)
        .map(|a| index.insert(a, a * 100).unwrap())
        .collect();
    let addrs: Vec<u64> = (1..=8).collect();
    let first = index.insert_shared(&addrs, 1).unwrap();
    let second = index.insert_shared(&addrs[2..], 2).unwrap();
    let values = |a: u64| index.lookup(a, |v| v.to_vec()).unwrap_or_default();
    assert_eq!(values(1), [100, 1]);
    assert_eq!(values(3), [300, 1, 2]);
    assert_eq!(values(6), [1, 2]);
    // A private write to one address leaves the others as they were.
    index.insert(6, 66).unwrap();
    index.remove(7, first).unwrap();
    assert_eq!(values(6), [1, 2, 66]);
    assert_eq!(values(7), [2]);
    assert_eq!(values(8), [1, 2]);
    assert_eq!(index.take(8, second).unwrap(), 2);
    assert_eq!(values(8), [1]);
    assert_eq!(values(5), [1, 2], "a take at one address leaves the others");
    assert_eq!(index.remove(8, second), Err(Error::NotFound));
    // Removing the first from all of them (7 lost it already): the rest
    // stays, in order.
    assert_eq!(index.remove_shared(&addrs, first), 7);
    assert_eq!(values(1), [100]);
    assert_eq!(values(3), [300, 2]);
    assert_eq!(values(6), [2, 66]);
    assert!(!index.contains(8));
    assert_eq!(index.remove_shared(&addrs, second), 5);
    for (a, id) in (1..=4u64).zip(own) {
        assert_eq!(index.take(a, id).unwrap(), a * 100);
    }
    assert_eq!(values(6), [66]);
    assert_eq!((index.len(), index.len_addrs()), (1, 1));
    // Repeated addresses get the value once.
    let id = index.insert_shared(&[9, 9, 10, 9], 3).unwrap();
    assert_eq!(values(9), [3]);
    assert_eq!(index.remove_shared(&[9, 10, 10], id), 2);
}

#[test]
fn shared_values_are_dropped_once_whoever_lets_them_go() {
    let live = Arc::new(AtomicUsize::new(0));
    let index = AddrIndex::builder()
        .min_slots(8)
        .stripes(4)
        .build()
        .unwrap();
    let addrs: Vec<u64> = (0..64u64).collect();
    let a = index.insert_shared(&addrs, Copies::new(1, &live)).unwrap();
    let b = index
        .insert_shared(&addrs[16..], Copies::new(2, &live))
        .unwrap();
    index.insert(20, Copies::new(3, &live)).unwrap();
    index.remove(21, a).unwrap();
    assert_eq!(index.take(22, b).unwrap().0, 2);
    assert_eq!(index.remove_addr(23), 2);
    assert_eq!(index.remove_shared(&addrs[..32], a), 30);
    rcu::barrier();
    // Still held: `a` at 32..64 (one record with `b`), `b` at 16..64 but
    // 22 and 23, 3 at 20: as many copies as distinct records need.
    assert!(live.load(Ordering::Relaxed) > 0);
    index.clear();
    rcu::barrier();
    assert_eq!(live.load(Ordering::Relaxed), 0, "clear dropped everything");
    index.insert_shared(&addrs, Copies::new(4, &live)).unwrap();
    index.insert(3, Copies::new(5, &live)).unwrap();
    drop(index);
    rcu::barrier();
    assert_eq!(live.load(Ordering::Relaxed), 0, "drop released everything");
}

#[test]
fn a_shared_insert_over_the_address_limit_changes_nothing() {
    let index = AddrIndex::builder().max_addresses(10).build().unwrap();
    index.insert(1, 1u32).unwrap();
    let e = index
        .insert_shared(&(1..=11).collect::<Vec<u64>>(), 9)
        .unwrap_err();
    assert_eq!(e.error, Error::CapacityExceeded { max_addresses: 10 });
    assert_eq!(e.value, 9);
    assert_eq!((index.len(), index.len_addrs()), (1, 1));
    let id = index
        .insert_shared(&(1..=10).collect::<Vec<u64>>(), 9)
        .unwrap();
    assert_eq!(index.lookup(1, |v| v.to_vec()), Some(vec![1, 9]));
    assert_eq!(index.remove_shared(&(1..=10).collect::<Vec<u64>>(), id), 10);
    assert_eq!(index.len_addrs(), 1);
}

#[test]
fn a_shared_insert_is_undone_when_a_clone_panics() {
    use std::cell::Cell;
    thread_local! {
        /// Clones left before one panics (`usize::MAX`: never).
        static CLONES_LEFT: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    #[derive(Debug)]
    struct Fragile(Copies);
    impl Clone for Fragile {
        fn clone(&self) -> Self {
            let left = CLONES_LEFT.get();
            if left == 0 {
                CLONES_LEFT.set(usize::MAX);
                panic!("clone of {} refused", self.0.0);
            }
            CLONES_LEFT.set(left.saturating_sub(1));
            Fragile(self.0.clone())
        }
    }
    let live = Arc::new(AtomicUsize::new(0));
    let index = AddrIndex::builder()
        .min_slots(8)
        .stripes(2)
        .build()
        .unwrap();
    // Distinct values at 0..20: each needs its own copy with the shared
    // value, so the clones run out halfway.
    for a in 0..20u64 {
        index.insert(a, Fragile(Copies::new(a, &live))).unwrap();
    }
    let addrs: Vec<u64> = (0..40).collect();
    CLONES_LEFT.set(15);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        index.insert_shared(&addrs, Fragile(Copies::new(99, &live)))
    }));
    CLONES_LEFT.set(usize::MAX);
    assert!(r.is_err(), "the clone's panic reaches the caller");
    assert_eq!((index.len(), index.len_addrs()), (20, 20));
    for a in 0..20u64 {
        assert_eq!(index.lookup(a, |v| v.len()), Some(1), "address {a}");
    }
    rcu::barrier();
    assert_eq!(live.load(Ordering::Relaxed), 20, "each copy dropped once");
    drop(index);
    rcu::barrier();
    assert_eq!(live.load(Ordering::Relaxed), 0);
}

/// Shared inserts and removals on overlapping address sets (every
/// stripe) race with private writes to the same addresses and with
/// readers: every reader sees whole values, every writer finds its own
/// values where it left them, and every copy is dropped once.
#[test]
fn shared_writes_race_with_private_writes_and_readers() {
    let live = Arc::new(AtomicUsize::new(0));
    let index: AddrIndex<Copies> = AddrIndex::builder()
        .min_slots(8)
        .stripes(4)
        .build()
        .unwrap();
    let rounds = if cfg!(miri) { 6 } else { 400 };
    let stop = AtomicBool::new(false);
    let finished = AtomicUsize::new(0);
    let span = 48u64;
    std::thread::scope(|s| {
        for w in 0..2u64 {
            let (index, live, finished) = (&index, &live, &finished);
            s.spawn(move || {
                for r in 0..rounds {
                    let lo = (r * 7 + w * 13) % span;
                    let addrs: Vec<u64> = (lo..lo + 24).map(|a| a % span).collect();
                    let tag = w << 32 | r;
                    let id = index.insert_shared(&addrs, Copies::new(tag, live)).unwrap();
                    let own = index
                        .insert(addrs[3], Copies::new(tag | 1 << 40, live))
                        .unwrap();
                    for &a in &addrs {
                        let found = index.lookup(a, |v| v.iter().filter(|c| c.0 == tag).count());
                        assert_eq!(found, Some(1), "writer {w}: shared value at {a}");
                    }
                    index.remove(addrs[5], id).unwrap();
                    assert_eq!(index.remove_shared(&addrs, id), addrs.len() - 1);
                    assert_eq!(index.take(addrs[3], own).unwrap().0, tag | 1 << 40);
                }
                // Release: pairs with the Acquire load that stops the reader.
                finished.fetch_add(1, Ordering::Release);
            });
        }
        let (index, stop) = (&index, &stop);
        s.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let g = rcu::read_lock();
                for a in 0..span {
                    for c in index.get(a, &g) {
                        assert!((c.0 >> 32) & 0xff < 2, "torn value {:#x}", c.0);
                    }
                }
            }
        });
        while finished.load(Ordering::Acquire) < 2 {
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(index.is_empty());
    drop(index);
    rcu::barrier();
    assert_eq!(live.load(Ordering::Relaxed), 0, "every copy dropped once");
}
