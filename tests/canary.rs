//! Canaries: deliberately broken code each dynamic checker must catch.
//!
//! Every test here is `#[ignore]`d and wrong on purpose (undefined
//! behaviour that happens to pass when run plainly). `scripts/miri.sh`,
//! `scripts/tsan.sh` and `scripts/asan.sh` run them under their checker and
//! fail unless the checker reports them ("canary caught"): proof that the
//! checker is live and sees the crate's kind of bug. Never run them outside
//! a checker.

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Barrier};

use fprobe::rcu;

/// A Relaxed publication: the writer initialises an object and publishes
/// its pointer with a `Relaxed` store (it must be `Release`, as
/// `rcu_assign_pointer` is), the reader loads it `Relaxed` and reads the
/// object. Nothing orders the initialisation before the read: a data race
/// (miri, TSan).
#[test]
#[ignore = "canary: a data race miri and TSan must report"]
fn canary_relaxed_publication() {
    static SLOT: AtomicPtr<u64> = AtomicPtr::new(std::ptr::null_mut());
    let reader = std::thread::spawn(|| {
        loop {
            let p = SLOT.load(Ordering::Relaxed);
            if !p.is_null() {
                // SAFETY: none, deliberately: the Relaxed publication does
                // not make the initialisation visible (the canary's bug).
                return unsafe { p.read() };
            }
            std::thread::yield_now();
        }
    });
    let obj = Box::into_raw(Box::new(42u64));
    SLOT.store(obj, Ordering::Relaxed); // BUG: must be Release.
    let seen = reader.join().unwrap();
    assert_eq!(seen, 42);
    // SAFETY: the reader has finished; `obj` came from `Box::into_raw`.
    drop(unsafe { Box::from_raw(SLOT.swap(std::ptr::null_mut(), Ordering::Relaxed)) });
}

/// Reclamation without a grace period: the updater unpublishes an object and
/// frees it at once instead of after `rcu::synchronize`, while a reader that
/// entered its read-side section before still uses it: a heap
/// use-after-free (ASan, miri). The steps are sequenced with barriers, so
/// the free always comes first.
#[test]
#[ignore = "canary: a use-after-free ASan and miri must report"]
fn canary_free_without_grace_period() {
    let slot = Arc::new(AtomicPtr::new(Box::into_raw(Box::new(vec![7u64; 16]))));
    let loaded = Arc::new(Barrier::new(2));
    let freed = Arc::new(Barrier::new(2));
    let reader = {
        let (slot, loaded, freed) = (slot.clone(), loaded.clone(), freed.clone());
        std::thread::spawn(move || {
            let guard = rcu::read_lock();
            let p = slot.load(Ordering::Acquire);
            loaded.wait();
            freed.wait();
            // SAFETY: none, deliberately: the updater freed the object
            // without waiting for this read-side section (the canary's bug).
            let sum: u64 = unsafe { (*p).iter().sum() };
            drop(guard);
            sum
        })
    };
    loaded.wait();
    let old = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
    // BUG: `rcu::synchronize()` belongs here.
    // SAFETY: none, deliberately (see above); `old` came from `Box::into_raw`.
    drop(unsafe { Box::from_raw(old) });
    freed.wait();
    assert_eq!(reader.join().unwrap(), 7 * 16);
}
