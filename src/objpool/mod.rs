//! `objpool`: a fixed-capacity pool of preallocated objects with one ring
//! per thread slot, the userspace counterpart of the kernel's `lib/objpool.c`
//! that replaced the global freelist of kretprobe instances in 2023.
//!
//! # Algorithm
//!
//! The pool preallocates `nr_objs` objects and spreads their indices over
//! `rings` rings (a power of two; default: the number of CPUs rounded up).
//! Every ring can hold all `nr_objs` objects (`cap = next_pow2(nr_objs)`),
//! so a push can never fail.
//!
//! * [`ObjPool::pop`] tries the calling thread's ring, then *steals* from
//!   the other rings in order; when every ring is empty it returns `None`
//!   and counts a miss. It never blocks and never allocates.
//! * Dropping the returned [`PoolObj`] pushes the object back to the ring of
//!   the thread that drops it (which may differ from the one that popped).
//!
//! In the steady state each thread pops from and pushes to its own ring, so
//! rings are uncontended and throughput scales with threads (seed 000:
//! 159× the Treiber freelist at 128 threads in the kernel).
//!
//! **Preemption and migration.** The kernel disables interrupts so that a
//! ring has one producer at a time; userspace cannot, and any thread may
//! push to any ring (a thread can be preempted in the middle of an
//! operation, and several threads share a ring slot). Each ring is therefore
//! a full multi-producer multi-consumer ring whose entries carry a sequence
//! number (Vyukov's idea) so that a pusher preempted between reserving a
//! position and writing it can never let a popper see an unwritten entry;
//! the protocol and its invariants are in `objpool/ring.rs`.
//!
//! **Choosing the local ring.** A thread's ring is `slot & (rings - 1)`,
//! where `slot` is a process-wide number handed out round-robin the first
//! time the thread touches any pool (one thread-local load afterwards, about
//! 0.3 ns). `sched_getcpu()` would follow the thread across CPUs, but costs
//! 1–2.5 ns per call on a fast host (REFERENCE §3) and measured 3–9 ns on
//! the 2-vCPU machine of `BENCHMARKS-objpool.md` (the benchmark prints it),
//! twice per pop/push pair, against 8–10 ns for the whole pair; and with a
//! ring per thread slot the common case (threads ≤ rings) has no sharing at
//! all. When more threads than rings run, threads share rings; that is
//! correct, only slower.
//!
//! **Lifetime.** The pool can be dropped while objects are outstanding, as
//! with the kernel's `objpool_fini`: the objects in the rings are dropped at
//! once, each outstanding one when its [`PoolObj`] is dropped, and the last
//! one frees the memory (reference count `nr_objs + 1`, never touched by
//! pop or push; see `objpool/raw.rs`).
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
//! drop(buf); // back into this thread's ring
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
//! is visible to the thread that pops the object next (the push's `Release`
//! store pairs with the pop's `Acquire` load). An object is held by at most
//! one [`PoolObj`] at a time and never lost: it is in exactly one ring or
//! one handle.
//!
//! A pop may return `None` while objects remain, in one case only: every
//! ring that still holds objects has, at its head, a position whose pusher
//! was preempted between reserving and publishing it. The pop does not wait
//! for that thread; the objects become available when it runs again.
//!
//! # Execution context
//!
//! | operation | blocks? | allocates? | async-signal-safe? |
//! |---|---|---|---|
//! | [`ObjPool::pop`] | never (lock-free: one CAS per ring tried) | no | yes, when `T`'s use is |
//! | [`PoolObj`] drop (push) | never (wait-free: one `fetch_add`, one store) | no | yes, while the pool lives |
//! | [`PoolObj`] drop after the pool was dropped | never | frees, if it is the last object | no |
//! | [`ObjPool`] drop | waits only for pushes already in flight | frees | no |
//! | [`ObjPool::new`], [`ObjPoolBuilder::build`] | never | yes | no |
//!
//! The first pop or push on a thread reads a process-wide counter (one
//! `fetch_add`) to assign the thread's slot. Dropping the pool from a
//! signal handler that interrupted a push on the same thread would wait
//! forever for that push: don't.
//!
//! # Performance
//!
//! A pop/push pair costs two atomic read-modify-writes on the thread's own
//! ring (a CAS on `head`, a `fetch_add` on `tail`) and scales with threads
//! while each has its own ring. glibc's `malloc`/`free` of a small object is
//! itself a per-thread cache (tcache); see `BENCHMARKS-objpool.md` for the
//! honest comparison against it, a Treiber freelist, `Mutex<Vec>` and
//! crossbeam's `ArrayQueue`.

mod raw;
mod ring;

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

pub(crate) use raw::RawPool;

/// The most objects a pool may hold (object indices are 32-bit and a ring's
/// capacity must stay below `2^32`).
pub const MAX_OBJECTS: usize = 1 << 31;

/// The most rings a pool may have.
pub const MAX_RINGS: usize = 1 << 16;

