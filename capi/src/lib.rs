//! The C ABI of fprobe.
//!
//! A C or C++ instrumentation engine creates a registry, registers probes
//! (C function pointers for entry and exit) on arrays of addresses, and
//! calls [`fprobe_on_entry`] / [`fprobe_on_exit`] from its hooks, or lets
//! the `-finstrument-functions` runtime in [`cyg`] do that for it. The
//! header `include/fprobe.h` is generated from this crate by cbindgen
//! (`tests/header.rs` fails when it is stale; `FPROBE_BLESS=1 cargo test -p
//! fprobe-capi --test header` rewrites it).
//!
//! # Conventions
//!
//! * Every function returns an `int` status: [`FPROBE_OK`] (0) or a
//!   negative `FPROBE_E_*` code; [`fprobe_strerror`] names it. Outputs go
//!   through pointer arguments, written only on success.
//! * Bad input is an error code, never a crash and never a change of state:
//!   a null pointer argument is [`FPROBE_E_NULL`], an unknown or
//!   unregistered probe handle [`FPROBE_E_NOT_FOUND`], a destroyed registry
//!   [`FPROBE_E_DESTROYED`]. (A pointer that was never a registry, or a
//!   dangling pointer into freed memory, cannot be detected: that is
//!   undefined behaviour, as for any C library.)
//! * Every function is thread-safe: any thread may call any function on the
//!   same registry at any time, including [`fprobe_registry_destroy`] while
//!   other threads dispatch (they get [`FPROBE_E_DESTROYED`] afterwards).
//! * Handlers run on whichever thread hit the probe, possibly on several
//!   threads at once, each inside an RCU read-side section of its
//!   dispatch: they must be thread-safe,
//!   must not unwind (C++ exceptions, `longjmp`) out of the handler, and
//!   must not call [`fprobe_unregister`] or [`fprobe_registry_destroy`]
//!   (those return [`FPROBE_E_BUSY`] in any handler).
//!   A handler that calls a probed function does not recurse into probes:
//!   that hit is counted as a recursion miss.
//!
//! # Lifetime of a registry
//!
//! [`fprobe_registry_destroy`] unpublishes the registry, waits an RCU
//! grace period (every dispatch already inside it finishes) and frees it.
//! The 16-byte handle itself is kept as a tombstone so that later calls
//! through a stale pointer return [`FPROBE_E_DESTROYED`] instead of reading
//! freed memory. Tombstones cost 16 bytes per registry ever created, cut
//! from blocks of their own so that they pin no page of the freed
//! registries' memory: 100,000 registries created, dispatched through and
//! destroyed leave about 2 MiB (`tests/lifecycle.rs`).
//!
//! # Why the hot path takes no reference count
//!
//! [`fprobe_on_entry`] and [`fprobe_on_exit`] load the registry pointer
//! inside an RCU read-side section (a thread-local store, about a
//! nanosecond) and use it for the duration of the section; destroy waits
//! for a grace period after unpublishing, so the registry outlives every
//! such section. Control operations (register, unregister, stats) must
//! wait for grace periods themselves, which they cannot do inside a read
//! section, so they take an `Arc` reference (one atomic increment) instead.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use fprobe::Error;
use fprobe::probe::{CEngineCtx, CEngineRepr, CEntryContext, CExitContext, Fprobe, ProbeHandle};
use fprobe::rcu;

mod codes;
mod registry;

#[cfg(feature = "cyg")]
pub mod cyg;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub mod patch;

pub use codes::{
    FPROBE_E_BUSY, FPROBE_E_CAPACITY, FPROBE_E_DESTROYED, FPROBE_E_INTERNAL, FPROBE_E_INVALID,
    FPROBE_E_NOT_FOUND, FPROBE_E_NOT_PATCHABLE, FPROBE_E_NULL, FPROBE_E_OS, FPROBE_OK,
    FPROBE_SKIP_EXIT,
};
use codes::{cannot_wait, code, ffi};
#[cfg(feature = "cyg")]
pub use cyg::{fprobe_cyg_attach, fprobe_cyg_detach};
use registry::{DEAD, EngineCtx, LIVE, Reg};
pub use registry::{fprobe_config, fprobe_registry, fprobe_registry_new};

