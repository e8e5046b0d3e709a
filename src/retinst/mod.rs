//! Return instances: the per-thread shadow stack that carries what an exit
//! handler needs from function entry to function return (the kernel's
//! `kretprobe_instance` / uprobes' `return_instance`).
//!
//! # Design
//!
//! * A [`RetInstPool`] preallocates `instances` return instances, each with
//!   a data area of `data_size` bytes, in an [`ObjPool`](crate::ObjPool).
//! * Each thread registers once and gets its [`ReturnStack`] (keep it in a
//!   thread-local). At function entry, [`ReturnStack::push`] records the
//!   probe's identity ([`ProbeRef`]: slot + generation), the address, and
//!   hands out the instance's data area; at return, [`ReturnStack::pop`]
//!   gives the instance back as a [`ReturnInstance`].
//! * A finished instance goes onto the thread's own LIFO and is reused by
//!   the next entry with no atomic read-modify-write, no fence and no
//!   allocation (the kernel's uprobes keep a `ri_pool` per task the same
//!   way). Only a thread that has none
//!   draws from the shared object pool.
//! * The stack is bounded (`max_depth`); misses are returned as values, by
//!   cause ([`PushMiss::DepthOverflow`], [`PushMiss::PoolExhausted`]), and counted
//!   ([`RetInstPool::stats`]). A push that missed has no matching pop.
//! * [`RetInstPool::expire`] is the concurrent scanner an unregister needs:
//!   it marks every in-flight instance of a probe expired, so its exit
//!   handler is skipped. Reuse of finished instances is made safe against it
//!   by a seqcount read inside an RCU read-side section; the protocol and
//!   its proof are in `retinst/shadow.rs`.
//!
//! # Usage
//!
//! ```
//! use std::cell::RefCell;
//! use fprobe::retinst::{ProbeRef, RetInstPool, ReturnStack};
//!
//! let pool = RetInstPool::builder().instances(256).data_size(16).build().unwrap();
//! let probe = ProbeRef { slot: 7, generation: 1 };
//!
//! thread_local! {
//!     static STACK: RefCell<Option<ReturnStack>> = const { RefCell::new(None) };
//! }
//! STACK.with(|s| {
//!     let mut s = s.borrow_mut();
//!     let stack = s.get_or_insert_with(|| pool.register_thread());
//!
//!     // Function entry: remember something for the exit handler.
//!     let data = stack.push(probe, 0x401000, 8).expect("no miss");
//!     data.copy_from_slice(&42u64.to_ne_bytes());
//!
//!     // Function return.
//!     let ri = stack.pop().unwrap();
//!     assert_eq!(ri.probe(), probe);
//!     assert!(!ri.is_expired());
//!     assert_eq!(ri.data(), 42u64.to_ne_bytes());
//! });
//! ```
//!
//! # Consistency
//!
//! * An instance returned by [`ReturnStack::pop`] is the one most recently
//!   pushed and not yet popped on that stack, with the fields and data its
//!   push stored.
//! * [`RetInstPool::expire`]`(slot)` marks every instance of probe `slot` that
//!   was in flight (pushed, not yet popped) when it was called; instances
//!   pushed while it runs may or may not be marked. It never marks an
//!   instance of another probe, even when instances are reused concurrently.
//!   It does not wait for exit handlers that popped their instance before
//!   the mark: an unregister combines it with an RCU grace period.
//!
//! # Execution context
//!
//! | operation | blocks? | allocates? | async-signal-safe? |
//! |---|---|---|---|
//! | [`ReturnStack::push`] | never | no | yes, after the thread's first push and pop |
//! | [`ReturnStack::pop`] + drop of the instance | never, except taking a lock while an `expire` runs | no | yes, outside an `expire` |
//! | [`RetInstPool::register_thread`] | briefly (a mutex) | yes | no |
//! | [`RetInstPool::expire`] | yes: one RCU grace period | no | no |
//! | [`ReturnStack`] drop | briefly (a mutex) | no | no |
//!
//! The first pop on a thread registers it with the RCU (one allocation);
//! call [`crate::rcu::register_thread`] first to avoid that on the hot path.
//!
//! # Which to use
//!
//! The crate has three ways to carry data from a function's entry to its
//! return; `BENCHMARKS.md`, section "Keeping per-call data from entry to
//! exit: which to use", measures them side by side.
//!
//! | you have | use | why |
//! |---|---|---|
//! | an engine that dispatches through a [`Registry`](crate::probe::Registry) | the registry's own per-call data ([`Fprobe`](crate::probe::Fprobe)`::builder().data_size`) | it lives in the registry's per-thread shadow stack, inside the frame the dispatch pushes anyway: nothing to pop, nothing shared |
//! | a dispatch of your own, and the kernel's `kretprobe_instance` model | [`retinst`](crate::retinst) | instances named by probe, a bounded pool shared by all threads, and [`expire`](crate::retinst::RetInstPool::expire) for an unregistered probe's in-flight instances; the cost does not grow with the data size |
//! | objects that outlive a call or move between threads | [`ObjPool`](crate::ObjPool) | any thread may push back what another popped; a fixed set of preallocated objects instead of `malloc` |
//!
//! # Performance
//!
//! Entry + return with reuse is a handful of plain loads and stores on the
//! thread's own cache lines plus one RCU read-side section (no atomic
//! read-modify-write, no fence), so the per-thread rate does not depend on
//! the number of threads. Allocating each instance with `Box` is the
//! baseline; `BENCHMARKS.md`, section "Object pool", compares the two
//! (`--bench uretprobe-nop`).