/// A fixed-capacity pool of preallocated objects with per-thread-slot rings.
///
/// See the [module docs](self) for the algorithm and its guarantees.
///
/// # Examples
///
/// ```
/// let pool = fprobe::ObjPool::builder().rings(4).build(8, |i| i).unwrap();
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
    /// A builder to choose the number of rings (on `ObjPool<()>` so that
    /// `ObjPool::builder()` needs no type annotation, as papaya does; the
    /// object type comes from [`ObjPoolBuilder::build`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = fprobe::ObjPool::builder().rings(2).build(16, |_| 0u64).unwrap();
    /// assert_eq!(pool.rings(), 2);
    /// ```
    pub fn builder() -> ObjPoolBuilder {
        ObjPoolBuilder::default()
    }
}

impl<T: Send> ObjPool<T> {
    /// Creates a pool of `nr_objs` objects, object `i` made by `init(i)`,
    /// with the default number of rings (see [`ObjPoolBuilder::rings`]).
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

    /// Takes an object: from the calling thread's ring, else stolen from
    /// another ring; `None` when the pool is exhausted (counted in
    /// [`nmissed`](Self::nmissed)). Never blocks, never allocates.
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

    /// Number of rings.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = fprobe::ObjPool::new(3, |_| ());
    /// assert!(pool.rings().is_power_of_two());
    /// ```
    pub fn rings(&self) -> usize {
        self.raw_ref().nr_rings()
    }

    /// Number of pops that found the pool exhausted.
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
            .field("rings", &self.rings())
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
/// | [`rings`](Self::rings) | `std::thread::available_parallelism()` (1 if unknown), rounded up to a power of two |
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
    rings: Option<usize>,
}

impl ObjPoolBuilder {
    /// Number of rings (rounded up to a power of two). One per CPU, the
    /// default, suits threads that come and go; one per long-lived worker
    /// thread removes all sharing.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = fprobe::ObjPool::builder().rings(3).build(4, |_| ()).unwrap();
    /// assert_eq!(pool.rings(), 4);
    /// ```
    pub fn rings(mut self, rings: usize) -> Self {
        self.rings = Some(rings);
        self
    }

    /// Builds a pool of `nr_objs` objects, object `i` made by `init(i)`.
    ///
    /// Allocates the objects and `rings × next_pow2(nr_objs)` ring entries
    /// of 8 bytes.
    ///
    /// # Errors
    ///
    /// [`ObjPoolError::NoObjects`] when `nr_objs` is 0,
    /// [`ObjPoolError::TooManyObjects`] above [`MAX_OBJECTS`],
    /// [`ObjPoolError::BadRings`] when `rings` is 0 or above [`MAX_RINGS`].
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
        let rings = match self.rings {
            Some(r) if r == 0 || r > MAX_RINGS => return Err(ObjPoolError::BadRings),
            Some(r) => r,
            None => std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_RINGS)),
        };
        Ok(ObjPool {
            raw: RawPool::new(nr_objs, rings.next_power_of_two(), init),
            _owns: PhantomData,
        })
    }
}

/// Why an [`ObjPool`] could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ObjPoolError {
    /// A pool needs at least one object.
    NoObjects,
    /// More than [`MAX_OBJECTS`] objects were asked for.
    TooManyObjects,
    /// The ring count was 0 or above [`MAX_RINGS`].
    BadRings,
}

impl fmt::Display for ObjPoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NoObjects => "an object pool needs at least one object",
            Self::TooManyObjects => "too many objects for an object pool (at most 2^31)",
            Self::BadRings => "an object pool needs between 1 and 65536 rings",
        })
    }
}

impl std::error::Error for ObjPoolError {}

/// The calling thread's ring slot (before masking with `rings - 1`).
#[cfg(not(loom))]
#[inline(always)]
fn local_ring() -> usize {
    use std::cell::Cell;

    /// Next slot to hand out; process-wide so that consecutive threads get
    /// different rings in every pool.
    static NEXT_SLOT: crate::sync::AtomicUsize = crate::sync::AtomicUsize::new(0);

    std::thread_local! {
        /// This thread's slot, `usize::MAX` before the first use.
        static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
    }

    #[cold]
    fn assign(slot: &Cell<usize>) -> usize {
        // Relaxed: only uniqueness-ish spreading matters, not ordering.
        let s = NEXT_SLOT.fetch_add(1, crate::sync::Ordering::Relaxed) & (usize::MAX >> 1);
        slot.set(s);
        s
    }

    // During thread-local destruction `SLOT` may be gone; any ring is
    // correct, ring 0 is as good as another.
    SLOT.try_with(|slot| match slot.get() {
        usize::MAX => assign(slot),
        s => s,
    })
    .unwrap_or(0)
}

/// Under loom, threads are numbered by the model: thread `n` uses ring `n`.
#[cfg(loom)]
fn local_ring() -> usize {
    let id = format!("{:?}", loom::thread::current().id());
    id.trim_start_matches("ThreadId(")
        .trim_end_matches(')')
        .parse()
        .unwrap_or(0)
}