/// What an entry handler sees: the probe layer's own C context, defined
/// once (`fprobe::probe::CEntryContext`, named `fprobe_entry_ctx` in C).
pub type fprobe_entry_ctx = CEntryContext;

/// What an exit handler sees: the probe layer's own C context
/// (`fprobe::probe::CExitContext`, named `fprobe_exit_ctx` in C).
pub type fprobe_exit_ctx = CExitContext;

/// An entry handler (NULL for none): `user` is the probe's `user`
/// pointer. Returns 0 to have the exit handler called, [`FPROBE_SKIP_EXIT`]
/// to skip it.
pub type fprobe_entry_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, ctx: *mut CEntryContext) -> c_int>;
/// An exit handler (NULL for none).
pub type fprobe_exit_fn = Option<unsafe extern "C" fn(user: *mut c_void, ctx: *const CExitContext)>;
/// Called once with the probe's `user` pointer when the probe is gone and
/// no handler of it can run any more (NULL for none).
pub type fprobe_release_fn = Option<unsafe extern "C" fn(user: *mut c_void)>;

/// A probe definition, copied by [`fprobe_register`].
#[repr(C)]
pub struct fprobe_probe {
    /// Entry handler, or NULL.
    pub entry: fprobe_entry_fn,
    /// Exit handler, or NULL. At least one of `entry` and `exit` is set.
    pub exit: fprobe_exit_fn,
    /// Called once with `user` after the probe is unregistered (or its
    /// registry destroyed) and no handler of it can run any more, on an
    /// unspecified thread; never called if registration fails (the caller
    /// still owns `user` then). May be NULL.
    pub release: fprobe_release_fn,
    /// Passed to every handler; shared by all threads.
    pub user: *mut c_void,
    /// Bytes of per-call data from entry to exit (at most the registry's
    /// `data_size`; 0 for none).
    pub data_size: usize,
}

/// A probe's counters, summed over threads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct fprobe_stats {
    /// Entry hits that ran the probe.
    pub hits: u64,
    /// Exit handlers run.
    pub exits: u64,
    /// Hits refused as recursion: a handler of the same context (normal
    /// code, or one signal-handler level) was already running.
    pub missed_recursion: u64,
    /// Exit handlers skipped: the thread's shadow stack was full.
    pub missed_depth: u64,
    /// Hits while the probe was disabled.
    pub missed_disabled: u64,
    /// Calls between an entry that kept the probe's exit and their return
    /// (0 once they have all returned; see [`fprobe_drain`]).
    pub in_flight: u64,
    /// Exit handlers skipped because the call never returned: an
    /// exception, a forced unwind or a `longjmp` went past it (found by
    /// [`fprobe_on_return`] and [`fprobe_on_entry_taking_return`] by stack
    /// address). Last, so that the fields before keep their offsets.
    pub missed_unwound: u64,
}

impl From<fprobe::probe::ProbeStats> for fprobe_stats {
    fn from(s: fprobe::probe::ProbeStats) -> Self {
        fprobe_stats {
            hits: s.hits,
            exits: s.exits,
            missed_recursion: s.missed.recursion,
            missed_depth: s.missed.depth,
            missed_disabled: s.missed.disabled,
            in_flight: s.in_flight,
            missed_unwound: s.missed.unwound,
        }
    }
}

/// The probe's `user` pointer and release callback; calls `release` when
/// dropped with the probe, after its last handler call.
pub(crate) struct User {
    user: *mut c_void,
    release: fprobe_release_fn,
    /// Set once registration succeeded: a failed registration leaves
    /// `user` with the caller.
    armed: AtomicBool,
}

// SAFETY: `fprobe_probe::user` is documented as shared by all threads; the
// crate only passes it back to the caller's handlers and release function.
unsafe impl Send for User {}
// SAFETY: as above.
unsafe impl Sync for User {}

impl User {
    /// The registration succeeded: `release` runs when the probe is
    /// dropped.
    pub(crate) fn arm(&self) {
        // Release: pairs with the Acquire load in `User::drop`.
        self.armed.store(true, Ordering::Release);
    }
}

impl Drop for User {
    fn drop(&mut self) {
        if let Some(release) = self.release {
            // Acquire: pairs with the Release store of `armed` in
            // `fprobe_register`; the registration it arms happened before.
            if self.armed.load(Ordering::Acquire) {
                // SAFETY: the caller's function, given its own pointer, once.
                unsafe { release(self.user) };
            }
        }
    }
}

