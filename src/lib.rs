//! # fprobe
//!
//! The userspace counterpart of the Linux kernel's fprobe machinery: answer
//! *which probe handlers are attached to this function address?* millions of
//! times a second on every core.
//!
//! * [`rcu`] — read-side critical sections of one load and one store (no
//!   atomic read-modify-write, no fence), grace periods, deferred
//!   reclamation.
//! * [`AddrIndex`] ([`index`]) — the address index: a multi-value concurrent
//!   hash table with lock-free, store-free lookups and online resize.
//! * [`cache`] — an opt-in per-thread or per-CPU recent-hit cache that
//!   composes in front of an index ([`AddrIndexBuilder::hit_cache`]) or of
//!   any other lookup ([`HitCache`]).
//! * [`ObjPool`] ([`objpool`]) — a fixed-capacity object pool with per-thread
//!   magazines in front of a lock-free depot, and [`retinst`] — per-thread return-instance stacks that reuse
//!   finished instances without atomics.
//! * [`probe`] — the kernel's fprobe: entry/exit probes on many addresses at
//!   once, dispatch, misses by cause, safe unregister.
//!
//!
//! # Quick start
//!
//! An engine attaches probes to function addresses and calls the registry
//! from its hooks on every function entry and return:
//!
//! ```
//! use fprobe::probe::{EntryAction, Fprobe, Registry};
//!
//! // The engine's context type is `()` here; handlers see it as `ctx`.
//! let registry = Registry::<()>::builder().build()?;
//! let probe = Fprobe::builder()
//!     .data_size(8) // per-call data from the entry handler to the exit's
//!     .entry(|e| {
//!         e.data.copy_from_slice(&e.addr.to_ne_bytes());
//!         EntryAction::Continue
//!     })
//!     .exit(|x| println!("{:#x} returned to {:#x}", x.addr, x.ret_addr))
//!     .build();
//! let handle = registry.register(probe, &[0x401000, 0x401200])?;
//!
//! // The engine's hooks: function 0x401000 entered from 0x400800, and
//! // returning there.
//! registry.on_entry(0x401000, 0x400800, &());
//! registry.on_exit(0x400800, &());
//! assert_eq!(registry.stats(handle)?.exits, 1);
//! registry.unregister(handle)?;
//! # Ok::<(), fprobe::Error>(())
//! ```
//!
//! No engine of your own? `fprobe-patch` (the `patch/` crate of this
//! repository) attaches to functions compiled with
//! `-fpatchable-function-entry=7,5` at run time, and the C ABI
//! (`fprobe-capi`, `capi/`: `fprobe.h`, a shared and a static library)
//! serves C and C++ engines, with a `-finstrument-functions` runtime.
//!
//! Measurements: `BENCHMARKS.md`. Design invariants and memory-ordering
//! arguments are in each module's documentation.
//!
//! # Glossary
//!
//! One name per concept, across the crate:
//!
//! | name | what it is | where |
//! |---|---|---|
//! | read-side section, guard | the span in which a thread may read RCU-protected memory; a [`rcu::ReadGuard`] holds one | [`rcu`] |
//! | grace period | the wait, in `synchronize`, until every section that began before it has ended | [`rcu`] |
//! | RCU epoch | the domain's counter that readers copy into their record at a section's start, and a grace period advances | `rcu/raw.rs` |
//! | nesting word | a thread's RCU record word: the epoch its outermost section began in, its sections' nesting count and the dispatch bit | `rcu/raw.rs` |
//! | dispatch section | the section of an outermost probe dispatch, marked by the dispatch bit; also recursion level 0 | [`probe::DispatchSection`] |
//! | context | a thread's one thread-local block of the hot path: its RCU record, its cached registry and hit-cache states, the recursion levels | `context.rs` |
//! | thread serial | a number unique to a thread's lifetime, never reused, that owns its per-thread values | `per_thread.rs` |
//! | write sequence | a table's count of writes, advanced after each publish or unlink; a hit-cache entry keeps the number it was filled at | [`cache`], `index/raw` |
//! | table count | how many tables an index has made; it seeds each new table's hash | `index/raw` |
//! | attachment | one index value of a registry: a probe at one address, by slot, slot generation and cookie | `probe/registry.rs` |
//! | slot generation | the number of a probe slot's registrations; a frame or attachment that names an older one names an unregistered probe | `probe/registry.rs` |
//! | pairing epoch | a registry's count of pairing resets ([`probe::Registry::reset_pairing`]); a thread's stack of an older one is emptied at its next dispatch | `probe/shadow.rs` |
//! | frame, return entry, bare call | what an entry keeps on the thread's shadow stack for its exit: one return entry per probe with an exit handler; a call that keeps none counts in the bare word | `probe/shadow.rs` |
//! | return instance | a standalone, pooled record of one pending return, for engines that keep their own return stacks | [`retinst`] |
//! | magazine, depot | a thread's private stack of free objects, and the shared lock-free stack behind all of them | [`objpool`] |
//! | trial, trial number | a hit cache's timed comparison of lookups with and without it, and the count of trials started, which tells a stale decision | `cache/rearm.rs` |
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub(crate) mod sync;

pub mod cache;
mod context;
mod error;
pub mod index;
pub mod objpool;
mod per_thread;
pub mod probe;
pub mod rcu;
pub mod retinst;
mod setters;
mod sys;

pub use cache::{HitCache, HitCacheConfig, HitCacheMode, HitCacheStats};
pub use error::{Error, InsertError, InsertManyError};
pub use index::{AddrIndex, AddrIndexBuilder, EntryId, IndexStats};
pub use objpool::ObjPool;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
