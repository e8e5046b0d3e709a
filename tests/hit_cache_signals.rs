//! A hit-cached index looked up by a thread and by signal handlers that
//! interrupt it: the handler's lookups use the same thread's cache, and one
//! that lands while the interrupted lookup fills an entry must never leave
//! that entry pairing one address with another address's record. Every
//! lookup, on either side, must return exactly its own address's value.
//!
//! The cache is small and direct-mapped so that both sides fill entries all
//! the time, and the same ones. The storm lasts `FPROBE_SIGNAL_SECS`
//! seconds (2 by default), twice: with the cache always on, then with its
//! switch, whose trials end (and switch the cache off) in handlers too.

use std::ffi::c_int;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use fprobe::{AddrIndex, HitCacheConfig, rcu};

#[path = "common/signal_storm.rs"]
mod signal_storm;

/// Addresses each side looks up: more than the cache's entries, so sets
/// are shared and refilled constantly.
const PER_SIDE: u64 = 24;
const KEY: u64 = 0x5bd1_e995;

/// The index of the current storm: always on, then switched.
static INDEX: [OnceLock<AddrIndex<u64>>; 2] = [OnceLock::new(), OnceLock::new()];
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static BAD: AtomicU64 = AtomicU64::new(0);
static SIGNALS: AtomicU64 = AtomicU64::new(0);

/// Address `i` of side `side` (0: the thread, 1: the handler).
fn addr(side: u64, i: u64) -> u64 {
    0x10_0000 + (side * PER_SIDE + i) * 64
}

/// Looks up every address of `side` and checks each value.
fn look_up_side(side: u64) {
    let index = INDEX[CURRENT.load(Ordering::Relaxed)].get().unwrap();
    let guard = rcu::read_lock();
    for i in 0..PER_SIDE {
        let a = addr(side, i);
        if index.get(a, &guard) != [a ^ KEY] {
            BAD.fetch_add(1, Ordering::Relaxed);
        }
    }
}

extern "C" fn on_sigusr1(_: c_int) {
    signal_storm::keeping_errno(|| {
        SIGNALS.fetch_add(1, Ordering::Relaxed);
        look_up_side(1);
    });
}

#[test]
#[cfg_attr(miri, ignore)] // signals, threads and wall-clock time
fn a_handler_lookup_never_tears_the_interrupted_fill() {
    signal_storm::install(on_sigusr1);
    // Always on (every lookup fills), then with the switch, whose trials
    // end (and switch the cache off) inside handlers as well as outside.
    for (which, adaptive) in [(0, false), (1, true)] {
        storm(which, adaptive);
    }
}

fn storm(which: usize, adaptive: bool) {
    let index = INDEX[which].get_or_init(|| {
        let index = AddrIndex::builder()
            .hit_cache(HitCacheConfig::new().entries(16).ways(1).adaptive(adaptive))
            .build()
            .unwrap();
        for side in 0..2 {
            for i in 0..PER_SIDE {
                let a = addr(side, i);
                index.insert(a, a ^ KEY).unwrap();
            }
        }
        index
    });
    CURRENT.store(which, Ordering::Relaxed);
    SIGNALS.store(0, Ordering::Relaxed);
    let rounds = signal_storm::storm_a_worker(
        // The handler must not allocate: make this thread's cache.
        || look_up_side(0),
        |stop| {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                look_up_side(0);
                rounds += 1;
            }
            rounds
        },
    );
    let signals = SIGNALS.load(Ordering::Relaxed);
    let s = index.hit_cache_stats().unwrap();
    eprintln!(
        "hit cache signal storm (adaptive: {adaptive}): {rounds} rounds of {PER_SIDE} lookups, \
         {signals} handlers; {s:?}"
    );
    assert_eq!(
        BAD.load(Ordering::Relaxed),
        0,
        "a lookup returned another address's values"
    );
    assert!(
        signals > 100,
        "too few signals handled to test anything: {signals}"
    );
    assert!(
        s.hits > 0 && s.misses > 0,
        "the cache was not exercised: {s:?}"
    );
    if adaptive {
        assert!(s.trials > 0, "no trial ran: {s:?}");
    }
}