/// A counted reference to a live registry, for control operations.
///
/// # Safety
///
/// `r` is null or a pointer returned by [`fprobe_registry_new`].
unsafe fn control(r: *const fprobe_registry) -> Result<Arc<Reg>, c_int> {
    // SAFETY: null or a handle from `fprobe_registry_new` (kept forever).
    let r = unsafe { r.as_ref() }.ok_or(FPROBE_E_NULL)?;
    // Acquire: pairs with the AcqRel compare-exchange of
    // `fprobe_registry_destroy`; a caller that sees DEAD sees the teardown
    // that followed it.
    if r.magic.load(Ordering::Acquire) != LIVE {
        return Err(FPROBE_E_DESTROYED);
    }
    let _guard = rcu::read_lock();
    // Acquire: pairs with the Release store of `fprobe_registry_new`.
    let p = r.inner.load(Ordering::Acquire);
    if p.is_null() {
        return Err(FPROBE_E_DESTROYED);
    }
    // SAFETY: `p` came from `Arc::into_raw`; destroy nulls `inner`, waits a
    // grace period and only then drops its reference, so the count is
    // still positive inside this read section.
    unsafe {
        Arc::increment_strong_count(p);
        Ok(Arc::from_raw(p))
    }
}

/// Destroys a registry: detaches the `-finstrument-functions` runtime if
/// it uses this registry, waits for dispatches in progress to finish, and
/// frees everything; release callbacks of the probes still registered run
/// (possibly on another thread, after this returns). Later calls with `r`
/// return [`FPROBE_E_DESTROYED`].
///
/// Returns [`FPROBE_E_NULL`], [`FPROBE_E_DESTROYED`] (already destroyed)
/// or [`FPROBE_E_BUSY`] (called from a handler). Thread-safe; blocks for an
/// RCU grace period.
///
/// # Safety
///
/// `r` is NULL or a pointer from [`fprobe_registry_new`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_registry_destroy(r: *mut fprobe_registry) -> c_int {
    ffi(|| {
        // SAFETY: NULL or a handle (never freed), by the contract.
        let h = unsafe { r.as_ref() }.ok_or(FPROBE_E_NULL)?;
        if cannot_wait() {
            return Err(FPROBE_E_BUSY);
        }
        // AcqRel: one destroyer wins (the RMW is totally ordered); the
        // Release half pairs with the Acquire magic loads in `control`.
        h.magic
            .compare_exchange(LIVE, DEAD, Ordering::AcqRel, Ordering::Acquire)
            .map_err(|_| FPROBE_E_DESTROYED)?;
        // SeqCst, with the runtime's attach (see `cyg::detach_registry`).
        let p = h.inner.swap(std::ptr::null_mut(), Ordering::SeqCst);
        #[cfg(feature = "cyg")]
        cyg::detach_registry(r);
        // Every read section that could have loaded `p` ends.
        rcu::synchronize();
        if !p.is_null() {
            // SAFETY: from `Arc::into_raw`, unpublished above, released once
            // (the magic compare-exchange admits one destroyer).
            drop(unsafe { Arc::from_raw(p) });
        }
        Ok(())
    })
}

/// Registers `probe` on `n` addresses, all or nothing, with per-address
/// cookies (`cookies` may be NULL: all zero). The probe is enabled at once.
/// Writes the probe's handle (never 0) to `*handle_out`.
///
/// Returns [`FPROBE_E_NULL`] (`r`, `probe` or `handle_out` NULL, or
/// `addrs` NULL with `n > 0`), [`FPROBE_E_INVALID`] (no handler, `n` of 0,
/// or `data_size` above the registry's), [`FPROBE_E_CAPACITY`],
/// [`FPROBE_E_DESTROYED`]. On error nothing is registered and `user` stays
/// the caller's (`release` is not called). Thread-safe; takes the
/// registry's writer locks briefly; never blocks dispatch.
///
/// # Safety
///
/// `r` is NULL or from [`fprobe_registry_new`]; `probe` is NULL or valid;
/// `addrs` (and `cookies` if not NULL) point to `n` readable `u64`s;
/// `handle_out` is NULL or writable; the handlers follow the crate's
/// handler rules (module docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_register(
    r: *mut fprobe_registry,
    probe: *const fprobe_probe,
    addrs: *const u64,
    cookies: *const u64,
    n: usize,
    handle_out: *mut u64,
) -> c_int {
    ffi(|| {
        // SAFETY: the pointers as the contract says.
        let (p, attach) = unsafe { c_attach_args(probe, addrs, cookies, n, handle_out) }?;
        // SAFETY: as above.
        let reg = unsafe { control(r) }?;
        let (probe, user) = c_probe::<EngineCtx>(p);
        let h = reg.register_with_cookies(probe, attach).map_err(code)?;
        user.arm();
        // SAFETY: checked non-null; writable by the contract.
        unsafe { *handle_out = h.to_bits() };
        Ok(())
    })
}

