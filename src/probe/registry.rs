//! The registry: probe slots and their generations, register and
//! unregister, enable and disable, statistics.
//!
//! # Slots and generations
//!
//! Probes live in a fixed array of slots (`max_probes`). A slot's
//! *generation* is odd while a probe is registered in it and changes on
//! unregister; its *state* word is `generation << 1 | enabled`. Every
//! attachment in the index and every return entry on a shadow stack
//! carries the generation it was made under, so one load of the state
//! tells dispatch whether the probe is live and enabled, and an old
//! generation is recognised as dead even after the slot is reused (the
//! kernel checks the probe pointer only, which address reuse defeats).
//!
//! # When a probe is freed
//!
//! `unregister` changes the generation, then waits for a grace period:
//! every dispatch, entry or exit, runs inside a read-side section of the
//! thread's RCU record (`dispatch.rs`), so once the grace period ends no
//! dispatch that may have seen the old generation is still running. Only
//! then is the probe dropped and its slot freed. A failed registration
//! cannot wait (it may run inside a read-side section): its probe is
//! parked and dropped after the next such wait, or with the registry.

use super::def::Fprobe;
use super::recursion;
use super::section::DispatchSection;
use super::shadow::ShadowStack;
use super::stats::{NCOUNTERS, ProbeStats, Sums};
use crate::error::Error;
use crate::index::AddrIndex;
use crate::per_thread::{CacheSlot, PerThread};
use crate::rcu;
use crate::setters::setters;
use crate::sync::unmodelled::{AtomicU64, Mutex};
use crate::sync::{AtomicPtr, Ordering};

/// Identifies a registered probe.
///
/// # Examples
///
/// ```
/// use fprobe::probe::ProbeHandle;
/// let h = ProbeHandle::from_bits(0x3_0002);
/// assert_eq!(h.to_bits(), 0x3_0002);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProbeHandle {
    pub(super) slot: u32,
    pub(super) generation: u64,
}

impl ProbeHandle {
    /// The handle as one non-zero integer, for FFI: the slot in the low 16
    /// bits, the generation above (a slot's generation stays within the 48
    /// bits for at least 2^31 register/unregister cycles: each registry's
    /// generations start in a range of their own, 2^32 wide).
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

/// One index value: a probe attached at one address. It names the probe
/// by slot and generation only: dispatch takes the probe from the slot
/// once the generation matches (see `ProbeSlot::probe`), so records hold
/// no reference count and copying one touches no shared line.
///
/// Invariant: `slot` is below the registry's slot count (`max_probes`), the
/// length of `Registry::slots` and of every thread's counters; dispatch
/// indexes both with it unchecked.
#[derive(Clone, Copy)]
pub(super) struct Attachment {
    pub(super) slot: u32,
    /// Words of the probe's return entry on a shadow stack (its data words
    /// plus 3); 0 when it has no exit handler.
    pub(super) frame_words: u32,
    pub(super) generation: u64,
    pub(super) cookie: u64,
}

/// `generation << 1 | enabled`.
#[inline(always)]
pub(super) fn state(generation: u64, enabled: bool) -> u64 {
    generation << 1 | u64::from(enabled)
}

pub(super) struct ProbeSlot<C> {
    /// `state(generation, enabled)`; the generation is odd while a probe is
    /// registered here. Invariant: stored only under the registry mutex
    /// (enable/disable: a compare-exchange that keeps the generation).
    pub(super) state: AtomicU64,
    /// The registered probe (`Box::into_raw`), for entry and exit dispatch.
    /// Set before the generation is published; taken and dropped by
    /// `unregister` after its grace period (module docs). So a dispatcher
    /// that loaded the state with the generation it expects, inside its
    /// read-side section, finds the probe here, alive until it leaves the
    /// section; or null, when a failed registration took it back (without
    /// a grace period: it is parked, not freed).
    pub(super) probe: AtomicPtr<Fprobe<C>>,
}

impl<C> ProbeSlot<C> {
    /// Whether the slot holds the probe of `generation`, enabled or not.
    #[inline(always)]
    pub(super) fn holds(&self, generation: u64) -> bool {
        // Acquire: pairs with the Release state store of
        // `register_with_cookies`; the probe pointer is visible.
        self.state.load(Ordering::Acquire) >> 1 == generation
    }