mod shadow;

use std::fmt;
use std::sync::Arc;

use shadow::{PoolShared, StackView};

use crate::objpool::{ObjPoolBuilder, ObjPoolError};
use crate::setters::setters;
use crate::sync::Ordering;

/// The identity of a probe as a return instance records it: the exit path
/// checks the generation, not just the slot, so a probe unregistered and a new
/// one registered in the same slot are told apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ProbeRef {
    /// The probe's slot (its number among the engine's probes, as in
    /// [`ProbeHandle`](crate::probe::ProbeHandle)).
    pub slot: u64,
    /// The probe's generation (bumped each time the slot is reused).
    pub generation: u64,
}

/// Why a [`ReturnStack::push`] recorded nothing (the kernel's `nmissed`, by
/// cause).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PushMiss {
    /// The thread's stack already holds `max_depth` instances.
    DepthOverflow,
    /// The thread has no finished instance and the pool is exhausted.
    PoolExhausted,
}

impl fmt::Display for PushMiss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::DepthOverflow => "return stack depth exceeded",
            Self::PoolExhausted => "return instance pool exhausted",
        })
    }
}

impl std::error::Error for PushMiss {}

/// Counters of a [`RetInstPool`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetInstStats {
    /// Pushes missed because the stack was full.
    pub missed_depth: u64,
    /// Pushes missed because no instance was free.
    pub missed_exhausted: u64,
    /// Threads with a registered [`ReturnStack`] now.
    pub threads: usize,
    /// Completed [`RetInstPool::expire`] scans.
    pub scans: u64,
}

/// A pool of return instances shared by all threads; cheap to clone.
///
/// # Examples
///
/// ```
/// let pool = fprobe::retinst::RetInstPool::builder().build().unwrap();
/// assert_eq!(pool.data_size(), 64);
/// ```
#[derive(Clone)]
pub struct RetInstPool {
    shared: Arc<PoolShared>,
}

impl RetInstPool {
    /// A builder with the defaults listed on [`RetInstPoolBuilder`].
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = fprobe::retinst::RetInstPool::builder().max_depth(8).build().unwrap();
    /// assert_eq!(pool.max_depth(), 8);
    /// ```
    pub fn builder() -> RetInstPoolBuilder {
        RetInstPoolBuilder::default()
    }

