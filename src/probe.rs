//! The probe layer: the kernel's fprobe in userspace.
//!
//! A [`Fprobe`] bundles an entry handler, an optional exit handler and the
//! size of the per-call data passed from one to the other. A [`Registry`]
//! attaches probes to many addresses at once (all or nothing) and
//! dispatches: an engine calls [`Registry::on_entry`] from its hook or
//! trampoline when a function is entered and [`Registry::on_exit`] when it
//! returns.
//!
//! # Design
//!
//! * The registry owns an [`AddrIndex`] from address to
//!   `(probe slot, generation, cookie, handlers)`. Entry dispatch is one
//!   lookup under an RCU read section and one pass over the address's
//!   record (values in registration order).
//! * Probes live in a fixed array of *slots* (`max_probes`). A slot's
//!   generation is odd while a probe is registered in it and changes on
//!   unregister, so an entry or a return instance that carries an old
//!   generation is recognised as dead even if the slot is reused: the
//!   kernel checks the probe pointer only, which address reuse defeats.
//! * Each call through an address with exit handlers pushes one return
//!   instance per such probe (the `retinst` module: per-thread reuse, no
//!   allocation, no atomics in the steady state) and one *frame* on the
//!   thread's frame stack recording how many; `on_exit` pops exactly that
//!   many. Every `on_entry` pushes a frame (possibly empty), so the engine
//!   must call `on_exit` once for every `on_entry`, in LIFO order, as a
//!   return trampoline or `-finstrument-functions` does.
//! * Counters (hits and misses by cause) are per thread and per probe slot,
//!   stored by their thread only and summed on read: no shared-line write
//!   on the hit path, no racy increments.
//! * Handlers run inside an RCU read-side section with the thread's
//!   re-entrancy flag set: a handler that calls a probed function does not
//!   recurse into probes (counted as [`Missed::recursion`]).
//!
//! # Unregister
//!
//! [`Registry::unregister`] (1) changes the slot's generation, so hits that
//! load the entry from now on skip it; (2) removes the probe's entries from
//! the index; (3) marks the probe's in-flight return instances expired
//! (`RetInstPool::expire`); (4) waits for an RCU grace period, which ends
//! every handler call that was already running (handlers run inside read
//! sections). When it returns no handler of the probe is running or will
//! run. It never waits for a thread parked *between* entry and exit (that
//! call's exit handler is simply skipped), so it cannot hang on one.
//!
//! # Execution context
//!
//! | operation | blocks? | allocates? | async-signal-safe? |
//! |---|---|---|---|
//! | [`on_entry`](Registry::on_entry), [`on_exit`](Registry::on_exit) | never | first call on a thread only (its state) | yes, after the thread's first call |
//! | [`register`](Registry::register) | briefly (registry mutex, index stripes) | yes | no |
//! | [`unregister`](Registry::unregister) | yes: grace periods | no | no |
//! | [`enable`](Registry::enable), [`disable`](Registry::disable) | never | no | yes |
//! | [`stats`](Registry::stats) | briefly (registry mutex) | yes | no |
//!
//! A handler that panics is caught at the dispatch boundary (unwinding into
//! an engine's trampoline or C frames would be undefined behaviour), counted
//! in [`ProbeStats::panics`], and dispatch goes on.

use std::cell::{Cell, UnsafeCell};
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::error::Error;
use crate::index::AddrIndex;
use crate::rcu;
use crate::retinst::{Miss, ProbeRef, RetInstPool, ReturnStack};
use crate::sync::unmodelled::{AtomicU64, Mutex};
use crate::sync::{AtomicBool, AtomicPtr, Ordering};

/// Bytes at the front of each return instance's data holding the cookie.
const COOKIE: usize = 8;

/// What an entry handler sees.
pub struct EntryContext<'a, C> {
    /// The probed function's address.
    pub addr: u64,
    /// The return (caller) address the engine passed.
    pub ret_addr: u64,
    /// The cookie given for this (probe, address) at registration.
    pub cookie: u64,
    /// The engine's context (registers, arguments…).
    pub ctx: &'a C,
    /// Per-call data for the exit handler (`data_size` bytes; empty when the
    /// probe has no exit handler or no instance could be reserved).
    pub data: &'a mut [u8],
}

