//! [`AddrIndex`]: a concurrent multi-map from addresses to values, with
//! lookups that take no lock and write no shared memory.
//!
//! The userspace counterpart of the kernel's `rhltable` as fprobe uses it
//! (`fprobe_ip_table`): many values per address, tens of thousands to
//! millions of addresses, online resize that never stops readers.
//!
//! # Design
//!
//! One **record per address** holds all of its values contiguously, and an
//! open-addressing table of `{address, record pointer}` slots, four per
//! cache line, finds it: a cold lookup costs two dependent cache misses (the
//! slot's line and the record), where rhltable pays one per chained
//! duplicate. The hash is a seeded folded multiply and one more multiply (a
//! fresh seed and multiplier per rehash; one fold alone clustered strided
//! address sets for some seeds), and
//! a lookup reads the first two slots of its probe sequence together (an
//! extra slot after the last home keeps them adjacent), keys and record
//! pointers, picking the match with conditional moves, so a key's distance
//! from its home slot (0 or 1 for nearly all keys) does not cost a
//! misprediction; a deterministic per-lookup count against hashbrown is
//! `scripts/cachegrind-lookup.sh`. Records are immutable; writers
//! copy-on-write them (which is
//! why `V: Clone`: the values that stay are cloned into the new record, the
//! old record is dropped after an RCU grace period). Writes are rare and
//! reads are everything.
//!
//! One value attached to many addresses at once
//! ([`AddrIndex::insert_shared`], the kernel's one fprobe on thousands of
//! functions) is one record for all of them: every address of the set
//! points at it, so it stays in cache and a lookup spread over the set
//! costs one miss (the slot's line), not two, and the set costs one
//! record of memory rather than one per address. Addresses that held the
//! same record before a shared insert or removal hold one record after
//! it; a write to one address alone copies its record out of the set.
//!
//! Writers serialise per *stripe* (a mutex per key-hash stripe, each on its
//! own cache lines, at least four stripes per CPU), and keep the index's
//! counts per stripe, so registrations from several threads proceed in
//! parallel without sharing a counter. A resize attaches a new table
//! (the same seed, or a fresh one when a probe sequence ran too long)
//! behind the old one and migrates slots a chunk at a time from
//! later writes; readers follow the chain. The algorithm and its invariants
//! are documented in the (private) `raw` module.
//!
//! Tables of 8 MiB and more (524,288 slots: from about 131,000 addresses
//! up) are mapped on their own, at a 2 MiB boundary, and advised onto
//! transparent huge pages on Linux: a lookup into a table of a million
//! addresses then needs one TLB entry per 2 MiB instead of per 4 KiB. See
//! [`AddrIndexBuilder::huge_pages`] for the trade-offs and the way out.
//!
//! Hand-written rather than built on papaya, scc, dashmap or arc-swap: their
//! read sides cost an atomic read-modify-write or a `SeqCst` fence per
//! lookup, a lock, or a full-table copy per write (`BENCHMARKS.md` has the
//! figures, measured side by side).
//!
//! # Consistency
//!
//! * A lookup returns every value inserted before it began and not removed
//!   before it began ("before" = happens-before: the insert returned, and
//!   the reader learned of it through some synchronisation). Values
//!   inserted or removed concurrently may or may not appear.
//! * The values returned for one address are a snapshot: they were all
//!   present together at one instant, in insertion order.
//! * Once [`AddrIndex::remove`] returns, no lookup that begins afterwards
//!   returns the removed value; the value is dropped after every lookup that
//!   might still hold it has ended.
//! * A reader never blocks, never spins on a writer, and never sees a torn
//!   or half-initialised entry, including during a resize.
//!
//! # What a lookup costs
//!
//! A key in its home pair of slots (nearly all keys at the loads the table
//! runs at: it grows at 50%) is found with one well-predicted branch. A key
//! past it costs a mispredicted branch and a walk along its probe sequence
//! (`BENCHMARKS.md`, section "Single-thread latency", measures how much).
//! Which keys those are depends on the hash seed, random per index by
//! default, so a workload that sends most lookups to a few addresses pays
//! more of that cost in one index than in another.
//! [`AddrIndexBuilder::hash_seed`] fixes the layout where timings must be
//! reproducible.
//!
//! # What writes cost readers
//!
//! Writers never block readers, but every write stores to lines that
//! readers may read (a slot's line, and for a changed address its new
//! record), and a reader that next touches such a line fetches it from the
//! writer's core. The loss is a cost per write times the write rate; the
//! cost per write depends mostly on how far apart the two cores are, and is
//! larger for a write that replaces the record of an address taking many of
//! the lookups than for a write to other addresses. `BENCHMARKS.md`
//! (`--bench churn-rates`, in the churn section) measures both kinds at
//! several write rates, beside the concurrent maps a user could pick
//! instead.
//!
//! # Execution context
//!
//! | operation | blocks? | allocates? | async-signal-safe? |
//! |---|---|---|---|
//! | [`get`](AddrIndex::get), [`get_with_ids`](AddrIndex::get_with_ids), [`lookup`](AddrIndex::lookup), [`contains`](AddrIndex::contains) | never: lock-free, no stores | no (after the thread's first RCU use) | yes, with an already registered thread |
//! | [`insert`](AddrIndex::insert), [`remove`](AddrIndex::remove), [`remove_addr`](AddrIndex::remove_addr) | on the key's stripe lock, briefly; rarely a resize step | yes | no |
//! | [`insert_many`](AddrIndex::insert_many) | as `insert`; may presize the table (O(table)); a batch that fails midway waits one grace period, except inside a read-side section | yes | no |
//! | [`take`](AddrIndex::take) | yes, one RCU grace period | yes | no |
//! | [`clear`](AddrIndex::clear) | on every lock, briefly | yes | no |
//! | [`len`](AddrIndex::len), [`len_addrs`](AddrIndex::len_addrs) | never | no | yes |
//! | [`stats`](AddrIndex::stats) | never | no | no (scans the table) |
//!
//! Writers must not be called from inside an RCU read-side section only for
//! [`take`](AddrIndex::take) (it waits for a grace period, and panics there);
//! the others may.

mod addr_index;
mod builder;
pub(crate) mod raw;

pub use addr_index::{AddrIndex, EntryId, IndexStats, Iter};
pub use builder::AddrIndexBuilder;
