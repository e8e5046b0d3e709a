//! The recent-hit cache never returns a stale value.

#[path = "common/stress.rs"]
mod stress;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

#[cfg(all(unix, not(miri)))]
#[path = "common/fork.rs"]
mod fork;

use fprobe::{AddrIndex, Error, HitCacheConfig, HitCacheMode, rcu};

fn cached<V: Clone + Send + Sync + 'static>(ways: usize) -> AddrIndex<V> {
    cached_mode(ways, false)
}

fn cached_mode<V: Clone + Send + Sync + 'static>(ways: usize, per_cpu: bool) -> AddrIndex<V> {
    AddrIndex::builder()
        .min_slots(8)
        .hit_cache(
            HitCacheConfig::default()
                .entries(64)
                .ways(ways)
                .per_cpu(per_cpu),
        )
        .build()
        .unwrap()
}

#[test]
fn hits_after_first_lookup_and_invalidates_on_write() {
    let index = cached(4);
    index.insert(1, 10u32).unwrap();
    assert_eq!(index.lookup(1, |v| v.to_vec()), Some(vec![10]));
    assert_eq!(index.lookup(1, |v| v.to_vec()), Some(vec![10]));
    let s = index.hit_cache_stats().unwrap();
    assert_eq!((s.misses, s.hits), (1, 1));
    // A negative result is cached too, and an insert invalidates it.
    assert_eq!(index.lookup(2, |v| v.len()), None);
    assert_eq!(index.lookup(2, |v| v.len()), None);
    let id = index.insert(2, 20).unwrap();
    assert_eq!(index.lookup(2, |v| v.to_vec()), Some(vec![20]));
    index.remove(2, id).unwrap();
    assert_eq!(index.lookup(2, |v| v.len()), None);
    let id = index.insert(1, 11).unwrap();
    assert_eq!(index.lookup(1, |v| v.to_vec()), Some(vec![10, 11]));
    assert_eq!(index.take(1, id), Ok(11));
    assert_eq!(index.lookup(1, |v| v.to_vec()), Some(vec![10]));
    index.clear();
    assert_eq!(index.lookup(1, |v| v.len()), None);
}

/// Every address goes through the cache, the extremes included (the index
/// sends lookups past the cache with one compare of the address against a
/// bound, which must admit none when a cache is configured).
#[test]
fn extreme_addresses_go_through_the_cache() {
    let index = cached(4);
    for a in [0u64, u64::MAX] {
        index.insert(a, a).unwrap();
        let before = index.hit_cache_stats().unwrap();
        assert_eq!(index.lookup(a, |v| v.to_vec()), Some(vec![a]));
        assert_eq!(index.lookup(a, |v| v.to_vec()), Some(vec![a]));
        let after = index.hit_cache_stats().unwrap();
        assert_eq!(
            (after.misses - before.misses, after.hits - before.hits),
            (1, 1),
            "address {a:#x}"
        );
    }
}

#[test]
fn cached_and_uncached_agree_through_resizes() {
    let (all_ways, steps): (&[usize], u64) = if cfg!(miri) {
        (&[1, 4], 150)
    } else {
        (&[1, 2, 4, 8], 4000)
    };
    for (&ways, per_cpu) in all_ways.iter().flat_map(|w| [(w, false), (w, true)]) {
        let c = cached_mode::<u64>(ways, per_cpu);
        let u: AddrIndex<u64> = AddrIndex::builder().min_slots(8).build().unwrap();
        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ ways as u64;
        let mut ids = Vec::new();
        for step in 0..steps {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let a = x % 300;
            match x % 5 {
                0 | 1 => {
                    ids.push((a, c.insert(a, step).unwrap(), u.insert(a, step).unwrap()));
                }
                2 if !ids.is_empty() => {
                    let (a, ic, iu) = ids.swap_remove((x as usize >> 8) % ids.len());
                    c.remove(a, ic).unwrap();
                    u.remove(a, iu).unwrap();
                }
                _ => {}
            }
            let g = rcu::read_lock();
            assert_eq!(
                c.get(a, &g),
                u.get(a, &g),
                "ways {ways}, per-CPU {per_cpu}, step {step}, addr {a}"
            );
        }
    }
}