    /// Registers the calling thread: returns its return stack. Keep it for
    /// the life of the thread (e.g. in a thread-local); dropping it returns
    /// its cached instances to the pool.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = fprobe::retinst::RetInstPool::builder().build().unwrap();
    /// let stack = pool.register_thread();
    /// assert_eq!(stack.depth(), 0);
    /// assert_eq!(pool.stats().threads, 1);
    /// ```
    pub fn register_thread(&self) -> ReturnStack {
        let rec = self.shared.claim_record();
        ReturnStack {
            free: Vec::with_capacity(self.shared.max_depth),
            depth: 0,
            rec,
            shared: self.shared.clone(),
        }
    }

    /// Marks every in-flight instance of probe `probe_slot` expired (see the
    /// module's Consistency section); returns how many it marked.
    ///
    /// Blocks for one RCU grace period; scans are serialised.
    ///
    /// # Panics
    ///
    /// When called inside an RCU read-side section of the calling thread
    /// (the grace period would wait for itself).
    ///
    /// # Examples
    ///
    /// ```
    /// use fprobe::retinst::{ProbeRef, RetInstPool};
    /// let pool = RetInstPool::builder().build().unwrap();
    /// let mut stack = pool.register_thread();
    /// stack.push(ProbeRef { slot: 1, generation: 0 }, 0x10, 0).unwrap();
    /// assert_eq!(pool.expire(1), 1);
    /// assert!(stack.pop().unwrap().is_expired());
    /// ```
    pub fn expire(&self, probe_slot: u64) -> usize {
        self.shared.expire(probe_slot)
    }

    /// Size of each instance's data area in bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// let p = fprobe::retinst::RetInstPool::builder().data_size(8).build().unwrap();
    /// assert_eq!(p.data_size(), 8);
    /// ```
    pub fn data_size(&self) -> usize {
        self.shared.data_size
    }

    /// Most instances one thread's stack holds.
    ///
    /// # Examples
    ///
    /// ```
    /// let p = fprobe::retinst::RetInstPool::builder().build().unwrap();
    /// assert_eq!(p.max_depth(), 64);
    /// ```
    pub fn max_depth(&self) -> usize {
        self.shared.max_depth
    }

    /// Reads the counters.
    ///
    /// # Examples
    ///
    /// ```
    /// use fprobe::retinst::{PushMiss, ProbeRef, RetInstPool};
    /// let pool = RetInstPool::builder().max_depth(0).build().unwrap();
    /// let mut stack = pool.register_thread();
    /// assert_eq!(stack.push(ProbeRef::default(), 0, 0), Err(PushMiss::DepthOverflow));
    /// assert_eq!(pool.stats().missed_depth, 1);
    /// ```
    pub fn stats(&self) -> RetInstStats {
        let (missed_depth, missed_exhausted, threads) = self.shared.miss_counts();
        RetInstStats {
            missed_depth,
            missed_exhausted,
            threads,
            scans: self.shared.scans(),
        }
    }
}

impl fmt::Debug for RetInstPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetInstPool")
            .field("instances", &self.shared.pool.capacity())
            .field("data_size", &self.shared.data_size)
            .field("max_depth", &self.shared.max_depth)
            .finish()
    }
}

/// Configuration of a [`RetInstPool`].
///
/// | setting | default |
/// |---|---|
/// | [`instances`](Self::instances) | 1024 |
/// | [`data_size`](Self::data_size) | 64 bytes |
/// | [`max_depth`](Self::max_depth) | 64 (uprobes' `MAX_URETPROBE_DEPTH`) |
/// | [`thread_cache`](Self::thread_cache) | as [`ObjPoolBuilder::thread_cache`] |
///
/// # Examples
///
/// ```
/// let pool = fprobe::retinst::RetInstPool::builder()
///     .instances(4096)
///     .data_size(32)
///     .max_depth(128)
///     .build()
///     .unwrap();
/// assert_eq!(pool.data_size(), 32);
/// ```
#[derive(Clone, Debug)]
pub struct RetInstPoolBuilder {
    instances: usize,
    data_size: usize,
    max_depth: usize,
    pool: ObjPoolBuilder,
}

