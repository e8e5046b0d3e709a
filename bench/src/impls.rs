//! The lookup implementations compared, all built from the same
//! `(address, handlers)` data and all doing the same work per lookup: find
//! the address, sum its handlers.
//!
//! Peers get hashbrown's default hasher (foldhash) rather than their own
//! SipHash default: the faster hasher makes them stronger, not weaker.

use std::sync::Arc;

use fprobe::{AddrIndex, rcu};
use hashbrown::DefaultHashBuilder;

use crate::chained::Chained;

/// Lookups per batch (per counter update), as `bench_trigger`.
pub const BATCH: usize = 100;

/// One implementation under test.
pub trait LookupImpl: Send + Sync {
    /// Looks up every address of `addrs` and returns the sum of all their
    /// handlers.
    fn batch(&self, addrs: &[u64]) -> u64;
}

/// The sum over `addrs` of `handlers_of(address)`: the loop every
/// [`LookupImpl::batch`] runs, inlined into each so that each peer's lookup
/// is compiled into its own loop.
#[inline(always)]
fn sum_over(addrs: &[u64], handlers_of: impl Fn(&u64) -> u64) -> u64 {
    addrs.iter().map(handlers_of).sum()
}

/// The work per found address: the sum of its handlers.
#[inline(always)]
fn sum(handlers: &[u64]) -> u64 {
    handlers.iter().sum()
}

pub struct Impl {
    pub name: &'static str,
    pub map: Box<dyn LookupImpl>,
}

/// Every implementation name, in report order.
pub const NAMES: &[(&str, &str)] = &[
    (
        "fprobe",
        "fprobe::AddrIndex::get, one rcu::read_lock per batch of 100",
    ),
    (
        "fprobe-lock-per-lookup",
        "fprobe::AddrIndex::lookup, one rcu::read_lock per lookup",
    ),
    (
        "fprobe-small-pages",
        "fprobe with huge_pages(false): its table on the global allocator's 4 KiB pages, like every peer's (fprobe's too below 8 MiB: ~131k addresses)",
    ),
    (
        "fprobe-hit-cache",
        "fprobe with the default recent-hit cache and its switch (on only where it times faster)",
    ),
    (
        "hashbrown-ceiling",
        "unsynchronised read-only hashbrown::HashMap<u64, Vec<u64>>",
    ),
    (
        "fixed256",
        "old fprobe table: 256 buckets of immutable chains, one node per handler, full chain walk",
    ),
    (
        "fixed256-array",
        "fixed256 with each chain a contiguous array of (address, handler): a stronger variant than the kernel had",
    ),
    (
        "rwlock-hashbrown",
        "parking_lot::RwLock<hashbrown::HashMap>, read lock per lookup",
    ),
    ("dashmap", "dashmap::DashMap 6, get per lookup"),
    ("papaya", "papaya::HashMap 0.2, pin per lookup"),
    ("scc", "scc::HashIndex 2, peek_with per lookup"),
    (
        "arc-swap",
        "arc_swap::ArcSwap<hashbrown::HashMap>, load per lookup",
    ),
];

/// Builds the implementations whose names pass `keep`, in [`NAMES`] order.
pub fn build(data: &[(u64, Vec<u64>)], keep: &dyn Fn(&str) -> bool) -> Vec<Impl> {
    let hb = || -> hashbrown::HashMap<u64, Vec<u64>> { data.iter().cloned().collect() };
    let mut out = Vec::new();
    for &(name, _) in NAMES {
        if !keep(name) {
            continue;
        }
        let map: Box<dyn LookupImpl> = match name {
            "fprobe" => Box::new(FprobeBatch(fprobe_index(data))),
            "fprobe-lock-per-lookup" => Box::new(FprobePerLookup(fprobe_index(data))),
            "fprobe-small-pages" => Box::new(FprobeBatch(fprobe_index_with(
                data,
                AddrIndex::builder().huge_pages(false),
            ))),
            "fprobe-hit-cache" => Box::new(FprobeBatch(fprobe_index_with(
                data,
                AddrIndex::builder().hit_cache(fprobe::HitCacheConfig::new()),
            ))),
            "hashbrown-ceiling" => Box::new(Ceiling(hb())),
            "fixed256" => Box::new(Fixed256::new(data)),
            "fixed256-array" => Box::new(Fixed256Array::new(data)),
            "rwlock-hashbrown" => Box::new(RwLocked::new(data)),
            "dashmap" => Box::new(Dash::new(data)),
            "papaya" => Box::new(Papaya::new(data)),
            "scc" => Box::new(Scc::new(data)),
            "arc-swap" => Box::new(Swap::new(data)),
            _ => unreachable!("NAMES and build disagree on {name}"),
        };
        out.push(Impl { name, map });
    }
    out
}

