//! One open-addressing table of the address index.
//!
//! `capacity` (a power of two) home slots plus one extra slot, 16 bytes
//! each, four per cache line, each `{ key: u64, rec: *Record }`, probed
//! linearly from `hash(key, seed)`: a key's home is in `0..capacity`, and a
//! probe runs on through the extra slot (index `capacity`) before it wraps
//! to 0, so the first two slots of every sequence are adjacent in memory.
//!
//! # Slot states
//!
//! | key | rec | meaning |
//! |---|---|---|
//! | 0 | null | empty: ends every probe sequence |
//! | k | null | k has no values here (never had, or all removed: a tombstone) |
//! | k | live | k's values live here |
//! | k | `MOVED` | k's values were migrated to `future` |
//!
//! # Invariants
//!
//! * **Keys are write-once.** A slot's key goes from 0 to `k` by CAS and
//!   never changes again in this table, so a reader that matched `k` can
//!   trust the slot without re-checking, and a probe sequence never gets a
//!   hole (an empty slot never reappears). Tombstones are cleared only by
//!   migrating to a new table.
//! * **One slot per key per table.** Only holders of the key's stripe lock
//!   claim a slot for it, after searching the whole probe sequence. Writers
//!   claim by CAS (writers on other stripes may race for the same empty
//!   slot); a migration, which holds every stripe lock, claims by a plain
//!   store ([`Table::claim_exclusive`]).
//! * **At most one live slot per key across a chain of tables** (`root`,
//!   `root.future`, …): migration writes the new slot before it marks the
//!   old one `MOVED`, both under the key's stripe lock.
//! * **No claims in a table that has a future.** The future is attached while
//!   every stripe lock is held, and writers read `future` under their stripe
//!   lock before claiming, so the migration cursor never passes a slot that
//!   is claimed later.
//! * The table is never full: writers grow it at 50% claimed slots and force
//!   a resize before 90%, so every probe meets an empty slot. A writer's
//!   claim is *reserved* first ([`Table::try_reserve`]): the check against
//!   90% and the count are one atomic step, because writers on different
//!   stripes claim concurrently (checking first and counting at the claim
//!   let two of them pass the same check and fill a small table). Writers
//!   reserve a few claims at a time for their stripe (claim credits, see
//!   `insert_group_at`), so `claimed` counts every claim made and
//!   some not made yet: it is never below the real count. The
//!   reservation also keeps room for the claims a migration into the table
//!   still has to make, so the migration's own claims never find it full.
//!
//! Key 0 cannot live in a slot (0 marks empty); it has a dedicated slot.

use std::ptr::{self, NonNull};

use super::record::Header;
pub(crate) use super::slots::Slot;
use super::slots::SlotArray;
use crate::sync::{AtomicPtr, AtomicUsize, CachePadded, Ordering};

/// Marks a slot whose values moved to the next table. Never dereferenced.
#[inline(always)]
pub(crate) fn moved() -> *mut Header {
    ptr::without_provenance_mut(1)
}

/// Whether `rec` is a record pointer (neither null nor `MOVED`).
#[inline(always)]
pub(crate) fn is_live(rec: *mut Header) -> bool {
    rec.addr() > 1
}

/// The seeded hash of one table: a folded multiply, `lo ^ hi` of the
/// 128-bit product `(key ^ seed) × mul`, multiplied once more by `mul`
/// (64 bits, wrapping); the table takes its slot index from the top bits of
/// the result ([`Table::home`]). `seed` and the odd multiplier `mul` are
/// drawn afresh for the first table and for every rehash; growing and
/// shrinking keep them (`Seed` in the parent module).
///
/// Why the second multiply: the fold alone is a nearly linear map of the
/// key, and for some multipliers it maps an arithmetic sequence of
/// addresses onto a few runs of slots: indexed by its low bits, addresses
/// spaced by a large power of two, or page-aligned ones, pile up in long
/// probe sequences for some seeds (the probe-length tests of
/// `tests/index.rs` catch it). With the second multiply and the top bits
/// (the top bits of a product depend on every bit of its input) those sets
/// probe as random addresses do, as with a second full fold, in one
/// instruction less.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Hasher {
    seed: u64,
    mul: u64,
}

impl Hasher {
    /// The hasher of a table whose seed is `seed`. The multiplier is odd and
    /// dense (between 24 and 40 bits set, top bit set), so no input bit is
    /// lost and every product bit mixes many of them.
    pub(crate) fn new(seed: u64) -> Self {
        let mut state = seed;
        loop {
            let mul = splitmix64(&mut state) | (1 << 63) | 1;
            if (24..=40).contains(&mul.count_ones()) {
                return Self { seed, mul };
            }
        }
    }