impl Default for RetInstPoolBuilder {
    fn default() -> Self {
        Self {
            instances: 1024,
            data_size: 64,
            max_depth: 64,
            pool: ObjPoolBuilder::default(),
        }
    }
}

impl RetInstPoolBuilder {
    setters! {
        /// Number of preallocated instances, shared by all threads.
        ///
        /// # Examples
        ///
        /// ```
        /// assert!(fprobe::retinst::RetInstPool::builder().instances(0).build().is_err());
        /// ```
        instances: usize;

        /// Bytes of each instance's data area: the largest entry data any probe
        /// will ask for.
        ///
        /// # Examples
        ///
        /// ```
        /// let p = fprobe::retinst::RetInstPool::builder().data_size(0).build().unwrap();
        /// assert_eq!(p.data_size(), 0);
        /// ```
        data_size: usize;

        /// Most in-flight instances per thread (recursion depth).
        ///
        /// # Examples
        ///
        /// ```
        /// let p = fprobe::retinst::RetInstPool::builder().max_depth(3).build().unwrap();
        /// assert_eq!(p.max_depth(), 3);
        /// ```
        max_depth: usize;
    }

    /// Magazine size of the underlying object pool
    /// ([`ObjPoolBuilder::thread_cache`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let p = fprobe::retinst::RetInstPool::builder().thread_cache(1).build().unwrap();
    /// # drop(p);
    /// ```
    pub fn thread_cache(mut self, objects: usize) -> Self {
        self.pool = self.pool.thread_cache(objects);
        self
    }

    /// Builds the pool; allocates every instance and its data area.
    ///
    /// # Errors
    ///
    /// As [`ObjPoolBuilder::build`] for the instance count and magazine size.
    ///
    /// # Examples
    ///
    /// ```
    /// let p = fprobe::retinst::RetInstPool::builder().build().unwrap();
    /// # drop(p);
    /// ```
    pub fn build(self) -> Result<RetInstPool, ObjPoolError> {
        let shared = PoolShared::new(self.pool, self.instances, self.data_size, self.max_depth)?;
        Ok(RetInstPool {
            shared: Arc::new(shared),
        })
    }
}

/// One thread's shadow stack of return instances.
///
/// Made by [`RetInstPool::register_thread`]; meant to stay on one thread
/// (it may be moved, never shared).
///
/// # Examples
///
/// ```
/// use fprobe::retinst::{ProbeRef, RetInstPool};
/// let pool = RetInstPool::builder().build().unwrap();
/// let mut stack = pool.register_thread();
/// let p = ProbeRef { slot: 1, generation: 3 };
/// stack.push(p, 0xa, 0).unwrap();
/// stack.push(p, 0xb, 0).unwrap(); // recursion
/// assert_eq!(stack.pop().unwrap().addr(), 0xb);
/// assert_eq!(stack.pop().unwrap().addr(), 0xa);
/// assert!(stack.pop().is_none());
/// ```
pub struct ReturnStack {
    /// Finished instances ready for reuse (uprobes' `ri_pool`), LIFO.
    ///
    /// Invariant: no scanner can reach them (unlinked while no scan ran, or
    /// after it ended); `len + depth <= max_depth`, so pushes never
    /// reallocate.
    free: Vec<u32>,
    /// Invariant: equals `rec.depth`, which only this stack stores.
    depth: usize,
    rec: Arc<StackView>,
    shared: Arc<PoolShared>,
}