#[test]
fn rejects_bad_cache_configuration() {
    for cfg in [
        HitCacheConfig::default().entries(0),
        HitCacheConfig::default().entries(100),
        HitCacheConfig::default().entries(1 << 20),
        HitCacheConfig::default().ways(3),
        HitCacheConfig::default().ways(16),
    ] {
        let r = AddrIndex::<u8>::builder().hit_cache(cfg).build();
        assert!(matches!(r, Err(Error::InvalidConfig(_))));
    }
    assert!(HitCacheConfig::default().bytes_per_thread() <= 33 * 1024);
}

#[test]
fn dropped_index_cache_slot_is_not_reused_stale() {
    // Recreate cached indexes many times on one thread: each new index may
    // reuse a thread-local slot whose cache belonged to a dropped index.
    for round in 0..if cfg!(miri) { 4 } else { 100u64 } {
        let index = cached::<u64>(4);
        assert_eq!(index.lookup(7, |v| v[0]), None, "round {round}");
        index.insert(7, round).unwrap();
        assert_eq!(index.lookup(7, |v| v[0]), Some(round));
        assert_eq!(index.lookup(7, |v| v[0]), Some(round));
    }
}

/// Threads hammer a few hot addresses through the cache while writers
/// remove and re-insert their values. Once a remove has returned (and the
/// reader learned of it), the reader never sees that value again; a value
/// inserted (and announced) before the lookup and not yet removed is seen.
#[test]
fn never_stale_under_churn() {
    churn(HitCacheConfig::default().adaptive(false));
}

/// The same with one cache per CPU: the four threads share the caches of
/// the CPUs they run on, and fill and read them concurrently.
#[test]
fn never_stale_under_churn_per_cpu() {
    churn(HitCacheConfig::default().per_cpu(true).adaptive(false));
}

#[test]
fn per_cpu_mode_reports_its_source_and_memory() {
    // The two lookups below must run on one CPU for the second to find
    // the first's entry: keep this test's thread on one CPU (a loaded
    // machine, or qemu-user's host threads, move it otherwise).
    #[cfg(not(miri))]
    if let Some(cpu) = core_affinity::get_core_ids().and_then(|ids| ids.first().copied()) {
        core_affinity::set_for_current(cpu);
    }
    let index: AddrIndex<u32> = AddrIndex::builder()
        .hit_cache(HitCacheConfig::default().per_cpu(true))
        .build()
        .unwrap();
    index.insert(5, 1).unwrap();
    assert_eq!(index.lookup(5, |v| v[0]), Some(1));
    assert_eq!(index.lookup(5, |v| v[0]), Some(1));
    let s = index.hit_cache_stats().unwrap();
    assert_eq!((s.misses, s.hits), (1, 1));
    if cfg!(all(target_os = "linux", not(miri))) {
        assert!(
            matches!(
                s.mode,
                HitCacheMode::PerCpuRseq | HitCacheMode::PerCpuSchedGetcpu
            ),
            "{:?}",
            s.mode
        );
        assert!(s.bytes_per_cpu_total >= HitCacheConfig::default().bytes_per_cpu());
        assert!(s.bytes_per_thread < 1024, "threads keep counters only");
    }
    let plain: AddrIndex<u32> = AddrIndex::builder()
        .hit_cache(HitCacheConfig::default())
        .build()
        .unwrap();
    plain.lookup(5, |v| v.len());
    let s = plain.hit_cache_stats().unwrap();
    assert_eq!(
        (s.mode, s.bytes_per_cpu_total),
        (HitCacheMode::PerThread, 0)
    );
}