    /// The probe of `generation`, if the slot holds it; `None` also when a
    /// failed registration took it back.
    ///
    /// # Safety
    ///
    /// The caller is inside a read-side section for as long as the
    /// reference lives: `unregister` frees the probe only after a grace
    /// period that began once the generation was dead.
    #[inline(always)]
    pub(super) unsafe fn probe_of(&self, generation: u64) -> Option<&Fprobe<C>> {
        if !self.holds(generation) {
            return None;
        }
        // Relaxed: ordered by the Acquire of `holds`.
        let p = self.probe.load(Ordering::Relaxed);
        // SAFETY: the generation matched inside the caller's section (the
        // contract above).
        unsafe { p.as_ref() }
    }
}

/// Where a registered probe is in the index, to take it out again.
#[derive(Clone, Default)]
enum Placement {
    #[default]
    Nowhere,
    /// One shared insert: one id at all of the addresses.
    Shared(Vec<u64>, crate::index::EntryId),
    /// One entry per address.
    Each(Vec<(u64, crate::index::EntryId)>),
}

/// Registration bookkeeping, under the registry mutex.
struct Book<C: 'static> {
    /// Per slot: where the registered probe is in the index.
    attached: Vec<Placement>,
    free: Vec<u32>,
    /// Per slot: the slot's counter sums when its current probe was
    /// registered. Counters are per slot and never reset (each thread's are
    /// stored by that thread only), so a probe's own counts are the sums
    /// minus this.
    base: Vec<Sums>,
    /// Per slot: freed by a failed registration, which does not wait for
    /// a grace period, so a dispatcher that saw its generation may still
    /// count on the slot.
    dirty: Vec<bool>,
    /// Probes of failed registrations, which a dispatcher that saw their
    /// generation may still run: dropped after the next wait for
    /// dispatches that starts after they were parked (module docs).
    parked: Vec<Parked<C>>,
}

/// A probe taken out of its slot, waiting to be dropped.
struct Parked<C: 'static>(*mut Fprobe<C>);

// SAFETY: the pointer is owned (from `Box::into_raw`, out of its slot) and
// `Fprobe<C>` is `Send`.
unsafe impl<C> Send for Parked<C> where Fprobe<C>: Send {}

impl<C> Drop for Parked<C> {
    fn drop(&mut self) {
        // SAFETY: from `Box::into_raw`, taken out of its slot by a failed
        // registration and dropped once, here; whoever drops it waited for
        // every dispatch that could have loaded it (a grace period)
        // or holds the registry exclusively.
        drop(unsafe { Box::from_raw(self.0) });
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
    pub(super) index: AddrIndex<Attachment>,
    pub(super) slots: Box<[ProbeSlot<C>]>,
    book: Mutex<Book<C>>,
    /// Each thread's shadow stack and counters, freed with the registry.
    /// Its key changes at every [`reset_pairing`](Registry::reset_pairing):
    /// a stack cached in a thread's context under the current key belongs
    /// to the current pairing epoch (the key is the epoch; see
    /// `local_outermost` in `dispatch.rs`).
    pub(super) locals: PerThread<ShadowStack, { CacheSlot::Context as usize }>,
    /// Words of each thread's shadow stack.
    pub(super) stack_words: usize,
    /// Largest per-call data a probe may ask for, in bytes.
    data_size: usize,
}

/// Builds a [`Registry`].
///
/// | setting | default |
/// |---|---|
/// | [`max_probes`](Self::max_probes) | 256 |
/// | [`data_size`](Self::data_size) | 64 bytes |
/// | [`max_depth`](Self::max_depth) | 64 |
/// | [`capacity`](Self::capacity) | 0 addresses |
/// | [`hit_cache`](Self::hit_cache) | none |
/// | [`huge_pages`](Self::huge_pages) | on |
///
/// # Examples
///
/// ```
/// let r = fprobe::probe::Registry::<()>::builder()
///     .max_probes(16)
///     .data_size(16)
///     .max_depth(128)
///     .capacity(50_000)
///     .build()
///     .unwrap();
/// assert_eq!(r.addresses(), 0);
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct RegistryBuilder<C> {
    max_probes: usize,
    data_size: usize,
    max_depth: usize,
    capacity: usize,
    hit_cache: Option<crate::cache::HitCacheConfig>,
    huge_pages: bool,
    _ctx: std::marker::PhantomData<fn(&C)>,
}

/// Largest `data_size` a registry accepts, in bytes.
pub const MAX_DATA_SIZE: usize = 4096;

/// Registries built so far in the process: each starts the generations of
/// its slots in a range of its own (`GENERATIONS_PER_REGISTRY` wide, the
/// `n`-th registry's at `n mod 2^16` ranges up), so that a handle of one
/// registry names no probe of another: a foreign handle is `NotFound`
/// unless one of the two registries' slots was reused more than 2^30
/// times or 65,536 registries were built in between.
static REGISTRIES: AtomicU64 = AtomicU64::new(0);
/// Width of one registry's range of generations: 2^16 ranges fill the 48
/// bits a [`ProbeHandle`] keeps, and a slot's generation stays inside them
/// for 2^31 register/unregister cycles from the last range's start.
const GENERATIONS_PER_REGISTRY: u64 = 1 << 32;

impl<C: Send + Sync + 'static> RegistryBuilder<C> {
    setters! {
        /// Most probes registered at once (1..=65536).
        max_probes: usize;

        /// Largest per-call data a probe may ask for, in bytes (at most
        /// [`MAX_DATA_SIZE`]).
        data_size: usize;

        /// Nesting depth each thread's shadow stack holds: at least this many
        /// nested calls, each with a return probe of the full `data_size`
        /// (calls that keep nothing for an exit take no room, at any depth).
        /// Deeper calls still run their entry handlers; their exit handlers
        /// are skipped and counted ([`Missed::depth`](super::Missed::depth)).
        /// Each thread that dispatches takes `max_depth × (ceil(data_size /
        /// 8) + 9)` words (a frame takes its data words and 6 more, 9 when
        /// it took a return).
        max_depth: usize;

        /// Addresses to presize the index for.
        capacity: usize;

        /// Whether the address index puts tables of 8 MiB and more on
        /// transparent huge pages (see
        /// [`AddrIndexBuilder::huge_pages`](crate::AddrIndexBuilder::huge_pages)).
        huge_pages: bool;
    }

