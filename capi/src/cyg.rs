//! The `-finstrument-functions` runtime.
//!
//! GCC and Clang, given `-finstrument-functions`, call
//! `__cyg_profile_func_enter(fn, call_site)` on entry to every function of
//! the instrumented code and `__cyg_profile_func_exit(fn, call_site)` on
//! return. This module defines both on top of a registry: after
//! [`fprobe_cyg_attach`], every instrumented call is dispatched through
//! [`fprobe_on_entry`](crate::fprobe_on_entry) /
//! [`fprobe_on_exit`](crate::fprobe_on_exit) with `addr = fn` and
//! `ret_addr = call_site`, and the engine context is NULL.
//!
//! # Invariants
//!
//! * **Re-entrancy.** The hooks keep no state of their own: an
//!   instrumented signal handler that interrupts a hook dispatches like
//!   any other call (the probe layer is safe against a signal at any
//!   instruction of a dispatch), and instrumented calls made by handlers
//!   are refused and counted as recursion by the probe layer's
//!   per-context guard.
//! * **No allocation on the hit path.** After a thread's first hook (which
//!   registers it with the RCU and the registry), a hook is: one load of
//!   the attached registry, a thread-local flag, an RCU read-side section,
//!   and the registry's dispatch, none of which allocate.
//! * **Pairing across attach.** Calls entered before attach are not
//!   dispatched at entry, and their exits find no frame to pop (the probe
//!   layer ignores an exit with an empty frame stack): every function
//!   entered after attach has returned by then, because calls nest.
//! * **Attach again.** Detaching leaves the frames of calls in flight on
//!   their threads' shadow stacks, and the exits of calls that return
//!   while detached pop nothing; attaching therefore resets the registry's
//!   pairing ([`Registry::reset_pairing`](fprobe::probe::Registry::reset_pairing))
//!   before publishing it, so every thread starts from an empty stack and
//!   a registry may be attached, detached and attached again.
//! * **Lifetime.** The attached registry is loaded inside the RCU read
//!   section of the hook; [`fprobe_cyg_detach`] and registry destruction
//!   unpublish it and wait for a grace period before anything is freed.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use fprobe::probe::DispatchSection;
use fprobe::rcu;

use crate::codes::{FPROBE_E_BUSY, FPROBE_E_DESTROYED, FPROBE_E_NULL, FPROBE_OK};
use crate::registry::fprobe_registry;

/// The registry the hooks dispatch to; null when detached.
static ATTACHED: AtomicPtr<fprobe_registry> = AtomicPtr::new(std::ptr::null_mut());

/// Makes the hooks dispatch to `r`, forgetting calls left in flight by an
/// earlier attachment of it. Fails with [`FPROBE_E_BUSY`] if the runtime
/// is attached already (to any registry), [`FPROBE_E_NULL`],
/// [`FPROBE_E_DESTROYED`]. Thread-safe.
///
/// # Safety
///
/// `r` is NULL or from [`fprobe_registry_new`](crate::fprobe_registry_new).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_cyg_attach(r: *mut fprobe_registry) -> c_int {
    // SAFETY: NULL or a handle (never freed), by the contract.
    let Some(h) = (unsafe { r.as_ref() }) else {
        return FPROBE_E_NULL;
    };
    {
        // A read section keeps the registry alive while it is reset.
        let _guard = rcu::read_lock();
        // Acquire: pairs with the Release store of `fprobe_registry_new`.
        let p = h.inner.load(Ordering::Acquire);
        // SAFETY: destroy unpublishes `inner` and waits a grace period
        // before freeing; this section began before it could end.
        match unsafe { p.as_ref() } {
            // Seen by every hook after the publication below, which
            // orders it (Release/Acquire on `ATTACHED`).
            Some(reg) => reg.reset_pairing(),
            None => return FPROBE_E_DESTROYED,
        }
    }
    // SeqCst (also a Release: a hook that loads `r` sees the registry's
    // initialisation), with the re-check below against destroy.
    match ATTACHED.compare_exchange(std::ptr::null_mut(), r, Ordering::SeqCst, Ordering::Relaxed) {
        Ok(_) => {
            // Destroy unpublishes `inner`, then detaches; we attach, then
            // re-check `inner`. All four are SeqCst, so either we see the
            // unpublish and undo here, or destroy's detach sees our attach
            // and undoes it: the runtime is never left attached to a dead
            // registry (which would refuse every later attach).
            if h.inner.load(Ordering::SeqCst).is_null() {
                let _ = ATTACHED.compare_exchange(
                    r,
                    std::ptr::null_mut(),
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                );
                return FPROBE_E_DESTROYED;
            }
            FPROBE_OK
        }
        Err(_) => FPROBE_E_BUSY,
    }
}

