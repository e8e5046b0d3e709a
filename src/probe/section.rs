//! The dispatch section an engine's hook opens itself.

use crate::rcu;

/// An outermost dispatch section opened by an engine's hook, for the
/// registry's `*_held` dispatches ([`Registry::on_entry_held`](super::Registry::on_entry_held),
/// [`Registry::on_exit_held`](super::Registry::on_exit_held)): the read-side section and the mark of a
/// running dispatch that `on_entry` would otherwise take itself. A hook
/// that must load its registry under a read-side section (one published
/// through RCU, as the C ABI's runtimes do) loads it inside this one and
/// dispatches in it, instead of nesting the dispatch's section in a
/// guard of its own. While it lives it is a read-side section like
/// [`rcu::read_lock`]'s: `synchronize` waits for it. Hold it only around
/// the hook's own dispatches, which borrow it mutably, one at a time;
/// `!Send`.
#[must_use = "the section ends when it drops"]
pub struct DispatchSection {
    rec: &'static crate::rcu::raw::ReaderRecord,
    _not_send: std::marker::PhantomData<*mut ()>,
}

impl DispatchSection {
    /// Opens the section for an entry; `None` when a dispatch already
    /// runs on the thread (the hook was called from a handler or a signal
    /// handler: dispatch with the plain methods, which nest) or while the
    /// thread's thread-locals are being destroyed.
    #[inline]
    pub fn enter() -> Option<Self> {
        let rec = rcu::thread_record()?;
        // `then`, not `then_some`: a section made eagerly would be dropped
        // (ending a dispatch this call did not begin) on `false`.
        rcu::begin_dispatch(rec).then(|| Self {
            rec,
            _not_send: std::marker::PhantomData,
        })
    }

    /// As [`enter`](Self::enter), for an exit: keeps the epoch of the
    /// thread's last section (its entry's) rather than loading it.
    #[inline]
    pub fn enter_for_exit() -> Option<Self> {
        let rec = rcu::thread_record()?;
        // As in `enter`.
        rcu::begin_exit_dispatch(rec).then(|| Self {
            rec,
            _not_send: std::marker::PhantomData,
        })
    }
}

impl Drop for DispatchSection {
    #[inline]
    fn drop(&mut self) {
        self.rec.end_dispatch();
    }
}

impl std::fmt::Debug for DispatchSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchSection").finish_non_exhaustive()
    }
}