    /// Puts the recent-hit cache in front of the registry's index (see
    /// [`crate::cache`]).
    pub fn hit_cache(mut self, config: crate::cache::HitCacheConfig) -> Self {
        self.hit_cache = Some(config);
        self
    }

    /// Builds the registry.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for `max_probes` outside 1..=65536, a
    /// `data_size` over [`MAX_DATA_SIZE`], a `max_depth` of 0 (no exit
    /// handler could ever run), or an invalid index configuration.
    pub fn build(self) -> Result<Registry<C>, Error> {
        if !(1..=65536).contains(&self.max_probes) {
            return Err(Error::InvalidConfig("max_probes must be in 1..=65536"));
        }
        if self.data_size > MAX_DATA_SIZE {
            return Err(Error::InvalidConfig("data_size must be at most 4096 bytes"));
        }
        super::panics::install_hook();
        if self.max_depth == 0 {
            return Err(Error::InvalidConfig(
                "max_depth must be at least 1 (0 would skip every exit handler)",
            ));
        }
        let stack_words = self
            .max_depth
            .checked_mul(self.data_size.div_ceil(8) + 9)
            .filter(|&w| w <= 1 << 24)
            .ok_or(Error::InvalidConfig(
                "max_depth × data_size makes a shadow stack over 128 MiB",
            ))?;
        let index = AddrIndex::builder()
            .capacity(self.capacity)
            .huge_pages(self.huge_pages);
        let index = match self.hit_cache {
            Some(c) => index.hit_cache(c),
            None => index,
        }
        .build()?;
        // Relaxed: a counter that orders nothing.
        let first = REGISTRIES.fetch_add(1, Ordering::Relaxed) % (1 << 16);
        // Even: no probe registered; the first registration takes the next
        // odd generation but one (`register_with_cookies`).
        let free = state(first * GENERATIONS_PER_REGISTRY, false);
        Ok(Registry {
            index,
            slots: (0..self.max_probes)
                .map(|_| ProbeSlot {
                    state: AtomicU64::new(free),
                    probe: AtomicPtr::new(std::ptr::null_mut()),
                })
                .collect(),
            book: Mutex::new(Book {
                attached: vec![Placement::Nowhere; self.max_probes],
                free: (0..self.max_probes as u32).rev().collect(),
                base: vec![[0; NCOUNTERS + 1]; self.max_probes],
                dirty: vec![false; self.max_probes],
                parked: Vec::new(),
            }),
            locals: PerThread::new(),
            stack_words,
            data_size: self.data_size,
        })
    }
}