/// Stops the hooks from dispatching and waits until no hook is inside the
/// registry. Returns [`FPROBE_E_BUSY`] from inside a handler; detaching
/// when nothing is attached is not an error. Thread-safe; blocks for an
/// RCU grace period.
#[unsafe(no_mangle)]
pub extern "C" fn fprobe_cyg_detach() -> c_int {
    if crate::codes::cannot_wait() {
        return FPROBE_E_BUSY;
    }
    // Release: pairs with the Acquire load in `hook`; the grace period
    // below waits for every hook that loaded the old pointer.
    ATTACHED.store(std::ptr::null_mut(), Ordering::Release);
    rcu::synchronize();
    FPROBE_OK
}

/// Detaches if `r` is the attached registry (registry destruction, after
/// unpublishing the registry with SeqCst; the caller then waits for the
/// grace period). SeqCst: pairs with [`fprobe_cyg_attach`]'s re-check.
pub(crate) fn detach_registry(r: *mut fprobe_registry) {
    let _ = ATTACHED.compare_exchange(r, std::ptr::null_mut(), Ordering::SeqCst, Ordering::SeqCst);
}

/// The attached registry, if any.
///
/// # Safety
///
/// The caller is inside a read-side section (a [`DispatchSection`] or an
/// [`rcu::ReadGuard`]) that began before the load and lasts for all of
/// `'s`: the registry is freed a grace period after it is detached.
#[inline(always)]
unsafe fn attached_registry<'s>() -> Option<&'s crate::registry::Reg> {
    // Acquire: pairs with the Release of `fprobe_cyg_attach`.
    let r = ATTACHED.load(Ordering::Acquire);
    // SAFETY: an attached handle is live (handles are never freed).
    let h = unsafe { r.as_ref() }?;
    // Acquire: pairs with the Release store of `fprobe_registry_new`.
    let p = h.inner.load(Ordering::Acquire);
    // SAFETY: destroy detaches, unpublishes `inner` and waits a grace
    // period before freeing; the caller's section began before that grace
    // period could end, and the reference does not outlive it (`'s`).
    unsafe { p.as_ref() }
}

/// Runs the hook's dispatch with the attached registry, if any. One
/// read-side section covers the registry's loads and the dispatch: the
/// dispatch's own ([`DispatchSection`]), or, when the hook runs inside
/// another dispatch (a handler or a signal handler called an instrumented
/// function), a guard the nested dispatch nests in.
#[inline(always)]
fn hook(
    section: Option<DispatchSection>,
    held: impl FnOnce(&crate::registry::Reg, &mut DispatchSection),
    nested: impl FnOnce(&crate::registry::Reg, &rcu::ReadGuard),
) {
    match section {
        Some(mut section) => {
            // SAFETY: `section` is a read-side section, open across the
            // load and the dispatch, which is all `reg` is used for.
            if let Some(reg) = unsafe { attached_registry() } {
                held(reg, &mut section);
            }
        }
        None => {
            let guard = rcu::read_lock();
            // SAFETY: `guard` is a read-side section, open across the load
            // and the dispatch, which is all `reg` is used for.
            if let Some(reg) = unsafe { attached_registry() } {
                nested(reg, &guard);
            }
        }
    }
}

/// The `-finstrument-functions` entry hook.
///
/// # Safety
///
/// Called by compiler-generated code with the function's address and its
/// call site.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __cyg_profile_func_enter(this_fn: *mut c_void, call_site: *mut c_void) {
    // Relaxed: a cheap filter; the pointer used is reloaded in the section.
    if ATTACHED.load(Ordering::Relaxed).is_null() {
        return;
    }
    let (f, site) = (this_fn as u64, call_site as u64);
    hook(
        DispatchSection::enter(),
        |reg, s| reg.on_entry_held(s, f, site, &NO_CTX),
        |reg, g| reg.on_entry_in(g, f, site, &NO_CTX),
    );
}

/// The `-finstrument-functions` exit hook.
///
/// # Safety
///
/// As [`__cyg_profile_func_enter`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __cyg_profile_func_exit(_this_fn: *mut c_void, call_site: *mut c_void) {
    // Relaxed: as in the entry hook.
    if ATTACHED.load(Ordering::Relaxed).is_null() {
        return;
    }
    let site = call_site as u64;
    hook(
        DispatchSection::enter_for_exit(),
        |reg, s| reg.on_exit_held(s, site, &NO_CTX),
        |reg, g| reg.on_exit_in(g, site, &NO_CTX),
    );
}

/// The engine context of hooked calls: NULL.
const NO_CTX: crate::registry::EngineCtx = crate::registry::EngineCtx(std::ptr::null_mut());
