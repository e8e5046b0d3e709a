//! Userspace RCU: read-side critical sections with no atomic
//! read-modify-write and no fence, grace periods, and deferred reclamation.
//!
//! The flavour is liburcu's "memb": readers touch only a thread-local word
//! and run no fence, and writers pay with a process-wide barrier
//! (`membarrier(2)` on Linux; see "Writer-side barrier" below for every
//! platform). It is hand-written rather than taken from crossbeam-epoch,
//! seize or arc-swap because their read guards cost an atomic
//! read-modify-write or a `SeqCst` fence per pin (compared with this read
//! side in `BENCHMARKS.md`, section "RCU read side"), and this is the hot
//! path of every probe hit.
//!
//! # Usage
//!
//! ```
//! use fprobe::rcu::{self, RcuPtr};
//!
//! let table = RcuPtr::new(vec![1, 2, 3]);
//!
//! // Readers: no lock, no atomic read-modify-write, no fence.
//! let sum: i32 = {
//!     let guard = rcu::read_lock();
//!     table.load(&guard).map_or(0, |v| v.iter().sum())
//! };
//! assert_eq!(sum, 6);
//!
//! // Writers: publish a new version; the old one is dropped after every
//! // reader that might still see it has left its critical section.
//! table.replace(vec![4, 5]);
//! rcu::synchronize(); // wait for a grace period explicitly…
//! rcu::barrier(); // …or for every retired object to have been dropped.
//! ```
//!
//! # Consistency
//!
//! * [`synchronize`] returns only after every read-side critical section
//!   that was running when it was called has ended.
//! * Everything a writer stored before calling [`synchronize`] (or
//!   [`retire`], [`RcuPtr::replace`]) is visible to every critical section
//!   that begins after `synchronize` returns.
//! * An object passed to [`retire`] is dropped after a grace period that
//!   began after the `retire` call; [`barrier`] returns once every object
//!   retired before it was called has been dropped.
//!
//! # Execution context
//!
//! | operation | blocks? | allocates? | async-signal-safe? |
//! |---|---|---|---|
//! | [`read_lock`] / guard drop | never (wait-free) | first call on a thread only | yes, once the thread is registered ([`register_thread`]) |
//! | [`RcuPtr::load`] | never | no | yes |
//! | [`register_thread`] | never (lock-free) | yes, the first time | no |
//! | [`synchronize`] | yes: until pre-existing readers leave | no | no |
//! | [`retire`], [`call_rcu`] | only under back-pressure (more than 65,536 objects pending) | yes | no |
//! | [`barrier`] | yes | no | no |
//!
//! A read-side critical section may nest, including from a signal handler
//! that interrupted another section on the same thread: every update of the
//! thread's word is one load and one store, and a handler leaves the word as
//! it found it. [`synchronize`] and [`barrier`] panic when called inside a
//! read-side section of the calling thread (they would wait for themselves).
//!
//! Threads register lazily on their first [`read_lock`] and give their
//! record back when they exit; an exited thread never delays a grace period.
//! A thread that exits while still holding a guard (one leaked with
//! `mem::forget`) keeps its record active forever: grace periods then never
//! end, which is the only sound choice (the leaked guard's references may
//! still be in use elsewhere).
//!
//! # Writer-side barrier
//!
//! A reader orders its record store before the section's loads with a
//! compiler fence only; the full fence that store-buffering needs on the
//! reader's side is run for it by the writer, on every CPU that runs a
//! thread of the process (`raw`, "The protocol"). Each platform gets the
//! best such barrier it has (`sys::barrier`):
//!
//! | platform | writer side | reader side |
//! |---|---|---|
//! | Linux ≥ 4.14 | `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` | compiler fence |
//! | Windows | `FlushProcessWriteBuffers` | compiler fence |
//! | macOS, FreeBSD, Linux without `membarrier`, `FPROBE_RCU_NO_MEMBARRIER` set | `SeqCst` fence | `SeqCst` fence |
//!
//! * `membarrier(2)` interrupts (IPI) every CPU currently running a thread
//!   of the process and has it execute a full memory barrier before the
//!   call returns; a thread not running then passes a barrier at its next
//!   context switch, before it runs again. Every reader has therefore had a
//!   full fence between its record store and its later loads, or before
//!   its record store, by the time the writer scans: as if it had run the
//!   fence itself.
//! * `FlushProcessWriteBuffers` gives the same guarantee: it flushes the
//!   write buffers of every processor running a thread of the process, by
//!   IPI, and returns once each has done so (a full barrier on each; a
//!   thread not running passes one at its context switch).
//! * Where the system has neither (macOS, FreeBSD), readers pay one
//!   `SeqCst` fence per outermost section and the writer runs one where it
//!   would have called the barrier: with a full fence on both sides of the
//!   store-buffering pattern, either the writer's scan sees the reader's
//!   record store or the reader's loads see the writer's earlier stores,
//!   which is all a grace period needs. The mode is carried in the word
//!   readers load anyway, so the fence costs only itself.
//!
//! # Fork
//!
//! (Unix; Windows has no `fork`.) In the child of `fork`, only the forking
//! thread exists. A `pthread_atfork`
//! child handler marks every other thread's record quiescent, releases the
//! grace-period lock if a parent thread held it, and starts the deferred
//! reclamation afresh (objects the parent had queued are leaked in the
//! child, never dropped twice). The child may keep using RCU. As with any
//! multi-threaded fork, a child that forked while another parent thread was
//! inside `retire` must `exec` rather than retire more objects.
//!
//! # Performance
//!
//! `read_lock` + drop is one thread-local load, two loads and one store to
//! the thread's own line and a compiler fence; `BENCHMARKS.md`, "RCU read
//! side", compares it with crossbeam-epoch, seize and arc-swap in the same
//! run.

mod domain;
mod ptr;
pub(crate) mod raw;
#[cfg(not(loom))]
mod reclaim;
mod retire;

pub use domain::{ReadGuard, in_read_section, read_lock, register_thread, synchronize};
pub(crate) use domain::{
    asymmetric_fences, begin_dispatch, begin_exit_dispatch, heavy_barrier, synchronize_unchecked,
    thread_record,
};
pub use ptr::RcuPtr;
pub use retire::RcuStats;
#[cfg(not(loom))]
pub use retire::{barrier, call_rcu, retire, set_reclaimer_follows_retirer, stats};
pub(crate) use retire::{retire_box_raw, retire_raw};
