//! # fprobe
//!
//! The userspace counterpart of the Linux kernel's fprobe machinery: answer
//! *which probe handlers are attached to this function address?* millions of
//! times a second on every core.
//!
//! * [`rcu`] — read-side critical sections that cost about a nanosecond,
//!   grace periods, deferred reclamation.
//! * [`AddrIndex`] ([`index`]) — the address index: a multi-value concurrent
//!   hash table with lock-free, store-free lookups and online resize.
//! * [`cache`] — an opt-in per-thread recent-hit cache, built into the index or
//!   standing in front of any other lookup ([`HitCache`]).
//! * [`ObjPool`] ([`objpool`]) — a fixed-capacity object pool with per-thread
//!   magazines in front of a lock-free depot, and [`retinst`] — per-thread return-instance stacks that reuse
//!   finished instances without atomics.
//! * [`probe`] — the kernel's fprobe: entry/exit probes on many addresses at
//!   once, dispatch, misses by cause, safe unregister.
//!
//! Measurements: `BENCHMARKS.md`. Design invariants and memory-ordering
//! arguments are in each module's documentation.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub(crate) mod sync;

pub mod cache;
mod context;
mod cpu;
mod error;
pub mod index;
pub mod objpool;
mod per_thread;
pub mod probe;
pub mod rcu;
pub mod retinst;

pub use cache::{HitCache, HitCacheConfig, HitCacheMode, HitCacheStats};
pub use error::{Error, InsertError, InsertManyError};
pub use index::{AddrIndex, AddrIndexBuilder, EntryId, IndexStats};
pub use objpool::ObjPool;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