    #[inline(always)]
    pub(crate) fn hash(&self, key: u64) -> u64 {
        fold(key ^ self.seed, self.mul).wrapping_mul(self.mul)
    }
}

/// `lo ^ hi` of the 128-bit product `a × b`.
#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let x = a as u128 * b as u128;
    (x as u64) ^ ((x >> 64) as u64)
}

/// SplitMix64: the multiplier's source.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Probe length beyond which a writer asks for a rehash with a new seed,
/// when the table is under half full. With a random-quality hash the
/// longest probe at 50% load is about 30 even at 32k keys; 128 means the
/// keys are defeating the seed.
pub(crate) const LONG_PROBE: usize = 128;

/// Numerator/denominator of the claimed-slot load at which writers start a
/// resize, and at which they force one before claiming.
///
/// Growth at 50%: linear probing's tail grows fast with load (the expected
/// probe length of a miss grows with `1 / (1 - load)²`). A hot address
/// that lands at the end of a long cluster costs every lookup that many
/// compares, so the table trades memory for a bounded tail
/// (BENCHMARKS.md, section "Single-thread latency", times keys past their
/// home pair).
pub(crate) const GROW_AT: (usize, usize) = (1, 2);
pub(crate) const FORCE_AT: (usize, usize) = (9, 10);

/// `repr(C)`, what the lookup's fast path reads first: the slot array's
/// pointer, `shift` and the hasher share the first 64-byte
/// line (a test checks it); `claimed`, written by every claim, is on a
/// line of its own.
#[repr(C)]
pub(crate) struct Table {
    /// `capacity + 1` slots. Homes are `0..capacity` (a power of two); the
    /// last slot is nobody's home, only the step after slot `capacity - 1`
    /// before a probe sequence wraps to 0. With it, the second slot of every
    /// probe sequence is the next one in memory, so the lookup's fast path
    /// reads `slots[i]` and `slots[i + 1]` with no wrap-around (two loads off
    /// one index, see [`Table::lookup`]).
    slots: SlotArray,
    /// `64 - log2(capacity)`: a hash's top bits are its home slot.
    shift: u32,
    hasher: Hasher,
    /// `capacity`: the index of the extra slot, where a probe wraps to 0.
    last: usize,
    /// The slot of key 0.
    zero: Slot,
    /// The table being migrated into; null when none. Set once (by CAS,
    /// under every stripe lock), never cleared.
    pub(crate) future: AtomicPtr<Table>,
    /// Slots whose key is set (live, tombstones and moved). Writers only.
    claimed: CachePadded<AtomicUsize>,
}

/// What a probe found.
pub(crate) enum Probe<'t> {
    /// The key's slot.
    Found(&'t Slot),
    /// The key is not in this table.
    Absent,
}

impl Table {
    /// A table of `capacity` (a power of two) home slots, all empty, and
    /// the extra slot after them (`capacity + 1` slots in all), on huge
    /// pages when `huge` and the array is large enough (`slots.rs`).
    pub(crate) fn new(capacity: usize, seed: u64, huge: bool) -> Box<Self> {
        // At least 2 slots: `shift` stays below 64.
        assert!(capacity.is_power_of_two() && capacity >= 2);
        Box::new(Self {
            slots: SlotArray::zeroed(capacity + 1, huge),
            last: capacity,
            shift: 64 - capacity.trailing_zeros(),
            hasher: Hasher::new(seed),
            zero: Slot::default(),
            future: AtomicPtr::new(ptr::null_mut()),
            claimed: CachePadded(AtomicUsize::new(0)),
        })
    }

    pub(crate) fn seed(&self) -> u64 {
        self.hasher.seed
    }

    #[inline(always)]
    pub(crate) fn capacity(&self) -> usize {
        self.last
    }

    /// The slot after `i` in a probe sequence.
    #[inline(always)]
    fn next(&self, i: usize) -> usize {
        if i == self.last { 0 } else { i + 1 }
    }