/// What an exit handler sees.
pub struct ExitContext<'a, C> {
    /// The probed function's address.
    pub addr: u64,
    /// The return address the engine passed to `on_exit`.
    pub ret_addr: u64,
    /// The cookie given for this (probe, address) at registration.
    pub cookie: u64,
    /// The engine's context at return.
    pub ctx: &'a C,
    /// The data the entry handler wrote.
    pub data: &'a [u8],
}

/// An entry handler's verdict on the exit handler of this call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryAction {
    /// Call the exit handler when the function returns.
    Continue,
    /// Do not call the exit handler for this call.
    SkipExit,
}

type EntryFn<C> = dyn Fn(&mut EntryContext<'_, C>) -> EntryAction + Send + Sync;
type ExitFn<C> = dyn Fn(&ExitContext<'_, C>) + Send + Sync;

/// A probe definition: handlers and per-call data size. Build with
/// [`Fprobe::builder`].
pub struct Fprobe<C> {
    entry: Option<Box<EntryFn<C>>>,
    exit: Option<Box<ExitFn<C>>>,
    data_size: usize,
}

impl<C> fmt::Debug for Fprobe<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fprobe")
            .field("entry", &self.entry.is_some())
            .field("exit", &self.exit.is_some())
            .field("data_size", &self.data_size)
            .finish()
    }
}

impl<C> Fprobe<C> {
    /// A probe with no handlers yet.
    pub fn builder() -> FprobeBuilder<C> {
        FprobeBuilder {
            probe: Fprobe {
                entry: None,
                exit: None,
                data_size: 0,
            },
        }
    }
}

/// Builds an [`Fprobe`].
#[must_use]
pub struct FprobeBuilder<C> {
    probe: Fprobe<C>,
}

impl<C> FprobeBuilder<C> {
    /// The entry handler.
    pub fn entry(
        mut self,
        f: impl Fn(&mut EntryContext<'_, C>) -> EntryAction + Send + Sync + 'static,
    ) -> Self {
        self.probe.entry = Some(Box::new(f));
        self
    }

    /// The exit handler; with one, every hit reserves a return instance.
    pub fn exit(mut self, f: impl Fn(&ExitContext<'_, C>) + Send + Sync + 'static) -> Self {
        self.probe.exit = Some(Box::new(f));
        self
    }

    /// Bytes of per-call data passed from entry to exit (default 0; at
    /// most the registry's `data_size`).
    pub fn data_size(mut self, bytes: usize) -> Self {
        self.probe.data_size = bytes;
        self
    }

    /// The probe.
    pub fn build(self) -> Fprobe<C> {
        self.probe
    }
}

/// Identifies a registered probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProbeHandle {
    slot: u32,
    generation: u64,
}

impl ProbeHandle {
    /// The handle as one non-zero integer, for FFI: the slot in the low 16
    /// bits, the generation above (a slot's generation would need 2^47
    /// register/unregister cycles to overflow the 48 bits).
    pub fn to_bits(self) -> u64 {
        (self.generation << 16) | u64::from(self.slot)
    }

    /// A handle from [`to_bits`](Self::to_bits). Any integer is accepted:
    /// one that names no registered probe makes the registry's calls return
    /// [`Error::NotFound`].
    pub fn from_bits(bits: u64) -> Self {
        Self {
            slot: (bits & 0xFFFF) as u32,
            generation: bits >> 16,
        }
    }
}

/// Misses by cause (the kernel's `nmissed`, split).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Missed {
    /// Hits while the thread was already inside a handler.
    pub recursion: u64,
    /// Exit handlers skipped: no free return instance.
    pub pool_exhausted: u64,
    /// Exit handlers skipped: the thread's return stack was full.
    pub depth: u64,
    /// Hits while the probe was disabled.
    pub disabled: u64,
}

/// Counters of one probe, summed over threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProbeStats {
    /// Entry hits that ran the probe.
    pub hits: u64,
    /// Exit handlers run.
    pub exits: u64,
    /// Misses by cause.
    pub missed: Missed,
    /// Handler calls that panicked (caught).
    pub panics: u64,
}

const C_HITS: usize = 0;
const C_EXITS: usize = 1;
const C_RECURSION: usize = 2;
const C_EXHAUSTED: usize = 3;
const C_DEPTH: usize = 4;
const C_DISABLED: usize = 5;
const C_PANICS: usize = 6;
const NCOUNTERS: usize = 7;

