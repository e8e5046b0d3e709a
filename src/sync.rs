//! The one synchronisation shim of the crate.
//!
//! Every other module takes its atomics, fences, `UnsafeCell`, mutexes and
//! spin hints from here, never from `std::sync::atomic` directly, so that
//! `RUSTFLAGS="--cfg loom"` swaps the whole crate onto loom's model checker
//! in one place (the pattern of tokio's `src/loom/mod.rs` and crossbeam's
//! `primitive` module).
//!
//! Four build flavours:
//!
//! * normal builds: `std` atomics; the RCU read side uses a compiler fence
//!   and the writer side the process-wide barrier where the system offers
//!   one (`membarrier(2)`, `FlushProcessWriteBuffers`: `sys::barrier`);
//! * `cfg(miri)`: `std` atomics, but [`ASYMMETRIC_FENCES`] is `false`, so the
//!   read side issues real `SeqCst` fences (miri cannot model `membarrier`);
//! * `cfg(loom)`: loom's atomics, cells and mutexes, and again real fences
//!   (loom cannot model `membarrier` either, as seize notes);
//! * `cfg(fprobe_tsan)` (set by `scripts/tsan.sh` for ThreadSanitizer
//!   builds): `std` atomics, symmetric mode forced ([`ASYMMETRIC_FENCES`] is
//!   `false`), and every standalone fence the crate relies on replaced by an
//!   atomic read-modify-write TSan does track. TSan builds its
//!   happens-before graph from atomic accesses only and ignores
//!   `atomic_thread_fence` and `membarrier`, so an edge carried by a fence
//!   would be missing and it would report races that cannot happen. The
//!   replacements (see `rcu/raw.rs` and `objpool/raw.rs`) are each at least
//!   as strong as the fence they replace, so the TSan build checks the same
//!   protocol, only slower.

#![allow(dead_code, unused_imports)]

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, compiler_fence,
    fence,
};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

/// loom has no compiler fence; a real `SeqCst` fence is the conservative stand-in.
#[cfg(loom)]
pub(crate) fn compiler_fence(order: Ordering) {
    fence(order);
}

/// Whether the RCU may use asymmetric fences (compiler fence on the read
/// side, the process-wide barrier on the writer side). `false` under loom,
/// miri and ThreadSanitizer (`fprobe_tsan`), which model neither; the
/// run-time check for system support is separate (see `sys::barrier`).
pub(crate) const ASYMMETRIC_FENCES: bool = !cfg!(any(loom, miri, fprobe_tsan));

/// A cell whose accesses go through closures, so loom can track them.
///
/// Same API under both flavours (tokio's `UnsafeCell` shim).
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(
    #[cfg(not(loom))] std::cell::UnsafeCell<T>,
    #[cfg(loom)] loom::cell::UnsafeCell<T>,
);

impl<T> UnsafeCell<T> {
    #[cfg(not(loom))]
    pub(crate) const fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }

    #[cfg(loom)]
    pub(crate) fn new(value: T) -> Self {
        Self(loom::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a shared raw pointer to the contents.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        #[cfg(not(loom))]
        {
            f(self.0.get())
        }
        #[cfg(loom)]
        {
            self.0.with(f)
        }
    }

    /// Runs `f` with a mutable raw pointer to the contents.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        #[cfg(not(loom))]
        {
            f(self.0.get())
        }
        #[cfg(loom)]
        {
            self.0.with_mut(f)
        }
    }
}

/// One step of a wait loop: a CPU spin hint for the first iterations, then
/// yielding, then short sleeps, so a grace period that waits for a preempted
/// reader does not burn a core. Under loom every step yields to the model.
pub(crate) fn backoff(step: u32) {
    #[cfg(loom)]
    {
        let _ = step;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        if step < 64 {
            std::hint::spin_loop();
        } else if step < 128 {
            std::thread::yield_now();
        } else {
            let micros = 1u64 << ((step - 128) / 16).min(10);
            std::thread::sleep(std::time::Duration::from_micros(micros));
        }
    }
}

/// Pads and aligns a value to 128 bytes: two cache lines, because adjacent-line
/// prefetching on x86 makes 64-byte padding leak false sharing (the same
/// choice as crossbeam's `CachePadded` and the kernel's bench counters).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct CachePadded<T>(pub(crate) T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Synchronisation that is never part of a modelled protocol (statistics,
/// registries of per-thread caches): always `std`, even under loom, so it
/// can live in statics and thread-locals.
pub(crate) mod unmodelled {
    pub(crate) use std::sync::Mutex;
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
}
