//! `objpool`: a fixed-capacity pool of preallocated objects, the userspace
//! counterpart of the kernel's `lib/objpool.c` (the pool of kretprobe
//! instances), built on per-thread magazines in front of a shared depot
//! (Bonwick's magazine layer).
//!
//! # Algorithm
//!
//! The pool preallocates `nr_objs` objects. Each free object's index is in
//! exactly one place:
//!
//! * a **magazine**: a small stack (at most
//!   [`thread_cache`](ObjPoolBuilder::thread_cache) indices) that belongs
//!   to one thread and that its owner uses with plain loads and stores, no
//!   atomic read-modify-write and no fence where the kernel has
//!   `membarrier(2)` (a `SeqCst` fence where it has not:
//!   `objpool/magazine.rs`);
//! * the **depot**: a lock-free stack shared by all threads, which
//!   magazines refill from and flush to in batches of half their capacity,
//!   one CAS per batch (`objpool/depot.rs`).
//!
//! [`ObjPool::pop`] takes from the caller's magazine; when it is empty,
//! refills it from the depot; when the depot is empty too, *steals* half
//! of another thread's magazine. Dropping the returned [`PoolObj`] pushes
//! the object into the magazine of the thread that drops it (which may
//! differ from the one that popped), flushing half of it to the depot when
//! it is full. Pop and push never block and never allocate (after the
//! thread's first use of the pool, which allocates its magazine).
//!
//! In the steady state a thread pops and pushes in its own magazine, which
//! no other thread touches, so pops and pushes scale with threads and cost
//! a thread-local load and a few plain accesses of one cache line.
//!
//! **Stealing.** The owner of a magazine pays nothing for being stealable:
//! it marks its sections with a flag of its own and checks the magazine's
//! claim word after a compiler fence; a stealer claims the magazine with a
//! CAS and runs `membarrier(2)` (the asymmetric fence of the crate's RCU),
//! after which either it sees the owner inside a section and backs off, or
//! the owner sees the claim and uses the depot instead. A stealer never
//! waits for a preempted owner, and an owner never waits for a stealer.
//!
//! **Preemption, migration, exit.** Magazines belong to threads, not CPUs,
//! so preemption and migration change nothing. The magazine of a thread
//! that exits keeps its objects; any popper can steal them, and the next
//! thread given the exited thread's index (see `per_thread.rs`) takes the
//! magazine over.
//!
//! **Lifetime.** The pool can be dropped while objects are outstanding, as
//! with the kernel's `objpool_fini`: the free objects are dropped at once,
//! each outstanding one when its [`PoolObj`] is dropped, and the last one
//! frees the memory (reference count `nr_objs + 1`, never touched by pop
//! or push; see `objpool/raw.rs`).
//!
//! # Usage
//!
//! ```
//! use fprobe::ObjPool;
//!
//! // 64 preallocated 128-byte buffers.
//! let pool = ObjPool::new(64, |_| [0u8; 128]);
//!
//! let mut buf = pool.pop().expect("the pool has free objects");
//! buf[0] = 42;
//! drop(buf); // back into this thread's magazine
//!
//! // Exhaustion is a value, never a wait.
//! let all: Vec<_> = std::iter::from_fn(|| pool.pop()).collect();
//! assert_eq!(all.len(), 64);
//! assert!(pool.pop().is_none());
//! assert_eq!(pool.nmissed(), 2); // the pop that ended `collect`, and this one
//! ```
//!
//! # Consistency
//!
//! Everything a thread wrote to an object before dropping its [`PoolObj`]
//! is visible to the thread that pops the object next (through the depot's
//! Release CAS and Acquire load, or the magazine handshake's Release and
//! Acquire, or program order within one thread). An object is held by at
//! most one [`PoolObj`] at a time and never lost.
//!
//! **When a pop returns `None`.** A failing pop found the depot empty
//! and then looked at the magazines one after the other, so a free object
//! can escape it only by being, while the pop ran, in a magazine it could
//! not claim (its owner inside a section: preempted there, or interrupted
//! by a signal handler; or another popper stealing from it), in a magazine
//! it looked at before the object arrived there, or in a stealer's hands
//! on its way to the depot. All of these need another pop or push of the
//! pool running during the failing pop (an interrupted section and a
//! signal handler's own pop count as two). So:
//!
//! * when no other pop or push of the pool runs during a pop (a
//!   single-threaded program without signal handlers that use the pool,
//!   or any quiet moment), it fails only when every object is held;
//! * otherwise it misses at most `2 × c` free objects per pop or push
//!   running meanwhile, where `c` is [`ObjPool::thread_cache`] (one
//!   magazine claimed or busy, one batch in transit), plus objects freed
//!   into magazines it had already looked at.
//!
//! Objects in the depot are never missed: a thread preempted in the middle
//! of a depot operation has changed nothing shared.
//!
//! # Execution context
//!
//! | operation | blocks? | allocates? | async-signal-safe? |
//! |---|---|---|---|
//! | [`ObjPool::pop`] | never (a steal runs `membarrier(2)`, a system call) | the thread's first use only | yes, after the thread's first use or [`ObjPool::prepare_thread`], when `T`'s use is |
//! | [`PoolObj`] drop (push) | never | the thread's first use only | as for pop, while the pool lives |
//! | [`PoolObj`] drop after the pool was dropped | never | frees, if it is the last object | no |
//! | [`ObjPool`] drop | waits only for pushes in flight on other threads (no pop can run) | frees | no |
//! | [`ObjPool::new`], [`ObjPoolBuilder::build`] | never | yes | no |
//!
//! A signal handler that pops or pushes while its thread is inside a pop
//! or push of the same pool leaves the thread's magazine alone and uses
//! the depot. Dropping the pool from a signal handler that interrupted a
//! pop or push on the same thread would wait forever for it: don't. For
//! the same reason, a child of `fork(2)` must not drop a pool that another
//! thread of the parent was popping from or pushing to at the fork (that
//! thread does not exist in the child and never ends its operation); pops
//! and pushes in the child work, without the objects of that thread's
//! magazine.
//! Likewise a thread must not leave a pop or push by `siglongjmp` from a
//! signal handler: its magazine would stay busy (or claimed) for good.
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
//! | objects that outlive a call or move between threads | [`ObjPool`] | any thread may push back what another popped; a fixed set of preallocated objects instead of `malloc` |
//!
//! # Performance
//!
//! A pop/push pair in the thread's own magazine costs one thread-local
//! load to find it (a one-entry cache per thread) and plain loads and
//! stores of one cache line; a refill or flush adds one CAS per half
//! magazine, a steal one `membarrier(2)`. BENCHMARKS.md, section
//! "Object pool", compares it with glibc's `malloc`/`free` (itself a
//! per-thread cache), a Treiber freelist, `Mutex<Vec>` and crossbeam's
//! `ArrayQueue`, with more threads than CPUs.