/// One index value: a probe attached at one address.
struct Attach<C> {
    slot: u32,
    generation: u64,
    cookie: u64,
    probe: Arc<Fprobe<C>>,
}

impl<C> Clone for Attach<C> {
    fn clone(&self) -> Self {
        Self {
            slot: self.slot,
            generation: self.generation,
            cookie: self.cookie,
            probe: self.probe.clone(),
        }
    }
}

struct Slot<C> {
    /// Odd while a probe is registered here; changed on unregister.
    generation: AtomicU64,
    enabled: AtomicBool,
    /// The registered probe (`Arc::into_raw`), for exit dispatch without a
    /// second index lookup. Set before the generation is published; taken
    /// and dropped by `unregister` after its grace period.
    probe: AtomicPtr<Fprobe<C>>,
}

/// Registration bookkeeping, under the registry mutex.
struct Book {
    /// Per slot: the (address, entry id) pairs of the registered probe.
    attached: Vec<Vec<(u64, crate::EntryId)>>,
    free: Vec<u32>,
    /// Counters of exited threads, per slot.
    retired: Vec<[u64; NCOUNTERS]>,
    /// Per slot: the slot's counter sums when its current probe was
    /// registered. Counters are per slot and never reset (each thread's are
    /// stored by that thread only), so a probe's own counts are the sums
    /// minus this; without it a probe would inherit the counts of every
    /// earlier probe of its slot.
    base: Vec<[u64; NCOUNTERS]>,
    threads: Vec<Arc<ThreadCounters>>,
}

impl Book {
    /// The counters of `slot`, summed over exited and live threads.
    fn sum(&self, slot: u32) -> [u64; NCOUNTERS] {
        let mut c = self.retired[slot as usize];
        for t in &self.threads {
            for (i, v) in c.iter_mut().enumerate() {
                *v += t.c[slot as usize * NCOUNTERS + i].load(Ordering::Relaxed);
            }
        }
        c
    }
}

/// One thread's counters, per slot; stored only by that thread.
struct ThreadCounters {
    c: Box<[AtomicU64]>,
}

