//! The error of the index and the probe layer, and the wrappers that hand
//! values back.
//!
//! The object pool has its own, [`ObjPoolError`](crate::objpool::ObjPoolError):
//! a pool (and the return-instance pool built on it) is a component of its
//! own that users take without an index or a registry, and it fails only
//! when built, for reasons none of the operations here can have. Folding
//! it in would give every `match` on [`Error`] three variants it can never
//! see.

use std::fmt;

/// What went wrong. Every fallible operation leaves the structure it was
/// called on unchanged (or, for bulk operations, exactly as before the call)
/// and hands back any value it was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// No entry with this id at this address (never inserted, already
    /// removed, or an id from another address or index).
    NotFound,
    /// Inserting would exceed the configured maximum number of addresses.
    CapacityExceeded {
        /// The configured maximum (`AddrIndexBuilder::max_addresses`).
        max_addresses: usize,
    },
    /// Registering would exceed the registry's maximum number of probes.
    TooManyProbes {
        /// The configured maximum (`RegistryBuilder::max_probes`).
        max_probes: usize,
    },
    /// A builder setting is out of range; the message says which.
    InvalidConfig(&'static str),
    /// An argument that would make the call do nothing useful (a probe
    /// with no handler, an empty address list); the message says which.
    InvalidArgument(&'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotFound => f.write_str("no such entry at this address"),
            Error::CapacityExceeded { max_addresses } => {
                write!(f, "index is full: at most {max_addresses} addresses")
            }
            Error::TooManyProbes { max_probes } => {
                write!(f, "registry is full: at most {max_probes} probes")
            }
            Error::InvalidConfig(why) => write!(f, "invalid configuration: {why}"),
            Error::InvalidArgument(why) => write!(f, "invalid argument: {why}"),
        }
    }
}

impl std::error::Error for Error {}

/// A failed insert: the error and the value, handed back untouched.
#[derive(Debug, PartialEq, Eq)]
pub struct InsertError<V> {
    /// Why the insert failed.
    pub error: Error,
    /// The value that was not inserted.
    pub value: V,
}

impl<V> InsertError<V> {
    /// The value that was not inserted.
    pub fn into_value(self) -> V {
        self.value
    }
}

impl<V> fmt::Display for InsertError<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<V: fmt::Debug> std::error::Error for InsertError<V> {}

/// A failed bulk insert: nothing stayed inserted, and every value comes
/// back, in input order.
#[derive(Debug, PartialEq, Eq)]
pub struct InsertManyError<V> {
    /// Why the insert failed.
    pub error: Error,
    /// Every `(address, value)` pair of the call, in input order.
    pub values: Vec<(u64, V)>,
}

impl<V> fmt::Display for InsertManyError<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bulk insert of {} values failed: {}",
            self.values.len(),
            self.error
        )
    }
}

impl<V: fmt::Debug> std::error::Error for InsertManyError<V> {}