fn churn(config: HitCacheConfig) {
    const HOT: usize = 8;
    /// What the writers and readers share. Per address: the last serial
    /// whose insert returned, whose remove started, and whose remove
    /// returned.
    struct Shared {
        index: AddrIndex<u64>,
        inserted: Vec<AtomicU64>,
        removing: Vec<AtomicU64>,
        removed: Vec<AtomicU64>,
        stop: AtomicBool,
        start: Barrier,
    }
    let serials = || (0..HOT).map(|_| AtomicU64::new(0)).collect();
    let shared = Arc::new(Shared {
        index: AddrIndex::builder().hit_cache(config).build().unwrap(),
        inserted: serials(),
        removing: serials(),
        removed: serials(),
        stop: AtomicBool::new(false),
        start: Barrier::new(4),
    });
    let run = stress::duration(1500);
    let mut writers = Vec::new();
    for w in 0..2usize {
        let sh = shared.clone();
        writers.push(std::thread::spawn(move || {
            sh.start.wait();
            let mut serial = 0u64;
            let mut n = 0;
            while !sh.stop.load(Ordering::Relaxed) {
                for a in (w..HOT).step_by(2) {
                    serial += 1;
                    let s = serial << 8 | a as u64;
                    let id = sh.index.insert(a as u64, s).unwrap();
                    sh.inserted[a].store(s, Ordering::Release);
                    std::thread::yield_now();
                    sh.removing[a].store(s, Ordering::Release);
                    sh.index.remove(a as u64, id).unwrap();
                    sh.removed[a].store(s, Ordering::Release);
                    n += 1;
                }
            }
            n
        }));
    }
    let mut readers = Vec::new();
    for _ in 0..2 {
        let sh = shared.clone();
        readers.push(std::thread::spawn(move || {
            sh.start.wait();
            let mut checks = 0u64;
            while !sh.stop.load(Ordering::Relaxed) {
                for a in 0..HOT {
                    let dead = sh.removed[a].load(Ordering::Acquire);
                    let live = sh.inserted[a].load(Ordering::Acquire);
                    let g = rcu::read_lock();
                    let vals = sh.index.get(a as u64, &g);
                    for &v in vals {
                        assert!(
                            v > dead,
                            "stale value {v:#x} at {a} (removed up to {dead:#x})"
                        );
                    }
                    let saw_live = vals.contains(&live);
                    drop(g);
                    if live > dead && !saw_live {
                        // Only allowed if its removal started meanwhile.
                        assert!(
                            sh.removing[a].load(Ordering::Acquire) >= live,
                            "inserted value {live:#x} at {a} not visible"
                        );
                    }
                    checks += 1;
                }
            }
            checks
        }));
    }
    std::thread::sleep(run);
    shared.stop.store(true, Ordering::Relaxed);
    // Under miri the run is too short to be sure every thread got a turn.
    for w in writers {
        assert!(w.join().unwrap() > 0 || cfg!(miri));
    }
    for r in readers {
        assert!(r.join().unwrap() > 0 || cfg!(miri));
    }
    let s = shared.index.hit_cache_stats().unwrap();
    assert!(s.hits + s.misses + s.bypassed > 0 || cfg!(miri));
    println!("hit cache under churn: {s:?}");
}

/// Every cached index gets a cache on every thread, however many are alive
/// at once; threads that come and go do not pile up caches.
#[test]
fn any_number_of_cached_indexes_each_get_a_cache() {
    let n = if cfg!(miri) { 3 } else { 100 };
    let indexes: Vec<AddrIndex<u32>> = (0..n).map(|_| cached(4)).collect();
    for (i, index) in indexes.iter().enumerate() {
        index.insert(7, i as u32).unwrap();
    }
    for _ in 0..2 {
        // Interleaved, so that no index stays this thread's last one.
        for (i, index) in indexes.iter().enumerate() {
            assert_eq!(index.lookup(7, |v| v.to_vec()), Some(vec![i as u32]));
        }
    }
    for (i, index) in indexes.iter().enumerate() {
        let s = index.hit_cache_stats().unwrap();
        assert_eq!((s.misses, s.hits), (1, 1), "index {i}: {s:?}");
    }
    let index = Arc::new(cached::<u32>(4));
    index.insert(9, 1).unwrap();
    for _ in 0..3 {
        let index = index.clone();
        std::thread::spawn(move || {
            assert_eq!(index.lookup(9, |v| v.to_vec()), Some(vec![1]));
        })
        .join()
        .unwrap();
    }
    let s = index.hit_cache_stats().unwrap();
    assert_eq!(s.hits + s.misses, 3);
    // One at a time: each takes the lowest free thread index, which other
    // tests' threads may hold meanwhile, so at most one cache each.
    assert!(s.threads <= 3, "{s:?}");
}

