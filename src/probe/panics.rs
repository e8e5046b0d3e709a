//! Handler panics reported once per probe, not once per call.
//!
//! A handler that panics is caught at the dispatch boundary and counted
//! ([`ProbeStats::panics`](super::ProbeStats::panics)). Without more, the
//! process's panic hook would print the message (and, with
//! `RUST_BACKTRACE` set, a backtrace) on every call, which for a handler
//! that fails on every call of a hot function buries everything else. So
//! the first registry built installs a panic hook, chained to the one in
//! place, that keeps the message of a panic raised during a dispatch
//! (`in_handler`) off the output and leaves it for the dispatch that
//! catches it. That dispatch keeps the message of the probe's first panic
//! in the probe ([`Registry::first_panic`](super::Registry::first_panic))
//! and prints it once, then counts the rest silently. Panics anywhere
//! else go to the previous hook as before.
//!
//! A hook installed after the first registry replaces this one (Rust has
//! one hook per process): handler panics are then printed by that hook,
//! and still counted, kept and contained.

use std::cell::RefCell;
use std::sync::Once;

use super::recursion;
use crate::sync::Ordering;
use crate::sync::unmodelled::AtomicPtr;

std::thread_local! {
    /// The message of the last panic raised during a dispatch on this
    /// thread, for the dispatch that catches it.
    static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Drops the payload of a handler's panic without letting a second panic
/// out of the dispatch: a payload whose `Drop` panics (`panic_any` of such
/// a value) would otherwise unwind through the dispatch that caught the
/// first. The payload of each such panic is dropped the same way in turn,
/// until one drops cleanly (a `panic!` message's always does).
#[cold]
#[inline(never)]
pub(super) fn discard(payload: Box<dyn std::any::Any + Send>) {
    let mut payload = payload;
    while let Err(again) =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload)))
    {
        payload = again;
    }
}

/// Installs the hook (once per process).
pub(super) fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !recursion::in_handler() {
                return previous(info);
            }
            let payload = info.payload();
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(a panic payload that is not a string)".to_string());
            let message = match info.location() {
                Some(l) => format!("{what} (at {}:{})", l.file(), l.line()),
                None => what,
            };
            // `try_with`: a panic in a thread-local destructor finds it gone.
            let _ = CAUGHT.try_with(|c| *c.borrow_mut() = Some(message));
        }));
    });
}

/// The first panic of one probe: a message, set once.
pub(super) struct FirstPanic(AtomicPtr<String>);

impl FirstPanic {
    pub(super) fn new() -> Self {
        Self(AtomicPtr::new(std::ptr::null_mut()))
    }

    /// Keeps the message of the panic just caught on this thread if it is
    /// the probe's first, and prints it once (`probe`: how the report
    /// names the probe). Cold: a handler panicked.
    #[cold]
    #[inline(never)]
    pub(super) fn caught(&self, probe: &str) {
        let Some(message) = CAUGHT.try_with(|c| c.borrow_mut().take()).ok().flatten() else {
            return;
        };
        // Relaxed: a hint; the compare-exchange decides.
        if !self.0.load(Ordering::Relaxed).is_null() {
            return;
        }
        let boxed = Box::into_raw(Box::new(message));
        // AcqRel: Release publishes the message to `get` (Acquire);
        // Acquire on failure is not needed, the other message is kept.
        match self.0.compare_exchange(
            std::ptr::null_mut(),
            boxed,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => {
                // SAFETY: published above and freed only with `self`.
                let m = unsafe { &*boxed };
                eprintln!(
                    "fprobe: a handler of {probe} panicked: {m}; counted in \
                     ProbeStats::panics, later panics of this probe are not printed"
                );
            }
            // SAFETY: ours, never published.
            Err(_) => drop(unsafe { Box::from_raw(boxed) }),
        }
    }

    /// The kept message, if the probe's handlers ever panicked.
    pub(super) fn get(&self) -> Option<String> {
        // Acquire: pairs with the Release of `caught`; the string is whole.
        let p = self.0.load(Ordering::Acquire);
        // SAFETY: a message published by `caught`, freed only with `self`.
        (!p.is_null()).then(|| unsafe { (*p).clone() })
    }
}

impl Drop for FirstPanic {
    fn drop(&mut self) {
        let p = *self.0.get_mut();
        if !p.is_null() {
            // SAFETY: from `Box::into_raw` in `caught`, freed once.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}