impl ReturnStack {
    /// Function entry: pushes a return instance for `probe` at `addr` and
    /// returns its data area of `data_len` bytes, for the entry handler to
    /// fill (its previous contents are unspecified).
    ///
    /// # Errors
    ///
    /// [`PushMiss::DepthOverflow`] when the stack holds `max_depth` instances,
    /// [`PushMiss::PoolExhausted`] when no instance is free; both are counted.
    /// Nothing was pushed: do not pop at the function's return.
    ///
    /// # Panics
    ///
    /// When `data_len` exceeds the pool's [`data_size`](RetInstPool::data_size)
    /// (a configuration error the probe layer checks at registration).
    ///
    /// # Examples
    ///
    /// ```
    /// use fprobe::retinst::{ProbeRef, RetInstPool};
    /// let pool = RetInstPool::builder().data_size(4).build().unwrap();
    /// let mut stack = pool.register_thread();
    /// let data = stack.push(ProbeRef { slot: 9, generation: 0 }, 0x40, 4).unwrap();
    /// data.copy_from_slice(b"abcd");
    /// assert_eq!(stack.pop().unwrap().data(), b"abcd");
    /// ```
    #[inline]
    pub fn push(
        &mut self,
        probe: ProbeRef,
        addr: u64,
        data_len: usize,
    ) -> Result<&mut [u8], PushMiss> {
        assert!(
            data_len <= self.shared.data_size,
            "ReturnStack::push: data_len {data_len} exceeds the pool's data_size {}",
            self.shared.data_size
        );
        if self.depth >= self.shared.max_depth {
            StackView::bump(&self.rec.missed_depth);
            return Err(PushMiss::DepthOverflow);
        }
        let index = match self.free.pop() {
            Some(index) => index,
            None => match self.shared.pool.raw_ref().pop() {
                Some(index) => index,
                None => {
                    StackView::bump(&self.rec.missed_exhausted);
                    return Err(PushMiss::PoolExhausted);
                }
            },
        };
        let shared = &*self.shared;
        let ri = shared.ri(index);
        // Relaxed: published to scanners by the Release slot store below.
        ri.probe_slot.store(probe.slot, Ordering::Relaxed);
        ri.generation.store(probe.generation, Ordering::Relaxed);
        ri.addr.store(addr, Ordering::Relaxed);
        ri.expired.store(false, Ordering::Relaxed);
        // Release: pairs with the Acquire slot load in `expire`; a scanner
        // that finds `index` here sees the fields above.
        self.rec.slot(self.depth).store(index, Ordering::Release);
        self.depth += 1;
        // Release: pairs with the Acquire depth load in `expire`; the slot
        // is published before the depth covers it.
        self.rec.depth.store(self.depth, Ordering::Release);
        let data = ri.data.with_mut(|p| {
            // SAFETY: we hold the instance (taken from `free` or the pool),
            // so its data is ours (invariant of `RetInst::data`); the borrow
            // is tied to `&mut self`, and the instance stays ours until it is
            // popped, which needs `&mut self` again.
            unsafe { &mut *p }
        });
        data.len = data_len;
        Ok(&mut data.buf[..data_len])
    }

    /// Function return: pops the most recent instance, or `None` when the
    /// stack is empty. The instance is recycled when the returned
    /// [`ReturnInstance`] drops.
    ///
    /// # Examples
    ///
    /// ```
    /// use fprobe::retinst::{ProbeRef, RetInstPool};
    /// let pool = RetInstPool::builder().build().unwrap();
    /// let mut stack = pool.register_thread();
    /// assert!(stack.pop().is_none());
    /// stack.push(ProbeRef { slot: 2, generation: 5 }, 0x99, 0).unwrap();
    /// let ri = stack.pop().unwrap();
    /// assert_eq!(ri.probe(), ProbeRef { slot: 2, generation: 5 });
    /// ```
    #[inline]
    pub fn pop(&mut self) -> Option<ReturnInstance<'_>> {
        let depth = self.depth.checked_sub(1)?;
        // Relaxed: our own store.
        let index = self.rec.slot(depth).load(Ordering::Relaxed);
        let seq = self.shared.unlink(&self.rec, depth);
        self.depth = depth;
        Some(ReturnInstance {
            stack: self,
            index,
            seq,
        })
    }

    /// Number of in-flight instances on this stack.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = fprobe::retinst::RetInstPool::builder().build().unwrap();
    /// assert_eq!(pool.register_thread().depth(), 0);
    /// ```
    #[inline]
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Recycles an unlinked instance; `seq` is the scan seqcount read when
    /// it was unlinked.
    #[inline]
    fn recycle(&mut self, index: u32, seq: u32) {
        let reusable = if seq & 1 == 0 {
            Some(index)
        } else {
            self.shared.orphan(index, seq)
        };
        if let Some(index) = reusable {
            debug_assert!(self.free.len() + self.depth < self.shared.max_depth.max(1));
            self.free.push(index);
        }
    }
}

