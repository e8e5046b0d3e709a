//! Shared inserts and removals: one value attached to (or detached from)
//! many addresses under one id, with the addresses that held the same
//! record before holding one record after (see `record.rs`, "Shared
//! records").
//!
//! An insert walks its distinct addresses by stripe, one lock acquisition
//! per run, as `insert_many` does. An address with no values gets the
//! insert's one fresh record `{value}`; an address holding record `R` gets
//! `R + value`, built once per `R` and memoised for the other addresses
//! holding `R`. A removal does the same with `R − value` (or no record).
//! So one probe on 50,000 functions is one record, a second probe on the
//! same functions turns it into one record holding both, and removing
//! either leaves one record again.
//!
//! The operation holds its own reference to every record in its memo
//! (each `R` and each copy it built) and to the fresh record until it
//! ends. So no record it has seen can be freed meanwhile, and a memo key
//! (a record's address) can never come back as the address of another
//! record within the operation. Other writers may replace any of these
//! records in their own slots meanwhile; they give back only the slot's
//! reference.

use std::collections::HashMap;

use super::bulk::{BULK_RUN, BulkRun};
use super::record::{Header, RecordPtr};
use super::{RawIndex, SHARED_ID, STRIPE_ID_BITS, Stripe, StripeState, lock, stripe_of};
use crate::error::Error;
use crate::rcu;
use crate::sync::Ordering;

/// The references a shared operation holds, given back when it ends.
/// Invariant: `fresh` and every record in `memo` (found and built) each
/// stand for one reference the operation took and has not given back.
struct Held<'a, V: Clone + Send + Sync + 'static> {
    index: &'a RawIndex<V>,
    /// The insert's record for addresses that had no values.
    fresh: Option<RecordPtr<V>>,
    /// Each record found, and what replaced it (`None`: nothing, the value
    /// was its last).
    memo: HashMap<*mut Header, (RecordPtr<V>, Option<RecordPtr<V>>)>,
}

impl<V: Clone + Send + Sync + 'static> Drop for Held<'_, V> {
    fn drop(&mut self) {
        // SAFETY: each is a reference the operation took (`Held`'s
        // invariant), taken out of `self`, so given back once.
        unsafe {
            if let Some(rec) = self.fresh.take() {
                self.index.retire_record(rec);
            }
            for (_, (old, new)) in self.memo.drain() {
                self.index.retire_record(old);
                if let Some(new) = new {
                    self.index.retire_record(new);
                }
            }
        }
    }
}

