//! Online resize of the address index: attaching a new table behind the
//! root, migrating the old one a chunk at a time, and sizing tables.
//!
//! # Protocol
//!
//! Under the `resize` mutex (lock order: `resize`, then stripes in
//! ascending order):
//!
//! 1. **Attachment**: allocate the new table (new size; the same seed for
//!    growth and shrinking, a fresh one for a rehash: `Seed`), then,
//!    holding every stripe lock, set `root.future`. From then on no writer
//!    claims a slot in the old table (writers read `future` under their
//!    stripe lock).
//! 2. **Migrate**, `MIGRATE_CHUNK` slots at a time, by whichever writer gets
//!    the `resize` lock after its own operation (`try_lock`: nobody waits):
//!    holding every stripe lock for the run of slots, for each live slot
//!    claim the key in the new table, store the record pointer there, then
//!    mark the old slot `MOVED`. The record itself is not copied. Before
//!    the locks, the run faults in its share of the new table, one write
//!    per page (`Table::prefault`), so that no page of a fresh table is read
//!    before it is written (two page faults instead of one). Holding
//!    every lock (rather than each key's own, once per key) costs one lock
//!    operation per stripe per run instead of two per moved key, and with
//!    no writer able to claim meanwhile the claims need no CAS
//!    ([`Table::claim_exclusive`](super::table::Table::claim_exclusive)); writers
//!    wait at most one run (`migrate_run`, ≤ 1,024 slots unless there are
//!    more than 256 stripes).
//! 3. **Swap**: after the last slot, `root = future`; the old table (slots
//!    only, no records) is retired.
//!
//! No single write pays more than one chunk of migration, except a writer
//! that finds the newest table at 90% claimed (it finishes the migration and
//! attaches a larger table: the forced path of rhashtable), a bulk insert
//! that presizes, and `clear`. During a migration the 90% check also counts
//! the live addresses (an upper bound on the keys still to migrate), and a
//! writer's check and count are one atomic reservation (`table.rs`), so the
//! migration's claims always find room however many writers claimed first.
//!
//! Growth starts at 50% claimed slots (live keys and tombstones; see
//! `GROW_AT` for why so low) and sizes the new table at three times the
//! live keys, rounded up to a power of two (`capacity_grown`: a table full
//! of tombstones is replaced by one with room for at least `live / 2` new
//! claims, so migration costs at most 2 moved keys per claim); tombstones
//! are dropped; with `auto_shrink` the table shrinks below
//! 12.5% live, to at most 25%. A claim that probes more
//! than `LONG_PROBE` slots in a table under half full means the hash is being
//! defeated: the table is rehashed with a new seed (at once, or, when a
//! migration is running, by the next table attached: `rehash_pending`).

use std::ptr;

use super::table::{GROW_AT, Table, is_live, moved};
use super::{MIGRATE_CHUNK, RawIndex, ResizeState, lock, table_seed};
use crate::rcu::{self, ReadGuard};
use crate::sync::Ordering;

/// Old slots a migration run scans before moving the live ones among them
/// (`migrate`).
const MIGRATE_BATCH: usize = 64;

/// The hash seed of a table that [`RawIndex::attach`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Seed {
    /// The root's seed: growth and shrinking. Homes are the top bits of
    /// the hash, so with the same seed a key's home in a table twice as
    /// large is `2h` or `2h + 1` for its old home `h`: a migration that
    /// walks the old table in order writes the new one in order too, with
    /// far fewer cache misses than scattered writes.
    Keep,
    /// A new seed: a rehash, asked for when a probe sequence grew too long
    /// for the load (keys that defeat the current seed).
    Fresh,
}

/// Capacity (a power of two) that holds `addrs` keys at ≤ 50% load.
pub(crate) fn capacity_for(addrs: usize, min: usize) -> usize {
    addrs
        .saturating_mul(2)
        .max(min)
        .checked_next_power_of_two()
        .expect("index capacity overflow")
}