impl Drop for ReturnStack {
    fn drop(&mut self) {
        // In-flight instances (the thread leaves between entry and return):
        // unlink and recycle them like a return would.
        while let Some(ri) = self.pop() {
            drop(ri);
        }
        for index in self.free.drain(..) {
            // SAFETY: instances on `free` are ours and no scanner can reach
            // them (invariant of `free`), so another thread may reuse them.
            unsafe { self.shared.pool.push_index(index) };
        }
        self.shared.release_record(&self.rec);
    }
}

impl fmt::Debug for ReturnStack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReturnStack")
            .field("depth", &self.depth)
            .field("cached", &self.free.len())
            .finish()
    }
}

/// A return instance popped at function return; recycled on drop.
///
/// # Examples
///
/// ```
/// use fprobe::retinst::{ProbeRef, RetInstPool};
/// let pool = RetInstPool::builder().data_size(1).build().unwrap();
/// let mut stack = pool.register_thread();
/// stack.push(ProbeRef { slot: 1, generation: 1 }, 0x1234, 1).unwrap()[0] = 7;
/// let mut ri = stack.pop().unwrap();
/// assert_eq!((ri.addr(), ri.data()), (0x1234, &[7u8][..]));
/// ri.data_mut()[0] = 8;
/// ```
pub struct ReturnInstance<'s> {
    stack: &'s mut ReturnStack,
    index: u32,
    /// Scan seqcount read when the instance was unlinked.
    seq: u32,
}

impl ReturnInstance<'_> {
    #[inline]
    fn ri(&self) -> &shadow::RetInst {
        self.stack.shared.ri(self.index)
    }

    /// The probe recorded at entry.
    ///
    /// # Examples
    ///
    /// See [`ReturnStack::pop`].
    #[inline]
    pub fn probe(&self) -> ProbeRef {
        let ri = self.ri();
        // Relaxed: our own stores (the instance is held by this thread).
        ProbeRef {
            slot: ri.probe_slot.load(Ordering::Relaxed),
            generation: ri.generation.load(Ordering::Relaxed),
        }
    }

    /// The address recorded at entry.
    ///
    /// # Examples
    ///
    /// See [`ReturnInstance`].
    #[inline]
    pub fn addr(&self) -> u64 {
        self.ri().addr.load(Ordering::Relaxed)
    }

    /// Whether [`RetInstPool::expire`] marked the instance: skip the exit
    /// handler.
    ///
    /// # Examples
    ///
    /// See [`RetInstPool::expire`].
    #[inline]
    pub fn is_expired(&self) -> bool {
        // Relaxed: a flag; a racing expire may or may not be seen.
        self.ri().expired.load(Ordering::Relaxed)
    }

    /// The data area the entry handler filled.
    ///
    /// # Examples
    ///
    /// See [`ReturnStack::push`].
    #[inline]
    pub fn data(&self) -> &[u8] {
        self.ri().data.with(|p| {
            // SAFETY: the instance is held by this thread until `self` drops
            // (invariant of `RetInst::data`); `&self` borrows it.
            let data = unsafe { &*p };
            &data.buf[..data.len]
        })
    }

    /// The data area, mutably.
    ///
    /// # Examples
    ///
    /// See [`ReturnInstance`].
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        self.ri().data.with_mut(|p| {
            // SAFETY: as in `data`; `&mut self` makes the borrow unique.
            let data = unsafe { &mut *p };
            &mut data.buf[..data.len]
        })
    }
}

impl Drop for ReturnInstance<'_> {
    #[inline]
    fn drop(&mut self) {
        self.stack.recycle(self.index, self.seq);
    }
}

impl fmt::Debug for ReturnInstance<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReturnInstance")
            .field("probe", &self.probe())
            .field("addr", &self.addr())
            .field("expired", &self.is_expired())
            .finish()
    }
}