mod depot;
mod magazine;
mod raw;

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

pub use raw::MAX_OBJECTS;
pub(crate) use raw::RawPool;

/// The most objects a thread's magazine may hold
/// ([`ObjPoolBuilder::thread_cache`]).
pub const MAX_THREAD_CACHE: usize = magazine::MAX_MAGAZINE;

/// A fixed-capacity pool of preallocated objects with per-thread magazines.
///
/// See the [module docs](self) for the algorithm and its guarantees.
///
/// # Examples
///
/// ```
/// let pool = fprobe::ObjPool::builder().thread_cache(4).build(8, |i| i).unwrap();
/// let obj = pool.pop().unwrap();
/// assert!(*obj < 8);
/// ```
pub struct ObjPool<T: Send> {
    /// Invariant: holds the handle's reference to a live `RawPool`.
    raw: NonNull<RawPool<T>>,
    _owns: PhantomData<RawPool<T>>,
}

// SAFETY: `&ObjPool<T>` only pops (each object goes to one caller) and
// reads counters; objects move between threads, so `T: Send` is enough.
unsafe impl<T: Send> Sync for ObjPool<T> {}
// SAFETY: dropping the pool on another thread drops objects there: `T: Send`.
unsafe impl<T: Send> Send for ObjPool<T> {}

impl ObjPool<()> {
    /// A builder to choose the magazine size (on `ObjPool<()>` so that
    /// `ObjPool::builder()` needs no type annotation, as papaya does; the
    /// object type comes from [`ObjPoolBuilder::build`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = fprobe::ObjPool::builder().thread_cache(2).build(16, |_| 0u64).unwrap();
    /// assert_eq!(pool.thread_cache(), 2);
    /// ```
    pub fn builder() -> ObjPoolBuilder {
        ObjPoolBuilder::default()
    }
}

impl<T: Send> ObjPool<T> {
    /// Creates a pool of `nr_objs` objects, object `i` made by `init(i)`,
    /// with the default magazine size (see [`ObjPoolBuilder::thread_cache`]).
    ///
    /// # Panics
    ///
    /// When `nr_objs` is zero or above [`MAX_OBJECTS`]; use
    /// [`ObjPool::builder`] to get these as an error instead.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = fprobe::ObjPool::new(4, |_| String::with_capacity(64));
    /// assert_eq!(pool.capacity(), 4);
    /// ```
    pub fn new(nr_objs: usize, init: impl FnMut(usize) -> T) -> Self {
        match ObjPool::builder().build(nr_objs, init) {
            Ok(pool) => pool,
            Err(e) => panic!("ObjPool::new: {e}"),
        }
    }

