//! The codes of the C ABI: the status every function returns
//! ([`FPROBE_OK`] or a negative `FPROBE_E_*` code), the helpers that make
//! it ([`ffi`], [`code`], and [`cannot_wait`], the test behind
//! [`FPROBE_E_BUSY`]), and the entry handlers' [`FPROBE_SKIP_EXIT`].

use std::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};

use fprobe::Error;
use fprobe::probe::C_SKIP_EXIT;
use fprobe::rcu;

/// Success.
pub const FPROBE_OK: c_int = 0;
/// A required pointer argument was null.
pub const FPROBE_E_NULL: c_int = -1;
/// The probe handle names no registered probe of this registry (never
/// returned by it, already unregistered, or from another registry).
pub const FPROBE_E_NOT_FOUND: c_int = -2;
/// No room: `max_probes` probes are registered already, or the address
/// index is full.
pub const FPROBE_E_CAPACITY: c_int = -3;
/// An argument or configuration value is out of range (the probe has no
/// handler, its `data_size` exceeds the registry's, `max_probes` is not in
/// 1..=65536, ...).
pub const FPROBE_E_INVALID: c_int = -4;
/// The registry was destroyed.
pub const FPROBE_E_DESTROYED: c_int = -5;
/// The call would wait for itself: `fprobe_unregister` or
/// `fprobe_registry_destroy` from inside a handler, or the
/// `-finstrument-functions` runtime is attached already.
pub const FPROBE_E_BUSY: c_int = -6;
/// An internal error was caught at the ABI boundary (a bug: please report).
pub const FPROBE_E_INTERNAL: c_int = -7;
/// The patching runtime refused a function: not a patchable function of a
/// loaded object, not the `-fpatchable-function-entry=7,5` layout, or its
/// bytes are not the expected nops.
pub const FPROBE_E_NOT_PATCHABLE: c_int = -8;
/// A system call of the patching runtime failed (`mprotect`, `mmap`), or
/// no stub page could be placed near the function's object.
pub const FPROBE_E_OS: c_int = -9;

/// Returned by an entry handler: do not call the exit handler for this
/// call. Any other value (0 by convention) means "call it".
pub const FPROBE_SKIP_EXIT: c_int = 1;

// The skip code of C entry handlers is the probe layer's.
const _: () = assert!(FPROBE_SKIP_EXIT == C_SKIP_EXIT);

/// Whether the calling thread is inside an RCU read-side section or a
/// probe handler (exit handlers run outside any section), where a call
/// that waits for dispatches would wait for itself: such calls return
/// [`FPROBE_E_BUSY`].
pub(crate) fn cannot_wait() -> bool {
    rcu::in_read_section() || fprobe::probe::in_handler()
}

pub(crate) fn code(e: Error) -> c_int {
    match e {
        Error::NotFound => FPROBE_E_NOT_FOUND,
        Error::CapacityExceeded { .. } | Error::TooManyProbes { .. } => FPROBE_E_CAPACITY,
        Error::InvalidConfig(_) | Error::InvalidArgument(_) => FPROBE_E_INVALID,
        _ => FPROBE_E_INTERNAL,
    }
}

/// Runs `f` with panics caught (unwinding into C is undefined behaviour).
pub(crate) fn ffi(f: impl FnOnce() -> Result<(), c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => FPROBE_OK,
        Ok(Err(c)) => c,
        Err(_) => FPROBE_E_INTERNAL,
    }
}