/// The switch's schedule, whatever the timings: 1,024 lookups through the
/// cache, a trial of three 1,024-lookup windows through it and three past
/// it, then 65,536 lookups all through it (switch on), or all past it
/// uncounted (switch off, the first trial lost) until the re-arm, no sooner
/// than 64 ms later; then the next warm-up through it. Counts that depend
/// on the next trial not having come yet are checked only when the
/// lookups took less time than its delay.
#[test]
#[cfg_attr(miri, ignore)] // 70,000 lookups: minutes under miri, and no unsafe code of its own
fn the_switch_runs_its_schedule() {
    use std::time::{Duration, Instant};
    let index = cached(4);
    for a in 0..32u64 {
        index.insert(a, a).unwrap();
    }
    let counts = |n: u64| {
        for i in 0..n {
            assert_eq!(index.lookup(i % 32, |v| v[0]), Some(i % 32));
        }
        let s = index.hit_cache_stats().unwrap();
        (s.hits + s.misses, s.bypassed, s.trials, s.enabled)
    };
    assert_eq!(
        counts(1024 + 6 * 1024 - 1),
        (1024 + 3072, 3071, 0, true),
        "warm-up and trial"
    );
    let before_end = Instant::now();
    let (through, past, trials, on) = counts(1);
    assert_eq!((through, past, trials), (4096, 3072, 1), "the trial ends");
    if on {
        let run = counts(65_536);
        let next = counts(1024);
        // Only while the next trial cannot have come yet (it is due 256 ms
        // after the decision; a slow build, under an emulator or a
        // sanitizer, may take longer than that for these lookups).
        if before_end.elapsed() < Duration::from_millis(200) {
            assert_eq!(
                run,
                (4096 + 65_536, 3072, 1, true),
                "a run through the cache"
            );
            assert_eq!(
                (next.0 - run.0, next.1 - run.1),
                (1024, 0),
                "more lookups through the cache"
            );
        }
        return;
    }
    let run = counts(1024);
    // Only while the re-arm cannot have come yet (as above).
    let early = before_end.elapsed() < Duration::from_millis(50);
    if early {
        assert_eq!(run, (4096, 3072, 1, false), "a run past the cache");
    }
    while !index.hit_cache_stats().unwrap().enabled {
        assert!(
            before_end.elapsed() < Duration::from_secs(10),
            "the switch was never re-armed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        before_end.elapsed() >= Duration::from_millis(64),
        "re-armed before its delay"
    );
    if early {
        let (through2, past2, _, _) = counts(1024);
        assert_eq!(
            (through2 - run.0, past2 - run.1),
            (1024, 0),
            "the next warm-up"
        );
    }
}

/// The switch keeps running trials: each one it wins is followed by
/// another after the run, each one it loses by a re-arm, on any thread;
/// the index answers right throughout, through resizes.
#[test]
#[cfg_attr(miri, ignore)] // hundreds of thousands of lookups
fn trials_go_on_through_resizes() {
    let index = Arc::new(cached::<u64>(4));
    for a in 1..=64u64 {
        index.insert(a * 16, a).unwrap();
    }
    let t = std::time::Instant::now();
    let mut grown = 65u64;
    let mut seen = (false, false);
    loop {
        let s = index.hit_cache_stats().unwrap();
        if s.trials >= 3 {
            break;
        }
        seen = (seen.0 || s.enabled, seen.1 || !s.enabled);
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "trials stopped: {:?}",
            index.hit_cache_stats()
        );
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let index = index.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        let a = (i * 7 + w) % 64 + 1;
                        assert_eq!(index.lookup(a * 16, |v| v[0]), Some(a));
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        // A resize now and then: the tables change under the cache.
        for _ in 0..200 {
            index.insert(grown * 16, grown).unwrap();
            grown += 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for a in 1..grown {
        assert_eq!(index.lookup(a * 16, |v| v[0]), Some(a));
    }
}

/// Indexes whose caches are switched off, dropped while their re-arm is
/// pending: the agent must not write into their freed tables (the
/// AddressSanitizer run catches it if it does).
#[test]
#[cfg_attr(miri, ignore)] // 8,000 lookups per index
fn index_dropped_while_its_rearm_is_pending() {
    for round in 0..20u64 {
        let index = cached::<u64>(4);
        index.insert(round + 1, 1).unwrap();
        for _ in 0..8 * 1024 {
            assert_eq!(index.lookup(round + 1, |v| v[0]), Some(1));
        }
        drop(index);
    }
    // Past the agent's first delay: it has run its re-arms by now.
    std::thread::sleep(std::time::Duration::from_millis(100));
}

/// The standalone cache in front of a table of its user's: a writer
/// changes an address's answer and then invalidates; a lookup that begins
/// after the invalidation never sees an older answer, on any thread.
#[test]
fn standalone_cache_is_never_stale_after_invalidate() {
    use fprobe::HitCache;
    use std::sync::RwLock;
    const HOT: u64 = 8;
    /// What the writer and the readers share: the table behind the cache,
    /// and per address the last serial written and invalidated.
    struct Shared {
        table: RwLock<Vec<u64>>,
        published: Vec<AtomicU64>,
        cache: HitCache<u64>,
        stop: AtomicBool,
    }
    let shared = Arc::new(Shared {
        table: RwLock::new(vec![0; HOT as usize]),
        published: (0..HOT).map(|_| AtomicU64::new(0)).collect(),
        cache: HitCache::new(HitCacheConfig::new().adaptive(false)).unwrap(),
        stop: AtomicBool::new(false),
    });
    let ms = if cfg!(miri) { 50 } else { 500 };
    let writer = {
        let sh = shared.clone();
        std::thread::spawn(move || {
            let mut serial = 0;
            while !sh.stop.load(Ordering::Relaxed) {
                for a in 0..HOT as usize {
                    serial += 1;
                    sh.table.write().unwrap()[a] = serial;
                    sh.cache.invalidate();
                    sh.published[a].store(serial, Ordering::Release);
                }
                std::thread::yield_now();
            }
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let sh = shared.clone();
            std::thread::spawn(move || {
                let mut checks = 0u64;
                while !sh.stop.load(Ordering::Relaxed) {
                    for a in 0..HOT {
                        let floor = sh.published[a as usize].load(Ordering::Acquire);
                        let got = sh.cache.lookup(a, || sh.table.read().unwrap()[a as usize]);
                        assert!(
                            got >= floor,
                            "stale answer {got} at {a} (published {floor})"
                        );
                        checks += 1;
                    }
                }
                checks
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(ms));
    shared.stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    for r in readers {
        assert!(r.join().unwrap() > 0 || cfg!(miri));
    }
    let s = shared.cache.stats();
    assert!(s.hits > 0 || cfg!(miri), "{s:?}");
}

#[test]
fn standalone_cache_rejects_bad_configuration() {
    let e = fprobe::HitCache::<u32>::new(HitCacheConfig::new().entries(3));
    assert!(matches!(e, Err(fprobe::Error::InvalidConfig(_))));
}

/// After `fork`, the child (whose agent did not survive) keeps using,
/// resizing and dropping a cached index whose trial the parent ran, and a
/// cache made in the child runs its own trial: nothing waits for the
/// parent's agent.
#[cfg(all(unix, not(miri)))]
#[test]
fn cached_index_works_in_a_forked_child() {
    if fork::left_out_under_qemu_user("cached_index_works_in_a_forked_child") {
        return;
    }
    let index = cached::<u64>(4);
    for a in 1..=64u64 {
        index.insert(a * 16, a).unwrap();
    }
    for i in 0..8 * 1024u64 {
        let a = i % 64 + 1;
        assert_eq!(index.lookup(a * 16, |v| v[0]), Some(a));
    }
    assert_eq!(index.hit_cache_stats().unwrap().trials, 1);
    // SAFETY: (test) the child only uses the index, allocates, and exits
    // with _exit; the parent has no other thread inside the crate's locks.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for a in 65..=5000u64 {
                index.insert(a * 16, a).unwrap();
            }
            for a in 1..=5000u64 {
                assert_eq!(index.lookup(a * 16, |v| v[0]), Some(a));
            }
            // A cache made in the child runs its trial.
            let other = cached::<u64>(4);
            other.insert(16, 1).unwrap();
            for _ in 0..8 * 1024 {
                assert_eq!(other.lookup(16, |v| v[0]), Some(1));
            }
            assert_eq!(other.hit_cache_stats().unwrap().trials, 1);
            drop(other);
            drop(index);
        }))
        .is_ok();
        // SAFETY: (test) plain exit without running the parent's atexit.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    assert!(pid > 0);
    let status = fork::wait_child(
        pid,
        Duration::from_secs(20),
        "child hung using a cached index after fork",
    );
    assert!(fork::exited_cleanly(status), "child failed");
}
