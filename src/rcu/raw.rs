//! The grace-period protocol: reader records and `synchronize`.
//!
//! This is the core that loom models directly (the `loom_tests` module at
//! the end builds a private [`Domain`]); `rcu/domain.rs` puts a thread-local
//! cache and a process-wide domain in front of it. Its `unsafe` is confined
//! to the record list's pointers (following them, and freeing the records
//! when a domain drops), each justified where it is.
//!
//! # The protocol
//!
//! A [`Domain`] holds one global word `gp`, laid out as
//! `epoch << NEST_BITS | SYMMETRIC_BIT? | 1`, and a lock-free, append-only list of
//! [`ReaderRecord`]s, one claimed by each reader thread.
//!
//! Each record holds one word `ctr` that only its owner writes:
//! `epoch << NEST_BITS | nesting`. `nesting == 0` means the thread is
//! outside any read-side critical section (quiescent).
//!
//! * **enter** (outermost): `ctr = gp` (one load, one `Release` store — a
//!   plain store on x86: nesting becomes 1 and the epoch is the current one;
//!   Release so that a scan which reads the new epoch is ordered after the
//!   thread's earlier sections), then a *compiler* fence
//!   (asymmetric mode) or a `SeqCst` fence (symmetric mode, flagged by
//!   [`SYMMETRIC_BIT`] in the `gp` value just loaded).
//!   **enter** (nested): `ctr = ctr + 1`.
//! * **exit**: `ctr = ctr - 1`, a `Release` store. Guards may drop in any
//!   order: the epoch stays the outermost section's until nesting is 0.
//!
//! No read-modify-write, no fence in asymmetric mode, and the only shared
//! line written is the reader's own record. Each step is a single store of a
//! value computed from a single load of the thread's own word, so a signal
//! handler that nests a critical section between the load and the store
//! leaves the word exactly as it found it: the read side is async-signal-safe.
//!
//! * **synchronize** (serialised by `gp_lock`):
//!   1. `heavy_barrier()`: the process-wide barrier (`membarrier(PRIVATE_EXPEDITED)`
//!      on Linux, `FlushProcessWriteBuffers` on Windows: `sys::barrier`) or
//!      a `SeqCst` fence.
//!      Pairs with the fence at *enter*: for every reader, either its `ctr`
//!      store is visible to the scan below, or every load it makes after
//!      *enter* sees the updater's stores made before `synchronize` (the
//!      store-buffering pattern, forbidden with a fence on both sides;
//!      the process-wide barrier runs that fence on the reader's CPU by IPI).
//!   2. `gp += 1 epoch`, a `Release` store; readers load `gp` with `Acquire`,
//!      so a reader that sees the new epoch also sees every store the updater
//!      made before `synchronize`: such a reader cannot hold an old pointer,
//!      and the scan may skip it.
//!   3. For every record, wait while `ctr` is active with an epoch other than
//!      the new one (`Acquire` loads, pairing with the `Release` at *exit*:
//!      everything the reader read inside its section happens-before the
//!      caller frees anything).
//!
//! **Invariant (grace period).** When `synchronize` returns, every read-side
//! critical section that was running when it was called has ended.
//! Readers that began later either published an epoch the scan accepts
//! (they saw the new `gp`, hence the updater's stores) or were invisible to
//! the scan (then step 1 guarantees they see the updater's stores).
//!
//! A reader that read a stale `gp` merely makes the scan wait for it until it
//! exits: conservative, never unsafe. A thread that enters and exits at a high
//! rate cannot starve the scan: each new section loads the new epoch once the
//! store is visible.
//!
//! **ThreadSanitizer build** (`--cfg fprobe_tsan`, `scripts/tsan.sh`). TSan
//! ignores standalone fences (and cannot see `membarrier`), so under that
//! cfg the symmetric mode is forced and each `SeqCst` fence of the protocol
//! becomes a `SeqCst` read-modify-write that TSan tracks: the reader's
//! *enter* stores `ctr` with a `swap` (a locked instruction, a full barrier
//! on x86, and a release TSan records), and step 1 of `synchronize` is a
//! `fetch_add(0)` on `gp` (a full barrier too, and a release that every
//! reader's `Acquire` load of `gp` pairs with, so TSan sees the updater's
//! earlier stores ordered before any section that reads that `gp`).
//!
//! Epochs are 48 bits wide: a wrap needs 2^48 grace periods while one reader
//! stays inside a single section, which cannot happen in practice; the scan
//! compares for equality only, so a wrap could at worst make it wait longer.

