//! # fprobe
//!
//! The userspace counterpart of the Linux kernel's fprobe machinery: answer
//! *which probe handlers are attached to this function address?* millions of
//! times a second on every core.
//!
//! * [`rcu`] — read-side critical sections that cost about a nanosecond,
//!   grace periods, deferred reclamation.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub(crate) mod sync;

pub mod objpool;
pub mod rcu;
pub mod retinst;

pub use objpool::ObjPool;