impl ThreadCounters {
    #[inline(always)]
    fn bump(&self, slot: u32, which: usize) {
        let a = &self.c[slot as usize * NCOUNTERS + which];
        a.store(a.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

/// A registry: owns the index and dispatches entry/exit events to probes.
/// `C` is the context type the engine passes to handlers.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use fprobe::probe::{EntryAction, Fprobe, Registry};
///
/// let registry = Registry::<()>::builder().build().unwrap();
/// let calls = Arc::new(AtomicU64::new(0));
/// let c = calls.clone();
/// let probe = Fprobe::builder()
///     .entry(move |_| { c.fetch_add(1, Ordering::Relaxed); EntryAction::Continue })
///     .build();
/// let handle = registry.register(probe, &[0x1000, 0x2000]).unwrap();
///
/// // The engine's hook:
/// registry.on_entry(0x1000, 0, &());
/// registry.on_exit(0, &());
/// assert_eq!(calls.load(Ordering::Relaxed), 1);
///
/// registry.unregister(handle).unwrap();
/// registry.on_entry(0x1000, 0, &());
/// registry.on_exit(0, &());
/// assert_eq!(calls.load(Ordering::Relaxed), 1);
/// ```
pub struct Registry<C: 'static> {
    id: u64,
    index: AddrIndex<Attach<C>>,
    slots: Box<[Slot<C>]>,
    book: Arc<Mutex<Book>>,
    pool: RetInstPool,
    max_frames: usize,
}

/// Builds a [`Registry`].
#[derive(Clone, Debug)]
#[must_use]
pub struct RegistryBuilder<C> {
    max_probes: usize,
    instances: usize,
    data_size: usize,
    max_depth: usize,
    capacity: usize,
    hit_cache: Option<crate::HitCacheConfig>,
    huge_pages: bool,
    _ctx: std::marker::PhantomData<fn(&C)>,
}

impl<C: Send + Sync + 'static> RegistryBuilder<C> {
    /// Most probes registered at once (default 256).
    pub fn max_probes(mut self, n: usize) -> Self {
        self.max_probes = n;
        self
    }

    /// Return instances in the shared pool (default 4096).
    pub fn instances(mut self, n: usize) -> Self {
        self.instances = n;
        self
    }

    /// Largest per-call data a probe may ask for, in bytes (default 64).
    pub fn data_size(mut self, bytes: usize) -> Self {
        self.data_size = bytes;
        self
    }

    /// Deepest return stack per thread (default 64 instances; frames:
    /// 4 × that).
    pub fn max_depth(mut self, depth: usize) -> Self {
        self.max_depth = depth;
        self
    }

    /// Addresses to presize the index for (default 0).
    pub fn capacity(mut self, addresses: usize) -> Self {
        self.capacity = addresses;
        self
    }

    /// Puts the recent-hit cache in front of the registry's index (see
    /// [`crate::cache`]; default none).
    pub fn hit_cache(mut self, config: crate::HitCacheConfig) -> Self {
        self.hit_cache = Some(config);
        self
    }

    /// Whether the address index puts tables of 8 MiB and more on
    /// transparent huge pages (default on; see
    /// [`AddrIndexBuilder::huge_pages`](crate::AddrIndexBuilder::huge_pages)).
    pub fn huge_pages(mut self, on: bool) -> Self {
        self.huge_pages = on;
        self
    }

    /// Builds the registry.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for `max_probes` outside 1..=65536 or an
    /// invalid return-instance pool configuration.
    pub fn build(self) -> Result<Registry<C>, Error> {
        if !(1..=65536).contains(&self.max_probes) {
            return Err(Error::InvalidConfig("max_probes must be in 1..=65536"));
        }
        let pool = RetInstPool::builder()
            .instances(self.instances)
            .data_size(self.data_size + COOKIE)
            .max_depth(self.max_depth)
            .build()
            .map_err(|_| Error::InvalidConfig("invalid return-instance pool configuration"))?;
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Ok(Registry {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            index: {
                let b = AddrIndex::builder()
                    .capacity(self.capacity)
                    .huge_pages(self.huge_pages);
                match self.hit_cache {
                    Some(c) => b.hit_cache(c),
                    None => b,
                }
                .build()?
            },
            slots: (0..self.max_probes)
                .map(|_| Slot {
                    generation: AtomicU64::new(0),
                    enabled: AtomicBool::new(false),
                    probe: AtomicPtr::new(std::ptr::null_mut()),
                })
                .collect(),
            book: Arc::new(Mutex::new(Book {
                attached: vec![Vec::new(); self.max_probes],
                free: (0..self.max_probes as u32).rev().collect(),
                retired: vec![[0; NCOUNTERS]; self.max_probes],
                base: vec![[0; NCOUNTERS]; self.max_probes],
                threads: Vec::new(),
            })),
            pool,
            max_frames: self.max_depth.max(1) * 4,
        })
    }
}

/// This thread's dispatch state for one registry.
struct Local {
    registry: u64,
    /// Where to fold this thread's counters when it exits.
    book: std::sync::Weak<Mutex<Book>>,
    in_handler: Cell<bool>,
    /// Instances pushed per call, innermost last. Invariant: `len <= cap`.
    frames: UnsafeCell<Vec<u16>>,
    /// Calls whose frame did not fit (popped first by `on_exit`).
    overflow: Cell<usize>,
    stack: UnsafeCell<ReturnStack>,
    counters: Arc<ThreadCounters>,
}

impl Drop for Local {
    fn drop(&mut self) {
        let Some(book) = self.book.upgrade() else {
            return;
        };
        let mut book = book.lock().unwrap_or_else(|e| e.into_inner());
        let Book {
            retired, threads, ..
        } = &mut *book;
        threads.retain(|t| !Arc::ptr_eq(t, &self.counters));
        for (slot, r) in retired.iter_mut().enumerate() {
            for (i, v) in r.iter_mut().enumerate() {
                *v += self.counters.c[slot * NCOUNTERS + i].load(Ordering::Relaxed);
            }
        }
    }
}

/// This thread's dispatch states, one per registry used, as raw pointers
/// from `Box::into_raw`: `local()` hands out references into them while the
/// vector may grow, and moving a `Box` would invalidate those (a unique
/// retag), moving a raw pointer does not. Freed when the thread exits.
struct Locals(Vec<*mut Local>);

impl Drop for Locals {
    fn drop(&mut self) {
        for p in self.0.drain(..) {
            // SAFETY: each pointer came from `Box::into_raw` in `local_slow`
            // and is freed once, here, when no dispatch runs on the thread.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

std::thread_local! {
    static LOCALS: UnsafeCell<Locals> = const { UnsafeCell::new(Locals(Vec::new())) };
    static IGNORE_ALL: Cell<bool> = const { Cell::new(false) };
}

/// Makes every registry skip probes on the calling thread (`true`) or not
/// (`false`): for an engine's own threads. Frames are still kept, so
/// entry/exit pairing survives toggling mid-call.
pub fn ignore_current_thread(ignore: bool) {
    IGNORE_ALL.with(|i| i.set(ignore));
}

impl<C: Send + Sync + 'static> Registry<C> {
    /// A builder with the defaults.
    pub fn builder() -> RegistryBuilder<C> {
        RegistryBuilder {
            max_probes: 256,
            instances: 4096,
            data_size: 64,
            max_depth: 64,
            capacity: 0,
            hit_cache: None,
            huge_pages: true,
            _ctx: std::marker::PhantomData,
        }
    }

    /// Attaches `probe` to every address in `addrs` (cookie 0), all or
    /// nothing.
    ///
    /// # Errors
    ///
    /// [`Error::CapacityExceeded`] when `max_probes` probes are registered
    /// (reported with `max_addresses` = `max_probes`), or the index refuses
    /// the addresses; [`Error::InvalidConfig`] when the probe's `data_size`
    /// exceeds the registry's. Nothing stays registered on error.
    pub fn register(&self, probe: Fprobe<C>, addrs: &[u64]) -> Result<ProbeHandle, Error> {
        self.register_with_cookies(probe, addrs.iter().map(|&a| (a, 0)))
    }

    /// Attaches `probe` to each `(address, cookie)`, all or nothing.
    ///
    /// # Errors
    ///
    /// As [`register`](Self::register).
    pub fn register_with_cookies(
        &self,
        probe: Fprobe<C>,
        attach: impl IntoIterator<Item = (u64, u64)>,
    ) -> Result<ProbeHandle, Error> {
        if probe.data_size + COOKIE > self.pool.data_size() {
            return Err(Error::InvalidConfig(
                "probe data_size exceeds the registry's data_size",
            ));
        }
        let probe = Arc::new(probe);
        let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        let slot = book.free.pop().ok_or(Error::CapacityExceeded {
            max_addresses: self.slots.len(),
        })?;
        // No thread counts for a free slot (the previous probe's
        // `unregister` waited for every dispatch that could), so the sums
        // are stable until the generation store below publishes the slot.
        book.base[slot as usize] = book.sum(slot);
        let s = &self.slots[slot as usize];
        let generation = (s.generation.load(Ordering::Relaxed) | 1) + 2;
        // Relaxed: published by the Release generation store below.
        s.probe
            .store(Arc::into_raw(probe.clone()).cast_mut(), Ordering::Relaxed);
        s.enabled.store(true, Ordering::Relaxed);
        // Release: pairs with the Acquire generation loads of dispatch; a
        // thread that sees this generation sees the probe pointer.
        s.generation.store(generation, Ordering::Release);
        let items: Vec<(u64, Attach<C>)> = attach
            .into_iter()
            .map(|(addr, cookie)| {
                (
                    addr,
                    Attach {
                        slot,
                        generation,
                        cookie,
                        probe: probe.clone(),
                    },
                )
            })
            .collect();
        let addrs: Vec<u64> = items.iter().map(|(a, _)| *a).collect();
        match self.index.insert_many(items) {
            Ok(ids) => {
                book.attached[slot as usize] = addrs.into_iter().zip(ids).collect();
                Ok(ProbeHandle { slot, generation })
            }
            Err(e) => {
                s.generation.store(generation + 1, Ordering::Release);
                s.enabled.store(false, Ordering::Release);
                let p = s.probe.swap(std::ptr::null_mut(), Ordering::Relaxed);
                // The batch is undone, but its entries may have been in the
                // index for a while (a bulk insert that failed midway), and
                // inside a read-side section it returns without a grace
                // period: a dispatcher that saw this generation may still
                // hold `p`. Dropped after a grace period, then.
                // SAFETY: `p` came from `Arc::into_raw`; the swap took it
                // out of the slot, so it is released once; the box is ours
                // and `Arc<Fprobe<C>>` may be dropped on another thread.
                unsafe { rcu::retire_box_raw(Box::into_raw(Box::new(Arc::from_raw(p)))) };
                book.free.push(slot);
                Err(e.error)
            }
        }
    }

    fn live_slot(&self, h: ProbeHandle) -> Result<&Slot<C>, Error> {
        let s = self.slots.get(h.slot as usize).ok_or(Error::NotFound)?;
        if s.generation.load(Ordering::Acquire) != h.generation {
            return Err(Error::NotFound);
        }
        Ok(s)
    }

    /// Detaches the probe everywhere. When it returns, no handler of the
    /// probe is running or will run (see the module docs); it does not wait
    /// for calls in flight between entry and exit.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] for a handle already unregistered (or of another
    /// registry); nothing changes.
    ///
    /// # Panics
    ///
    /// Inside an RCU read-side section (or a handler) of the calling thread.
    pub fn unregister(&self, h: ProbeHandle) -> Result<(), Error> {
        assert!(
            !rcu::in_read_section(),
            "Registry::unregister called inside an RCU read-side section or a handler"
        );
        let attached = {
            let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
            let s = self.live_slot(h)?;
            // (1) Dead from now on for every new hit and every return.
            s.generation.store(h.generation + 1, Ordering::Release);
            s.enabled.store(false, Ordering::Release);
            std::mem::take(&mut book.attached[h.slot as usize])
        };
        // (2) Out of the index.
        for (addr, id) in attached {
            let _ = self.index.remove(addr, id);
        }
        // (3) In-flight return instances expire (waits one grace period).
        self.pool.expire(u64::from(h.slot));
        // (4) Handlers already running finish.
        rcu::synchronize();
        let s = &self.slots[h.slot as usize];
        let p = s.probe.swap(std::ptr::null_mut(), Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: the generation changed before the grace period above:
            // a dispatcher that could still load `p` was inside a read
            // section the grace period waited for. `p` came from
            // `Arc::into_raw`.
            drop(unsafe { Arc::from_raw(p) });
        }
        self.book
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free
            .push(h.slot);
        Ok(())
    }

    /// Resumes a disabled probe.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] for an unregistered handle.
    pub fn enable(&self, h: ProbeHandle) -> Result<(), Error> {
        self.live_slot(h)?.enabled.store(true, Ordering::Release);
        Ok(())
    }

    /// Stops running the probe's handlers (hits count as
    /// [`Missed::disabled`]) without detaching it.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] for an unregistered handle.
    pub fn disable(&self, h: ProbeHandle) -> Result<(), Error> {
        self.live_slot(h)?.enabled.store(false, Ordering::Release);
        Ok(())
    }

    /// The probe's counters, summed over threads.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] for an unregistered handle.
    pub fn stats(&self, h: ProbeHandle) -> Result<ProbeStats, Error> {
        self.live_slot(h)?;
        let book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        let mut c = book.sum(h.slot);
        for (v, b) in c.iter_mut().zip(&book.base[h.slot as usize]) {
            *v -= b;
        }
        Ok(ProbeStats {
            hits: c[C_HITS],
            exits: c[C_EXITS],
            missed: Missed {
                recursion: c[C_RECURSION],
                pool_exhausted: c[C_EXHAUSTED],
                depth: c[C_DEPTH],
                disabled: c[C_DISABLED],
            },
            panics: c[C_PANICS],
        })
    }

    /// Number of addresses with at least one probe.
    pub fn addresses(&self) -> usize {
        self.index.len_addrs()
    }

    /// This thread's state for this registry, created on first use; `None`
    /// while the thread's thread-locals are being destroyed.
    #[inline]
    fn local(&self) -> Option<&Local> {
        let found = LOCALS
            .try_with(|l| {
                // SAFETY: the vector is only touched by this thread, in this
                // function and `local_slow`, never re-entrantly (no callbacks
                // run while it is borrowed).
                let v = unsafe { &*l.get() };
                // SAFETY: live pointers from `Box::into_raw` (see `Locals`).
                v.0.iter()
                    .copied()
                    .find(|&p| unsafe { (*p).registry } == self.id)
            })
            .ok()?;
        match found {
            // SAFETY: freed only when the thread exits (see `Locals`).
            Some(p) => Some(unsafe { &*p }),
            None => Some(self.local_slow()),
        }
    }

    #[cold]
    fn local_slow(&self) -> &Local {
        let counters = Arc::new(ThreadCounters {
            c: (0..self.slots.len() * NCOUNTERS)
                .map(|_| AtomicU64::new(0))
                .collect(),
        });
        self.book
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .threads
            .push(counters.clone());
        let local = Box::new(Local {
            registry: self.id,
            book: Arc::downgrade(&self.book),
            in_handler: Cell::new(false),
            frames: UnsafeCell::new(Vec::with_capacity(self.max_frames)),
            overflow: Cell::new(0),
            stack: UnsafeCell::new(self.pool.register_thread()),
            counters,
        });
        let p = Box::into_raw(local);
        LOCALS.with(|l| {
            // SAFETY: as in `local`.
            unsafe { &mut *l.get() }.0.push(p)
        });
        // SAFETY: just pushed; lives until the thread exits (`Locals`).
        unsafe { &*p }
    }

    /// Function entry at `addr`: runs the entry handlers of the probes
    /// attached there, in registration order, and reserves return
    /// instances for those with exit handlers. Call [`on_exit`](Self::on_exit)
    /// exactly once when this call returns.
    #[inline]
    pub fn on_entry(&self, addr: u64, ret_addr: u64, ctx: &C) {
        self.on_entry_in(&rcu::read_lock(), addr, ret_addr, ctx);
    }

    /// [`on_entry`](Self::on_entry) inside a read-side section the caller
    /// already holds (an engine's hook that loaded the registry under it):
    /// saves entering a nested section.
    #[inline]
    pub fn on_entry_in(&self, guard: &rcu::ReadGuard, addr: u64, ret_addr: u64, ctx: &C) {
        let Some(local) = self.local() else { return };
        // SAFETY: this thread's vector, borrowed only for the statement;
        // nested dispatch from handlers pushes and pops its own balanced
        // frames in between, never while we hold a borrow.
        if unsafe { (*local.frames.get()).len() } >= self.max_frames {
            local.overflow.set(local.overflow.get() + 1);
            return;
        }
        let attached = self.index.get(addr, guard);
        let mut pushed = 0u16;
        if !attached.is_empty() {
            if local.in_handler.get() {
                for a in attached {
                    local.counters.bump(a.slot, C_RECURSION);
                }
            } else if !IGNORE_ALL.with(|i| i.get()) {
                local.in_handler.set(true);
                for a in attached {
                    pushed += self.entry_one(local, a, addr, ret_addr, ctx);
                }
                local.in_handler.set(false);
            }
        }
        // SAFETY: see above.
        unsafe { (*local.frames.get()).push(pushed) };
    }

    /// Runs one probe's entry side; returns 1 if it pushed an instance.
    #[inline]
    fn entry_one(&self, local: &Local, a: &Attach<C>, addr: u64, ret_addr: u64, ctx: &C) -> u16 {
        let slot = &self.slots[a.slot as usize];
        if slot.generation.load(Ordering::Acquire) != a.generation {
            return 0; // being unregistered
        }
        if !slot.enabled.load(Ordering::Relaxed) {
            local.counters.bump(a.slot, C_DISABLED);
            return 0;
        }
        local.counters.bump(a.slot, C_HITS);
        let p = &*a.probe;
        let mut empty = [0u8; 0];
        let (data, pushed): (&mut [u8], bool) = if p.exit.is_some() {
            // SAFETY: this thread's stack, not borrowed elsewhere (see
            // `on_entry`); handlers cannot reach it (re-entrancy flag).
            let stack = unsafe { &mut *local.stack.get() };
            match stack.push(
                ProbeRef {
                    id: u64::from(a.slot),
                    generation: a.generation,
                },
                addr,
                COOKIE + p.data_size,
            ) {
                Ok(d) => {
                    let (cookie, data) = d.split_at_mut(COOKIE);
                    cookie.copy_from_slice(&a.cookie.to_ne_bytes());
                    (data, true)
                }
                Err(miss) => {
                    local.counters.bump(
                        a.slot,
                        match miss {
                            Miss::DepthOverflow => C_DEPTH,
                            _ => C_EXHAUSTED,
                        },
                    );
                    (&mut empty[..], false)
                }
            }
        } else {
            (&mut empty[..], false)
        };
        let mut action = EntryAction::Continue;
        if let Some(entry) = &p.entry {
            let mut ec = EntryContext {
                addr,
                ret_addr,
                cookie: a.cookie,
                ctx,
                data,
            };
            match catch_unwind(AssertUnwindSafe(|| entry(&mut ec))) {
                Ok(act) => action = act,
                Err(_) => {
                    local.counters.bump(a.slot, C_PANICS);
                    action = EntryAction::SkipExit;
                }
            }
        }
        if pushed && action == EntryAction::SkipExit {
            // SAFETY: as above.
            let stack = unsafe { &mut *local.stack.get() };
            drop(stack.pop());
            return 0;
        }
        u16::from(pushed)
    }

    /// Function return: runs the exit handlers reserved by the matching
    /// [`on_entry`](Self::on_entry), newest first, skipping probes
    /// unregistered since. Never looks the address up again: a probe
    /// registered between entry and return has no instance for this call.
    #[inline]
    pub fn on_exit(&self, ret_addr: u64, ctx: &C) {
        self.on_exit_with(ret_addr, ctx, rcu::read_lock);
    }

    /// [`on_exit`](Self::on_exit) inside a read-side section the caller
    /// already holds.
    #[inline]
    pub fn on_exit_in(&self, _guard: &rcu::ReadGuard, ret_addr: u64, ctx: &C) {
        self.on_exit_with(ret_addr, ctx, || ());
    }

    /// `section` opens the read-side section the exit handlers run in (or
    /// nothing, when the caller holds one); called only when there is an
    /// instance to run.
    #[inline(always)]
    fn on_exit_with<G>(&self, ret_addr: u64, ctx: &C, section: impl FnOnce() -> G) {
        let Some(local) = self.local() else { return };
        if local.overflow.get() > 0 {
            local.overflow.set(local.overflow.get() - 1);
            return;
        }
        // SAFETY: this thread's vector, borrowed for the statement only.
        let Some(n) = (unsafe { (*local.frames.get()).pop() }) else {
            return; // unbalanced exit: nothing to pair with
        };
        if n == 0 {
            return;
        }
        let _section = section();
        let was_in = local.in_handler.replace(true);
        for _ in 0..n {
            // SAFETY: this thread's stack; nested dispatch from a handler
            // only sees empty frames and never touches it.
            let stack = unsafe { &mut *local.stack.get() };
            let Some(ri) = stack.pop() else { break };
            let probe = ri.probe();
            let slot_idx = probe.id as u32;
            let slot = &self.slots[slot_idx as usize];
            // Acquire: pairs with the Release generation store in
            // `register_with_cookies`; the probe pointer is visible.
            if ri.is_expired() || slot.generation.load(Ordering::Acquire) != probe.generation {
                continue;
            }
            let p = slot.probe.load(Ordering::Relaxed);
            // SAFETY: the generation matched inside our read section, so
            // `unregister` has not passed its grace period: the Arc it owns
            // keeps the probe alive until we leave the section.
            let Some(fp) = (unsafe { p.as_ref() }) else {
                continue;
            };
            if let Some(exit) = &fp.exit {
                let (cookie, data) = ri.data().split_at(COOKIE);
                let xc = ExitContext {
                    addr: ri.addr(),
                    ret_addr,
                    cookie: u64::from_ne_bytes(cookie.try_into().expect("8 bytes")),
                    ctx,
                    data,
                };
                if catch_unwind(AssertUnwindSafe(|| exit(&xc))).is_err() {
                    local.counters.bump(slot_idx, C_PANICS);
                } else {
                    local.counters.bump(slot_idx, C_EXITS);
                }
            }
        }
        local.in_handler.set(was_in);
    }
}

impl<C: 'static> Drop for Registry<C> {
    fn drop(&mut self) {
        for s in self.slots.iter() {
            let p = s.probe.swap(std::ptr::null_mut(), Ordering::Relaxed);
            if !p.is_null() {
                // SAFETY: `&mut self`: no dispatch runs; `p` came from
                // `Arc::into_raw` and is dropped once.
                drop(unsafe { Arc::from_raw(p) });
            }
        }
        // Threads' states for this registry stay allocated until the threads
        // exit (keyed by a registry id that is never reused).
    }
}