/// Capacity of the table that replaces one at the growth threshold with
/// `live` live keys: at most 2/3 of the way to the next growth threshold,
/// so that the new table takes at least `live / 2` new claims before it
/// must be replaced in turn.
///
/// Sized at 50% load instead ([`capacity_for`]), a table whose claims are
/// mostly tombstones (a writer that keeps adding new addresses and
/// removing old ones) would be replaced by one of the same size with
/// almost no room: 54,000 live keys in 131,072 slots leave room for 11,536
/// claims before the next growth, so every new address would pay for
/// moving 4.7 old ones, and readers would see a fresh, cold table after
/// every 11,536 new addresses. Here the migration costs at most 2 moved
/// keys per claim, at the price of a table up to twice as large while
/// most claims are turned into tombstones. A table that grows by inserts
/// alone (no tombstones: `live` is half the capacity) doubles.
pub(crate) fn capacity_grown(live: usize, min: usize) -> usize {
    capacity_for(live.saturating_mul(3).div_ceil(2), min)
}

/// Capacity that holds `addrs` keys below the growth threshold (for
/// presizing: `with_capacity`, bulk inserts).
pub(crate) fn capacity_presized(addrs: usize, min: usize) -> usize {
    (addrs.saturating_mul(GROW_AT.1) / GROW_AT.0 + 1)
        .max(min)
        .checked_next_power_of_two()
        .expect("index capacity overflow")
}

