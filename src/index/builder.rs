//! Configuration of an [`AddrIndex`](super::AddrIndex).

use std::marker::PhantomData;

use super::addr_index::AddrIndex;
use super::raw::resize::capacity_presized;
use super::raw::{Config, RawIndex};
use crate::cache::HitCacheConfig;
use crate::error::Error;

/// Builds an [`AddrIndex`]; every setting has a documented default.
///
/// | setting | default |
/// |---|---|
/// | [`capacity`](Self::capacity) (addresses to presize for) | 0: start at `min_slots` slots |
/// | [`min_slots`](Self::min_slots) (home slots, power of two) | 64 |
/// | [`max_addresses`](Self::max_addresses) | unlimited |
/// | [`auto_shrink`](Self::auto_shrink) (below 12.5% load) | off |
/// | [`hash_seed`](Self::hash_seed) | random per index |
/// | [`stripes`](Self::stripes) (writer locks, power of two) | 4 × CPUs, in 8..=1024 |
/// | [`hit_cache`](Self::hit_cache) | none |
/// | [`huge_pages`](Self::huge_pages) (tables of 8 MiB and more, Linux) | on |
///
/// # Examples
///
/// ```
/// let index = fprobe::AddrIndex::<u64>::builder()
///     .capacity(50_000)
///     .max_addresses(1 << 20)
///     .auto_shrink(true)
///     .build()
///     .unwrap();
/// assert!(index.is_empty());
/// ```
#[must_use]
pub struct AddrIndexBuilder<V> {
    capacity: usize,
    min_capacity: usize,
    max_addresses: Option<usize>,
    auto_shrink: bool,
    seed: Option<u64>,
    stripes: Option<usize>,
    hit_cache: Option<HitCacheConfig>,
    huge_pages: bool,
    _values: PhantomData<fn() -> V>,
}

impl<V> Clone for AddrIndexBuilder<V> {
    fn clone(&self) -> Self {
        Self {
            _values: PhantomData,
            ..*self
        }
    }
}

impl<V> std::fmt::Debug for AddrIndexBuilder<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddrIndexBuilder")
            .field("capacity", &self.capacity)
            .field("min_capacity", &self.min_capacity)
            .field("max_addresses", &self.max_addresses)
            .field("auto_shrink", &self.auto_shrink)
            .field("hash_seed", &self.seed)
            .field("stripes", &self.stripes)
            .field("hit_cache", &self.hit_cache)
            .field("huge_pages", &self.huge_pages)
            .finish()
    }
}

impl<V: Clone + Send + Sync + 'static> Default for AddrIndexBuilder<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Clone + Send + Sync + 'static> AddrIndexBuilder<V> {
    /// The default configuration.
    pub fn new() -> Self {
        Self {
            capacity: 0,
            min_capacity: 64,
            max_addresses: None,
            auto_shrink: false,
            seed: None,
            stripes: None,
            hit_cache: None,
            huge_pages: true,
            _values: PhantomData,
        }
    }

    /// Presize for this many addresses (no resize until they are in). The
    /// table (32 to 64 bytes per address) is made resident by `build`, as
    /// by [`AddrIndex::with_capacity`](crate::AddrIndex::with_capacity).
    pub fn capacity(mut self, addresses: usize) -> Self {
        self.capacity = addresses;
        self
    }

    /// Smallest table, in home slots (see
    /// [`IndexStats::home_slots`](crate::IndexStats::home_slots)): a power of
    /// two, at least 8.
    pub fn min_slots(mut self, slots: usize) -> Self {
        self.min_capacity = slots;
        self
    }

    /// Refuse new addresses beyond this many ([`Error::CapacityExceeded`]).
    pub fn max_addresses(mut self, addresses: usize) -> Self {
        self.max_addresses = Some(addresses);
        self
    }

    /// Shrink the table when fewer than an eighth of its slots hold
    /// addresses (never below `min_capacity`).
    pub fn auto_shrink(mut self, on: bool) -> Self {
        self.auto_shrink = on;
        self
    }

    /// Seed of the hash. The first table uses a seed derived from it, and so
    /// does every rehash (a new one each time); growing and shrinking keep
    /// the table's seed, so that a migration writes the new table in order.
    /// Fixed seeds make layouts reproducible; the default is random, which
    /// is what resists chosen address sets.
    pub fn hash_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Number of writer stripes (locks): a power of two in 1..=65536.
    pub fn stripes(mut self, stripes: usize) -> Self {
        self.stripes = Some(stripes);
        self
    }