pub fn fprobe_index(data: &[(u64, Vec<u64>)]) -> AddrIndex<u64> {
    fprobe_index_with(data, AddrIndex::builder())
}

/// [`fprobe_index`] built with `builder`'s settings.
pub fn fprobe_index_with(
    data: &[(u64, Vec<u64>)],
    builder: fprobe::AddrIndexBuilder<u64>,
) -> AddrIndex<u64> {
    let index = builder.build().expect("valid settings");
    index
        .insert_many(
            data.iter()
                .flat_map(|(a, vs)| vs.iter().map(move |v| (*a, *v))),
        )
        .expect("no address limit configured");
    index
}

struct FprobeBatch(AddrIndex<u64>);

impl LookupImpl for FprobeBatch {
    #[inline(never)]
    fn batch(&self, addrs: &[u64]) -> u64 {
        let guard = rcu::read_lock();
        sum_over(addrs, |&a| sum(self.0.get(a, &guard)))
    }
}

struct FprobePerLookup(AddrIndex<u64>);

impl LookupImpl for FprobePerLookup {
    #[inline(never)]
    fn batch(&self, addrs: &[u64]) -> u64 {
        sum_over(addrs, |&a| self.0.lookup(a, sum).unwrap_or(0))
    }
}

struct Ceiling(hashbrown::HashMap<u64, Vec<u64>>);

impl LookupImpl for Ceiling {
    #[inline(never)]
    fn batch(&self, addrs: &[u64]) -> u64 {
        sum_over(addrs, |a| self.0.get(a).map_or(0, |v| sum(v)))
    }
}

pub struct RwLocked(pub parking_lot::RwLock<hashbrown::HashMap<u64, Vec<u64>>>);

impl RwLocked {
    pub fn new(data: &[(u64, Vec<u64>)]) -> Self {
        RwLocked(parking_lot::RwLock::new(data.iter().cloned().collect()))
    }
}

impl LookupImpl for RwLocked {
    #[inline(never)]
    fn batch(&self, addrs: &[u64]) -> u64 {
        sum_over(addrs, |a| self.0.read().get(a).map_or(0, |v| sum(v)))
    }
}

pub struct Dash(pub dashmap::DashMap<u64, Vec<u64>, DefaultHashBuilder>);

impl Dash {
    pub fn new(data: &[(u64, Vec<u64>)]) -> Self {
        let m = dashmap::DashMap::with_hasher(DefaultHashBuilder::default());
        for (a, v) in data {
            m.insert(*a, v.clone());
        }
        Dash(m)
    }
}

impl LookupImpl for Dash {
    #[inline(never)]
    fn batch(&self, addrs: &[u64]) -> u64 {
        sum_over(addrs, |a| self.0.get(a).map_or(0, |v| sum(v.value())))
    }
}

pub struct Papaya(pub papaya::HashMap<u64, Vec<u64>, DefaultHashBuilder>);

impl Papaya {
    pub fn new(data: &[(u64, Vec<u64>)]) -> Self {
        let m = papaya::HashMap::with_hasher(DefaultHashBuilder::default());
        {
            let pinned = m.pin();
            for (a, v) in data {
                pinned.insert(*a, v.clone());
            }
        }
        Papaya(m)
    }
}

impl LookupImpl for Papaya {
    #[inline(never)]
    fn batch(&self, addrs: &[u64]) -> u64 {
        sum_over(addrs, |a| self.0.pin().get(a).map_or(0, |v| sum(v)))
    }
}

pub struct Scc(pub scc::HashIndex<u64, Vec<u64>, DefaultHashBuilder>);

