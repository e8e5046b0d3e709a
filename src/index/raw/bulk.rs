//! Bulk insert (`insert_many`): all or nothing, presized, one stripe lock
//! acquisition per run of keys, repeated addresses appended after the first
//! pass with one record copy each, and the rollback that hands every value
//! back when the batch fails midway (or unlinks what it inserted when a
//! `V::clone` panics).

use super::record::RecordPtr;
use super::table::Slot;
use super::{RawIndex, SHARED_ID, STRIPE_ID_BITS, lock, stripe_of};
use crate::error::Error;
use crate::rcu;
use crate::sync::Ordering;

/// Most keys a bulk insert adds per stripe-lock acquisition.
pub(super) const BULK_RUN: usize = 1024;

/// How far ahead of the key being inserted a bulk insert prefetches.
const PREFETCH_AHEAD: usize = 8;

/// Records unlinked by an undone bulk insert, retired when dropped (also
/// when a clone taken from them panics, in `roll_back`). Invariant: each
/// record came from `unlink_inserted`, and the reference of the slot it
/// was unlinked from is held here, given back once, on drop.
struct RetireAll<'a, V: Clone + Send + Sync + 'static>(
    &'a RawIndex<V>,
    Vec<(RecordPtr<V>, Vec<u64>)>,
);

impl<V: Clone + Send + Sync + 'static> Drop for RetireAll<'_, V> {
    fn drop(&mut self) {
        for (rec, _) in self.1.drain(..) {
            // SAFETY: the struct invariant: the unlinked slot's reference,
            // drained, so given back once.
            unsafe { self.0.retire_record(rec) };
        }
    }
}

/// What the writes of one bulk run (under one stripe lock) found, for
/// [`RawIndex::after_bulk_run`].
#[derive(Default)]
pub(super) struct BulkRun {
    /// Slots the run's writes claimed.
    claims: usize,
    /// A write landed far from its home slot.
    long_probe: bool,
    /// Why the run stopped early: no room (`Ok`, with the keys left to
    /// place), or an error.
    stopped: Option<Result<usize, Error>>,
}

impl BulkRun {
    /// Takes one write's outcome: where it placed its key (`Some`; `claimed`
    /// says whether it claimed a slot and whether it landed far, as a pair),
    /// no room (`None`, with `left` keys still to place), or an error. Gives
    /// the placement back while the run goes on, `None` once it stopped.
    pub(super) fn take<P>(
        &mut self,
        r: Result<Option<P>, Error>,
        left: usize,
        claimed: impl FnOnce(&P) -> (bool, bool),
    ) -> Option<P> {
        match r {
            Ok(Some(placed)) => {
                let (claim, long) = claimed(&placed);
                self.claims += usize::from(claim);
                self.long_probe |= long;
                Some(placed)
            }
            Ok(None) => {
                self.stopped = Some(Ok(left));
                None
            }
            Err(e) => {
                self.stopped = Some(Err(e));
                None
            }
        }
    }
}

/// What a bulk insert needs to recognise an address repeated within the
/// batch.
#[derive(Default)]
struct BulkBatch {
    /// Per stripe: its sequence number when the batch first took its lock
    /// (`u64::MAX` before). An id of that stripe from there on is the
    /// batch's, or a concurrent writer's added during the batch; treating
    /// the latter as a repeat only defers a value, which is harmless.
    start: Vec<u64>,
    /// Addresses with a deferred value: every later value of theirs is
    /// deferred too, so the values the first pass adds are a prefix of the
    /// address's values in input order, whatever concurrent writers do.
    deferred_keys: std::collections::HashSet<u64>,
}

impl BulkBatch {
    fn new(stripes: usize) -> Self {
        Self {
            start: vec![u64::MAX; stripes],
            ..Self::default()
        }
    }

    /// The batch holds stripe `si`'s lock; its next sequence number is
    /// `seq`.
    fn hold(&mut self, si: usize, seq: u64) {
        if self.start[si] == u64::MAX {
            self.start[si] = seq;
        }
    }