/// `(address, cookie)` pairs to attach a probe to.
pub(crate) type Attachments = Vec<(u64, u64)>;

/// The arguments of an attach through the C ABI, checked: the probe (with
/// a handler) and its `(address, cookie)` pairs (cookie 0 when `cookies`
/// is NULL). [`FPROBE_E_NULL`] for a NULL `probe` or `handle_out`, or NULL
/// addresses with `n > 0`; [`FPROBE_E_INVALID`] for a probe without
/// handlers.
///
/// # Safety
///
/// `probe` is NULL or valid; `addrs` (and `cookies` if not NULL) point to
/// `n` readable `u64`s.
pub(crate) unsafe fn c_attach_args<'a>(
    probe: *const fprobe_probe,
    addrs: *const u64,
    cookies: *const u64,
    n: usize,
    handle_out: *mut u64,
) -> Result<(&'a fprobe_probe, Attachments), c_int> {
    // SAFETY: NULL or valid, by the contract.
    let p = unsafe { probe.as_ref() }.ok_or(FPROBE_E_NULL)?;
    if handle_out.is_null() || (addrs.is_null() && n > 0) {
        return Err(FPROBE_E_NULL);
    }
    if p.entry.is_none() && p.exit.is_none() {
        return Err(FPROBE_E_INVALID);
    }
    if n == 0 {
        return Ok((p, Vec::new()));
    }
    // SAFETY: `n` readable values, by the contract.
    let addrs = unsafe { std::slice::from_raw_parts(addrs, n) };
    let cookies: Option<&[u64]> = if cookies.is_null() {
        None
    } else {
        // SAFETY: as above.
        Some(unsafe { std::slice::from_raw_parts(cookies, n) })
    };
    let pairs = addrs
        .iter()
        .enumerate()
        .map(|(i, &a)| (a, cookies.map_or(0, |c| c[i])))
        .collect();
    Ok((p, pairs))
}

// SAFETY: `#[repr(transparent)]` over the engine's pointer.
unsafe impl CEngineCtx for EngineCtx {
    const REPR: CEngineRepr = CEngineRepr::ByValue;
}

/// A probe calling the C handlers of `p` directly, and their `user`, to
/// [`arm`](User::arm) once the probe is registered (a failed registration
/// leaves `user` with the caller, unreleased). The probe owns `user`: it
/// is released when the probe is dropped, after its last handler call.
pub(crate) fn c_probe<C: CEngineCtx + Send + Sync + 'static>(
    p: &fprobe_probe,
) -> (Fprobe<C>, Arc<User>) {
    let user = Arc::new(User {
        user: p.user,
        release: p.release,
        armed: AtomicBool::new(false),
    });
    let mut b = Fprobe::<C>::builder()
        .data_size(p.data_size)
        .owns(user.clone());
    if let Some(entry) = p.entry {
        // SAFETY: `fprobe_probe`'s contract: its handlers take any thread,
        // concurrently, with its `user` (shared by all threads).
        b = unsafe { b.entry_c(entry, p.user) };
    }
    if let Some(exit) = p.exit {
        // SAFETY: as for the entry handler.
        b = unsafe { b.exit_c(exit, p.user) };
    }
    (b.build(), user)
}

/// Runs `f` on the live registry with the probe handle decoded.
///
/// # Safety
///
/// As [`control`].
unsafe fn with_probe(
    r: *const fprobe_registry,
    handle: u64,
    f: impl FnOnce(&Reg, ProbeHandle) -> Result<(), Error>,
) -> c_int {
    ffi(|| {
        // SAFETY: forwarded contract.
        let reg = unsafe { control(r) }?;
        f(&reg, ProbeHandle::from_bits(handle)).map_err(code)
    })
}