    /// Makes the pages of slots `from..to` (clamped to the table) resident
    /// and writable now, with one write fault each, by a no-op write to one
    /// slot in every 4 KiB of them. Values are unchanged; safe at any time.
    ///
    /// Why: a large table is fresh memory from the kernel (`alloc_zeroed`
    /// above glibc's mmap threshold, or a mapping of its own: `slots.rs`),
    /// mapped lazily. A writer's first access to a page is a read (`locate`, then
    /// the probe of `claim`), which maps the kernel's shared zero page, and
    /// its claim then takes a second fault to copy it: two faults per page,
    /// against one for a page written first. A migration calls
    /// this on the part of the new table its step corresponds to, so a
    /// table attached by growth is faulted in once per page, spread over
    /// its migration steps (no stall of the whole table on one insert). A
    /// step's share is the new table's size over the old one's: about 2
    /// pages per step of a growth by 2, but the whole table in one step
    /// when a bulk insert presizes a small index (work linear in the new
    /// table, inside the bulk insert's own linear work, under the resize
    /// lock: other writers that claimed wait for it, as for the migration
    /// itself). On a table backed by huge pages the first write to each
    /// 2 MiB block faults the whole block in (the kernel zeroes it), and
    /// the writes to its other 4 KiB steps find it resident: the step that
    /// reaches a block pays for all of it, a stall bounded by the page size
    /// (`slots.rs`).
    pub(crate) fn prefault(&self, from: usize, to: usize) {
        #[cfg(not(loom))]
        {
            let n = self.slots.len();
            let to = to.min(n);
            if from >= to {
                return;
            }
            // One slot every 4 KiB from the start of the array: every page
            // holds exactly one of these addresses unless it is the last
            // page and ends before its point, hence the last slot too.
            let mut i = from.next_multiple_of(PAGE_SLOTS);
            while i < to {
                write_in_place(&self.slots[i]);
                i += PAGE_SLOTS;
            }
            if to == n && (n - 1) % PAGE_SLOTS != 0 {
                write_in_place(&self.slots[n - 1]);
            }
        }
        // Under loom the slots are model objects, not memory pages, and the
        // extra operations would only enlarge the models.
        #[cfg(loom)]
        let _ = (from, to);
    }

    pub(crate) fn claimed(&self) -> usize {
        self.claimed.load(Ordering::Relaxed)
    }

    /// Whether one more claim keeps the table under `num/den` claimed.
    pub(crate) fn has_room(&self, extra: usize, (num, den): (usize, usize)) -> bool {
        (self.claimed() + extra) * den <= self.capacity() * num
    }

    /// The record pointer of `key` in this table: null when absent or
    /// without values, `MOVED`, or live. Lock-free, wait-free in the
    /// absence of writers, no stores.
    ///
    /// The first two slots of the probe sequence (adjacent in memory: the
    /// extra slot after the last home means the pair never wraps) are read
    /// together, keys and record pointers, and the match is picked with
    /// conditional moves: a key is in one of them nearly always (at the
    /// loads the table keeps), so the one branch that remains is
    /// predictable. A loop that stops at a data-dependent slot mispredicts
    /// whenever consecutive lookups' keys sit at different distances from
    /// home, and so does `if k0 == key { .. } else if k1 == key { .. }`,
    /// which the compiler turns into two branches (`scripts/cachegrind-lookup.sh`
    /// counts the simulated mispredictions per lookup).
    #[inline(always)]
    pub(crate) fn lookup(&self, key: u64) -> *mut Header {
        if key == 0 {
            // Acquire: as in `lookup_nonzero`.
            return self.zero.rec.load(Ordering::Acquire);
        }
        self.lookup_nonzero(key)
    }

    /// [`Table::lookup`] of a key that is not 0.
    ///
    /// Key 0 must not come here: slots whose key reads 0 are empty, and
    /// a 0 would match the first one, whose record a concurrent claim may
    /// have just published for another key.
    #[inline(always)]
    pub(crate) fn lookup_nonzero(&self, key: u64) -> *mut Header {
        debug_assert_ne!(key, 0);
        let i = self.home(key);
        // SAFETY: `i < capacity`, so `i + 1 <= capacity < slots.len()`: both
        // slots are in the table. (Both from one pointer, so the compiler
        // addresses the second at `+16` rather than from a second index.)
        let (s0, s1) = unsafe {
            let p = self.slots.as_ptr().add(i);
            (&*p, &*p.add(1))
        };
        // Relaxed: keys are write-once and carry no data. Either load may
        // see an older value than the other (a slot claimed later seen,
        // an earlier one not yet): only a match is acted on before the
        // empty check, and a key is never in the second slot unless the
        // first was claimed before it.
        let (k0, k1) = (
            s0.key.load(Ordering::Relaxed),
            s1.key.load(Ordering::Relaxed),
        );
        // Both record pointers are loaded before the match is known: they
        // share the keys' cache line(s), so neither costs a miss, and the
        // pick is a conditional move on loaded values rather than a third
        // dependent load after the compare. The one not picked belongs to
        // another key (or none) and is ignored.
        // Acquire: pairs with the Release store that published the record
        // (`publish`); its contents are visible.
        let (r0, r1) = (
            s0.rec.load(Ordering::Acquire),
            s1.rec.load(Ordering::Acquire),
        );
        // `d0`, `d1` are 0 where the key matches. One compare picks the
        // smaller difference and its record (two conditional moves); the
        // picked difference is 0 exactly when either key matches, and then
        // the picked record is the matching slot's. Picking on `d0 <= d1`
        // rather than on `k0 == key` matters: with that condition (and the
        // picked key compared to `key`) the compiler turns the pick into a
        // data-dependent branch again; this form compiles to `cmp`, two
        // `cmov`s and one predictable branch (checked in the disassembly;
        // `std::hint::select_unpredictable` would say it outright, but needs
        // Rust 1.88 and the crate supports 1.85).
        let (d0, d1) = (k0 ^ key, k1 ^ key);
        let first = d0 <= d1;
        let d = if first { d0 } else { d1 };
        let rec = if first { r0 } else { r1 };
        if d == 0 {
            return rec;
        }
        if (k0 == 0) | (k1 == 0) {
            return ptr::null_mut();
        }
        match self.probe_from(self.next(i + 1), key) {
            // Acquire: pairs with the Release store that published the
            // record into the slot; the record is initialised.
            Probe::Found(slot) => slot.rec.load(Ordering::Acquire),
            Probe::Absent => ptr::null_mut(),
        }
    }