use crate::sync::{AtomicBool, AtomicPtr, AtomicU64, Ordering, backoff, fence};

/// Bits of `ctr` below the epoch: the nesting count and [`SYMMETRIC_BIT`].
pub(crate) const NEST_BITS: u32 = 16;
/// Mask of the nesting count.
pub(crate) const NEST_MASK: u64 = (1 << (NEST_BITS - 1)) - 1;
/// Set in `gp` (and so in every active `ctr`) when readers must fence:
/// carrying the mode in the word the reader loads anyway saves a load.
pub(crate) const SYMMETRIC_BIT: u64 = 1 << (NEST_BITS - 1);
/// The nesting a running dispatch of the probe layer takes: the top bit of
/// the nesting count, set while the thread's outermost dispatch runs
/// ([`ReaderRecord::begin_dispatch`]). A dispatch is a read-side section
/// like any other to `synchronize`; to the probe layer the bit also says
/// that a handler of the thread's first context level may be running (the
/// recursion guard's level 0) and that its per-thread context is held.
pub(crate) const DISPATCH: u64 = 1 << (NEST_BITS - 2);
/// Mask of the nesting count of plain read guards (below [`DISPATCH`]).
const GUARD_MASK: u64 = DISPATCH - 1;
/// One epoch step of `gp`.
pub(crate) const EPOCH_ONE: u64 = 1 << NEST_BITS;

/// How a domain orders readers against `synchronize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FenceMode {
    /// Compiler fence on the read side, the process-wide barrier
    /// (`membarrier(2)`, `FlushProcessWriteBuffers`) in `synchronize`.
    Asymmetric,
    /// `SeqCst` fences on both sides (no process-wide barrier: macOS,
    /// FreeBSD, old kernels; loom, miri).
    Symmetric,
}

/// One reader thread's state, on its own pair of cache lines.
#[repr(align(128))]
pub(crate) struct ReaderRecord {
    /// `epoch << NEST_BITS | nesting`.
    ///
    /// Invariant: stored only by the thread that owns the record (claimed
    /// `in_use`), read by that thread with `Relaxed` and by `synchronize`
    /// with `Acquire`.
    ctr: AtomicU64,
    /// Invariant: `true` exactly while one thread owns the record.
    in_use: AtomicBool,
    /// Next record in the domain list. Invariant: immutable once the record
    /// has been published on the list.
    next: AtomicPtr<ReaderRecord>,
}