/// Detaches the probe from all its addresses. When it returns no handler of
/// the probe is running or will run; calls in flight between entry and
/// exit skip their exit handler. The release callback runs afterwards
/// (possibly on another thread).
///
/// Returns [`FPROBE_E_NULL`], [`FPROBE_E_NOT_FOUND`] (unknown handle or
/// already unregistered: nothing changes), [`FPROBE_E_DESTROYED`], or
/// [`FPROBE_E_BUSY`] when called from a handler. Thread-safe; blocks for
/// RCU grace periods.
///
/// # Safety
///
/// `r` is NULL or from [`fprobe_registry_new`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_unregister(r: *mut fprobe_registry, handle: u64) -> c_int {
    if cannot_wait() {
        return FPROBE_E_BUSY;
    }
    // SAFETY: forwarded contract.
    unsafe { with_probe(r, handle, |reg, h| reg.unregister(h)) }
}

/// Disables the probe (as [`fprobe_disable`]) and waits until every call
/// in flight that entered it on another thread has returned through its
/// exit handler (or had it refused, counted), or until `timeout_ms`
/// milliseconds have passed; writes how many were still in flight to
/// `*left_out` (0: drained) unless it is NULL. Calls in flight on the
/// calling thread are not waited for. Drain and then [`fprobe_unregister`]
/// so that the calls in flight get their exits instead of skipping them.
///
/// Returns as [`fprobe_unregister`]. Thread-safe; blocks for a grace
/// period and then up to the timeout.
///
/// # Safety
///
/// `r` is NULL or from [`fprobe_registry_new`]; `left_out` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_drain(
    r: *mut fprobe_registry,
    handle: u64,
    timeout_ms: u64,
    left_out: *mut u64,
) -> c_int {
    if cannot_wait() {
        return FPROBE_E_BUSY;
    }
    // SAFETY: forwarded contract.
    unsafe {
        with_probe(r, handle, |reg, h| {
            let left = reg.drain(h, std::time::Duration::from_millis(timeout_ms))?;
            if !left_out.is_null() {
                // SAFETY: non-null, writable by the contract.
                *left_out = left;
            }
            Ok(())
        })
    }
}

/// Resumes a disabled probe. Returns [`FPROBE_E_NULL`],
/// [`FPROBE_E_NOT_FOUND`] or [`FPROBE_E_DESTROYED`]. Thread-safe, never
/// blocks.
///
/// # Safety
///
/// `r` is NULL or from [`fprobe_registry_new`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_enable(r: *mut fprobe_registry, handle: u64) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { with_probe(r, handle, |reg, h| reg.enable(h)) }
}

/// Stops running the probe's handlers (hits count as `missed_disabled`)
/// without detaching it. Errors as [`fprobe_enable`]. Thread-safe, never
/// blocks.
///
/// # Safety
///
/// `r` is NULL or from [`fprobe_registry_new`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_disable(r: *mut fprobe_registry, handle: u64) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { with_probe(r, handle, |reg, h| reg.disable(h)) }
}

/// Writes the probe's counters, summed over all threads, to `*out`.
/// Counters of calls still running on other threads may or may not be
/// included. Errors as [`fprobe_enable`] (and [`FPROBE_E_NULL`] for `out`).
/// Thread-safe; takes the registry's bookkeeping lock briefly.
///
/// # Safety
///
/// `r` is NULL or from [`fprobe_registry_new`]; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_probe_stats(
    r: *mut fprobe_registry,
    handle: u64,
    out: *mut fprobe_stats,
) -> c_int {
    if out.is_null() {
        return FPROBE_E_NULL;
    }
    // SAFETY: forwarded contract.
    unsafe {
        with_probe(r, handle, |reg, h| {
            // SAFETY: checked non-null; writable by the contract.
            *out = reg.stats(h)?.into();
            Ok(())
        })
    }
}

/// Writes the number of addresses with at least one probe to `*out`.
/// Errors: [`FPROBE_E_NULL`], [`FPROBE_E_DESTROYED`]. Thread-safe.
///
/// # Safety
///
/// `r` is NULL or from [`fprobe_registry_new`]; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_registry_addresses(
    r: *mut fprobe_registry,
    out: *mut usize,
) -> c_int {
    ffi(|| {
        if out.is_null() {
            return Err(FPROBE_E_NULL);
        }
        // SAFETY: forwarded contract.
        let reg = unsafe { control(r) }?;
        // SAFETY: checked non-null; writable by the contract.
        unsafe { *out = reg.addresses() };
        Ok(())
    })
}

