//! The thread's context: one thread-local block that a dispatch reaches
//! once, as the kernel reaches everything about the running task through
//! `current`.
//!
//! It holds:
//!
//! * the thread's RCU reader record (`rcu`), whose word is also the
//!   thread's one nesting word: read-side sections count in its low bits,
//!   and a running dispatch of the probe layer sets its
//!   [`DISPATCH`](crate::rcu::raw::DISPATCH) bit (`rcu/raw.rs`);
//! * the probe registry the thread dispatched through last, as the key of
//!   that registry's per-thread states and the thread's state there
//!   (`probe/registry.rs`);
//! * the recursion guard's levels above the first, its signal masks and
//!   whether the thread is ignored (`probe/recursion.rs`);
//! * the hit cache the thread looked up last, as that cache's key and the
//!   thread's state there (`cache/mod.rs`).
//!
//! # Invariants
//!
//! * Every field is used by the owning thread only: by its code and by
//!   signal handlers that interrupt it. Each change is a store of a value
//!   computed from the thread's own fields, undone or completed by the
//!   code that made it before it returns (the arguments are in the modules
//!   named above), so a signal handler finds the block as the interrupted
//!   code will next read it.
//! * `registry_key` and `registry_state` change only under the `DISPATCH`
//!   bit, by the thread's one outermost dispatch (the bit's own, or a held
//!   dispatch in a `DispatchSection`, which it borrows mutably, so none
//!   nests in another; `registry_key` may also be cleared, which only
//!   makes lookups miss). A dispatch that holds the bit therefore reads
//!   the pair at once, without the key-value-key check a lone
//!   thread-local cache needs: no other dispatch on the thread can
//!   rewrite it meanwhile.
//! * `hit_key` and `hit_local` the same way for hit caches: a lookup
//!   through a cache stores `BUSY` in `hit_key` before it reads
//!   `hit_local` or any entry and puts a key back only after its last
//!   access; `hit_local` is written only while `hit_key` reads `BUSY`, and
//!   a lookup that finds `BUSY` (a signal handler's, nested in one of the
//!   thread's own) touches neither. So whenever `hit_key` is a cache's
//!   key, `hit_local` is the thread's state in that cache.
//!
//! The block is const-initialised and has no destructor, so it is readable
//! at every point of a thread's life, thread-local destructors and signal
//! handlers included. In an executable its fields are reached with one
//! thread-pointer-relative access; in a `cdylib` the platform's dynamic
//! TLS model adds a call to `__tls_get_addr` per dispatch side (the block
//! being one, that call is made once).

use std::cell::Cell;

use crate::rcu::raw::ReaderRecord;

/// Context levels of the recursion guard: normal code and up to three
/// nested signal handlers (as the kernel's four contexts).
pub(crate) const MAX_LEVELS: usize = 4;

/// The thread's context; see the module docs.
pub(crate) struct Context {
    /// The thread's RCU reader record; null before the thread registers
    /// and after its exit handler gave the record back.
    pub(crate) rcu: Cell<*const ReaderRecord>,
    /// Key of the per-thread states of the registry this thread dispatched
    /// through last (never 0 for a live one: 0 matches nothing).
    pub(crate) registry_key: Cell<u64>,
    /// This thread's state in that registry, valid while the key matches
    /// the registry's current key.
    pub(crate) registry_state: Cell<*const ()>,
    /// Recursion guard: bit `l` (`l ≥ 1`) set while a handler of level `l`
    /// runs (level 0 is the record's `DISPATCH` bit), and the ignore bit.
    pub(crate) busy: Cell<u32>,
    /// Recursion guard: the signal mask of each level.
    pub(crate) masks: [Cell<u64>; MAX_LEVELS],
    /// Recursion guard: whether level 0's mask was read.
    pub(crate) mask0_read: Cell<bool>,
    /// Key of the hit cache this thread looked up last (0: none yet), or
    /// `BUSY` while one of its lookups runs through a cache
    /// (`cache/mod.rs`).
    pub(crate) hit_key: Cell<u64>,
    /// This thread's state in that cache, valid while `hit_key` is its key.
    pub(crate) hit_local: Cell<*const ()>,
}

std::thread_local! {
    static CONTEXT: Context = const {
        Context {
            rcu: Cell::new(std::ptr::null()),
            registry_key: Cell::new(0),
            registry_state: Cell::new(std::ptr::null()),
            busy: Cell::new(0),
            masks: [const { Cell::new(0) }; MAX_LEVELS],
            mask0_read: Cell::new(false),
            hit_key: Cell::new(0),
            hit_local: Cell::new(std::ptr::null()),
        }
    };
}

/// The calling thread's context.
#[inline(always)]
pub(crate) fn context() -> &'static Context {
    // SAFETY: `CONTEXT` is const-initialised and has no destructor, so it
    // lives as long as the thread; `Context` is `!Sync` (its cells), so the
    // reference cannot leave the thread.
    CONTEXT.with(|c| unsafe { &*(c as *const Context) })
}