    /// Takes an object: from the calling thread's magazine, else the depot,
    /// else stolen from another thread's magazine; `None` when no free
    /// object could be taken (counted in [`nmissed`](Self::nmissed); the
    /// module docs bound when that happens while objects are free). Never
    /// blocks, never allocates after the thread's first use of the pool.
    ///
    /// The object comes back to the pool when the [`PoolObj`] drops.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = fprobe::ObjPool::new(1, |_| 0u32);
    /// let a = pool.pop();
    /// assert!(a.is_some());
    /// assert!(pool.pop().is_none());
    /// drop(a);
    /// assert!(pool.pop().is_some());
    /// ```
    #[inline]
    pub fn pop(&self) -> Option<PoolObj<T>> {
        let index = self.raw_ref().pop()?;
        Some(PoolObj {
            pool: self.raw,
            index,
            _owns: PhantomData,
        })
    }

    /// Number of objects the pool was built with.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(fprobe::ObjPool::new(3, |_| ()).capacity(), 3);
    /// ```
    pub fn capacity(&self) -> usize {
        self.raw_ref().nr_objs()
    }

    /// Capacity of each thread's magazine ([`ObjPoolBuilder::thread_cache`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = fprobe::ObjPool::builder().thread_cache(8).build(64, |_| ()).unwrap();
    /// assert_eq!(pool.thread_cache(), 8);
    /// ```
    pub fn thread_cache(&self) -> usize {
        self.raw_ref().magazine_capacity()
    }

    /// Makes the calling thread's magazine now, so that its later pops and
    /// pushes on this pool never allocate and are async-signal-safe: call
    /// it before a signal handler on this thread may use the pool.
    /// Idempotent.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = fprobe::ObjPool::new(8, |_| 0u8);
    /// pool.prepare_thread();
    /// assert!(pool.pop().is_some());
    /// ```
    pub fn prepare_thread(&self) {
        self.raw_ref().prepare_thread();
    }

    /// Number of pops that returned `None`.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = fprobe::ObjPool::new(1, |_| ());
    /// let _held = pool.pop();
    /// assert!(pool.pop().is_none());
    /// assert_eq!(pool.nmissed(), 1);
    /// ```
    pub fn nmissed(&self) -> u64 {
        self.raw_ref().nmissed()
    }

    /// The raw pool, for crate-internal users that keep object indices
    /// themselves (return instances).
    pub(crate) fn raw_ref(&self) -> &RawPool<T> {
        // SAFETY: the handle's reference keeps the pool allocated (invariant
        // of `raw`).
        unsafe { self.raw.as_ref() }
    }

    /// Returns object `index`, taken with `raw_ref().pop()`, to the pool.
    ///
    /// # Safety
    ///
    /// The caller owns object `index` of this pool and gives it up.
    pub(crate) unsafe fn push_index(&self, index: u32) {
        // SAFETY: the handle keeps the pool alive; ownership per the caller.
        unsafe { RawPool::push(self.raw, index) }
    }
}

impl<T: Send> Drop for ObjPool<T> {
    fn drop(&mut self) {
        // SAFETY: we own the handle's reference and, holding `&mut self`,
        // no pop can run.
        unsafe { RawPool::fini(self.raw) }
    }
}

impl<T: Send> fmt::Debug for ObjPool<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjPool")
            .field("capacity", &self.capacity())
            .field("thread_cache", &self.thread_cache())
            .field("nmissed", &self.nmissed())
            .finish()
    }
}

/// An object taken from an [`ObjPool`]; dropping it pushes the object back.
///
/// It keeps the pool's memory alive on its own: the [`ObjPool`] may be
/// dropped first, and then this object is dropped for good when the handle
/// is, the last one freeing the pool.
///
/// # Examples
///
/// ```
/// let pool = fprobe::ObjPool::new(2, |_| Vec::<u8>::with_capacity(16));
/// let mut v = pool.pop().unwrap();
/// v.push(1);
/// drop(pool); // allowed: `v` still owns its object
/// assert_eq!(*v, [1]);
/// ```
pub struct PoolObj<T: Send> {
    /// Invariant: this handle owns object `index` of `pool`, and with it one
    /// reference to the pool.
    pool: NonNull<RawPool<T>>,
    index: u32,
    _owns: PhantomData<T>,
}

// SAFETY: the handle owns its object exclusively; sending it sends a `T`.
unsafe impl<T: Send> Send for PoolObj<T> {}
// SAFETY: `&PoolObj<T>` only gives `&T`.
unsafe impl<T: Send + Sync> Sync for PoolObj<T> {}