/// Dispatches inside an RCU read-side section with the registry loaded.
///
/// # Safety
///
/// `r` is NULL or from [`fprobe_registry_new`].
#[inline]
unsafe fn dispatch(r: *const fprobe_registry, f: impl FnOnce(&Reg)) -> c_int {
    // SAFETY: NULL or a handle (never freed), by the contract.
    let Some(h) = (unsafe { r.as_ref() }) else {
        return FPROBE_E_NULL;
    };
    let _guard = rcu::read_lock();
    // Acquire: pairs with the Release store of `fprobe_registry_new`.
    let p = h.inner.load(Ordering::Acquire);
    // SAFETY: destroy unpublishes and waits a grace period before freeing,
    // and this section began before any such grace period could end.
    match unsafe { p.as_ref() } {
        Some(reg) => {
            f(reg);
            FPROBE_OK
        }
        None => FPROBE_E_DESTROYED,
    }
}

/// Function entry at `addr` (the engine's hook): runs the entry handlers of
/// the probes attached there and keeps what their exit handlers need on
/// the thread's shadow stack. Call [`fprobe_on_exit`] exactly once when this call returns,
/// on the same thread, in LIFO order with other calls.
///
/// Returns [`FPROBE_OK`], [`FPROBE_E_NULL`] or [`FPROBE_E_DESTROYED`].
/// Thread-safe; never blocks; allocates only on a thread's first call
/// through the registry; async-signal-safe after that, also when a signal
/// handler dispatches in the middle of another dispatch on its thread.
///
/// # Safety
///
/// `r` is NULL or from [`fprobe_registry_new`]; `ctx` is passed to handlers
/// untouched.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_on_entry(
    r: *mut fprobe_registry,
    addr: u64,
    ret_addr: u64,
    ctx: *mut c_void,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { dispatch(r, |reg| reg.on_entry(addr, ret_addr, &EngineCtx(ctx))) }
}

/// Function return: runs the exit handlers reserved by the matching
/// [`fprobe_on_entry`], newest first. Errors and context as
/// [`fprobe_on_entry`].
///
/// # Safety
///
/// As [`fprobe_on_entry`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_on_exit(
    r: *mut fprobe_registry,
    ret_addr: u64,
    ctx: *mut c_void,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { dispatch(r, |reg| reg.on_exit(ret_addr, &EngineCtx(ctx))) }
}

/// Function entry for an engine that takes the call's return over (it
/// replaces the return address at stack address `sp`, where it read
/// `ret_addr`): runs the entry handlers like [`fprobe_on_entry`] and writes
/// to `*kept` 1 when it kept a frame holding `ret_addr` and `sp` (some exit
/// handler is to run: call [`fprobe_on_return`] with the same `sp` when the
/// function returns), 0 when it kept nothing (leave the return alone).
/// Calls kept below `sp` on top of the thread's stack (an unwind went past
/// them) end first, without their exit handlers, counted in
/// `missed_unwound`.
///
/// Returns [`FPROBE_OK`], [`FPROBE_E_NULL`] (`r` or `kept`) or
/// [`FPROBE_E_DESTROYED`]. After an error `*kept` is 0 (when `kept` is not
/// NULL): nothing was kept, so a trampoline that reads it without checking
/// the code leaves the return alone. Thread-safe; never blocks;
/// async-signal-safe as [`fprobe_on_entry`].
///
/// # Safety
///
/// As [`fprobe_on_entry`]; `kept` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_on_entry_taking_return(
    r: *mut fprobe_registry,
    addr: u64,
    ret_addr: u64,
    sp: u64,
    ctx: *mut c_void,
    kept: *mut c_int,
) -> c_int {
    if kept.is_null() {
        return FPROBE_E_NULL;
    }
    let mut k = false;
    // SAFETY: forwarded contract.
    let rc = unsafe {
        dispatch(r, |reg| {
            k = reg.on_entry_taking_return(addr, ret_addr, sp, &EngineCtx(ctx));
        })
    };
    // SAFETY: checked non-null; writable by the contract.
    unsafe { *kept = c_int::from(k) };
    rc
}

