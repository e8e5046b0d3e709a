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
mod sys;

pub use cache::{HitCache, HitCacheConfig, HitCacheMode, HitCacheStats};
pub use error::{Error, InsertError, InsertManyError};
pub use index::{AddrIndex, AddrIndexBuilder, EntryId, IndexStats};
pub use objpool::ObjPool;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