impl ReaderRecord {
    /// A record of a domain whose `gp` has `mode_bit` (0 or
    /// [`SYMMETRIC_BIT`]): a quiescent word carries the domain's mode from
    /// the start, for [`begin_dispatch_keeping_epoch`](Self::begin_dispatch_keeping_epoch).
    fn new(mode_bit: u64) -> Self {
        Self {
            ctr: AtomicU64::new(mode_bit),
            in_use: AtomicBool::new(true),
            next: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Enters a read-side critical section (nestable). Owner thread only.
    ///
    #[inline(always)]
    pub(crate) fn enter(&self, gp: &AtomicU64) {
        let v = self.ctr.load(Ordering::Relaxed);
        if v & NEST_MASK == 0 {
            // The epoch's `gp` has nesting 1.
            self.enter_outermost(gp, 0);
        } else {
            if v & GUARD_MASK == GUARD_MASK {
                nesting_overflow();
            }
            // Release: as for the outermost store in `open_outermost`.
            self.ctr.store(v + 1, Ordering::Release);
        }
    }

    /// Enters the outermost section: `ctr = gp + extra` (nesting 1 +
    /// `extra`), then the fence that orders it before the section's loads.
    #[inline(always)]
    fn enter_outermost(&self, gp: &AtomicU64, extra: u64) {
        // Acquire: pairs with the Release store of a new epoch in
        // `synchronize`; a reader that sees that epoch sees everything
        // the updater stored before calling `synchronize`.
        let g = gp.load(Ordering::Acquire);
        self.open_outermost(g + extra);
    }

    /// Stores `word` (active, carrying the domain's mode bit) as the
    /// outermost section's, and orders it before the section's loads.
    #[inline(always)]
    fn open_outermost(&self, word: u64) {
        if cfg!(fprobe_tsan) {
            // ThreadSanitizer build: the store and the fence below as
            // one SeqCst RMW, which TSan tracks (module docs); pairs with
            // the `fetch_add(0)` in `Domain::heavy_barrier`.
            self.ctr.swap(word, Ordering::SeqCst);
            return;
        }
        // Release (a plain store on x86): a grace period that skips this
        // record because it reads the new epoch here must still be
        // ordered after this thread's *previous* sections; C++20 release
        // sequences no longer extend over later plain stores of the same
        // thread, so the exit store's Release alone would not carry that
        // edge (a model checker that follows C++20 reports the race).
        self.ctr.store(word, Ordering::Release);
        order_section(word);
    }

    /// Starts a dispatch of the probe layer: a read-side section that also
    /// sets [`DISPATCH`]. Returns `false`, changing nothing, when a
    /// dispatch already runs on the thread (the caller nests a plain
    /// section instead). Owner thread only; one load and one store of the
    /// thread's own word (plus the `gp` load and the fence outside any
    /// section), so a signal handler that runs between them leaves the
    /// word as it found it, as for [`enter`](Self::enter).
    #[inline(always)]
    pub(crate) fn begin_dispatch(&self, gp: &AtomicU64) -> bool {
        let v = self.ctr.load(Ordering::Relaxed);
        if v & NEST_MASK == 0 {
            // Nesting `DISPATCH`: `gp`'s 1 and `DISPATCH - 1`.
            self.enter_outermost(gp, DISPATCH - 1);
            return true;
        }
        self.begin_dispatch_in_section(v)
    }

    /// [`begin_dispatch`](Self::begin_dispatch) that keeps the epoch the
    /// word holds, from the thread's last section, instead of loading the
    /// current one: for exits, whose entry's section loaded it shortly
    /// before. Safe with any epoch: a grace period skips a section only
    /// when its epoch is the one the grace period published, and a word
    /// holds that epoch only if this thread loaded it (Acquire) after it
    /// was published, so after every store the updater made before; with
    /// an older epoch the grace period waits for the section to end. The
    /// fence is the one outermost sections take (the mode bit is in every
    /// word, quiescent ones included: `new`, `reset_dead`).
    #[inline(always)]
    pub(crate) fn begin_dispatch_keeping_epoch(&self) -> bool {
        let v = self.ctr.load(Ordering::Relaxed);
        if v & NEST_MASK == 0 {
            self.open_outermost(v + DISPATCH);
            return true;
        }
        self.begin_dispatch_in_section(v)
    }

    /// A dispatch that finds the word `v` inside a section: `false` if it
    /// is a dispatch's, else the dispatch nests in it (its epoch and fence
    /// serve).
    #[inline(always)]
    fn begin_dispatch_in_section(&self, v: u64) -> bool {
        if v & DISPATCH != 0 {
            return false;
        }
        // Release: as in `open_outermost`.
        self.ctr.store(v + DISPATCH, Ordering::Release);
        true
    }

    /// Ends a dispatch that [`begin_dispatch`](Self::begin_dispatch)
    /// started. Owner thread only.
    #[inline(always)]
    pub(crate) fn end_dispatch(&self) {
        let v = self.ctr.load(Ordering::Relaxed);
        debug_assert!(v & DISPATCH != 0, "rcu: end_dispatch without begin");
        // Keep the compiler from sinking the dispatch's loads below the store.
        crate::sync::compiler_fence(Ordering::SeqCst);
        // Release: as in `exit`.
        self.ctr.store(v - DISPATCH, Ordering::Release);
    }

    /// Whether a dispatch runs on the thread. Owner thread only.
    #[inline(always)]
    pub(crate) fn dispatching(&self) -> bool {
        self.ctr.load(Ordering::Relaxed) & DISPATCH != 0
    }

    /// Leaves a read-side critical section. Owner thread only.
    ///
    /// A decrement, not a restore of the value `enter` found, so guards may
    /// be dropped in any order. One load and one store of the thread's own
    /// word: a signal handler that runs a whole section between them leaves
    /// the word as it found it.
    #[inline(always)]
    pub(crate) fn exit(&self) {
        let v = self.ctr.load(Ordering::Relaxed);
        debug_assert!(v & NEST_MASK != 0, "rcu: exit without enter");
        // Keep the compiler from sinking section loads below the store.
        crate::sync::compiler_fence(Ordering::SeqCst);
        // Release: pairs with the Acquire load in `wait_for_readers`; every
        // access of the section happens-before the grace period ends. Only
        // the outermost exit needs it, but on x86 a Release store is a plain
        // store, and not branching is cheaper.
        self.ctr.store(v - 1, Ordering::Release);
    }

    /// Current nesting depth. Owner thread only.
    #[inline]
    pub(crate) fn nesting(&self) -> u64 {
        self.ctr.load(Ordering::Relaxed) & NEST_MASK
    }

    /// Forces the record quiescent; used only for records whose owner no
    /// longer exists (the child side of `fork`).
    pub(crate) fn reset_dead(&self) {
        // Release, both: pair with the Acquire loads of `ctr` in
        // `wait_for_readers` and of `in_use` in `register`, as the owner's
        // own exit and unregister would.
        let mode_bit = self.ctr.load(Ordering::Relaxed) & SYMMETRIC_BIT;
        self.ctr.store(mode_bit, Ordering::Release);
        self.in_use.store(false, Ordering::Release);
    }
}

/// The fence after an outermost section's `ctr` store, whose value `w`
/// carries the domain's mode (the nesting bits added to it leave the mode
/// bit alone): none at all in the canary build; a `SeqCst`
/// fence in symmetric mode (pairs with the SeqCst fence in
/// `Domain::heavy_barrier`: store buffering, our `ctr` store against the
/// updater's stores); else a compiler fence (pairs with the process-wide
/// barrier, `membarrier(2)` or `FlushProcessWriteBuffers`, in
/// `Domain::heavy_barrier`, which runs a full fence on this CPU; the
/// compiler must not move the section's loads above the `ctr` store).
#[inline(always)]
fn order_section(w: u64) {
    if cfg!(fprobe_canary) {
        // Deliberately broken build (`--cfg fprobe_canary`): no fence at
        // all, so the checkers must report a reader that sees a reclaimed
        // object.
        return;
    }
    if w & SYMMETRIC_BIT != 0 {
        symmetric_fence();
    }
    crate::sync::compiler_fence(Ordering::SeqCst);
}

/// Out of line: the asymmetric mode's path stays straight.
#[cold]
#[inline(never)]
fn symmetric_fence() {
    fence(Ordering::SeqCst);
}

#[cold]
#[inline(never)]
fn nesting_overflow() -> ! {
    // Aborting rather than panicking: this can be reached from a signal
    // handler, and 16,383 nested sections is always a leak of guards.
    eprintln!("fprobe::rcu: read-side nesting overflow (more than 16383 nested guards)");
    std::process::abort()
}

const fn initial_gp(mode: FenceMode) -> u64 {
    match mode {
        FenceMode::Asymmetric => EPOCH_ONE | 1,
        FenceMode::Symmetric => EPOCH_ONE | SYMMETRIC_BIT | 1,
    }
}

/// A set of reader records sharing one grace-period counter.
pub(crate) struct Domain {
    /// `epoch << NEST_BITS | mode bit | 1`; only `synchronize` (and
    /// `set_mode`, before any use) stores it.
    pub(crate) gp: crate::sync::CachePadded<AtomicU64>,
    /// Head of the append-only record list.
    head: AtomicPtr<ReaderRecord>,
    /// Serialises grace periods (and their epoch increments). A plain flag
    /// rather than a mutex so the child of `fork` can reset it when the
    /// parent's reclaimer thread was inside `synchronize` at the fork.
    gp_lock: AtomicBool,
}

impl Domain {
    /// A domain whose readers and writers use `mode`.
    #[cfg(not(loom))]
    pub(crate) const fn new(mode: FenceMode) -> Self {
        Self {
            gp: crate::sync::CachePadded(AtomicU64::new(initial_gp(mode))),
            head: AtomicPtr::new(std::ptr::null_mut()),
            gp_lock: AtomicBool::new(false),
        }
    }

    /// A domain whose readers and writers use `mode`.
    #[cfg(loom)]
    pub(crate) fn new(mode: FenceMode) -> Self {
        Self {
            gp: crate::sync::CachePadded(AtomicU64::new(initial_gp(mode))),
            head: AtomicPtr::new(std::ptr::null_mut()),
            gp_lock: AtomicBool::new(false),
        }
    }

    /// The fence mode readers of this domain use.
    pub(crate) fn mode(&self) -> FenceMode {
        if self.gp.load(Ordering::Relaxed) & SYMMETRIC_BIT != 0 {
            FenceMode::Symmetric
        } else {
            FenceMode::Asymmetric
        }
    }

    /// Sets the fence mode. Only before the first `register`/`synchronize`
    /// (the process-wide domain does it inside a `Once`, whose completion
    /// orders this store before every later use).
    pub(crate) fn set_mode(&self, mode: FenceMode) {
        self.gp.store(initial_gp(mode), Ordering::Relaxed);
    }

    /// Claims a free record or appends a new one. Lock-free; allocates when
    /// no free record exists.
    pub(crate) fn register(&self) -> &ReaderRecord {
        let mut cur = self.head.load(Ordering::Acquire);
        while !cur.is_null() {
            // SAFETY: records on the list are never freed while the domain
            // lives (`Drop` frees them with exclusive access), and `&self`
            // keeps the domain alive.
            let rec = unsafe { &*cur };
            if !rec.in_use.load(Ordering::Relaxed)
                && rec
                    .in_use
                    // Acquire: pairs with the Release in `unregister`; the
                    // previous owner's last ctr store (quiescent) is visible.
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return rec;
            }
            cur = rec.next.load(Ordering::Relaxed);
        }
        let mode_bit = self.gp.load(Ordering::Relaxed) & SYMMETRIC_BIT;
        let rec = Box::into_raw(Box::new(ReaderRecord::new(mode_bit)));
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: `rec` is ours until the CAS below publishes it.
            unsafe { &*rec }.next.store(head, Ordering::Relaxed);
            // Release: publishes the initialised record to `wait_for_readers`
            // and `register`, which load `head` with Acquire.
            match self
                .head
                .compare_exchange_weak(head, rec, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
        // SAFETY: published records live as long as the domain.
        unsafe { &*rec }
    }

    /// Gives a quiescent record back for reuse by another thread.
    pub(crate) fn unregister(&self, rec: &ReaderRecord) {
        debug_assert_eq!(rec.nesting(), 0);
        // Release: pairs with the Acquire CAS in `register`.
        rec.in_use.store(false, Ordering::Release);
    }

    /// The full barrier `synchronize` pairs with each reader's enter fence.
    fn heavy_barrier(&self) {
        if cfg!(fprobe_canary) {
            return;
        }
        if cfg!(fprobe_tsan) {
            // The fence as a SeqCst RMW TSan can see (module docs). Release:
            // pairs with the readers' Acquire loads of `gp`.
            self.gp.fetch_add(0, Ordering::SeqCst);
            return;
        }
        match self.mode() {
            FenceMode::Symmetric => fence(Ordering::SeqCst),
            FenceMode::Asymmetric => {
                #[cfg(not(any(loom, miri)))]
                crate::sys::barrier::barrier();
                // miri and loom cannot model the barrier: the full fence
                // it would run, here.
                #[cfg(any(loom, miri))]
                fence(Ordering::SeqCst);
            }
        }
    }

    /// Waits until every read-side critical section that was running when
    /// the call began has ended. Blocks; must not be called from inside a
    /// read-side critical section of this domain (it would wait for itself).
    pub(crate) fn synchronize(&self) {
        let mut step = 0u32;
        // Acquire: pairs with the Release in the unlock below; the previous
        // grace period's `gp` store is ours to build on.
        while self
            .gp_lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            backoff(step);
            step = step.saturating_add(1);
        }
        // Step 1: pairs with each reader's enter fence (see module docs).
        self.heavy_barrier();
        // Step 2: the gp_lock serialises stores to `gp`; Relaxed load is ours.
        let target = self.gp.load(Ordering::Relaxed).wrapping_add(EPOCH_ONE);
        // Release: pairs with the Acquire load in `ReaderRecord::enter`.
        self.gp.store(target, Ordering::Release);
        // Step 3.
        self.wait_for_readers(target >> NEST_BITS);
        // Release: pairs with the Acquire above.
        self.gp_lock.store(false, Ordering::Release);
    }

    /// In the child of `fork`: only the calling thread survived, so every
    /// other record belongs to a thread that no longer exists, and the grace
    /// period lock may be held by one of them.
    pub(crate) fn after_fork_child(&self, survivor: *const ReaderRecord) {
        self.for_each_record(|r| {
            if !std::ptr::eq(r, survivor) && r.in_use.load(Ordering::Relaxed) {
                r.reset_dead();
            }
        });
        // Release: pairs with the Acquire of the next `synchronize`'s lock
        // (the parent's holder, if any, does not exist in the child).
        self.gp_lock.store(false, Ordering::Release);
    }

    fn wait_for_readers(&self, epoch: u64) {
        // Acquire: pairs with the Release CAS that published each record in
        // `register`; the records are initialised.
        let mut cur = self.head.load(Ordering::Acquire);
        while !cur.is_null() {
            // SAFETY: published records live as long as the domain.
            let rec = unsafe { &*cur };
            let mut step = 0u32;
            loop {
                // Acquire: pairs with the Release store in `ReaderRecord::exit`.
                let v = rec.ctr.load(Ordering::Acquire);
                if v & NEST_MASK == 0 || v >> NEST_BITS == epoch {
                    break;
                }
                backoff(step);
                step = step.saturating_add(1);
            }
            cur = rec.next.load(Ordering::Relaxed);
        }
    }

    /// Calls `f` on every record of the domain.
    pub(crate) fn for_each_record(&self, mut f: impl FnMut(&ReaderRecord)) {
        // Acquire: as in `wait_for_readers`.
        let mut cur = self.head.load(Ordering::Acquire);
        while !cur.is_null() {
            // SAFETY: published records live as long as the domain.
            let rec = unsafe { &*cur };
            f(rec);
            cur = rec.next.load(Ordering::Relaxed);
        }
    }

    /// Number of records (threads ever registered at once).
    pub(crate) fn records(&self) -> (usize, usize) {
        let (mut all, mut used) = (0, 0);
        self.for_each_record(|r| {
            all += 1;
            used += usize::from(r.in_use.load(Ordering::Relaxed));
        });
        (all, used)
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        let mut cur = self.head.load(Ordering::Relaxed);
        while !cur.is_null() {
            // SAFETY: `&mut self`: no thread can use the records any more;
            // each was created by `Box::into_raw` in `register`.
            let rec = unsafe { Box::from_raw(cur) };
            cur = rec.next.load(Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! loom models of the grace-period protocol on a private domain. The
    //! updaters publish with Release stores and the readers load with
    //! Acquire, as the users of the RCU do; the models check that a reader
    //! never sees an object reclaimed under it.
    //!
    //! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release --lib loom`

    use super::*;
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicUsize;

    /// Two objects; `freed[i]` is set when object `i` is reclaimed, `done`
    /// once the writer has finished.
    struct World {
        domain: Domain,
        current: AtomicUsize,
        freed: [AtomicBool; 2],
        done: AtomicBool,
    }

    /// Runs `reader` on one thread against a writer on another (loom
    /// explores spawned threads) that unpublishes object 0, waits for a
    /// grace period, reclaims it and sets `done` (Release). `reader` gets
    /// the world and its own record.
    fn world_model(reader: fn(&World, &ReaderRecord)) {
        loom::model(move || {
            let w = Arc::new(World {
                domain: Domain::new(FenceMode::Symmetric),
                current: AtomicUsize::new(0),
                freed: [AtomicBool::new(false), AtomicBool::new(false)],
                done: AtomicBool::new(false),
            });
            let r = w.clone();
            let reader = loom::thread::spawn(move || reader(&r, r.domain.register()));
            let writer = loom::thread::spawn(move || {
                w.current.store(1, Ordering::Release);
                w.domain.synchronize();
                w.freed[0].store(true, Ordering::Relaxed);
                w.done.store(true, Ordering::Release);
            });
            reader.join().unwrap();
            writer.join().unwrap();
        });
    }

    /// A reader that entered before `synchronize` never sees its object
    /// reclaimed, whatever the interleaving.
    #[test]
    fn reader_never_sees_reclaimed_object() {
        world_model(|w, rec| {
            rec.enter(&w.domain.gp);
            let i = w.current.load(Ordering::Acquire);
            assert!(
                !w.freed[i].load(Ordering::Relaxed),
                "reader saw a reclaimed object"
            );
            rec.exit();
            w.domain.unregister(rec);
        });
    }

    /// Nested sections keep the outer section's protection. (Two concurrent
    /// grace periods exceed loom's branch budget through the spinning
    /// `gp_lock`; `tests/rcu.rs` stresses that case.)
    #[test]
    fn nested_reader() {
        world_model(|w, rec| {
            rec.enter(&w.domain.gp);
            rec.enter(&w.domain.gp);
            let i = w.current.load(Ordering::Acquire);
            rec.exit();
            assert!(!w.freed[i].load(Ordering::Relaxed));
            rec.exit();
        });
    }

    /// Runs `reader` on one thread against a writer on another that
    /// unpublishes object 0, waits for a grace period and "frees" it with
    /// an exclusive write. The objects are loom cells, so loom reports any
    /// read of object 0 that the free is not ordered after. `reader` gets
    /// the domain, its own record, and `read`, which loads the current
    /// object's index and reads the object.
    fn against_reclaim(reader: fn(&Domain, &ReaderRecord, &dyn Fn() -> u64)) {
        loom::model(move || {
            let domain = Arc::new(Domain::new(FenceMode::Symmetric));
            let current = Arc::new(AtomicUsize::new(0));
            let objects = Arc::new([
                crate::sync::UnsafeCell::new(1u64),
                crate::sync::UnsafeCell::new(2u64),
            ]);
            let (d, c, o) = (domain.clone(), current.clone(), objects.clone());
            let reader = loom::thread::spawn(move || {
                let read = || {
                    let i = c.load(Ordering::Acquire);
                    // SAFETY: (model) a shared read of the object this
                    // section loaded; loom checks it against the "free".
                    o[i].with(|p| unsafe { *p })
                };
                reader(&d, d.register(), &read);
            });
            let writer = loom::thread::spawn(move || {
                current.store(1, Ordering::Release);
                domain.synchronize();
                // SAFETY: (model) the grace period has ended every reader of
                // object 0, which is what loom checks.
                objects[0].with_mut(|p| unsafe { *p = 0 });
            });
            reader.join().unwrap();
            writer.join().unwrap();
        });
    }

    /// A dispatch section (the probe layer's: `begin_dispatch`, with and
    /// inside a plain section) protects what it loads as a plain one
    /// does, across two dispatches in a row (as an entry, then its exit):
    /// the "free" of the old object comes after every read of it. The
    /// canary build (no reader fence) must fail here too.
    #[test]
    fn dispatch_sections_are_waited_for() {
        against_reclaim(|d, rec, read| {
            for inside_guard in [false, true] {
                if inside_guard {
                    rec.enter(&d.gp);
                }
                assert!(rec.begin_dispatch(&d.gp), "outermost dispatch");
                assert!(!rec.begin_dispatch(&d.gp), "a nested one is refused");
                assert_ne!(read(), 0, "reader saw a reclaimed object");
                rec.end_dispatch();
                if inside_guard {
                    rec.exit();
                }
            }
        });
    }

    /// A reader whose *earlier* section used the old object, and whose next
    /// section already shows the new epoch when the grace period scans it:
    /// the reclaimer's write to the object must still happen after the read.
    #[test]
    fn earlier_section_is_ordered_before_reclaim() {
        against_reclaim(|d, rec, read| {
            for _ in 0..2 {
                rec.enter(&d.gp);
                let _ = read();
                rec.exit();
            }
        });
    }

    /// After `synchronize` returns, a reader that starts afterwards sees the
    /// new object, never the reclaimed one.
    #[test]
    fn new_reader_sees_new_object() {
        world_model(|w, rec| {
            for _ in 0..2 {
                let after = w.done.load(Ordering::Acquire);
                rec.enter(&w.domain.gp);
                let i = w.current.load(Ordering::Acquire);
                if after {
                    assert_eq!(i, 1, "new reader saw the old object");
                }
                assert!(!w.freed[i].load(Ordering::Relaxed));
                rec.exit();
            }
        });
    }
}