/// The return of a call whose entry [`fprobe_on_entry_taking_return`] kept
/// at `sp`: ends the calls kept deeper that never returned (a `longjmp` or
/// an unwind went past them) without their exit handlers, counted in
/// `missed_unwound`, then runs its own exit handlers and writes the
/// caller's return address to `*ret_addr_out`.
///
/// Returns [`FPROBE_OK`], [`FPROBE_E_NULL`] (`r` or `ret_addr_out`),
/// [`FPROBE_E_NOT_FOUND`] (no frame kept at `sp`: the calls did not nest,
/// or the thread is exiting) or [`FPROBE_E_DESTROYED`]; on an error the
/// return address is not known here. Do not destroy a registry while
/// calls whose return it kept can still return. Thread-safe; never blocks;
/// async-signal-safe as [`fprobe_on_entry`].
///
/// # Safety
///
/// As [`fprobe_on_entry`]; `ret_addr_out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_on_return(
    r: *mut fprobe_registry,
    sp: u64,
    ctx: *mut c_void,
    ret_addr_out: *mut u64,
) -> c_int {
    if ret_addr_out.is_null() {
        return FPROBE_E_NULL;
    }
    let mut ret = None;
    // SAFETY: forwarded contract.
    let rc = unsafe { dispatch(r, |reg| ret = reg.on_return(sp, &EngineCtx(ctx))) };
    match (rc, ret) {
        (FPROBE_OK, Some(a)) => {
            // SAFETY: checked non-null; writable by the contract.
            unsafe { *ret_addr_out = a };
            FPROBE_OK
        }
        (FPROBE_OK, None) => FPROBE_E_NOT_FOUND,
        (rc, _) => rc,
    }
}

/// Forgets every call in flight on every thread for this registry: each
/// thread empties its shadow stack at its next dispatch, so exits of calls
/// entered before now run no handler. For engines that stop calling the
/// hooks and start again (exits of calls that returned in between would
/// otherwise pair with the wrong entries). Returns [`FPROBE_OK`],
/// [`FPROBE_E_NULL`] or [`FPROBE_E_DESTROYED`]. Thread-safe; never blocks.
///
/// # Safety
///
/// `r` is NULL or from [`fprobe_registry_new`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_reset_pairing(r: *mut fprobe_registry) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { dispatch(r, |reg| reg.reset_pairing()) }
}

/// Waits until every probe unregistered (or registry destroyed) before
/// this call has been freed and its release callback has run. Returns
/// [`FPROBE_E_BUSY`] from inside a handler. Blocks; thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn fprobe_barrier() -> c_int {
    if cannot_wait() {
        return FPROBE_E_BUSY;
    }
    ffi(|| {
        rcu::barrier();
        Ok(())
    })
}

/// Makes every registry skip probes on the calling thread (non-zero) or
/// not (zero): for an engine's own threads. Entry/exit pairing is kept.
/// Not async-signal-safe: call it from the thread's own code (a handler
/// included), not from a signal handler.
#[unsafe(no_mangle)]
pub extern "C" fn fprobe_ignore_current_thread(ignore: c_int) {
    fprobe::probe::ignore_current_thread(ignore != 0);
}

/// A static, NUL-terminated description of a status code.
#[unsafe(no_mangle)]
pub extern "C" fn fprobe_strerror(code: c_int) -> *const c_char {
    let s: &'static [u8] = match code {
        FPROBE_OK => b"success\0",
        FPROBE_E_NULL => b"a required pointer argument is NULL\0",
        FPROBE_E_NOT_FOUND => b"no such probe in this registry\0",
        FPROBE_E_CAPACITY => b"no room for another probe or address\0",
        FPROBE_E_INVALID => b"invalid argument or configuration\0",
        FPROBE_E_DESTROYED => b"the registry was destroyed\0",
        FPROBE_E_BUSY => b"not allowed here (inside a handler, or runtime attached elsewhere)\0",
        FPROBE_E_INTERNAL => b"internal error\0",
        FPROBE_E_NOT_PATCHABLE => b"not a patchable function (-fpatchable-function-entry=7,5)\0",
        FPROBE_E_OS => b"a system call of the patching runtime failed\0",
        _ => b"unknown status code\0",
    };
    s.as_ptr().cast()
}
