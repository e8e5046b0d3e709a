//! Magazines: each thread's own small stack of free object indices, the
//! pool's fast path, and the handshake that lets another thread take
//! objects out of it.
//!
//! # The handshake
//!
//! A magazine's `len` and `slots` are used by one thread at a time: its
//! *owner* inside a **section** (a pop or push on the magazine), or a
//! *claimer* (a popper stealing from it, or the pool's teardown). The owner
//! pays no atomic read-modify-write and, with `membarrier(2)`, no fence;
//! the claimer pays for both, as in the crate's RCU:
//!
//! ```text
//! owner (enter)                     claimer (claim)
//!   busy = 1                          CAS claim 0 → 1 (or dead = 1)
//!   compiler fence                    membarrier(2)
//!   if claim != 0 or dead: back off   if busy != 0: back off
//!   ... len, slots ...                ... len, slots ...
//!   busy = 0 (Release)                claim = 0 (Release)
//! ```
//!
//! This is store buffering: each side stores its flag, then loads the
//! other's. `membarrier(2)` runs a full fence on every CPU that runs a
//! thread of the process, so once it returns either the owner's `busy = 1`
//! is visible to the claimer (which backs off), or the owner's load of
//! `claim` comes after the barrier and sees the claim (the owner backs
//! off), or the owner's section ended before the barrier (the claimer's
//! Acquire load of `busy = 0` sees everything it did). Both may back off;
//! they can never both proceed. (`FlushProcessWriteBuffers` on Windows
//! gives the same guarantee: `rcu`, "Writer-side barrier".) Without a
//! process-wide barrier (macOS, FreeBSD, old kernels,
//! `FPROBE_RCU_NO_MEMBARRIER`, miri, loom, ThreadSanitizer) both sides run
//! a `SeqCst` fence instead; the mode is the RCU domain's, fixed for the
//! process (`rcu::asymmetric_fences`).
//!
//! # Signals and preemption
//!
//! * A signal handler that pops or pushes while its thread is inside a
//!   section finds `busy` set and leaves the magazine alone (the pool
//!   falls back to the depot). A handler that runs between two sections
//!   runs a whole section of its own and leaves `busy` as it found it.
//! * A claimer never waits: an owner preempted inside a section makes the
//!   claimer back off and try another magazine. The teardown alone waits
//!   for sections in flight.
//! * An owner never waits: a claimed magazine sends it to the depot.

use crate::sync::{AtomicU32, Ordering, UnsafeCell, compiler_fence, fence};

/// The most objects a magazine holds.
pub(crate) const MAX_MAGAZINE: usize = 64;

/// One thread's stack of free object indices.
#[repr(align(128))]
pub(crate) struct Magazine {
    /// 1 while the owner is inside a section. Invariant: stored only by
    /// the owning thread (a signal handler on it restores what it found).
    busy: AtomicU32,
    /// 1 while a claimer holds the magazine. Invariant: set only by a CAS
    /// from 0, cleared only by the thread whose CAS set it.
    claim: AtomicU32,
    /// Number of indices in `slots`. Invariant: written only by the thread
    /// using the magazine (owner in a section, or claimer); others read it
    /// as a hint.
    len: AtomicU32,
    /// `slots[..len]` are indices of free objects this magazine owns.
    slots: [UnsafeCell<u32>; MAX_MAGAZINE],
}

// SAFETY: `slots` is used by one thread at a time under the handshake of
// the module docs; every other field is atomic.
unsafe impl Sync for Magazine {}
// SAFETY: plain integers.
unsafe impl Send for Magazine {}

impl Magazine {
    pub(crate) fn new() -> Self {
        Self {
            busy: AtomicU32::new(0),
            claim: AtomicU32::new(0),
            len: AtomicU32::new(0),
            slots: std::array::from_fn(|_| UnsafeCell::new(0)),
        }
    }

    /// Starts a section; `false` (and no section) when the thread is
    /// already inside one (a signal handler interrupted it), the magazine
    /// is claimed, or `dead` is set.
    ///
    /// # Safety
    ///
    /// Called by the owning thread only (the one [`Magazines::mine`] gave
    /// the magazine to): `busy` is the owner's flag, and a second thread
    /// entering would use `len` and `slots` alongside the owner.
    #[inline(always)]
    pub(crate) unsafe fn enter(&self, asymmetric: bool, dead: &crate::sync::AtomicBool) -> bool {
        // Relaxed: only this thread stores `busy`.
        if self.busy.load(Ordering::Relaxed) != 0 {
            return false;
        }
        // Relaxed: the fence below (SeqCst mode) or membarrier(2) run by
        // the claimer (asymmetric mode) orders it before the loads (module
        // docs).
        self.busy.store(1, Ordering::Relaxed);
        if cfg!(fprobe_canary) {
            // Deliberately broken build (`--cfg fprobe_canary`): no fence on
            // either side of the handshake, so loom must report an owner and
            // a stealer using the slots at once.
        } else if asymmetric {
            // Pairs with membarrier(2) in `claim` and in the teardown.
            compiler_fence(Ordering::SeqCst);
        } else {
            // Pairs with the SeqCst fence in `claim` and in the teardown.
            fence(Ordering::SeqCst);
        }
        // Acquire: pairs with the Release in `release`; what the last
        // claimer did to `len` and `slots` is visible. `dead` Relaxed: the
        // handshake orders it (the teardown stores it before its barrier).
        if self.claim.load(Ordering::Acquire) != 0 || dead.load(Ordering::Relaxed) {
            // SAFETY: ends the section just started, on the owning thread.
            unsafe { self.exit() };
            return false;
        }
        true
    }