impl Scc {
    pub fn new(data: &[(u64, Vec<u64>)]) -> Self {
        let m = scc::HashIndex::with_hasher(DefaultHashBuilder::default());
        for (a, v) in data {
            m.insert(*a, v.clone()).expect("distinct addresses");
        }
        Scc(m)
    }
}

impl LookupImpl for Scc {
    #[inline(never)]
    fn batch(&self, addrs: &[u64]) -> u64 {
        sum_over(addrs, |a| self.0.peek_with(a, |_, v| sum(v)).unwrap_or(0))
    }
}

pub struct Swap(pub arc_swap::ArcSwap<hashbrown::HashMap<u64, Vec<u64>>>);

impl Swap {
    pub fn new(data: &[(u64, Vec<u64>)]) -> Self {
        Swap(arc_swap::ArcSwap::new(Arc::new(
            data.iter().cloned().collect(),
        )))
    }
}

impl LookupImpl for Swap {
    #[inline(never)]
    fn batch(&self, addrs: &[u64]) -> u64 {
        sum_over(addrs, |a| self.0.load().get(a).map_or(0, |v| sum(v)))
    }
}

/// The table fprobe used before rhltable (`fprobe_ip_table`): 256 buckets
/// (`FPROBE_IP_HASH_BITS` = 8) of singly linked chains, one node per
/// (address, handler), new nodes at the head, `hash_ptr(ip, 8)`. The entry
/// path walks the whole chain because one address's nodes may be anywhere
/// in it. Chains are immutable once built, so readers take only an RCU
/// read lock, as the kernel does.
struct Fixed256(Chained<u64, FIXED_BITS>);

/// `FPROBE_IP_HASH_BITS`.
const FIXED_BITS: u32 = 8;

impl Fixed256 {
    fn new(data: &[(u64, Vec<u64>)]) -> Self {
        Self(Chained::new(data.iter().flat_map(|(addr, handlers)| {
            handlers.iter().map(move |&handler| (*addr, handler))
        })))
    }
}

impl LookupImpl for Fixed256 {
    #[inline(never)]
    fn batch(&self, addrs: &[u64]) -> u64 {
        let _guard = rcu::read_lock();
        let mut sum = 0;
        for &a in addrs {
            self.0.for_each(a, |&handler| sum += handler);
        }
        sum
    }
}

/// [`Fixed256`] with each bucket's nodes stored contiguously, so the walk
/// streams through memory instead of chasing pointers. Not what the kernel
/// had; here so the fixed-table comparison is not won on layout alone.
struct Fixed256Array {
    buckets: Vec<Vec<(u64, u64)>>,
}

impl Fixed256Array {
    fn new(data: &[(u64, Vec<u64>)]) -> Self {
        let mut buckets: Vec<Vec<(u64, u64)>> = (0..1 << FIXED_BITS).map(|_| Vec::new()).collect();
        for (addr, handlers) in data {
            for &handler in handlers {
                buckets[Chained::<u64, FIXED_BITS>::bucket(*addr)].push((*addr, handler));
            }
        }
        Self { buckets }
    }
}

impl LookupImpl for Fixed256Array {
    #[inline(never)]
    fn batch(&self, addrs: &[u64]) -> u64 {
        let _guard = rcu::read_lock();
        let mut sum = 0;
        for &a in addrs {
            for &(addr, handler) in &self.buckets[Chained::<u64, FIXED_BITS>::bucket(a)] {
                if addr == a {
                    sum += handler;
                }
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    /// Every implementation finds the same handlers: the same sum over a
    /// batch of indexed and unindexed addresses.
    #[test]
    fn every_implementation_sums_alike() {
        let data: Vec<(u64, Vec<u64>)> = (0..2_000u64)
            .map(|i| {
                (
                    0x40_0000 + i * 48,
                    (0..1 + i % 3).map(|k| i * 10 + k).collect(),
                )
            })
            .collect();
        let addrs: Vec<u64> = data
            .iter()
            .map(|(a, _)| *a)
            .chain((0..100).map(|i| 0x40_0000 + i * 48 + 16))
            .collect();
        let expected: u64 = data.iter().flat_map(|(_, v)| v).sum();
        let built = super::build(&data, &|_| true);
        assert_eq!(built.len(), super::NAMES.len());
        for imp in built {
            assert_eq!(imp.map.batch(&addrs), expected, "{}", imp.name);
        }
    }
}