impl<V: Clone + Send + Sync + 'static> RawIndex<V> {
    // --------------------------------------------------------------- resize

    /// After a write: help a migration along, or start a resize.
    ///
    /// `claims`: slots the write claimed. A claim in a table that is being
    /// migrated into must pay its migration step (waiting for the `resize`
    /// lock if need be): that is what bounds the new table's load. Other
    /// writes help only if the lock is free.
    pub(super) fn after_write(&self, claims: usize) {
        let guard = rcu::read_lock();
        // A first look without the lock: most writes have nothing to do.
        if !self.resize_work(claims, &guard) {
            return;
        }
        let st = if claims > 0 {
            Some(lock(&self.resize))
        } else {
            self.resize.try_lock().ok()
        };
        let Some(mut st) = st else { return };
        // Decide again under the lock: another writer may have attached a
        // table or finished a migration since the first look.
        let root = self.root_in(&guard);
        // Acquire: pairs with the Release store of the future in `attach`;
        // the new table is initialised.
        // Acquire: pairs with the Release store of the future in `attach`;
        // the new table is initialised.
        if !root.future.load(Ordering::Acquire).is_null() {
            let budget = st.budget.saturating_mul(claims.max(1));
            self.migrate(&mut st, budget, &guard);
            return;
        }
        if !root.has_room(0, GROW_AT) {
            let need = self.growth_need(root, 0);
            self.attach(
                &mut st,
                capacity_grown(need, self.config.min_capacity),
                Seed::Keep,
                &guard,
            );
        } else if claims == 0 && self.should_shrink(root) {
            // To at most 1/4 load: far enough from the growth threshold that
            // a few inserts do not grow it straight back.
            let addrs = self.live_addrs();
            let cap = capacity_for(addrs.saturating_mul(2), self.config.min_capacity);
            if cap < root.capacity() {
                self.attach(&mut st, cap, Seed::Keep, &guard);
            }
        }
    }

    /// Keys the table that replaces `root` must hold: the live addresses,
    /// `extra` more, and the bound on `root`'s unspent claim credits. The
    /// credits are in `root`'s claimed count, so at the growth threshold the
    /// live addresses may be that many short of it; sized on the live count
    /// alone, the "grown" table would be the same size (and grow again
    /// soon).
    fn growth_need(&self, root: &Table, extra: usize) -> usize {
        self.live_addrs() + extra + self.unspent_credits_bound(root)
    }

    /// Whether a resize step is due: a migration to help, or a table to
    /// grow or shrink.
    fn resize_work(&self, claims: usize, guard: &ReadGuard) -> bool {
        let root = self.root_in(guard);
        // Acquire: pairs with the Release store of the future in `attach`;
        // the new table is initialised.
        !root.future.load(Ordering::Acquire).is_null()
            || !root.has_room(0, GROW_AT)
            || (claims == 0 && self.should_shrink(root))
    }

    /// Shrink below 1/8 load (never below `min_capacity`). Sums the
    /// stripes' address counts when `auto_shrink` is on, so it is asked
    /// only after writes that claimed no slot (a claim cannot make a table
    /// too sparse).
    fn should_shrink(&self, root: &Table) -> bool {
        self.config.auto_shrink
            && root.capacity() > self.config.min_capacity
            && self.live_addrs() * 8 < root.capacity()
    }

    /// A claim probed more than `LONG_PROBE` slots in a table under half
    /// claimed. Rehashed now when no migration runs and the resize lock is
    /// free; otherwise (and whatever happens now) `rehash_pending` makes the
    /// next table attached draw a fresh seed.
    pub(super) fn request_rehash(&self) {
        // Relaxed: a hint read under `resize` by `attach`; a request that
        // races with an attach is served by the one after it.
        self.rehash_pending.store(true, Ordering::Relaxed);
        if let Ok(mut st) = self.resize.try_lock() {
            let guard = rcu::read_lock();
            let root = self.root_in(&guard);
            // Acquire: pairs with the Release store of the future in `attach`;
            // the new table is initialised.
            if root.future.load(Ordering::Acquire).is_null() {
                let cap =
                    capacity_for(self.live_addrs(), self.config.min_capacity).max(root.capacity());
                self.attach(&mut st, cap, Seed::Fresh, &guard);
            }
        }
    }

    /// Finishes any migration, then makes sure the newest table has room
    /// for `extra` more claims below the growth threshold. `tight`: size
    /// the new table just below the growth threshold (bulk presizing, for
    /// memory) rather than as growth does ([`capacity_grown`]).
    pub(super) fn grow_blocking(&self, extra: usize, tight: bool) {
        let mut st = lock(&self.resize);
        let guard = rcu::read_lock();
        self.finish_migration(&mut st, &guard);
        let root = self.root_in(&guard);
        if !root.has_room(extra, GROW_AT) {
            let need = self.growth_need(root, extra);
            let cap = if tight {
                capacity_presized(need, self.config.min_capacity)
            } else {
                capacity_grown(need, self.config.min_capacity)
            };
            self.attach(&mut st, cap, Seed::Keep, &guard);
            // The new table is empty: claims go there at once; the old
            // entries follow chunk by chunk.
        }
    }

    /// Bulk presizing: with room for `extra` new keys, grow once to the
    /// final size rather than several times on the way.
    pub(super) fn presize(&self, extra: usize) {
        let guard = rcu::read_lock();
        // SAFETY: `guard` is held, and `newest` is not used after it goes.
        let newest = unsafe { self.newest() };
        if !newest.has_room(extra, GROW_AT) {
            drop(guard);
            self.grow_blocking(extra, true);
        }
    }

    fn finish_migration(&self, st: &mut ResizeState, guard: &ReadGuard) {
        loop {
            let root = self.root_in(guard);
            // Acquire: pairs with the Release store of the future in `attach`;
            // the new table is initialised.
            if root.future.load(Ordering::Acquire).is_null() {
                return;
            }
            self.migrate(st, usize::MAX, guard);
        }
    }

    /// Attaches a new table of (at least) `capacity` slots to the root,
    /// if no migration is in progress. `st` is the state under `resize`,
    /// whose guard the caller holds.
    ///
    /// Load bound: the new table holds at least twice the live keys, and at
    /// least 1/64 of the old capacity. Callers size it from a count of live
    /// addresses read without the stripe locks, which writers may have
    /// outgrown by the time every stripe lock is held (a shrink decided on
    /// a count of 1 while a bulk insert adds 16 keys would leave the
    /// migration a table too small for them); so the count is read again under every stripe lock, where it is exact,
    /// and a table that is too small is replaced before it is attached.
    /// Each claim in it migrates `budget` ≥ `MIGRATE_CHUNK × ⌈old / new⌉ + 2`
    /// old slots (the `+ 2`: the extra slot and key 0's), so the migration
    /// ends after at most `new / MIGRATE_CHUNK` claims (one claim when the
    /// new table has fewer than `MIGRATE_CHUNK` slots); writers' claims
    /// also reserve room for the keys still to migrate
    /// (`insert_group_locked`), so the migration always finds room.
    fn attach(&self, st: &mut ResizeState, capacity: usize, seed: Seed, guard: &ReadGuard) {
        // Loaded once: the root only changes under `resize` (the migration's
        // swap, `clear`), which the caller holds.
        let root = self.root_in(guard);
        // Acquire: pairs with the Release store of the future in `attach`;
        // the new table is initialised.
        // Acquire: pairs with the Release store of the future in `attach`;
        // the new table is initialised.
        if !root.future.load(Ordering::Acquire).is_null() {
            // Futures are only attached under `resize`, which the caller
            // holds, so this cannot change under us; a caller that decided
            // on a stale view simply has nothing to do.
            return;
        }
        // A rehash asked for and not served yet turns any new table into one.
        let seed = if self.rehash_pending.swap(false, Ordering::Relaxed) {
            Seed::Fresh
        } else {
            seed
        };
        let seed = match seed {
            Seed::Fresh => {
                self.rehashes.fetch_add(1, Ordering::Relaxed);
                let s = table_seed(self.config.seed, st.tables);
                st.tables += 1;
                s
            }
            Seed::Keep => root.seed(),
        };
        let old_cap = root.capacity();
        let mut capacity = capacity.max(old_cap / 64);
        let (new, stripes) = loop {
            let new = Table::new(capacity, seed, self.config.huge_pages);
            let stripes = self.lock_all_stripes();
            // Exact under every stripe lock: writers change it under theirs.
            let live = self.live_addrs();
            let need = capacity_for(live, self.config.min_capacity);
            if need <= capacity {
                break (Box::into_raw(new), stripes);
            }
            drop(stripes);
            capacity = need;
        };
        // `+ 2`: the old table's extra slot and key 0's slot, so the whole
        // old table (`old_cap + 2` positions) is covered by `new / 256`
        // claims. At least 4 slots per stripe: a step takes every stripe
        // lock (`migrate`), and on machines with more stripes than
        // `MIGRATE_CHUNK / 4` a 258-slot step would take more lock
        // operations than it moves keys.
        st.budget =
            (MIGRATE_CHUNK * old_cap.div_ceil(capacity).max(1) + 2).max(4 * self.stripes.len());
        // Release: pairs with the Acquire loads of `future` by readers and
        // writers; the new table's fields are visible. Every stripe lock is
        // held, so no writer is between reading `future` and claiming.
        root.future.store(new, Ordering::Release);
        st.cursor = 0;
        // Credits belong to the newest table, which is now `new`; those
        // left unspent stay counted in the old table, which takes no more
        // claims.
        // Each stripe's lock is released as soon as its credits are reset.
        for mut stripe_state in stripes {
            stripe_state.credits = 0;
        }
        self.resizes.fetch_add(1, Ordering::Relaxed);
    }

    /// Migrates up to `budget` slots of the root into its future; swaps the
    /// root when done. `st` is the state under `resize`, whose guard the
    /// caller holds.
    fn migrate(&self, st: &mut ResizeState, budget: usize, _guard: &ReadGuard) {
        // Acquire: pairs with the Release store that published this root
        // (the migration's swap, `clear`, the first table); the table is initialised.
        let old_ptr = self.root.ptr.load(Ordering::Acquire);
        // SAFETY: root is live while `_guard` holds the read-side section
        // open (a replaced root is retired a grace period after its swap).
        let old = unsafe { &*old_ptr };
        // Acquire: pairs with the Release store of the future in `attach`;
        // the new table is initialised.
        let new_ptr = old.future.load(Ordering::Acquire);
        if new_ptr.is_null() {
            return;
        }
        // SAFETY: the future is live as long as the root is.
        let new = unsafe { &*new_ptr };
        let last = old.slot_count(); // inclusive: key 0's slot
        let end = st.cursor.saturating_add(budget).min(last + 1);
        // Every stripe lock is taken once per run of slots, not each moved
        // key's own lock once per key: a step of 258 slots moves up to about
        // 130 keys (tables grow at half claimed), two lock operations each
        // one by one, 16 in all with 8 stripes. With every lock held no
        // writer claims meanwhile, so the new slots are claimed and counted
        // without atomic read-modify-writes. A run is capped at
        // `migrate_run()` slots, so writers wait a bounded time even when a
        // forced resize migrates a whole table.
        let run = self.migrate_run();
        // The position in the new table that is as far through it as old
        // position `p` is through the old table (`last + 1` positions).
        let share = |p: usize| (p as u128 * new.slot_count() as u128 / (last as u128 + 1)) as usize;
        let mut i = st.cursor;
        while i < end {
            let run_end = end.min(i.saturating_add(run));
            // The same share of the new table as this run is of the old
            // one, faulted in before the claims read it (`Table::prefault`),
            // and before the locks are taken: a fault costs microseconds.
            // With the seed kept (`Seed::Keep`) that share is about where
            // this run's keys go; in any case the last run reaches the end,
            // so every page of the new table is covered once.
            new.prefault(share(i), share(run_end));
            let stripes = self.lock_all_stripes();
            let mut fresh = 0;
            // Two passes per batch: the first lists the live slots without a
            // branch on each (about half the slots are live, at random, so a
            // branch there mispredicts about every other slot), the second
            // moves them. Empty slots hold a null record, so the record alone
            // says whether a slot is live; no writer changes a slot of the
            // old table while every stripe lock is held, so what the first
            // pass read still holds in the second.
            let mut j = i;
            while j < run_end {
                let batch_end = run_end.min(j + MIGRATE_BATCH);
                let mut live = [(0, ptr::null_mut()); MIGRATE_BATCH];
                let mut n = 0;
                for k in j..batch_end {
                    // Acquire: pairs with the Release publish of the writer
                    // that stored it (also ordered by the stripe lock); the
                    // record is handed on to readers of the new slot.
                    let rec = old.slot_at(k).1.rec.load(Ordering::Acquire);
                    live[n] = (k, rec);
                    n += usize::from(is_live(rec));
                }
                for &(k, rec) in &live[..n] {
                    let (key, slot) = old.slot_at(k);
                    // SAFETY: every stripe lock is held (`stripes`), so no
                    // writer claims in `new` meanwhile, and the `resize`
                    // lock (`st`) keeps other migrators out.
                    let (new_slot, is_fresh) = unsafe { new.claim_exclusive(key) };
                    fresh += usize::from(is_fresh);
                    // New slot first, then MOVED (module docs): a reader that
                    // sees MOVED finds the record in `new`.
                    Self::publish(new_slot, rec);
                    Self::publish(slot, moved());
                }
                j = batch_end;
            }
            // Before the locks go: writers read the count under theirs.
            new.add_claims(fresh);
            drop(stripes);
            i = run_end;
        }
        st.cursor = end;
        if end == last + 1 {
            // Release (in `publish_root`): pairs with the Acquire loads of
            // `root`.
            self.publish_root(new_ptr);
            // SAFETY: unlinked from `root`; readers that loaded it hold
            // guards; its records now belong to `new` (all slots are moved,
            // tombstones or empty), so freeing it frees only its slots.
            unsafe { rcu::retire_box_raw(old_ptr) };
        }
    }

    /// Claims a stripe reserves at a time in `table` (at least 1): small
    /// enough that all stripes' unspent credits together stay under 1/64 of
    /// the table, at most 16.
    pub(super) fn credit_batch(&self, table: &Table) -> usize {
        (table.capacity() / (64 * self.stripes.len())).clamp(1, 16)
    }

    /// About the most claim credits reserved in `table` and not spent: a
    /// batch per stripe, which is at most 1/64 of the table when batches
    /// are larger than 1. Batches of 1 are spent by the insert that
    /// reserves them (unless the key's slot existed), so the bound is also
    /// capped at 1/64 of the table rather than a credit per stripe, which
    /// would size a small table for a machine's stripe count.
    fn unspent_credits_bound(&self, table: &Table) -> usize {
        (self.credit_batch(table) * self.stripes.len()).min(table.capacity() / 64)
    }

    /// Most slots one migration run covers while holding every stripe
    /// lock: `4 × MIGRATE_CHUNK`, or 4 slots per stripe when there are more
    /// than 256 stripes. Either covers a whole step of a grow by
    /// 2 (`budget`: 258 slots, and at least 4 per stripe), so a step takes
    /// the locks once, at most one lock operation per 2 slots; the cap
    /// bounds how long writers wait when a forced resize or a bulk insert's
    /// many claims migrate far more.
    fn migrate_run(&self) -> usize {
        (MIGRATE_CHUNK * 4).max(self.stripes.len() * 4)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::index::raw::Config;

    fn config() -> Config {
        Config {
            initial_capacity: 64,
            min_capacity: 8,
            max_addresses: None,
            auto_shrink: true,
            seed: 1,
            stripes: 1,
            count_writes: false,
            huge_pages: true,
        }
    }

    /// A resize sized from a stale count of live addresses (writers added
    /// keys between the count and the attach) still attaches a table that
    /// every key migrates into: `attach` re-counts under every stripe lock
    /// (without it, the migration panics with "address index table
    /// full").
    #[test]
    fn attach_sized_from_a_stale_count_still_fits_every_key() {
        let index = RawIndex::<u64>::new(config());
        for k in 1..=20u64 {
            index.insert(k, k).unwrap();
        }
        {
            let mut st = lock(&index.resize);
            let guard = rcu::read_lock();
            // Sized as a shrink decided on a count of 1 would size it.
            index.attach(&mut st, capacity_for(2, 8), Seed::Keep, &guard);
            index.finish_migration(&mut st, &guard);
        }
        let guard = rcu::read_lock();
        for k in 1..=20u64 {
            // SAFETY: a read guard is held and `index` outlives it.
            assert_eq!(unsafe { index.get(k) }, [k], "key {k}");
        }
        let root = index.root_in(&guard);
        assert!(root.capacity() >= 40, "capacity {}", root.capacity());
    }

    /// Claims made in a table being migrated into, before any migration
    /// step ran (a bulk insert's stripe run, or writers on several
    /// stripes), leave the migration room: each claim leaves room for the
    /// keys still to migrate (without it, they fill the table to 90% and
    /// the migration finds no slot: "address index table full").
    #[test]
    fn claims_during_a_migration_leave_room_for_it() {
        let index = RawIndex::<u64>::new(config());
        for k in 1..=3u64 {
            index.insert(k, k).unwrap();
        }
        // A small future with no migration step yet, as a shrink decided
        // while another writer's bulk run was between stripe runs.
        {
            let mut st = lock(&index.resize);
            let guard = rcu::read_lock();
            index.attach(&mut st, 8, Seed::Keep, &guard);
        }
        // A stripe run claiming new keys in it: refused before the
        // migration's room is used up.
        let guard = rcu::read_lock();
        let stripe = &*index.stripes[0];
        let mut st = lock(&stripe.lock);
        let mut claimed = 0;
        for k in 100..110u64 {
            // SAFETY: `guard` and stripe 0's lock (`st`) are held, and the
            // index has one stripe (`config`), so every key is stripe 0's.
            match unsafe { index.insert_group_locked(0, stripe, &mut st, k, &mut || k, 1) } {
                Ok(Some(g)) => claimed += usize::from(g.claimed),
                Ok(None) => break,
                Err(e) => panic!("{e}"),
            }
        }
        drop(st);
        drop(guard);
        assert!(
            claimed < 7,
            "{claimed} claims in an 8-slot table being migrated into"
        );
        // The migration finds room for every live key, and nothing is lost.
        {
            let mut st = lock(&index.resize);
            let guard = rcu::read_lock();
            index.finish_migration(&mut st, &guard);
        }
        let _guard = rcu::read_lock();
        for k in (1..=3u64).chain(100..100 + claimed as u64) {
            // SAFETY: a read guard is held and `index` outlives it.
            assert_eq!(unsafe { index.get(k) }, [k], "key {k}");
        }
    }

    /// Growth keeps the root's seed (a key's home `h` becomes `2h` or
    /// `2h + 1`, so the migration writes the new table in order); a rehash
    /// draws a new seed, and growth after it keeps that one; a rehash asked
    /// for while a migration runs is served by the next table attached. No
    /// key is lost on the way.
    #[test]
    fn growth_keeps_the_seed_and_a_rehash_draws_a_new_one() {
        let index = RawIndex::<u64>::new(config());
        let seed = |index: &RawIndex<u64>| {
            let guard = rcu::read_lock();
            index.root_in(&guard).seed()
        };
        let first = seed(&index);
        for k in 1..=1_000u64 {
            index.insert(k, k).unwrap();
        }
        assert!(index.resizes.load(Ordering::Relaxed) >= 4);
        assert_eq!(seed(&index), first, "growth changed the seed");
        index.request_rehash();
        {
            let mut st = lock(&index.resize);
            let guard = rcu::read_lock();
            index.finish_migration(&mut st, &guard);
        }
        let rehashed = seed(&index);
        assert_ne!(rehashed, first, "a rehash kept the seed");
        for k in 1_001..=4_000u64 {
            index.insert(k, k).unwrap();
        }
        assert_eq!(
            seed(&index),
            rehashed,
            "growth after a rehash changed the seed"
        );
        assert_eq!(index.rehashes.load(Ordering::Relaxed), 1);
        // A rehash asked for during a migration is not dropped: the next
        // table attached, a growth, draws a fresh seed.
        {
            let mut st = lock(&index.resize);
            let guard = rcu::read_lock();
            // SAFETY: `guard` is held; the table is used only here.
            let cap = unsafe { index.newest() }.capacity();
            index.attach(&mut st, cap, Seed::Keep, &guard);
        }
        index.request_rehash();
        {
            let mut st = lock(&index.resize);
            let guard = rcu::read_lock();
            index.finish_migration(&mut st, &guard);
        }
        assert_eq!(seed(&index), rehashed, "no table was attached yet");
        let resizes = index.resizes.load(Ordering::Relaxed);
        let mut k = 4_001u64;
        while index.resizes.load(Ordering::Relaxed) == resizes {
            index.insert(k, k).unwrap();
            k += 1;
        }
        {
            let mut st = lock(&index.resize);
            let guard = rcu::read_lock();
            index.finish_migration(&mut st, &guard);
        }
        assert_ne!(seed(&index), rehashed, "the pending rehash was dropped");
        assert_eq!(index.rehashes.load(Ordering::Relaxed), 2);
        let _guard = rcu::read_lock();
        for k in 1..k {
            // SAFETY: a read guard is held and `index` outlives it.
            assert_eq!(unsafe { index.get(k) }, [k], "key {k}");
        }
    }
}
