//! Why an attach, a detach or a site scan failed. Every failure leaves the
//! process as it was: no site patched, no probe registered.

use std::fmt;

/// A failed [`attach`](crate::attach), [`detach`](crate::detach) or
/// [`sites`](crate::sites).
#[derive(Debug)]
pub enum Error {
    /// The address is not a patchable function of any loaded object.
    NotASite(u64),
    /// The function's patchable nops are not the `7,5` layout the runtime
    /// patches (`-fpatchable-function-entry=7,5`).
    UnsupportedLayout {
        /// The function.
        function: u64,
        /// What the object has there.
        layout: crate::layout::Layout,
    },
    /// The bytes at the site are not the nops (or this runtime's jumps)
    /// expected: patched by someone else, or not code.
    UnexpectedBytes {
        /// The function.
        function: u64,
        /// The seven bytes from five before the function.
        found: [u8; 7],
    },
    /// The function's two entry bytes cross an 8-byte boundary, so they
    /// cannot be rewritten in one atomic store.
    Straddles(u64),
    /// No page for the module's stubs could be mapped within reach (±2 GiB)
    /// of its code.
    OutOfReach {
        /// The module's path.
        module: String,
    },
    /// The registry refused the probe (full, or the probe is invalid).
    Registry(fprobe::Error),
    /// A system call failed.
    Os {
        /// Which call.
        call: &'static str,
        /// Its error.
        error: std::io::Error,
    },
    /// An object file could not be read or parsed.
    Object {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
}

impl Error {
    pub(crate) fn os(call: &'static str) -> Self {
        Error::Os {
            call,
            error: std::io::Error::last_os_error(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotASite(a) => write!(f, "{a:#x} is not a patchable function"),
            Error::UnsupportedLayout { function, layout } => write!(
                f,
                "{function:#x}: patchable entry {layout:?}, not the 5 + 2 nops of \
                 -fpatchable-function-entry=7,5"
            ),
            Error::UnexpectedBytes { function, found } => {
                write!(
                    f,
                    "{function:#x}: unexpected bytes {found:02x?} at the site"
                )
            }
            Error::Straddles(a) => {
                write!(f, "{a:#x}: entry bytes cross an 8-byte boundary")
            }
            Error::OutOfReach { module } => {
                write!(f, "{module}: no stub page within 2 GiB of its code")
            }
            Error::Registry(e) => write!(f, "registry: {e}"),
            Error::Os { call, error } => write!(f, "{call}: {error}"),
            Error::Object { path, why } => write!(f, "{path}: {why}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Registry(e) => Some(e),
            Error::Os { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl From<fprobe::Error> for Error {
    fn from(e: fprobe::Error) -> Self {
        Error::Registry(e)
    }
}