impl<C: Send + Sync + 'static> Registry<C> {
    /// A builder with the defaults.
    pub fn builder() -> RegistryBuilder<C> {
        RegistryBuilder {
            max_probes: 256,
            data_size: 64,
            max_depth: 64,
            capacity: 0,
            hit_cache: None,
            huge_pages: true,
            _ctx: std::marker::PhantomData,
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book<C>> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The counters of `slot`, summed over threads.
    fn sum(&self, slot: u32) -> Sums {
        let mut s = [0; NCOUNTERS + 1];
        for local in self.locals.iter() {
            local.counters.add_to(slot, &mut s);
        }
        s
    }

    /// Attaches `probe` to every address in `addrs` (cookie 0), all or
    /// nothing.
    ///
    /// Placement at distinct addresses with one cookie, a probe is one
    /// index record for all of them (`AddrIndex::insert_shared`), whose
    /// lookups stay in cache however many addresses the calls spread
    /// over; distinct cookies, or an address given twice (the probe then
    /// runs twice there), take one record per address.
    ///
    /// # Errors
    ///
    /// In the order they are checked: [`Error::InvalidConfig`] when the
    /// probe's `data_size` exceeds the registry's;
    /// [`Error::InvalidArgument`] for a probe with neither an entry nor an
    /// exit handler, or an empty address list; [`Error::TooManyProbes`]
    /// when `max_probes` probes are registered;
    /// [`Error::CapacityExceeded`] when the index refuses the addresses.
    /// Nothing stays registered on error.
    ///
    /// # Examples
    ///
    /// ```
    /// use fprobe::Error;
    /// use fprobe::probe::{EntryAction, Fprobe, Registry};
    ///
    /// let registry = Registry::<()>::builder().build().unwrap();
    /// let probe = || Fprobe::builder().entry(|_| EntryAction::Continue).build();
    /// assert!(matches!(registry.register(probe(), &[]), Err(Error::InvalidArgument(_))));
    /// let none = Fprobe::<()>::builder().build();
    /// assert!(matches!(registry.register(none, &[0x1000]), Err(Error::InvalidArgument(_))));
    /// assert!(registry.register(probe(), &[0x1000]).is_ok());
    /// ```
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
        if probe.data_size > self.data_size {
            return Err(Error::InvalidConfig(
                "probe data_size exceeds the registry's data_size",
            ));
        }
        if !probe.has_entry() && !probe.has_exit() {
            return Err(Error::InvalidArgument(
                "a probe needs an entry or an exit handler",
            ));
        }
        let mut attach = attach.into_iter().peekable();
        if attach.peek().is_none() {
            return Err(Error::InvalidArgument("no address to attach the probe to"));
        }
        let frame_words = if probe.has_exit() {
            probe.data_size.div_ceil(8) as u32 + 3
        } else {
            0
        };
        let probe = Box::new(probe);
        let mut book = self.book();
        let slot = book.free.pop().ok_or(Error::TooManyProbes {
            max_probes: self.slots.len(),
        })?;
        if std::mem::take(&mut book.dirty[slot as usize]) && self.may_wait() {
            // Let the dispatchers that saw the failed registration finish
            // counting first (outside the mutex: a handler may be waiting
            // for it). The slot is ours meanwhile: it is off the free list.
            let parked = std::mem::take(&mut book.parked);
            drop(book);
            rcu::synchronize_unchecked();
            drop(parked);
            book = self.book();
        }
        // No thread counts for a free slot (the previous probe's
        // `unregister` waited for every dispatch that could; a failed
        // registration's, the wait above, unless this runs inside a read
        // section or a dispatch), so the sums are stable until the state
        // store below publishes the slot.
        book.base[slot as usize] = self.sum(slot);
        let s = &self.slots[slot as usize];
        let generation = ((s.state.load(Ordering::Relaxed) >> 1) | 1) + 2;
        // Relaxed: published by the Release state store below.
        s.probe.store(Box::into_raw(probe), Ordering::Relaxed);
        // Release: pairs with the Acquire state loads of dispatch; a thread
        // that sees this generation sees the probe pointer.
        s.state.store(state(generation, true), Ordering::Release);
        let items: Vec<(u64, Attachment)> = attach
            .map(|(addr, cookie)| {
                (
                    addr,
                    Attachment {
                        slot,
                        frame_words,
                        generation,
                        cookie,
                    },
                )
            })
            .collect();
        let addrs: Vec<u64> = items.iter().map(|(a, _)| *a).collect();
        // One cookie at distinct addresses (the usual case: `register`):
        // one record for all of them, so that a lookup spread over them
        // misses the cache once, not twice (`AddrIndex::insert_shared`).
        let shared = match items.split_first() {
            Some(((_, first), rest)) if !rest.is_empty() => {
                rest.iter().all(|(_, a)| a.cookie == first.cookie) && {
                    let mut sorted = addrs.clone();
                    sorted.sort_unstable();
                    sorted.windows(2).all(|w| w[0] != w[1])
                }
            }
            _ => false,
        };
        let inserted = match shared {
            true => {
                let value = items[0].1;
                self.index
                    .insert_shared(&addrs, value)
                    .map(|id| Placement::Shared(addrs, id))
                    .map_err(|e| e.error)
            }
            false => self
                .index
                .insert_many(items)
                .map(|ids| Placement::Each(addrs.into_iter().zip(ids).collect()))
                .map_err(|e| e.error),
        };
        match inserted {
            Ok(attached) => {
                book.attached[slot as usize] = attached;
                Ok(ProbeHandle { slot, generation })
            }
            Err(e) => {
                // Release: as in `unregister`.
                s.state
                    .store(state(generation + 1, false), Ordering::Release);
                let p = s.probe.swap(std::ptr::null_mut(), Ordering::Relaxed);
                // The batch is undone, but its entries may have been in the
                // index for a while (a bulk insert that failed midway), and
                // inside a read-side section or a handler it cannot wait: a
                // dispatcher that saw this generation may still hold `p`.
                // Parked until a wait for dispatches, then.
                book.parked.push(Parked(p));
                book.dirty[slot as usize] = true;
                book.free.push(slot);
                Err(e)
            }
        }
    }

    fn live_slot(&self, h: ProbeHandle) -> Result<&ProbeSlot<C>, Error> {
        let s = self.slots.get(h.slot as usize).ok_or(Error::NotFound)?;
        // Relaxed: only the generation is compared; the probe is not read.
        if s.state.load(Ordering::Relaxed) >> 1 != h.generation || h.generation & 1 == 0 {
            return Err(Error::NotFound);
        }
        Ok(s)
    }

    /// Detaches the probe everywhere. When it returns, no handler of the
    /// probe is running or will run; calls in flight between entry and
    /// exit skip its exit handler. It never waits for such a call, so a
    /// thread parked inside a probed function cannot hang it.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] for a handle already unregistered (or of another
    /// registry); nothing changes.
    ///
    /// # Panics
    ///
    /// Inside an RCU read-side section, a handler, or a dispatch of this
    /// registry on the calling thread.
    pub fn unregister(&self, h: ProbeHandle) -> Result<(), Error> {
        assert!(
            self.may_wait(),
            "Registry::unregister called inside an RCU read-side section or a handler"
        );
        let (attached, parked) = {
            let mut book = self.book();
            let s = self.live_slot(h)?;
            // (1) Dead from now on for every new hit and every return.
            // Release: the slot's later reuse is ordered after it for
            // dispatchers that Acquire the new generation.
            s.state
                .store(state(h.generation + 1, false), Ordering::Release);
            (
                std::mem::take(&mut book.attached[h.slot as usize]),
                std::mem::take(&mut book.parked),
            )
        };
        // (2) Out of the index.
        match attached {
            Placement::Nowhere => {}
            Placement::Shared(addrs, id) => {
                self.index.remove_shared(&addrs, id);
            }
            Placement::Each(entries) => {
                for (addr, id) in entries {
                    let _ = self.index.remove(addr, id);
                }
            }
        }
        // (3) Handlers already running finish: every dispatch that could
        // have seen the old generation is inside a read-side section.
        rcu::synchronize_unchecked();
        drop(parked);
        let s = &self.slots[h.slot as usize];
        // Relaxed: the waits above order every dispatcher before us.
        let p = s.probe.swap(std::ptr::null_mut(), Ordering::Relaxed);
        if !p.is_null() {
            // SAFETY: the generation changed before the waits above: a
            // dispatcher that could still load `p` was inside a read
            // section or a counted dispatch, which they waited for. `p`
            // came from `Box::into_raw`.
            drop(unsafe { Box::from_raw(p) });
        }
        self.book().free.push(h.slot);
        Ok(())
    }

    /// Whether the calling thread may wait for a grace period: it is
    /// inside no RCU read-side section, which every dispatch and handler
    /// is (each would wait for itself).
    fn may_wait(&self) -> bool {
        !rcu::in_read_section() && !recursion::in_handler()
    }

    /// Sets the enabled bit of a live probe's state.
    fn set_enabled(&self, h: ProbeHandle, on: bool) -> Result<(), Error> {
        let _book = self.book();
        let s = self.live_slot(h)?;
        // Relaxed: the bit is a flag that publishes nothing; state stores
        // are serialised by the mutex held here.
        s.state.store(state(h.generation, on), Ordering::Relaxed);
        Ok(())
    }

    /// Resumes a disabled probe.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] for an unregistered handle.
    pub fn enable(&self, h: ProbeHandle) -> Result<(), Error> {
        self.set_enabled(h, true)
    }

    /// Stops running the probe's handlers (hits count as
    /// [`Missed::disabled`](super::Missed::disabled)) without detaching
    /// it. Exit handlers of calls entered while it was enabled still run.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] for an unregistered handle.
    pub fn disable(&self, h: ProbeHandle) -> Result<(), Error> {
        self.set_enabled(h, false)
    }

    /// Stops the probe's entries (it is disabled, as by
    /// [`disable`](Self::disable)) and waits until every call in flight
    /// that entered it on another thread has returned (its exit handler
    /// ran, or was refused as recursion or for an ignored thread), or until
    /// `timeout` has passed. Returns how many such calls are still in
    /// flight then: 0 when the probe is drained. For ending a trace with
    /// every entry paired with its exit: drain, then
    /// [`unregister`](Self::unregister) (which, alone, skips the exits of
    /// calls still in flight).
    ///
    /// Not waited for, and not counted: calls in flight on the calling
    /// thread itself (they return after this does, and after an
    /// `unregister` their exits are skipped). A thread parked inside a
    /// probed call, one that exited inside one (until a thread given its
    /// index dispatches through this registry), or one that has not
    /// dispatched since a [`reset_pairing`](Self::reset_pairing) holds the
    /// drain until the timeout. The probe stays disabled;
    /// [`enable`](Self::enable) resumes it (and, during a drain, makes it
    /// time out).
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] for an unregistered handle.
    ///
    /// # Panics
    ///
    /// Inside an RCU read-side section, a handler, or a dispatch of this
    /// registry on the calling thread.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use fprobe::probe::{Fprobe, Registry};
    ///
    /// let registry = Registry::<()>::builder().build().unwrap();
    /// let h = registry.register(Fprobe::builder().exit(|_| {}).build(), &[0x1000]).unwrap();
    /// std::thread::scope(|s| {
    ///     s.spawn(|| {
    ///         registry.on_entry(0x1000, 0x500, &());
    ///         std::thread::sleep(Duration::from_millis(10));
    ///         registry.on_exit(0x500, &());
    ///     });
    /// });
    /// assert_eq!(registry.drain(h, Duration::from_secs(10)).unwrap(), 0);
    /// assert_eq!(registry.stats(h).unwrap().exits, 1);
    /// registry.unregister(h).unwrap();
    /// ```
    pub fn drain(&self, h: ProbeHandle, timeout: std::time::Duration) -> Result<u64, Error> {
        use std::time::{Duration, Instant};
        assert!(
            self.may_wait(),
            "Registry::drain called inside an RCU read-side section or a handler"
        );
        let start = Instant::now();
        self.disable(h)?;
        // Every entry that saw the probe enabled ran inside a read section
        // and bumped `Kept` there: after a grace period all of them show
        // in the sums, and no new one comes.
        rcu::synchronize();
        let mut pause = Duration::from_micros(10);
        loop {
            let left = self.in_flight_elsewhere(h)?;
            let waited = start.elapsed();
            if left == 0 || waited >= timeout {
                return Ok(left);
            }
            std::thread::sleep(pause.min(timeout - waited));
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// The probe's calls in flight on other threads than this one: the
    /// sum over threads less this thread's own kept return entries.
    fn in_flight_elsewhere(&self, h: ProbeHandle) -> Result<u64, Error> {
        if self.locals.find().is_none() {
            return Ok(self.stats(h)?.in_flight);
        }
        // Inside an outermost dispatch, as the walk's reads need: a signal
        // handler's dispatch meanwhile then neither forgets the frames nor
        // writes below `top`. Frames of an older pairing epoch are
        // forgotten first (their `Unrun`s before the sum is read).
        let own = DispatchSection::enter().and_then(|_section| {
            // SAFETY: `_section` holds the `DISPATCH` bit on this thread
            // while `local` is used; the context is this thread's.
            let local = unsafe { self.local_outermost(crate::context::context()) }?;
            let mut own = 0;
            local.each_return_entry(super::shadow::BOTTOM, |slot, generation| {
                own += u64::from(slot == h.slot && generation == h.generation);
            });
            Some(own)
        });
        let total = self.stats(h)?.in_flight;
        Ok(total.saturating_sub(own.unwrap_or(0)))
    }

    /// The message of the first panic of the probe's handlers (where it
    /// was raised, too), if any panicked: printed once when it happened,
    /// kept here; later panics are only counted
    /// ([`ProbeStats::panics`]).
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] for an unregistered handle.
    ///
    /// # Examples
    ///
    /// ```
    /// use fprobe::probe::{Fprobe, Registry};
    ///
    /// let registry = Registry::<()>::builder().build().unwrap();
    /// let h = registry
    ///     .register(Fprobe::builder().entry(|_| panic!("no data declared")).build(), &[1])
    ///     .unwrap();
    /// for _ in 0..3 {
    ///     registry.on_entry(1, 0, &());
    ///     registry.on_exit(0, &());
    /// }
    /// assert_eq!(registry.stats(h).unwrap().panics, 3);
    /// assert!(registry.first_panic(h).unwrap().unwrap().starts_with("no data declared"));
    /// ```
    pub fn first_panic(&self, h: ProbeHandle) -> Result<Option<String>, Error> {
        let _section = rcu::read_lock();
        let s = self.live_slot(h)?;
        // SAFETY: inside `_section`, which the reference does not outlive.
        let p = unsafe { s.probe_of(h.generation) }.ok_or(Error::NotFound)?;
        Ok(p.first_panic.get())
    }

    /// The probe's counters, summed over threads.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] for an unregistered handle.
    pub fn stats(&self, h: ProbeHandle) -> Result<ProbeStats, Error> {
        let book = self.book();
        self.live_slot(h)?;
        let now = self.sum(h.slot);
        Ok(ProbeStats::from_sums(&now, &book.base[h.slot as usize]))
    }

    /// Number of addresses with at least one probe.
    pub fn addresses(&self) -> usize {
        self.index.len_addrs()
    }

    /// Forgets every call in flight on every thread: each thread empties
    /// its shadow stack at its next dispatch, so the exits of calls
    /// entered before now run no handler. For engines that stop
    /// dispatching and start again (a detach, then an attach), whose
    /// threads would otherwise pair exits with the entries of calls that
    /// returned while nothing dispatched. Calls whose return an engine
    /// took over ([`on_entry_taking_return`](Self::on_entry_taking_return))
    /// are kept, with every frame below the topmost of them: they still
    /// return through the engine, which needs their return address.
    ///
    /// The reset is seen by every dispatch that happens after this call
    /// returns (through the synchronisation that makes the engine start
    /// dispatching again, such as publishing the registry to its hooks).
    pub fn reset_pairing(&self) {
        // Ordered before the dispatches that must see it by the caller's
        // own publication (see above), as `rekey` requires.
        self.locals.rekey();
    }

    /// Creates the calling thread's dispatch state now, so that its
    /// dispatches (signal handlers' included) never allocate. Optional:
    /// the first dispatch on a thread does it otherwise.
    pub fn prepare_thread(&self) {
        rcu::register_thread();
        // Made, or adopted, with nothing else of this thread's using it
        // (`local_made`): a section, no dispatch, around it.
        let _section = rcu::read_lock();
        // SAFETY: inside `_section`.
        let _ = unsafe { self.local_made(self.locals.key()) };
    }
}

impl<C: 'static> Drop for Registry<C> {
    fn drop(&mut self) {
        // `&mut self`: no dispatch runs, the parked probes may go.
        self.book
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .parked
            .clear();
        for s in self.slots.iter() {
            let p = s.probe.swap(std::ptr::null_mut(), Ordering::Relaxed);
            if !p.is_null() {
                // SAFETY: `&mut self`: no dispatch runs; `p` came from
                // `Box::into_raw` and is dropped once.
                drop(unsafe { Box::from_raw(p) });
            }
        }
        // The threads' states go with `locals`.
    }
}
