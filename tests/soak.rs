//! Soak tests: many threads for a bounded time (`FPROBE_SOAK_SECS`, 20 by
//! default), mixing lookups with every kind of write. `#[ignore]`d;
//! `.ci/run` runs them in release:
//!
//! ```sh
//! FPROBE_SOAK_SECS=30 cargo test --release --test soak -- --ignored --test-threads=1
//! ```
//!
//! Each test checks only what the documented consistency guarantees
//! promise, and arms a watchdog that aborts the process with a message if
//! the test overruns its budget (a deadlock fails CI instead of hanging it).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use fprobe::probe::{EntryAction, Fprobe, Registry};
use fprobe::{AddrIndex, EntryId, rcu};

fn soak_duration() -> Duration {
    let secs = std::env::var("FPROBE_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    Duration::from_secs(secs)
}

/// Aborts the process (after printing why) unless dropped within `budget`.
struct Watchdog {
    done: Arc<(Mutex<bool>, std::sync::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn arm(name: &'static str, budget: Duration) -> Self {
        let done = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let d = done.clone();
        let thread = std::thread::spawn(move || {
            let (lock, cv) = &*d;
            let deadline = Instant::now() + budget;
            let mut finished = lock.lock().unwrap();
            while !*finished {
                let now = Instant::now();
                if now >= deadline {
                    eprintln!(
                        "watchdog: {name} exceeded its budget of {budget:?} \
                         (deadlock or livelock?); aborting"
                    );
                    std::process::abort();
                }
                finished = cv.wait_timeout(finished, deadline - now).unwrap().0;
            }
        });
        Watchdog {
            done,
            thread: Some(thread),
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        *self.done.0.lock().unwrap() = true;
        self.done.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The budget for a test that runs `soak_duration()`: generous, because the
/// 2-core CI machine is shared, but finite.
fn budget() -> Duration {
    soak_duration() * 4 + Duration::from_secs(120)
}

/// The repository's one pseudo-random generator (xorshift64).
#[path = "../benches/common/xorshift.rs"]
mod xorshift;
use xorshift::next as xorshift;

// ------------------------------------------------------------------ index

/// An index value: its serial (which fixes its address) and a liveness flag
/// that a reader checks. Drops of originals are counted per serial, except
/// the resizer's bulk values ([`BULK`] set), which are counted in total.
/// Copy-on-write clones ([`CLONE`] set) are not counted.
#[derive(Debug)]
struct Val {
    serial: u64,
    alive: AtomicBool,
    drops: Arc<Drops>,
}

const CLONE: u64 = 1 << 63;
const BULK: u64 = 1 << 62;

struct Drops {
    per_serial: Vec<AtomicU8>,
    bulk: AtomicU64,
    /// Values and clones alive: every creation and clone adds one, every
    /// drop takes one; zero at the end means nothing leaked.
    live: AtomicI64,
}

impl std::fmt::Debug for Drops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Drops")
    }
}

impl Clone for Val {
    fn clone(&self) -> Self {
        self.drops.live.fetch_add(1, Ordering::Relaxed);
        Val {
            serial: self.serial | CLONE,
            alive: AtomicBool::new(true),
            drops: self.drops.clone(),
        }
    }
}

impl Drop for Val {
    fn drop(&mut self) {
        assert!(self.alive.swap(false, Ordering::Relaxed), "dropped twice");
        self.drops.live.fetch_sub(1, Ordering::Relaxed);
        if self.serial & CLONE != 0 {
            // A copy-on-write clone: not counted.
        } else if self.serial & BULK != 0 {
            self.drops.bulk.fetch_add(1, Ordering::Relaxed);
        } else {
            self.drops.per_serial[self.serial as usize].fetch_add(1, Ordering::Relaxed);
        }
    }
}

const WRITERS: u64 = 3;
const KEYS: u64 = 257;

/// The address of writer `w`'s value `serial` (values of one writer spread
/// over `KEYS` addresses; writers share none).
fn key_of(w: u64, serial: u64) -> u64 {
    (w + 1) << 40 | (serial.wrapping_mul(0x9E37_79B9) % KEYS) << 4
}

/// 3 writers (insert, insert_many, remove, take, remove_addr on their own
/// addresses), 1 resizer (bulk insert and remove of a private range: the
/// table grows and shrinks all the time), 4 readers. Checked:
/// * no value lost: each writer finds all its live values, periodically,
///   and readers always find the pinned addresses;
/// * no removed value seen after its removal returned: each writer
///   publishes the serial it removed last (Release), and a reader that has
///   seen it (Acquire) must not find that value in a lookup it starts
///   afterwards;
/// * every value found is alive and under its own address;
/// * every value is dropped exactly once (drop counters), once the index is
///   dropped and `rcu::barrier` has run.
#[test]
#[ignore = "soak test: run by .ci/run in release (FPROBE_SOAK_SECS)"]
fn soak_index_lookups_against_writes_and_resizes() {
    const READERS: usize = 4;
    const MAX_SERIALS: usize = 1 << 24;
    let _watchdog = Watchdog::arm("soak_index", budget());
    let drops = Arc::new(Drops {
        per_serial: (0..MAX_SERIALS).map(|_| AtomicU8::new(0)).collect(),
        bulk: AtomicU64::new(0),
        live: AtomicI64::new(0),
    });
    let index: Arc<AddrIndex<Val>> = Arc::new(
        AddrIndex::builder()
            .min_slots(8)
            .auto_shrink(true)
            .build()
            .unwrap(),
    );
    let serials = Arc::new(AtomicUsize::new(0));
    let new_val = |serials: &AtomicUsize, drops: &Arc<Drops>| -> Option<Val> {
        let s = serials.fetch_add(1, Ordering::Relaxed);
        (s < MAX_SERIALS).then(|| {
            drops.live.fetch_add(1, Ordering::Relaxed);
            Val {
                serial: s as u64,
                alive: AtomicBool::new(true),
                drops: drops.clone(),
            }
        })
    };
    // Pinned values every reader must always find.
    const PINNED: [u64; 4] = [0, u64::MAX, 1 << 20, 3 << 20];
    for k in PINNED {
        let v = new_val(&serials, &drops).unwrap();
        index.insert(k, v).unwrap();
    }
    // Per writer: the serial it removed last, +1 (0: none yet).
    let last_removed: Arc<Vec<AtomicU64>> =
        Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(WRITERS as usize + 1 + READERS + 1));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (index, serials, drops, last_removed, stop, start) = (
            index.clone(),
            serials.clone(),
            drops.clone(),
            last_removed.clone(),
            stop.clone(),
            start.clone(),
        );
        writers.push(std::thread::spawn(move || {
            start.wait();
            // Live values: (address, id, serial).
            let mut live: Vec<(u64, EntryId, u64)> = Vec::new();
            let mut rng = (w + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut ops = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = xorshift(&mut rng);
                if live.len() < 2000 && r % 3 != 0 {
                    let batch = if r % 5 == 0 { 1 + r as usize % 16 } else { 1 };
                    let vals: Vec<Val> = (0..batch)
                        .map_while(|_| new_val(&serials, &drops))
                        .collect();
                    if vals.is_empty() {
                        break;
                    }
                    let items: Vec<(u64, Val)> =
                        vals.into_iter().map(|v| (key_of(w, v.serial), v)).collect();
                    let meta: Vec<(u64, u64)> = items.iter().map(|(k, v)| (*k, v.serial)).collect();
                    if batch == 1 {
                        let (k, v) = items.into_iter().next().unwrap();
                        let id = index.insert(k, v).unwrap();
                        live.push((k, id, meta[0].1));
                    } else {
                        let ids = index.insert_many(items).unwrap();
                        live.extend(meta.iter().zip(ids).map(|(&(k, s), id)| (k, id, s)));
                    }
                } else if !live.is_empty() {
                    let i = (r as usize >> 8) % live.len();
                    let (k, id, s) = live.swap_remove(i);
                    match r % 13 {
                        0 => {
                            let v = index.take(k, id).unwrap();
                            assert_eq!(v.serial & !CLONE, s, "take returned another value");
                        }
                        1 => {
                            // Everything of this writer at `k` goes.
                            let gone: Vec<u64> =
                                live.iter().filter(|x| x.0 == k).map(|x| x.2).collect();
                            live.retain(|x| x.0 != k);
                            assert_eq!(index.remove_addr(k), gone.len() + 1);
                        }
                        _ => index.remove(k, id).unwrap(),
                    }
                    // Release: pairs with the readers' Acquire below; the
                    // removal happens before any lookup that sees this.
                    last_removed[w as usize].store(s + 1, Ordering::Release);
                    let g = rcu::read_lock();
                    assert!(
                        !index.get_with_ids(k, &g).0.contains(&id),
                        "writer {w}: removed value still visible"
                    );
                }
                if ops % 256 == 0 {
                    let g = rcu::read_lock();
                    for (k, id, _) in &live {
                        assert!(index.get_with_ids(*k, &g).0.contains(id), "value lost");
                    }
                }
                ops += 1;
            }
            for (k, id, _) in live {
                index.remove(k, id).unwrap();
            }
            ops
        }));
    }
    let resizer = {
        let (index, drops, stop, start) =
            (index.clone(), drops.clone(), stop.clone(), start.clone());
        std::thread::spawn(move || {
            start.wait();
            let (mut cycles, mut created) = (0u64, 0u64);
            let mut rng = 0xDEAD_BEEF_u64;
            while !stop.load(Ordering::Relaxed) {
                let n = 256 + xorshift(&mut rng) as usize % 4096;
                drops.live.fetch_add(n as i64, Ordering::Relaxed);
                let vals: Vec<Val> = (0..n)
                    .map(|_| Val {
                        serial: BULK,
                        alive: AtomicBool::new(true),
                        drops: drops.clone(),
                    })
                    .collect();
                created += n as u64;
                let base = 7 << 40;
                let ids = index
                    .insert_many(
                        vals.into_iter()
                            .enumerate()
                            .map(|(i, v)| (base + i as u64, v)),
                    )
                    .unwrap();
                for (i, id) in ids.into_iter().enumerate() {
                    index.remove(base + i as u64, id).unwrap();
                }
                cycles += 1;
            }
            (cycles, created)
        })
    };
    let mut readers = Vec::new();
    for r in 0..READERS as u64 {
        let (index, last_removed, stop, start) = (
            index.clone(),
            last_removed.clone(),
            stop.clone(),
            start.clone(),
        );
        readers.push(std::thread::spawn(move || {
            start.wait();
            let mut rng = (r + 11).wrapping_mul(0xD1B5_4A32_D192_ED03);
            let mut seen = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // A value some writer has removed (Acquire: pairs with the
                // writer's Release; the removal returned before our lookup).
                let w = xorshift(&mut rng) % WRITERS;
                let removed = last_removed[w as usize].load(Ordering::Acquire);
                let g = rcu::read_lock();
                if let Some(s) = removed.checked_sub(1) {
                    let k = key_of(w, s);
                    assert!(
                        index.get(k, &g).iter().all(|v| v.serial & !CLONE != s),
                        "reader {r}: value {s} seen after its removal returned"
                    );
                }
                for _ in 0..32 {
                    let w = xorshift(&mut rng) % WRITERS;
                    let k = key_of(w, xorshift(&mut rng));
                    for v in index.get(k, &g) {
                        assert!(
                            v.alive.load(Ordering::Relaxed),
                            "reader saw a dropped value"
                        );
                        assert_eq!(
                            key_of(w, v.serial & !CLONE),
                            k,
                            "value under the wrong address"
                        );
                        seen += 1;
                    }
                }
                for k in PINNED {
                    assert_eq!(index.get(k, &g).len(), 1, "pinned address {k:#x} lost");
                }
            }
            seen
        }));
    }
    start.wait();
    std::thread::sleep(soak_duration());
    stop.store(true, Ordering::Relaxed);
    let ops: Vec<u64> = writers.into_iter().map(|h| h.join().unwrap()).collect();
    let (cycles, bulk) = resizer.join().unwrap();
    let seen: Vec<u64> = readers.into_iter().map(|h| h.join().unwrap()).collect();
    let stats = index.stats();
    assert_eq!(index.len_addrs(), PINNED.len(), "{stats:?}");
    assert!(ops.iter().all(|&o| o > 0) && cycles > 0 && seen.iter().all(|&s| s > 0));
    assert!(stats.resizes > 0);
    drop(Arc::try_unwrap(index).ok().unwrap());
    rcu::barrier();
    let n = serials.load(Ordering::Relaxed).min(MAX_SERIALS);
    for (s, d) in drops.per_serial.iter().take(n).enumerate() {
        let d = d.load(Ordering::Relaxed);
        assert_eq!(d, 1, "value {s} dropped {d} times");
    }
    assert_eq!(
        drops.bulk.load(Ordering::Relaxed),
        bulk,
        "bulk values not dropped exactly once"
    );
    assert_eq!(
        drops.live.load(Ordering::Relaxed),
        0,
        "values or clones leaked"
    );
    println!(
        "soak index: {n} + {bulk} values, writer ops {ops:?}, resize cycles {cycles}, \
         reader values seen {seen:?}, {stats:?}"
    );
}