    /// The first slot of `key`'s probe sequence.
    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        // `shift < 64` (`new`), and the result is below `2^(64 - shift)`,
        // the capacity.
        (self.hasher.hash(key) >> self.shift) as usize
    }

    /// Finds `key`'s slot.
    #[inline(always)]
    pub(crate) fn probe(&self, key: u64) -> Probe<'_> {
        if key == 0 {
            return Probe::Found(&self.zero);
        }
        self.probe_from(self.home(key), key)
    }

    /// [`Table::probe`] from slot `i` of `key`'s probe sequence on (`key`
    /// is not 0 and not in the slots before `i`).
    #[inline(always)]
    fn probe_from(&self, mut i: usize, key: u64) -> Probe<'_> {
        loop {
            // SAFETY: `i <= last < slots.len()`.
            let slot = unsafe { self.slots.get_unchecked(i) };
            // Relaxed: keys are write-once and carry no data; the record is
            // read with Acquire.
            let k = slot.key.load(Ordering::Relaxed);
            if k == key {
                return Probe::Found(slot);
            }
            if k == 0 {
                return Probe::Absent;
            }
            i = self.next(i);
        }
    }

    /// Hints the CPU to fetch `key`'s home slot (bulk inserts know their
    /// keys in advance). A hint only: nothing is read or written.
    #[inline(always)]
    pub(crate) fn prefetch(&self, key: u64) {
        let i = self.home(key);
        let p = self.slots[i..].as_ptr();
        #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
        // SAFETY: prefetching is a hint that reads and writes nothing; any
        // address is allowed, and this one is inside the table.
        #[allow(unused_unsafe)]
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
        }
        #[cfg(not(all(target_arch = "x86_64", not(miri), not(loom))))]
        let _ = p;
    }

    /// Reserves `n` claims for a writer if, counting them and `pending`
    /// more claims still to come (a migration into this table), the table
    /// stays within `num/den` claimed. Check and count are one atomic step,
    /// so writers that reserve concurrently under different stripe locks
    /// cannot together overshoot. Reservations are spent by [`Table::claim`].
    pub(crate) fn try_reserve(&self, n: usize, pending: usize, (num, den): (usize, usize)) -> bool {
        let limit = self.capacity() * num;
        self.claimed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                ((c + n + pending) * den <= limit).then_some(c + n)
            })
            .is_ok()
    }

    /// Finds or claims `key`'s slot by CAS, for a writer that holds `key`'s
    /// stripe lock and an unspent reservation ([`Table::try_reserve`]), and
    /// has checked that `future` is null. Uncounted: the reservation
    /// counted it.
    ///
    /// Returns the slot, the probe distance of a new claim (0 when the slot
    /// existed) and whether the slot is fresh (the reservation is spent).
    pub(crate) fn claim(&self, key: u64) -> (&Slot, usize, bool) {
        // SAFETY: not exclusive: the claim is a CAS, atomic against other
        // claimers.
        unsafe { self.claim_inner(key, false) }
    }

    /// Finds or claims `key`'s slot with plain stores, for a migration: the
    /// migrator holds every stripe lock, so no other writer claims in this
    /// table meanwhile and the claim needs no CAS. The claim is not counted
    /// here: the migrator adds its fresh claims with [`Table::add_claims`]
    /// before it releases the locks, which is before any other writer can
    /// read the count. Returns the slot and whether it is fresh.
    ///
    /// # Safety
    ///
    /// No other thread claims in this table during the call: the caller
    /// holds every stripe lock of the index the table belongs to. Two
    /// claimers could otherwise both take one empty slot, each for its own
    /// key, and publish records over each other's.
    #[inline]
    pub(crate) unsafe fn claim_exclusive(&self, key: u64) -> (&Slot, bool) {
        // SAFETY: the caller's contract: no other claimer runs.
        let (slot, _, fresh) = unsafe { self.claim_inner(key, true) };
        (slot, fresh)
    }

    /// [`Table::claim`], or with `exclusive` [`Table::claim_exclusive`].
    ///
    /// # Safety
    ///
    /// With `exclusive`, as for [`Table::claim_exclusive`].
    #[inline(always)]
    unsafe fn claim_inner(&self, key: u64, exclusive: bool) -> (&Slot, usize, bool) {
        if key == 0 {
            return (&self.zero, 0, false);
        }
        let mut i = self.home(key);
        let mut dist = 0;
        loop {
            // SAFETY: `i <= last < slots.len()`.
            let slot = unsafe { self.slots.get_unchecked(i) };
            let k = slot.key.load(Ordering::Relaxed);
            if k == key {
                return (slot, 0, false);
            }
            if k == 0 {
                // Relaxed suffices: the key carries no data (the record is
                // published with Release later); readers may load the key
                // concurrently and see 0 or `key`, both valid.
                if exclusive {
                    // No other claimer runs (this function's contract).
                    slot.key.store(key, Ordering::Relaxed);
                    return (slot, dist, true);
                }
                // Other claimers only need the CAS's atomicity. Losing
                // means another key took the slot; keep probing.
                match slot
                    .key
                    .compare_exchange(0, key, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => return (slot, dist, true),
                    Err(other) if other == key => unreachable!("key claimed twice"),
                    Err(_) => {}
                }
            }
            i = self.next(i);
            dist += 1;
            // Unreachable while the load bounds hold (module docs); a panic
            // beats spinning forever if they were ever broken.
            assert!(dist <= self.last, "address index table full");
        }
    }

    /// Counts `n` claims made with [`Table::claim_exclusive`].
    pub(crate) fn add_claims(&self, n: usize) {
        self.claimed.fetch_add(n, Ordering::Relaxed);
    }

    /// Every slot including key 0's, with its key.
    pub(crate) fn slots(&self) -> impl Iterator<Item = (u64, &Slot)> {
        self.slots
            .iter()
            .map(|s| (s.key.load(Ordering::Relaxed), s))
            .chain(std::iter::once((0, &self.zero)))
    }

    /// Slots in the table, the extra one included, not key 0's:
    /// `capacity + 1`.
    pub(crate) fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Slot `i` for migration, `i` in `0..=slot_count()` (the last is key
    /// 0's).
    #[inline]
    pub(crate) fn slot_at(&self, i: usize) -> (u64, &Slot) {
        if i == self.slots.len() {
            (0, &self.zero)
        } else {
            let s = &self.slots[i];
            (s.key.load(Ordering::Relaxed), s)
        }
    }

    /// Claimed slots (keys set), and the longest and total distance of
    /// their keys from their home slots (a full scan; statistics only).
    /// Exact where `claimed` is not: that count includes reservations that
    /// writers have not spent.
    pub(crate) fn scan_probes(&self) -> (usize, usize, usize) {
        let (mut claimed, mut longest, mut total) = (0, 0, 0);
        for (i, s) in self.slots.iter().enumerate() {
            let k = s.key.load(Ordering::Relaxed);
            if k != 0 {
                let home = self.home(k);
                // Distance along the probe sequence, which wraps after
                // the extra slot (`slots.len()` positions in all).
                let d = if i >= home {
                    i - home
                } else {
                    i + self.slots.len() - home
                };
                claimed += 1;
                longest = longest.max(d);
                total += d;
            }
        }
        (claimed, longest, total)
    }

    /// Bytes of the table itself.
    pub(crate) fn bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.slots.len() * std::mem::size_of::<Slot>()
    }
}