    /// Puts a per-thread recent-hit cache in front of the index (see
    /// [`HitCacheConfig`] and the `cache` module docs). Lookups keep using
    /// `get`/`lookup`; every write then invalidates all cached entries.
    pub fn hit_cache(mut self, config: HitCacheConfig) -> Self {
        self.hit_cache = Some(config);
        self
    }

    /// Place tables of 8 MiB and more (524,288 slots: from about 131,000
    /// addresses up) on transparent huge pages, on Linux: each is an
    /// anonymous mapping at a 2 MiB boundary with `madvise(MADV_HUGEPAGE)`
    /// on its whole 2 MiB blocks. Lookups then take fewer TLB misses, and
    /// growth faults a new table in 2 MiB at a time instead of 4 KiB
    /// (BENCHMARKS.md, "Huge pages"). Smaller tables stay on the global
    /// allocator either way: in 4 KiB pages they still fit a core's
    /// second-level TLB, so huge pages have little to save there and still
    /// cost what `huge_pages(false)` below avoids. The
    /// kernel decides whether huge pages are used
    /// (`/sys/kernel/mm/transparent_hugepage/enabled` must not be `never`);
    /// with its `defrag` setting at `madvise` or `always`, a fault may
    /// compact memory first, a latency some deployments avoid: turn this
    /// off there, and every table comes from the global allocator.
    ///
    /// Off is also the better choice for a large index whose table is rebuilt
    /// many times a second. For example, a writer that keeps adding fresh
    /// addresses and removing old ones leaves tombstones, and each rebuild
    /// then maps fresh memory and unmaps the old table (a TLB shootdown on
    /// the process's other CPUs), where the global allocator reuses memory
    /// that is already resident.
    pub fn huge_pages(mut self, on: bool) -> Self {
        self.huge_pages = on;
        self
    }

    /// Builds the index.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `min_capacity` is not a power of two
    /// ≥ 8, `stripes` not a power of two in 1..=65536, `max_addresses` is 0,
    /// or `capacity` exceeds `max_addresses`.
    pub fn build(self) -> Result<AddrIndex<V>, Error> {
        if !self.min_capacity.is_power_of_two() || self.min_capacity < 8 {
            return Err(Error::InvalidConfig(
                "min_capacity must be a power of two >= 8",
            ));
        }
        if self.min_capacity > 1 << 40 {
            return Err(Error::InvalidConfig("min_capacity is absurdly large"));
        }
        if let Some(s) = self.stripes {
            if !s.is_power_of_two() || s > 1 << 16 {
                return Err(Error::InvalidConfig(
                    "stripes must be a power of two in 1..=65536",
                ));
            }
        }
        if let Some(max) = self.max_addresses {
            if max == 0 {
                return Err(Error::InvalidConfig("max_addresses must be at least 1"));
            }
            if self.capacity > max {
                return Err(Error::InvalidConfig("capacity exceeds max_addresses"));
            }
        }
        if let Some(c) = &self.hit_cache {
            c.validate().map_err(Error::InvalidConfig)?;
        }
        if self.capacity > 1 << 40 {
            return Err(Error::InvalidConfig("capacity is absurdly large"));
        }
        let stripes = self.stripes.unwrap_or_else(|| {
            let cpus = std::thread::available_parallelism().map_or(4, |n| n.get());
            (cpus * 4).next_power_of_two().clamp(8, 1024)
        });
        let seed = self.seed.unwrap_or_else(random_seed);
        Ok(AddrIndex::from_raw(
            RawIndex::new(Config {
                initial_capacity: capacity_presized(self.capacity, self.min_capacity),
                min_capacity: self.min_capacity,
                max_addresses: self.max_addresses,
                auto_shrink: self.auto_shrink,
                seed,
                stripes,
                count_writes: self.hit_cache.is_some(),
                huge_pages: self.huge_pages,
            }),
            self.hit_cache,
        ))
    }
}

impl<V: Clone + Send + Sync + 'static> AddrIndex<V> {
    /// A builder with the default configuration.
    pub fn builder() -> AddrIndexBuilder<V> {
        AddrIndexBuilder::new()
    }
}

/// A random seed from std's per-process random keys (no extra dependency).
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_usize(&h as *const _ as usize);
    h.finish()
}