impl<V: Clone + Send + Sync + 'static> RawIndex<V> {
    /// Attaches `value` at every distinct address of `keys` under one id
    /// (returned), all or nothing. On error the value comes back.
    pub(crate) fn insert_shared(&self, keys: &[u64], value: V) -> Result<u64, (Error, V)> {
        // Relaxed: only uniqueness matters.
        let seq = self.shared.seq.fetch_add(1, Ordering::Relaxed);
        let id = SHARED_ID | seq << STRIPE_ID_BITS;
        let order = self.by_stripe(keys);
        // Presized for the addresses that are new (a second probe on the
        // same functions adds none): concurrent writers may make the
        // count short, and then the table grows during the insert.
        let guard = rcu::read_lock();
        let new_keys = order
            .iter()
            // SAFETY: `guard` is held; only the pointer's nullness is used.
            .filter(|&&k| unsafe { self.lookup_raw(k) }.is_null())
            .count();
        drop(guard);
        if let Some(max) = self.config.max_addresses {
            if self.limited_addrs.load(Ordering::Relaxed) + new_keys > max {
                return Err((Error::CapacityExceeded { max_addresses: max }, value));
            }
        }
        self.presize(new_keys);
        let mut done = 0;
        let runs = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.insert_shared_runs(&order, id, &value, &mut done)
        }));
        match runs {
            Ok(Ok(())) => {
                self.after_write(0);
                Ok(id)
            }
            Ok(Err(e)) => {
                self.remove_shared(&order[..done], id);
                Err((e, value))
            }
            Err(panic) => {
                // A `V::clone` panicked: what was attached is detached, and
                // the panic goes on.
                self.remove_shared(&order[..done], id);
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// The distinct `keys`, grouped by stripe (so each run takes one lock).
    fn by_stripe(&self, keys: &[u64]) -> Vec<u64> {
        let mut order = keys.to_vec();
        order.sort_unstable_by_key(|&k| (stripe_of(k, self.stripe_mask), k));
        order.dedup();
        order
    }

    /// The runs of [`RawIndex::insert_shared`] over `order` (from
    /// `by_stripe`); `done` counts the addresses attached so far.
    fn insert_shared_runs(
        &self,
        order: &[u64],
        id: u64,
        value: &V,
        done: &mut usize,
    ) -> Result<(), Error> {
        let mut held = Held {
            index: self,
            fresh: None,
            memo: HashMap::new(),
        };
        while *done < order.len() {
            let si = stripe_of(order[*done], self.stripe_mask);
            let stripe = &*self.stripes[si];
            let guard = rcu::read_lock();
            let mut st = lock(&stripe.lock);
            let mut run = BulkRun::default();
            let end = (*done + BULK_RUN).min(order.len());
            while *done < end && stripe_of(order[*done], self.stripe_mask) == si {
                // SAFETY: `guard` and stripe `si`'s lock (`st`), the key's,
                // are held.
                let r =
                    unsafe { self.share_at(stripe, &mut st, order[*done], id, value, &mut held) };
                if run.take(r, order.len() - *done, |&placed| placed).is_none() {
                    break;
                }
                *done += 1;
            }
            drop(st);
            drop(guard);
            if let Some(e) = self.after_bulk_run(run) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Attaches `value` (id `id`) at `key`. `Ok(None)`: no room for a new
    /// address. Otherwise whether a slot was claimed, and whether it
    /// landed far from home.
    ///
    /// # Safety
    ///
    /// The caller holds a read guard and `key`'s stripe lock (`stripe` is
    /// that stripe, `st` its state).
    unsafe fn share_at(
        &self,
        stripe: &Stripe,
        st: &mut StripeState,
        key: u64,
        id: u64,
        value: &V,
        held: &mut Held<'_, V>,
    ) -> Result<Option<(bool, bool)>, Error> {
        // SAFETY: the caller holds `key`'s stripe lock and a read guard.
        let Some((slot, old)) = (unsafe { self.locate(key) }) else {
            // SAFETY: as for `locate`; `key` has no live slot.
            let Some((slot, long_probe)) = (unsafe { self.claim_new(st, key) })? else {
                return Ok(None);
            };
            let fresh = *held.fresh.get_or_insert_with(|| {
                let rec = RecordPtr::build_shared(1, [(id, value.clone())]);
                // SAFETY: just built, ours.
                let bytes = unsafe { rec.shared_bytes() };
                self.shared.bytes.fetch_add(bytes, Ordering::Relaxed);
                rec
            });
            // SAFETY: the operation holds a reference (`held`).
            unsafe { fresh.acquire() };
            Self::publish(slot, fresh.into_raw());
            // SAFETY: the caller holds this stripe's lock.
            unsafe { stripe.account(1, 1, 0) };
            self.bump();
            return Ok(Some((true, long_probe)));
        };
        let new = match held.memo.get(&old.into_raw()) {
            Some(&(_, Some(new))) => new,
            Some((_, None)) => unreachable!("an insert always replaces a record"),
            None => {
                // SAFETY: `old` is live in `key`'s slot, whose stripe lock
                // we hold, so it holds a reference meanwhile.
                let (ids, values) = unsafe { (old.ids(), old.values()) };
                let new = RecordPtr::build_shared(
                    ids.len() + 1,
                    ids.iter()
                        .copied()
                        .zip(values.iter().cloned())
                        .chain([(id, value.clone())]),
                );
                // SAFETY: just built, ours; `old` as above.
                unsafe {
                    self.shared
                        .bytes
                        .fetch_add(new.shared_bytes(), Ordering::Relaxed);
                    old.acquire();
                }
                held.memo.insert(old.into_raw(), (old, Some(new)));
                new
            }
        };
        // SAFETY: the operation holds a reference (`held`).
        unsafe { new.acquire() };
        Self::publish(slot, new.into_raw());
        // SAFETY: `old` is live: the operation holds a reference; the
        // caller holds this stripe's lock, as `account` needs.
        unsafe { stripe.account(1, 0, -old.private_bytes()) };
        self.bump();
        // SAFETY: `old` was unlinked from `key`'s slot above: the slot's
        // reference, given back once (the operation's own is in `held`).
        unsafe { self.retire_record(old) };
        Ok(Some((false, false)))
    }

    /// Detaches the value `id` from every address of `keys` that holds it;
    /// returns how many did. The values are dropped after a grace period.
    pub(crate) fn remove_shared(&self, keys: &[u64], id: u64) -> usize {
        let order = self.by_stripe(keys);
        let mut held = Held {
            index: self,
            fresh: None,
            memo: HashMap::new(),
        };
        let mut removed = 0;
        for run in order
            .chunk_by(|a, b| stripe_of(*a, self.stripe_mask) == stripe_of(*b, self.stripe_mask))
        {
            for keys in run.chunks(BULK_RUN) {
                let si = stripe_of(keys[0], self.stripe_mask);
                let stripe = &*self.stripes[si];
                let guard = rcu::read_lock();
                let st = lock(&stripe.lock);
                for &key in keys {
                    // SAFETY: `guard` and stripe `si`'s lock (`st`), the
                    // key's, are held.
                    removed += usize::from(unsafe { self.unshare_at(stripe, key, id, &mut held) });
                }
                drop(st);
                drop(guard);
            }
        }
        drop(held);
        if removed > 0 {
            self.after_write(0);
        }
        removed
    }

    /// Detaches the value `id` from `key`; whether it was there.
    ///
    /// # Safety
    ///
    /// The caller holds a read guard and `key`'s stripe lock (`stripe` is
    /// that stripe).
    unsafe fn unshare_at(
        &self,
        stripe: &Stripe,
        key: u64,
        id: u64,
        held: &mut Held<'_, V>,
    ) -> bool {
        // SAFETY: the caller holds `key`'s stripe lock and a read guard.
        let Some((slot, old)) = (unsafe { self.locate(key) }) else {
            return false;
        };
        let new = match held.memo.get(&old.into_raw()) {
            Some(&(_, new)) => new,
            None => {
                // SAFETY: `old` is live in `key`'s slot, whose stripe lock
                // we hold, so it holds a reference meanwhile.
                let (ids, values) = unsafe { (old.ids(), old.values()) };
                if !ids.contains(&id) {
                    return false;
                }
                let left = ids.len() - 1;
                let new = (left > 0).then(|| {
                    let rec = RecordPtr::build_shared(
                        left,
                        ids.iter()
                            .copied()
                            .zip(values.iter())
                            .filter(|&(x, _)| x != id)
                            .map(|(x, v)| (x, v.clone())),
                    );
                    // SAFETY: just built, ours.
                    let bytes = unsafe { rec.shared_bytes() };
                    self.shared.bytes.fetch_add(bytes, Ordering::Relaxed);
                    rec
                });
                // SAFETY: as above.
                unsafe { old.acquire() };
                held.memo.insert(old.into_raw(), (old, new));
                new
            }
        };
        // SAFETY: `old` is live: the operation holds a reference.
        let old_bytes = unsafe { old.private_bytes() };
        match new {
            Some(new) => {
                // SAFETY: the operation holds a reference (`held`).
                unsafe { new.acquire() };
                Self::publish(slot, new.into_raw());
                // SAFETY: the caller holds this stripe's lock.
                unsafe { stripe.account(-1, 0, -old_bytes) };
            }
            None => {
                Self::publish(slot, std::ptr::null_mut());
                self.release_addr();
                // SAFETY: the caller holds this stripe's lock.
                unsafe { stripe.account(-1, -1, -old_bytes) };
            }
        }
        self.bump();
        // SAFETY: `old` was unlinked from `key`'s slot above: the slot's
        // reference, given back once (the operation's own is in `held`).
        unsafe { self.retire_record(old) };
        true
    }
}