    /// Whether `key`, whose current record is `found` (under its stripe
    /// lock), may already hold a value of this batch, or has deferred ones.
    /// O(values of the address).
    ///
    /// # Safety
    ///
    /// The caller holds a read guard and `key`'s stripe lock, under which
    /// `locate` returned `found`.
    unsafe fn repeats<V>(&mut self, key: u64, found: Option<&(&Slot, RecordPtr<V>)>) -> bool {
        if !self.deferred_keys.is_empty() && self.deferred_keys.contains(&key) {
            return true;
        }
        let Some((_, rec)) = found else {
            return false;
        };
        // SAFETY: the caller holds a read guard and the stripe lock, so
        // the record is live. A shared insert's id is never the batch's.
        let recent = unsafe { rec.ids() }.iter().any(|&id| {
            let si = (id & ((1 << STRIPE_ID_BITS) - 1)) as usize;
            id & SHARED_ID == 0 && id >> STRIPE_ID_BITS >= self.start[si]
        });
        if recent {
            self.deferred_keys.insert(key);
        }
        recent
    }
}

/// A failed bulk insert: the error and every value, in input order.
pub(crate) type BulkError<V> = (Error, Vec<(u64, V)>);

impl<V: Clone + Send + Sync + 'static> RawIndex<V> {
    /// Bulk insert, all-or-nothing. On error every value comes back in
    /// input order.
    pub(crate) fn insert_many(&self, items: Vec<(u64, V)>) -> Result<Vec<u64>, BulkError<V>> {
        let n = items.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let keys: Vec<u64> = items.iter().map(|(k, _)| *k).collect();
        let mut vals: Vec<Option<V>> = items.into_iter().map(|(_, v)| Some(v)).collect();
        // Up-front capacity check, before presizing (a refused batch must not
        // grow the table): fails before inserting anything unless concurrent
        // writers race us (then the rollback below runs).
        if let Some(max) = self.config.max_addresses {
            let mut distinct = keys.clone();
            distinct.sort_unstable();
            distinct.dedup();
            let guard = rcu::read_lock();
            let new_keys = distinct
                .iter()
                // SAFETY: `guard` is held; only the pointer's nullness is
                // used.
                .filter(|&&k| unsafe { self.lookup_raw(k) }.is_null())
                .count();
            drop(guard);
            if self.limited_addrs.load(Ordering::Relaxed) + new_keys > max {
                let values = keys
                    .into_iter()
                    .zip(vals.into_iter().map(Option::unwrap))
                    .collect();
                return Err((Error::CapacityExceeded { max_addresses: max }, values));
            }
        }
        // Presize for every key being new (bulk registrations rarely repeat
        // an address; a batch that does only over-allocates): no migration
        // runs during the batch.
        self.presize(n);
        // Input positions grouped by stripe, input order kept within each
        // stripe (a counting sort: two linear passes; a comparison sort of
        // the batch cost as much as the inserts): one lock acquisition per
        // stripe run, and the values and keys read in ascending order.
        let stripes = self.stripes.len();
        let mut bounds = vec![0usize; stripes + 1];
        for &k in &keys {
            bounds[stripe_of(k, self.stripe_mask) + 1] += 1;
        }
        for i in 0..stripes {
            bounds[i + 1] += bounds[i];
        }
        let mut order = vec![0usize; n];
        let mut fill = bounds.clone();
        for (i, &k) in keys.iter().enumerate() {
            let s = stripe_of(k, self.stripe_mask);
            order[fill[s]] = i;
            fill[s] += 1;
        }
        drop(fill);
        let mut ids = vec![0u64; n];
        // Positions inserted so far, for the rollback.
        let mut inserted: Vec<usize> = Vec::new();
        // A panic out of the runs (a `V::clone` of an address's values,
        // copied on write) is caught so that the batch stays all or nothing:
        // what it inserted is unlinked before the panic goes on. Nothing in
        // the index is left half-done by the panic (records are built
        // before they are published, locks ignore poison), and `ids` and
        // `inserted` hold every completed insert at every point.
        let runs = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.insert_runs(&keys, &mut vals, &order, &bounds, &mut ids, &mut inserted)
        }));
        match runs {
            Ok(Ok(())) => {
                self.after_write(0);
                Ok(ids)
            }
            Ok(Err(e)) => Err(self.roll_back(e, &keys, vals, &ids, &inserted)),
            Err(panic) => {
                // The values cannot travel with the panic: they are dropped
                // with their records after a grace period.
                drop(RetireAll(
                    self,
                    self.unlink_inserted(&keys, &ids, &inserted),
                ));
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// The runs of [`RawIndex::insert_many`]: its values by stripe, then
    /// the repeated addresses. Records each insert in `ids` and `inserted`
    /// as it completes; stops at the first error.
    fn insert_runs(
        &self,
        keys: &[u64],
        vals: &mut [Option<V>],
        order: &[usize],
        bounds: &[usize],
        ids: &mut [u64],
        inserted: &mut Vec<usize>,
    ) -> Result<(), Error> {
        let stripes = self.stripes.len();
        // A repeated address: its first value goes in with the pass below,
        // the later ones are deferred and appended afterwards, all of an
        // address's deferred values in one record copy (appending each on
        // its own would copy the record once per value: quadratic for many
        // values on one address).
        let mut batch = BulkBatch::new(stripes);
        // Input positions of repeats, appended after the first pass.
        let mut deferred: Vec<usize> = Vec::new();
        for si in 0..stripes {
            let mut j = bounds[si];
            while j < bounds[si + 1] {
                // At most BULK_RUN keys per lock acquisition, so writers
                // waiting on this stripe are not held up for the whole batch.
                let end = bounds[si + 1].min(j + BULK_RUN);
                let stripe = &*self.stripes[si];
                let guard = rcu::read_lock();
                let mut st = lock(&stripe.lock);
                batch.hold(si, st.next_seq);
                // No future can be attached while we hold a stripe lock.
                // SAFETY: `guard` is held, and `table` is used only under
                // it (this stripe run).
                let table = unsafe { self.newest() };
                let mut run = BulkRun::default();
                while j < end {
                    // The keys are known in advance: fetch the slot of a
                    // key a few places ahead while this one is inserted
                    // (overlaps the table's cache misses).
                    if j + PREFETCH_AHEAD < end {
                        table.prefetch(keys[order[j + PREFETCH_AHEAD]]);
                    }
                    let p = order[j];
                    // SAFETY: `guard` and stripe `si`'s lock (`st`), which
                    // is `keys[p]`'s, are held while `found` is used.
                    let found = unsafe { self.locate(keys[p]) };
                    // SAFETY: `found` is `locate`'s, under the same hold of
                    // `guard` and `st`.
                    if unsafe { batch.repeats(keys[p], found.as_ref()) } {
                        deferred.push(p);
                        j += 1;
                        continue;
                    }
                    let mut next = || vals[p].take().expect("each value inserted once");
                    // SAFETY: as for `locate` above, whose `found` this is,
                    // under the same hold.
                    let r = unsafe {
                        self.insert_group_at(si, stripe, &mut st, keys[p], found, &mut next, 1)
                    };
                    let left = bounds[si + 1] - j;
                    let Some(g) = run.take(r, left, |g| (g.claimed, g.long_probe)) else {
                        break;
                    };
                    ids[p] = g.first;
                    inserted.push(p);
                    j += 1;
                }
                drop(st);
                drop(guard);
                if let Some(e) = self.after_bulk_run(run) {
                    return Err(e);
                }
            }
        }
        // The deferred repeats, grouped by address (a stable sort keeps
        // input order within each address), one record copy per address.
        deferred.sort_by_key(|&p| keys[p]);
        let mut j = 0;
        while j < deferred.len() {
            let key = keys[deferred[j]];
            let end = j + deferred[j..]
                .iter()
                .take_while(|&&p| keys[p] == key)
                .count();
            let group = &deferred[j..end];
            let (si, stripe) = self.stripe(key);
            let guard = rcu::read_lock();
            let mut st = lock(&stripe.lock);
            let mut taken = 0;
            let mut next = || {
                let v = vals[group[taken]].take().expect("each value inserted once");
                taken += 1;
                v
            };
            // SAFETY: `guard` and stripe `si`'s lock (`st`), `key`'s, are
            // held.
            let r = unsafe {
                self.insert_group_locked(si, stripe, &mut st, key, &mut next, group.len())
            };
            drop(st);
            drop(guard);
            let mut run = BulkRun::default();
            if let Some(g) = run.take(r, deferred.len() - j, |g| (g.claimed, g.long_probe)) {
                for (i, &p) in group.iter().enumerate() {
                    ids[p] = g.first + ((i as u64) << STRIPE_ID_BITS);
                    inserted.push(p);
                }
                j = end;
            }
            if let Some(e) = self.after_bulk_run(run) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// After a bulk insert releases a stripe lock: rehash, resize or grow
    /// as the run found; a run that stopped on an error hands it back.
    pub(super) fn after_bulk_run(&self, run: BulkRun) -> Option<Error> {
        if run.long_probe {
            self.request_rehash();
        }
        if run.claims > 0 {
            self.after_write(run.claims);
        }
        match run.stopped {
            None => None,
            // No room (a concurrent writer filled the table first): grow,
            // and the caller retries from the key that stopped.
            Some(Ok(extra)) => {
                self.grow_blocking(extra, false);
                None
            }
            Some(Err(e)) => Some(e),
        }
    }

    /// Undoes a failed bulk insert: unlinks what it inserted (`inserted`:
    /// input positions), waits one grace period, and moves every value back
    /// out, in input order.
    ///
    /// Inside a read-side section of the calling thread a grace period
    /// would wait for that section (`synchronize` panics there), and other
    /// readers may still hold the unlinked values, so they cannot be moved
    /// out: the caller gets clones, and the originals are dropped with their
    /// records after a grace period.
    fn roll_back(
        &self,
        e: Error,
        keys: &[u64],
        mut vals: Vec<Option<V>>,
        ids: &[u64],
        inserted: &[usize],
    ) -> BulkError<V> {
        let unlinked = self.unlink_inserted(keys, ids, inserted);
        let mut back = Vec::new();
        // A record a shared insert has copied into (or holds) since is not
        // ours to drain: clones of our values come back from it, as from
        // every record inside a read section.
        // SAFETY: each is live: we hold the reference of the slot it was
        // unlinked from.
        let (cloned, owned): (Vec<_>, Vec<_>) = unlinked
            .into_iter()
            .partition(|(rec, _)| rcu::in_read_section() || unsafe { rec.shared() });
        // The owned first: a clone that panics below then leaks nothing.
        if !owned.is_empty() {
            rcu::synchronize();
            for (rec, gids) in owned {
                // Unshared, so no writer can take a reference any more (that
                // needs one): ours is the last.
                // SAFETY: live until freed below.
                let bytes = unsafe { rec.shared_bytes() };
                self.shared.bytes.fetch_sub(bytes, Ordering::Relaxed);
                // SAFETY: unlinked above, a grace period has passed, and we
                // are the record's only owner.
                unsafe { rec.free_extracting(|id| gids.contains(&id), &mut back) };
            }
        }
        // Retired on drop, so that a panicking clone leaks nothing.
        let retire = RetireAll(self, cloned);
        for (rec, gids) in &retire.1 {
            // SAFETY: unlinked by us and not yet retired: nobody frees it
            // meanwhile, and its values are initialised.
            let (rids, rvals) = unsafe { (rec.ids(), rec.values()) };
            back.extend(
                rids.iter()
                    .zip(rvals)
                    .filter(|(id, _)| gids.contains(id))
                    .map(|(&id, v)| (id, v.clone())),
            );
        }
        drop(retire);
        let pos_of: std::collections::HashMap<u64, usize> =
            inserted.iter().map(|&p| (ids[p], p)).collect();
        for (id, v) in back {
            vals[pos_of[&id]] = Some(v);
        }
        let values = keys
            .iter()
            .zip(vals)
            .filter_map(|(&k, v)| v.map(|v| (k, v)))
            .collect();
        (e, values)
    }

    /// Unlinks the values a bulk insert inserted (`inserted`: input
    /// positions; `ids`: their ids), each address's together; returns the
    /// records that held them with the batch's ids in each, for the caller
    /// to drain or retire.
    fn unlink_inserted(
        &self,
        keys: &[u64],
        ids: &[u64],
        inserted: &[usize],
    ) -> Vec<(RecordPtr<V>, Vec<u64>)> {
        // The batch's ids of each address, unlinked together.
        let mut by_key: Vec<(u64, u64)> = inserted.iter().map(|&p| (keys[p], ids[p])).collect();
        by_key.sort_unstable();
        let mut unlinked = Vec::with_capacity(by_key.len());
        for group in by_key.chunk_by(|a, b| a.0 == b.0) {
            let key = group[0].0;
            let gids: Vec<u64> = group.iter().map(|&(_, id)| id).collect();
            match self.unlink(key, &gids) {
                Ok(rec) => unlinked.push((rec, gids)),
                // A concurrent writer removed one of our fresh ids (ids are
                // not secret); what it removed it has dropped, the rest we
                // still unlink.
                Err(_) => {
                    for id in gids {
                        if let Ok(rec) = self.unlink(key, &[id]) {
                            unlinked.push((rec, vec![id]));
                        }
                    }
                }
            }
        }
        unlinked
    }
}