    /// Ends the section [`enter`](Self::enter) started.
    ///
    /// # Safety
    ///
    /// Called by the owning thread, inside a section `enter` started
    /// (it returned `true`) and not yet ended: clearing `busy` otherwise
    /// would let a claimer use the magazine while the owner does.
    #[inline(always)]
    pub(crate) unsafe fn exit(&self) {
        // Release: pairs with the Acquire load of `busy` in `claim` and in
        // `wait_idle`; the section's accesses happen before the claimer's.
        self.busy.store(0, Ordering::Release);
    }

    /// Claims the magazine for another thread; `false` when another
    /// claimer holds it or its owner is inside a section. Never waits.
    pub(crate) fn claim(&self, asymmetric: bool) -> bool {
        // Acquire: pairs with the Release in `release` by the previous
        // claimer.
        if self
            .claim
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        if !cfg!(fprobe_canary) {
            crate::rcu::heavy_barrier(asymmetric);
        }
        // Acquire: pairs with the Release in `exit`.
        if self.busy.load(Ordering::Acquire) != 0 {
            // SAFETY: the claim our CAS just took.
            unsafe { self.release() };
            return false;
        }
        true
    }

    /// Gives a claim back.
    ///
    /// # Safety
    ///
    /// The caller holds the claim ([`claim`](Self::claim) returned `true`
    /// to it) and uses the magazine no more: clearing another claimer's
    /// claim would let the owner use the magazine while that claimer does.
    pub(crate) unsafe fn release(&self) {
        // Release: pairs with the Acquire claim loads in `enter` and `claim`.
        self.claim.store(0, Ordering::Release);
    }

    /// Waits until the owner is outside a section (teardown, after its
    /// barrier); from then on the caller may use the magazine.
    pub(crate) fn wait_idle(&self) {
        let mut step = 0;
        // Acquire: pairs with the Release in `exit`.
        while self.busy.load(Ordering::Acquire) != 0 {
            crate::sync::backoff(step);
            step = step.saturating_add(1);
        }
    }

    /// Number of indices held: exact for the thread using the magazine, a
    /// hint for others.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        // Relaxed: written only by the thread using the magazine; for it
        // this is its own last store.
        self.len.load(Ordering::Relaxed) as usize
    }

    /// Sets the number of indices.
    ///
    /// # Safety
    ///
    /// The caller uses the magazine (module docs): it is the owning thread
    /// inside a section ([`enter`](Self::enter)), or a thread that has
    /// taken the magazine over (its [`claim`](Self::claim) succeeded, or
    /// the teardown after [`wait_idle`](Self::wait_idle)).
    #[inline(always)]
    pub(crate) unsafe fn set_len(&self, len: usize) {
        debug_assert!(len <= MAX_MAGAZINE);
        // Relaxed: published by `exit` or `release`.
        self.len.store(len as u32, Ordering::Relaxed);
    }

    /// Index at `i < MAX_MAGAZINE`.
    ///
    /// # Safety
    ///
    /// As for [`set_len`](Self::set_len): the caller uses the magazine.
    #[inline(always)]
    pub(crate) unsafe fn get(&self, i: usize) -> u32 {
        // SAFETY: the caller uses the magazine (this function's contract,
        // module docs): no other thread accesses the slots.
        self.slots[i].with(|p| unsafe { *p })
    }

    /// Stores `index` at `i < MAX_MAGAZINE`.
    ///
    /// # Safety
    ///
    /// As for [`set_len`](Self::set_len): the caller uses the magazine.
    #[inline(always)]
    pub(crate) unsafe fn set(&self, i: usize, index: u32) {
        // SAFETY: as in `get`.
        self.slots[i].with_mut(|p| unsafe { *p = index })
    }
}

/// The magazines of one pool: one per thread that used it.
pub(crate) struct Magazines {
    #[cfg(not(loom))]
    per_thread:
        crate::per_thread::PerThread<Magazine, { crate::per_thread::CacheSlot::Pool as usize }>,
    /// Under loom thread-locals are not per model thread; model thread `n`
    /// uses magazine `n`.
    #[cfg(loom)]
    fixed: Box<[Magazine]>,
}

impl Magazines {
    pub(crate) fn new() -> Self {
        Self {
            #[cfg(not(loom))]
            per_thread: crate::per_thread::PerThread::new(),
            #[cfg(loom)]
            fixed: (0..4).map(|_| Magazine::new()).collect(),
        }
    }

    /// The calling thread's magazine, made on its first use (which
    /// allocates); `None` while its thread-locals are being destroyed.
    #[cfg(not(loom))]
    #[inline(always)]
    pub(crate) fn mine(&self) -> Option<&Magazine> {
        if let Some(m) = self.per_thread.get() {
            return Some(m);
        }
        // An exited thread's magazine goes to the next thread given its
        // index as it is: its objects stay in it, and any popper can steal
        // them meanwhile.
        self.per_thread.get_or(Magazine::new, |_| {})
    }

    #[cfg(loom)]
    pub(crate) fn mine(&self) -> Option<&Magazine> {
        let id = format!("{:?}", loom::thread::current().id());
        let n: usize = id
            .trim_start_matches("ThreadId(")
            .trim_end_matches(')')
            .parse()
            .unwrap_or(0);
        self.fixed.get(n)
    }

    /// Every magazine, of live and exited threads.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Magazine> {
        #[cfg(not(loom))]
        {
            self.per_thread.iter()
        }
        #[cfg(loom)]
        {
            self.fixed.iter()
        }
    }
}