/// Looks `key` up in `t` and the tables chained behind it: the reader's
/// whole algorithm, with `step` the lookup in one table
/// ([`Table::lookup`], or [`Table::lookup_nonzero`] for a key known not to
/// be 0). Hands a live record to `found`, or calls `absent`: a caller that
/// turns the record into something else (the values' slice) does so on the
/// found path alone, without testing a returned pointer for null again.
/// `lookup_chain(t, key, Table::lookup, NonNull::as_ptr, ptr::null_mut)` is
/// the record or null.
///
/// # Safety
///
/// `t` and every table reachable through `future` stay allocated for the
/// duration of the call (the caller holds an RCU read guard).
#[inline(always)]
pub(crate) unsafe fn lookup_chain<R>(
    mut t: *const Table,
    key: u64,
    step: impl Fn(&Table, u64) -> *mut Header,
    found: impl FnOnce(NonNull<Header>) -> R,
    absent: impl FnOnce() -> R,
) -> R {
    loop {
        // SAFETY: caller contract.
        let table = unsafe { &*t };
        let rec = step(table, key);
        if is_live(rec) {
            // SAFETY: live records are not null.
            return found(unsafe { NonNull::new_unchecked(rec) });
        }
        // Acquire: pairs with the Release store of `future` in `attach`;
        // the new table's fields and claims are visible.
        t = table.future.load(Ordering::Acquire);
        if t.is_null() {
            return absent();
        }
    }
}

