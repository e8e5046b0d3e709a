//! [`RcuPtr`]: an owned, RCU-protected, nullable pointer.

use std::marker::PhantomData;

use super::domain::ReadGuard;
use crate::sync::{AtomicPtr, Ordering};

/// An owned `Option<Box<T>>` that readers dereference under a [`ReadGuard`]
/// while writers replace it: the RCU-protected pointer of the kernel's
/// `rcu_dereference` / `rcu_assign_pointer` pair.
///
/// Replaced values are dropped after a grace period ([`RcuPtr::replace`]) or
/// handed back after one ([`RcuPtr::swap_sync`]).
///
/// # Execution context
///
/// | operation | blocks? | allocates? | async-signal-safe? |
/// |---|---|---|---|
/// | [`load`](Self::load) | never; lock-free, wait-free | no | yes |
/// | [`replace`](Self::replace), [`clear`](Self::clear) | only under retire back-pressure | yes (the box, a queue slot) | no |
/// | [`swap_sync`](Self::swap_sync) | yes, one grace period | yes | no |
///
/// # Examples
///
/// ```
/// use fprobe::rcu::{self, RcuPtr};
///
/// let config = RcuPtr::new(String::from("v1"));
/// {
///     let guard = rcu::read_lock();
///     assert_eq!(config.load(&guard).map(String::as_str), Some("v1"));
///     // A writer may replace it while we read: our reference stays valid.
///     config.replace(String::from("v2"));
/// }
/// let guard = rcu::read_lock();
/// assert_eq!(config.load(&guard).map(String::as_str), Some("v2"));
/// ```
pub struct RcuPtr<T: Send + Sync + 'static> {
    /// Invariant: null or a pointer from `Box::into_raw` that this `RcuPtr`
    /// owns; a pointer swapped out is retired or handed back exactly once.
    ptr: AtomicPtr<T>,
    _owns: PhantomData<Box<T>>,
}

impl<T: Send + Sync + 'static> RcuPtr<T> {
    /// A pointer to `value`.
    pub fn new(value: T) -> Self {
        Self {
            ptr: AtomicPtr::new(Box::into_raw(Box::new(value))),
            _owns: PhantomData,
        }
    }

    /// A null pointer.
    pub fn null() -> Self {
        Self {
            ptr: AtomicPtr::new(std::ptr::null_mut()),
            _owns: PhantomData,
        }
    }

    /// The current value, valid for as long as `guard` (and `self`) are.
    #[inline]
    pub fn load<'g>(&'g self, _guard: &'g ReadGuard) -> Option<&'g T> {
        // Acquire: pairs with the Release in `publish`; the pointee's
        // initialisation is visible.
        let p = self.ptr.load(Ordering::Acquire);
        // SAFETY: a non-null pointer is a live box owned by `self` or
        // retired after a grace period that cannot end while `_guard` (a
        // read-side critical section begun before we loaded `p`) lives.
        unsafe { p.as_ref() }
    }

    fn publish(&self, new: *mut T) -> *mut T {
        // AcqRel: Release publishes the new box's contents to readers'
        // Acquire loads; Acquire makes the old box's contents ours to drop.
        self.ptr.swap(new, Ordering::AcqRel)
    }

    /// Stores `value`; the previous value is dropped after a grace period.
    pub fn replace(&self, value: T) {
        let old = self.publish(Box::into_raw(Box::new(value)));
        retire_ptr(old);
    }

    /// Stores null; the previous value is dropped after a grace period.
    pub fn clear(&self) {
        let old = self.publish(std::ptr::null_mut());
        retire_ptr(old);
    }

    /// Stores `value` (or null), waits for a grace period, and hands the
    /// previous value back.
    ///
    /// # Panics
    ///
    /// Inside a read-side critical section of the calling thread (the grace
    /// period would wait for the caller itself).
    pub fn swap_sync(&self, value: Option<T>) -> Option<Box<T>> {
        let new = value.map_or(std::ptr::null_mut(), |v| Box::into_raw(Box::new(v)));
        let old = self.publish(new);
        if old.is_null() {
            return None;
        }
        super::domain::synchronize();
        // SAFETY: `old` came from `Box::into_raw`, was swapped out exactly
        // once (so we own it), and the grace period has ended every reader
        // that could have loaded it.
        Some(unsafe { Box::from_raw(old) })
    }

    /// Consumes the pointer, returning its value.
    pub fn into_inner(self) -> Option<Box<T>> {
        let p = self.ptr.swap(std::ptr::null_mut(), Ordering::Relaxed);
        // SAFETY: `self` is owned, so no reader holds a guard-bound borrow of
        // it; a non-null `p` is a box we own.
        (!p.is_null()).then(|| unsafe { Box::from_raw(p) })
    }
}

fn retire_ptr<T: Send + Sync + 'static>(old: *mut T) {
    if old.is_null() {
        return;
    }
    // SAFETY: `old` was swapped out exactly once, so we own it; readers may
    // still hold it until a grace period ends, which `retire_box_raw` awaits.
    unsafe { super::retire::retire_box_raw(old) };
}

impl<T: Send + Sync + 'static> Drop for RcuPtr<T> {
    fn drop(&mut self) {
        let p = self.ptr.load(Ordering::Relaxed);
        if !p.is_null() {
            // SAFETY: `&mut self`: no reader borrows `self` any more (loads
            // are bound to `&'g self`), and we own the box.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

impl<T: Send + Sync + 'static> Default for RcuPtr<T> {
    fn default() -> Self {
        Self::null()
    }
}

impl<T: Send + Sync + std::fmt::Debug + 'static> std::fmt::Debug for RcuPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let guard = super::domain::read_lock();
        f.debug_tuple("RcuPtr").field(&self.load(&guard)).finish()
    }
}