impl<T: Send> PoolObj<T> {
    /// The object's index in its pool, in `0..capacity`: stable for the
    /// life of the pool, handy as an identity.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = fprobe::ObjPool::new(2, |i| i);
    /// let o = pool.pop().unwrap();
    /// assert_eq!(o.index(), *o);
    /// ```
    #[inline]
    pub fn index(&self) -> usize {
        self.index as usize
    }
}

impl<T: Send> std::ops::Deref for PoolObj<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the pool is alive and the object initialised and owned by
        // this handle (invariant of `pool`); `&self` borrows it.
        unsafe { &*self.pool.as_ref().obj(self.index) }
    }
}

impl<T: Send> std::ops::DerefMut for PoolObj<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow unique.
        unsafe { &mut *self.pool.as_ref().obj(self.index) }
    }
}

impl<T: Send> Drop for PoolObj<T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: we own the object and its reference and give both up.
        unsafe { RawPool::push(self.pool, self.index) }
    }
}

impl<T: Send + fmt::Debug> fmt::Debug for PoolObj<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolObj")
            .field("index", &self.index)
            .field("value", &**self)
            .finish()
    }
}

/// Configuration of an [`ObjPool`].
///
/// | setting | default |
/// |---|---|
/// | [`thread_cache`](Self::thread_cache) | `nr_objs / 16`, between 1 and 32 |
///
/// # Examples
///
/// ```
/// use fprobe::objpool::ObjPoolError;
/// let err = fprobe::ObjPool::builder().build(0, |_| ()).unwrap_err();
/// assert_eq!(err, ObjPoolError::NoObjects);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ObjPoolBuilder {
    thread_cache: Option<usize>,
}

impl ObjPoolBuilder {
    /// The most free objects each thread's magazine holds, up to
    /// [`MAX_THREAD_CACHE`]; 0 turns magazines off (every pop and push
    /// goes to the shared depot). Larger magazines go to the depot less
    /// often; smaller ones leave more objects to other threads (see the
    /// bound in the module docs). The default is a sixteenth of the objects,
    /// between 1 and 32: with up to 8 threads, the magazines then hold at
    /// most half the objects of a pool of 16 or more.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = fprobe::ObjPool::builder().thread_cache(0).build(4, |_| ()).unwrap();
    /// assert_eq!(pool.thread_cache(), 0);
    /// ```
    pub fn thread_cache(mut self, objects: usize) -> Self {
        self.thread_cache = Some(objects);
        self
    }

    /// Builds a pool of `nr_objs` objects, object `i` made by `init(i)`.
    ///
    /// Allocates the objects and 4 bytes of depot link per object; each
    /// thread's magazine (384 bytes) is allocated on its first use.
    ///
    /// # Errors
    ///
    /// [`ObjPoolError::NoObjects`] when `nr_objs` is 0,
    /// [`ObjPoolError::TooManyObjects`] above [`MAX_OBJECTS`],
    /// [`ObjPoolError::ThreadCacheTooLarge`] when `thread_cache` is above
    /// [`MAX_THREAD_CACHE`].
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = fprobe::ObjPool::builder().build(2, |i| i * 10).unwrap();
    /// assert_eq!(pool.capacity(), 2);
    /// ```
    pub fn build<T: Send>(
        self,
        nr_objs: usize,
        init: impl FnMut(usize) -> T,
    ) -> Result<ObjPool<T>, ObjPoolError> {
        if nr_objs == 0 {
            return Err(ObjPoolError::NoObjects);
        }
        if nr_objs > MAX_OBJECTS {
            return Err(ObjPoolError::TooManyObjects);
        }
        let thread_cache = match self.thread_cache {
            Some(c) if c > MAX_THREAD_CACHE => return Err(ObjPoolError::ThreadCacheTooLarge),
            Some(c) => c,
            None => (nr_objs / 16).clamp(1, 32),
        };
        Ok(ObjPool {
            raw: RawPool::new(nr_objs, thread_cache, init),
            _owns: PhantomData,
        })
    }
}

/// Why an [`ObjPool`] could not be built: the pool's only error (pops and
/// pushes cannot fail with one). Separate from [`crate::Error`], whose
/// variants are about addresses and probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ObjPoolError {
    /// A pool needs at least one object.
    NoObjects,
    /// More than [`MAX_OBJECTS`] objects were asked for.
    TooManyObjects,
    /// The magazine size was above [`MAX_THREAD_CACHE`].
    ThreadCacheTooLarge,
}

impl fmt::Display for ObjPoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NoObjects => "an object pool needs at least one object",
            Self::TooManyObjects => "too many objects for an object pool (at most 2^31)",
            Self::ThreadCacheTooLarge => "an object pool's thread cache holds at most 64 objects",
        })
    }
}

impl std::error::Error for ObjPoolError {}