/// Slots per 4 KiB, the smallest page size [`Table::prefault`] assumes (on
/// larger pages it writes to some pages more than once).
#[cfg(not(loom))]
const PAGE_SLOTS: usize = 4096 / std::mem::size_of::<Slot>();

/// A write to `slot` that changes nothing: a compare-exchange of its key
/// from 0 to 0 (stores 0 over 0, or fails on another key). It is a locked
/// read-modify-write, which the CPU performs with write access, so the
/// kernel maps the page writable at the first fault. `fetch_or(0)` would
/// say the same, but rustc compiles an idempotent relaxed RMW to nothing;
/// the compare-exchange stays a `lock cmpxchg`. Concurrent claims (a
/// compare-exchange from 0 to their key) are unaffected: either goes first.
#[cfg(not(loom))]
#[inline(always)]
fn write_in_place(slot: &Slot) {
    let _ = slot
        .key
        .compare_exchange(0, 0, Ordering::Relaxed, Ordering::Relaxed);
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! loom models of the slot protocol: migration (claim in the new table,
    //! publish, mark `MOVED`) racing a reader and a copy-on-write writer.
    //! Each atomic access of the models uses the ordering of the production
    //! access it stands for (slot and future stores Release, their loads
    //! Acquire, as in `table.rs`, `mod.rs` and `resize.rs`): the models
    //! check exactly those pairings.
    //!
    //! `RUSTFLAGS="--cfg loom" cargo test --release --lib loom`

    use super::*;
    use loom::sync::{Arc, Mutex};

    fn rec(tag: u64) -> *mut Header {
        // Records are leaked in the model (reclamation is the RCU's job,
        // modelled separately); only their identity matters here.
        crate::index::raw::record::RecordPtr::<u64>::build(1, [(tag, tag)]).into_raw()
    }

    struct Tables {
        old: Box<Table>,
        new: Box<Table>,
        stripe: Mutex<()>,
    }

    const KEY: u64 = 42;

    /// A reader never misses a key that is live throughout, while a
    /// migrator moves it and a writer replaces its record.
    #[test]
    fn migration_never_hides_a_live_key() {
        loom::model(|| {
            let t = Arc::new(Tables {
                old: Table::new(4, 1, false),
                new: Table::new(8, 2, false),
                stripe: Mutex::new(()),
            });
            let r1 = rec(1);
            // SAFETY: no other thread runs yet.
            let (slot, _) = unsafe { t.old.claim_exclusive(KEY) };
            slot.rec.store(r1, Ordering::Release);
            // Attachment (single-threaded here, as under every stripe lock).
            let new_ptr = &*t.new as *const Table as *mut Table;
            t.old.future.store(new_ptr, Ordering::Release);

            let m = t.clone();
            let migrator = loom::thread::spawn(move || {
                let _g = m.stripe.lock().unwrap();
                let (_, slot) = m.old.slot_at(
                    (0..m.old.slot_count())
                        .find(|&i| m.old.slot_at(i).0 == KEY)
                        .unwrap(),
                );
                let r = slot.rec.load(Ordering::Acquire);
                if is_live(r) {
                    // SAFETY: the model's one stripe lock (`_g`) is held;
                    // every claimer in the model takes it.
                    let (ns, _) = unsafe { m.new.claim_exclusive(KEY) };
                    ns.rec.store(r, Ordering::Release);
                    slot.rec.store(moved(), Ordering::Release);
                }
            });
            let w = t.clone();
            let writer = loom::thread::spawn(move || {
                let _g = w.stripe.lock().unwrap();
                // Copy-on-write wherever the key is live.
                for table in [&*w.old, &*w.new] {
                    if let Probe::Found(slot) = table.probe(KEY) {
                        let r = slot.rec.load(Ordering::Acquire);
                        if is_live(r) {
                            slot.rec.store(rec(2), Ordering::Release);
                            return;
                        }
                    }
                }
                panic!("writer found no live slot");
            });
            let r = t.clone();
            let reader = loom::thread::spawn(move || {
                // SAFETY: both tables live until the end of the model.
                let found = unsafe {
                    lookup_chain(&*r.old, KEY, Table::lookup, NonNull::as_ptr, ptr::null_mut)
                };
                assert!(is_live(found), "reader missed a live key during migration");
            });
            reader.join().unwrap();
            migrator.join().unwrap();
            writer.join().unwrap();
            // SAFETY: as above.
            let after = unsafe {
                lookup_chain(&*t.old, KEY, Table::lookup, NonNull::as_ptr, ptr::null_mut)
            };
            assert!(is_live(after));
        });
    }

    /// A lookup reads the first two slots of its sequence, keys and record
    /// pointers, before it knows which key matches. While a writer claims
    /// the second slot for another key with the same home (the extra slot
    /// when the home is the last one), publishes it, then marks the first
    /// key `MOVED`, a lookup of either key returns that key's record (or,
    /// for the second, nothing yet), never the other key's.
    #[test]
    fn lookup_pair_never_returns_the_neighbours_record() {
        for home in [1, 3] {
            loom::model(move || {
                let t = Arc::new(Table::new(4, 9, false));
                let mut same_home = (1u64..).filter(|&k| t.home(k) == home);
                let (k1, k2) = (same_home.next().unwrap(), same_home.next().unwrap());
                let (r1, r2) = (rec(1), rec(2));
                let (slot, _, _) = t.claim(k1);
                slot.rec.store(r1, Ordering::Release);
                // Raw pointers are not `Send`; their addresses are.
                let (a1, a2) = (r1 as usize, r2 as usize);
                let w = t.clone();
                let writer = loom::thread::spawn(move || {
                    let (slot, dist, fresh) = w.claim(k2);
                    assert!(fresh && dist == 1);
                    slot.rec.store(a2 as *mut Header, Ordering::Release);
                    let (slot, _, fresh) = w.claim(k1);
                    assert!(!fresh);
                    slot.rec.store(moved(), Ordering::Release);
                });
                let r = t.clone();
                let reader = loom::thread::spawn(move || {
                    let got = r.lookup(k1);
                    assert!(got as usize == a1 || got == moved(), "k1 got {got:?}");
                    let got = r.lookup(k2);
                    assert!(got.is_null() || got as usize == a2, "k2 got {got:?}");
                });
                writer.join().unwrap();
                reader.join().unwrap();
                assert_eq!(t.lookup(k2), r2);
                // Home 3 is the last home: the neighbour is the extra slot.
                assert_eq!(t.slot_at(home + 1).0, k2);
            });
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// What the lookup's fast path reads of a table (the slot array's
    /// pointer, `shift`, the hasher) lies on its first 64-byte line.
    #[test]
    fn fast_path_fields_share_the_first_line() {
        use std::mem::{offset_of, size_of};
        assert_eq!(std::mem::align_of::<Table>() % 64, 0);
        for (name, at, len) in [
            ("slots", offset_of!(Table, slots), size_of::<SlotArray>()),
            ("shift", offset_of!(Table, shift), 4),
            ("hasher", offset_of!(Table, hasher), size_of::<Hasher>()),
        ] {
            assert!(at + len <= 64, "{name} at {at}..{}", at + len);
        }
    }

    /// Keys of `t` whose home slot is `home`, from a simple counter.
    fn keys_with_home(t: &Table, home: usize, n: usize) -> Vec<u64> {
        (1u64..).filter(|&k| t.home(k) == home).take(n).collect()
    }

    /// Minor page faults of the calling thread so far.
    #[cfg(all(target_os = "linux", target_arch = "x86_64", not(miri)))]
    fn minor_faults() -> usize {
        // SAFETY: `getrusage` fills the zeroed struct it is given.
        let mut r: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: a valid pointer to a `rusage`.
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut r) }, 0);
        r.ru_minflt as usize
    }

    /// After `prefault`, a table's pages take reads and writes without a
    /// fault; without it (or with a prefault the compiler reduced to a
    /// load) every page read first and written then costs two. The table is
    /// 64 MiB, above glibc's largest mmap threshold, so its pages are fresh
    /// from the kernel; other allocators (or transparent huge pages) can
    /// only make the counts smaller, which the bounds allow. x86-64 only: a
    /// compare-exchange there is one locked instruction, a write access;
    /// built from load-exclusive/store-exclusive (Arm without LSE, RISC-V)
    /// its load faults first and `prefault` saves nothing.
    #[cfg(all(target_os = "linux", target_arch = "x86_64", not(miri)))]
    #[test]
    fn prefault_leaves_no_fault_for_the_claims() {
        let t = Table::new(1 << 22, 7, false);
        let pages = t.slot_count() * std::mem::size_of::<Slot>() / 4096;
        let f0 = minor_faults();
        t.prefault(0, t.slot_count());
        let f1 = minor_faults();
        // A read, then a write, on every page (four slots per page).
        for i in (0..t.slot_count()).step_by(PAGE_SLOTS / 4) {
            let key = &t.slots[i].key;
            if key.load(Ordering::Relaxed) == 0 {
                key.store(i as u64 + 1, Ordering::Relaxed);
            }
        }
        let f2 = minor_faults();
        assert!(
            f1 - f0 <= pages + 64,
            "{} faults for {pages} pages",
            f1 - f0
        );
        assert!(
            f2 - f1 <= 64,
            "{} faults after prefault ({pages} pages)",
            f2 - f1
        );
    }

    /// Keys at each distance from their home up to 6 (in the home pair or
    /// past it) are found, and keys absent from a sequence whose first
    /// empty slot is at each of those distances are not; with homes near
    /// the end, the sequences run through the extra slot and wrap to slot
    /// 0.
    #[test]
    fn lookups_find_keys_at_every_distance_from_home() {
        let rec = |n: usize| ptr::without_provenance_mut::<Header>(8 * (n + 1)); // never read
        for home in [0, 5, 13, 14, 15] {
            for n in 0..=7 {
                let t = Table::new(16, 0x5eed, false);
                // Eight absent keys per case: an empty slot must end the
                // search whichever of the pair's keys the pick lands on.
                let keys = keys_with_home(&t, home, n + 8);
                for (d, &k) in keys[..n].iter().enumerate() {
                    let (slot, dist, fresh) = t.claim(k);
                    assert!(fresh);
                    assert_eq!(dist, d, "home {home}, key {d}");
                    slot.rec.store(rec(d), Ordering::Release);
                }
                for (d, &k) in keys[..n].iter().enumerate() {
                    assert_eq!(t.lookup(k), rec(d), "home {home}, {n} keys, key {d}");
                }
                for &absent in &keys[n..] {
                    assert!(t.lookup(absent).is_null(), "home {home}, {n} keys, absent");
                }
            }
        }
    }

    /// A probe sequence that starts at the last home slot runs through the
    /// extra slot and wraps to slot 0; lookups, claims and the statistics
    /// scan agree on it.
    #[test]
    fn probe_sequences_wrap_through_the_extra_slot() {
        let t = Table::new(8, 0x5eed, false);
        assert_eq!(t.slot_count(), 9);
        let last_home = keys_with_home(&t, 7, 3);
        let zero_home = keys_with_home(&t, 0, 1)[0];
        let rec = |n: usize| ptr::without_provenance_mut::<Header>(8 * n); // never read
        for (n, &k) in last_home.iter().chain([&zero_home]).enumerate() {
            let (slot, dist, fresh) = t.claim(k);
            assert!(fresh);
            // Homes 7, 7, 7, 0: slots 7, 8 (the extra one), 0, then 1.
            assert_eq!(dist, [0, 1, 2, 1][n], "key {n}");
            slot.rec.store(rec(n + 1), Ordering::Release);
        }
        for (n, &k) in last_home.iter().chain([&zero_home]).enumerate() {
            assert_eq!(t.lookup(k), rec(n + 1), "key {n}");
        }
        let (_, k8) = t.slot_at(8);
        assert_eq!(k8.key.load(Ordering::Relaxed), last_home[1]);
        let (_, k0) = t.slot_at(0);
        assert_eq!(k0.key.load(Ordering::Relaxed), last_home[2]);
        // A key that is absent, homed at 7, probes 7, 8, 0, 1, 2 (empty).
        let absent = keys_with_home(&t, 7, 4)[3];
        assert!(t.lookup(absent).is_null());
        assert_eq!(t.scan_probes(), (4, 2, 4));
        // Key 0's slot comes after every table slot.
        assert!(std::ptr::eq(t.slot_at(9).1, &t.zero));
    }
}