// ------------------------------------------------------------------ probe

/// Counts live probes (handler closures), so the test can check that each
/// is dropped exactly once.
struct ProbeToken(Arc<AtomicU64>);

impl Drop for ProbeToken {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// 2 registrars register, enable/disable and unregister probes on random
/// address sets; 6 dispatchers run nested entry/exit calls on those
/// addresses. Checked:
/// * no handler of a probe runs once its `unregister` has returned (each
///   probe's handlers check a flag set right after `unregister` returns);
/// * per probe, exits never exceed hits, and nothing panicked;
/// * every probe is dropped exactly once (live-probe counter back to 0 after
///   the registry is dropped and `rcu::barrier` has run);
/// * entry/exit pairing survives: each dispatcher's data check holds.
#[test]
#[ignore = "soak test: run by .ci/run in release (FPROBE_SOAK_SECS)"]
fn soak_probe_register_unregister_dispatch() {
    const REGISTRARS: u64 = 2;
    const DISPATCHERS: u64 = 6;
    const ADDRS: u64 = 64;
    let _watchdog = Watchdog::arm("soak_probe", budget());
    let reg = Arc::new(
        Registry::<u64>::builder()
            .max_probes(64)
            .max_depth(8)
            .build()
            .unwrap(),
    );
    let live_probes = Arc::new(AtomicU64::new(0));
    let violations = Arc::new(AtomicU64::new(0));
    let registered = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new((REGISTRARS + DISPATCHERS + 1) as usize));
    let mut registrars = Vec::new();
    for t in 0..REGISTRARS {
        let (reg, live_probes, violations, registered, stop, start) = (
            reg.clone(),
            live_probes.clone(),
            violations.clone(),
            registered.clone(),
            stop.clone(),
            start.clone(),
        );
        registrars.push(std::thread::spawn(move || {
            start.wait();
            let mut rng = (t + 5).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut mine = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let r = xorshift(&mut rng);
                if mine.len() < 12 && r % 2 == 0 {
                    let dead = Arc::new(AtomicBool::new(false));
                    live_probes.fetch_add(1, Ordering::Relaxed);
                    let token = Arc::new(ProbeToken(live_probes.clone()));
                    let (d1, d2, v1, v2, t1) = (
                        dead.clone(),
                        dead.clone(),
                        violations.clone(),
                        violations.clone(),
                        token.clone(),
                    );
                    let probe = Fprobe::<u64>::builder()
                        .data_size(8)
                        .entry(move |e| {
                            let _ = &t1;
                            if d1.load(Ordering::Acquire) {
                                v1.fetch_add(1, Ordering::Relaxed);
                            }
                            // Empty when no return instance could be had (depth
                            // or pool exhausted): no exit handler runs then.
                            if e.data.len() == 8 {
                                e.data.copy_from_slice(&(e.addr ^ *e.ctx).to_ne_bytes());
                            }
                            EntryAction::Continue
                        })
                        .exit(move |x| {
                            let _ = &token;
                            if d2.load(Ordering::Acquire)
                                || x.data != (x.addr ^ *x.ctx).to_ne_bytes()
                            {
                                v2.fetch_add(1, Ordering::Relaxed);
                            }
                        })
                        .build();
                    let n = 1 + r as usize % 16;
                    let addrs: Vec<u64> = (0..n)
                        .map(|_| 0x1000 + (xorshift(&mut rng) % ADDRS) * 16)
                        .collect();
                    if let Ok(h) = reg.register(probe, &addrs) {
                        registered.fetch_add(1, Ordering::Relaxed);
                        mine.push((h, dead));
                    }
                } else if !mine.is_empty() {
                    let (h, dead) = mine.swap_remove((r as usize >> 8) % mine.len());
                    match r % 7 {
                        0 => reg.disable(h).unwrap(),
                        1 => reg.enable(h).unwrap(),
                        _ => {
                            let s = reg.stats(h).unwrap();
                            assert!(s.exits <= s.hits, "{s:?}");
                            assert_eq!(s.panics, 0);
                            reg.unregister(h).unwrap();
                            // Release: pairs with the handlers' Acquire;
                            // no handler may run from now on.
                            dead.store(true, Ordering::Release);
                            continue;
                        }
                    }
                    mine.push((h, dead));
                }
            }
            for (h, dead) in mine {
                reg.unregister(h).unwrap();
                dead.store(true, Ordering::Release);
            }
        }));
    }
    let mut dispatchers = Vec::new();
    for t in 0..DISPATCHERS {
        let (reg, stop, start) = (reg.clone(), stop.clone(), start.clone());
        dispatchers.push(std::thread::spawn(move || {
            start.wait();
            let mut rng = (t + 99).wrapping_mul(0xD1B5_4A32_D192_ED03);
            let mut calls = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // A nest of up to 4 calls, returning in LIFO order.
                let depth = 1 + xorshift(&mut rng) % 4;
                for _ in 0..depth {
                    let a = 0x1000 + (xorshift(&mut rng) % ADDRS) * 16;
                    reg.on_entry(a, 0, &t);
                }
                for _ in 0..depth {
                    reg.on_exit(0, &t);
                }
                calls += depth;
            }
            calls
        }));
    }
    start.wait();
    std::thread::sleep(soak_duration());
    stop.store(true, Ordering::Relaxed);
    for h in registrars {
        h.join().unwrap();
    }
    let calls: Vec<u64> = dispatchers.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(
        violations.load(Ordering::Relaxed),
        0,
        "handler ran after unregister or lost its data"
    );
    assert_eq!(reg.addresses(), 0);
    drop(Arc::try_unwrap(reg).ok().unwrap());
    rcu::barrier();
    assert_eq!(
        live_probes.load(Ordering::Relaxed),
        0,
        "probes not dropped exactly once"
    );
    println!(
        "soak probe: {} probes registered, dispatcher calls {calls:?}",
        registered.load(Ordering::Relaxed)
    );
}
