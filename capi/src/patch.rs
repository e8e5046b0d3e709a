//! The patching runtime (`fprobe-patch`) through the C ABI: probes with C
//! handlers attached at run time to functions compiled with
//! `-fpatchable-function-entry=7,5`, on x86-64 Linux.
//!
//! Handlers are [`fprobe_probe`]s as for a registry; their
//! `engine_ctx` points at the call's saved registers, a
//! [`fprobe_patch_regs`], valid for the handler call: the argument
//! registers at entry, the return registers at exit. Attached probes live
//! in the runtime's one registry and are named by the handle
//! [`fprobe_patch_attach`] returns.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::Mutex;

use fprobe_patch::{Attached, Error, Regs};

use crate::codes::{
    FPROBE_E_BUSY, FPROBE_E_CAPACITY, FPROBE_E_NOT_FOUND, FPROBE_E_NOT_PATCHABLE, FPROBE_E_NULL,
    FPROBE_E_OS, code, ffi,
};
use crate::{c_attach_args, c_probe, fprobe_probe, fprobe_stats};

/// A patched call's saved registers, what a handler's `engine_ctx` points
/// at: the patching runtime's own `repr(C)` type, defined once
/// (`fprobe_patch::Regs`, named `fprobe_patch_regs` in C).
pub type fprobe_patch_regs = Regs;

/// Attached probes by handle.
static ATTACHED: Mutex<(u64, Option<HashMap<u64, Attached>>)> = Mutex::new((0, None));

fn patch_code(e: Error) -> c_int {
    match e {
        Error::NotASite(_)
        | Error::UnsupportedLayout { .. }
        | Error::UnexpectedBytes { .. }
        | Error::Straddles(_) => FPROBE_E_NOT_PATCHABLE,
        Error::OutOfReach { .. } | Error::Os { .. } | Error::Object { .. } => FPROBE_E_OS,
        Error::Registry(e) => code(e),
    }
}

/// Does now what the first attach to the `n` functions at `functions`
/// would do besides patching: reads the loaded objects, checks every
/// site, makes the stubs of their objects and registers the process for
/// the serialising `membarrier(2)`, so that a later
/// [`fprobe_patch_attach`] to them only registers and patches. Optional.
///
/// Returns [`FPROBE_E_NULL`] (`functions` NULL with `n > 0`),
/// [`FPROBE_E_NOT_PATCHABLE`] (as for [`fprobe_patch_attach`]; nothing is
/// made then), [`FPROBE_E_OS`]. Thread-safe; not from a handler.
///
/// # Safety
///
/// `functions` is NULL or points to `n` readable `u64`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_patch_prepare(functions: *const u64, n: usize) -> c_int {
    ffi(|| {
        if n == 0 {
            return Ok(());
        }
        if functions.is_null() {
            return Err(FPROBE_E_NULL);
        }
        // SAFETY: `n` readable values, by the contract.
        let fs = unsafe { std::slice::from_raw_parts(functions, n) };
        fprobe_patch::prepare(fs).map_err(patch_code)
    })
}

/// Attaches `probe` to the `n` functions at `functions` (with `cookies[i]`
/// for `functions[i]`, or 0 when `cookies` is NULL) and writes its handle
/// to `*handle_out`. All or nothing: on error no function is patched and
/// nothing is registered (`release` is not called).
///
/// Returns [`FPROBE_E_NULL`], [`FPROBE_E_INVALID`](crate::FPROBE_E_INVALID) (no handler, or a
/// `data_size` above 64), [`FPROBE_E_NOT_PATCHABLE`] (a function that is
/// not a `-fpatchable-function-entry=7,5` function of a loaded object),
/// [`FPROBE_E_CAPACITY`] (4096 probes attached), [`FPROBE_E_OS`].
/// Thread-safe; not from a handler.
///
/// # Safety
///
/// `probe` is NULL or valid; `functions` (and `cookies` if not NULL) point
/// to `n` readable `u64`s; `handle_out` is NULL or writable; the handlers
/// follow the crate's handler rules.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_patch_attach(
    probe: *const fprobe_probe,
    functions: *const u64,
    cookies: *const u64,
    n: usize,
    handle_out: *mut u64,
) -> c_int {
    ffi(|| {
        // SAFETY: the pointers as the contract says.
        let (p, with_cookies) = unsafe { c_attach_args(probe, functions, cookies, n, handle_out) }?;
        let (probe, user) = c_probe::<Regs>(p);
        let a = fprobe_patch::attach_with_cookies(probe, with_cookies).map_err(patch_code)?;
        user.arm();
        let mut t = ATTACHED.lock().unwrap_or_else(|p| p.into_inner());
        t.0 += 1;
        let h = t.0;
        t.1.get_or_insert_with(HashMap::new).insert(h, a);
        // SAFETY: checked non-null; writable by the contract.
        unsafe { *handle_out = h };
        Ok(())
    })
}

/// Takes the attached probe `handle` names out of the table, for
/// detaching; [`FPROBE_E_BUSY`] from a handler (detaching waits for
/// handlers to finish), leaving it there.
fn take(handle: u64) -> Result<Attached, c_int> {
    if crate::codes::cannot_wait() {
        return Err(FPROBE_E_BUSY);
    }
    let mut t = ATTACHED.lock().unwrap_or_else(|p| p.into_inner());
    t.1.as_mut()
        .and_then(|m| m.remove(&handle))
        .ok_or(FPROBE_E_NOT_FOUND)
}

/// Detaches the probe `handle` names: when this returns none of its
/// handlers runs or will run (one grace period), and functions no other
/// attached probe uses run their entry nops again. The release callback
/// runs afterwards. Returns [`FPROBE_E_NOT_FOUND`] for an unknown or
/// detached handle, [`FPROBE_E_OS`], and [`FPROBE_E_BUSY`] (nothing
/// changes) from a handler. Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn fprobe_patch_detach(handle: u64) -> c_int {
    ffi(|| fprobe_patch::detach(take(handle)?).map_err(patch_code))
}

/// Detaches the probe `handle` names as [`fprobe_patch_detach`] does,
/// after waiting up to `timeout_ms` milliseconds for the calls in flight
/// on other threads to return through its exit handler; writes how many
/// were still in flight then (their exits skipped; 0: none) to
/// `*left_out` unless it is NULL. Returns as [`fprobe_patch_detach`].
/// Thread-safe; from a handler it returns [`FPROBE_E_BUSY`] and changes
/// nothing.
///
/// # Safety
///
/// `left_out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_patch_detach_draining(
    handle: u64,
    timeout_ms: u64,
    left_out: *mut u64,
) -> c_int {
    ffi(|| {
        let timeout = std::time::Duration::from_millis(timeout_ms);
        let left = fprobe_patch::detach_draining(take(handle)?, timeout).map_err(patch_code)?;
        if !left_out.is_null() {
            // SAFETY: non-null, writable by the contract.
            unsafe { *left_out = left };
        }
        Ok(())
    })
}

/// Writes the attached probe's counters to `*out`. Returns
/// [`FPROBE_E_NULL`], [`FPROBE_E_NOT_FOUND`].
///
/// # Safety
///
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_patch_stats(handle: u64, out: *mut fprobe_stats) -> c_int {
    ffi(|| {
        if out.is_null() {
            return Err(FPROBE_E_NULL);
        }
        let t = ATTACHED.lock().unwrap_or_else(|p| p.into_inner());
        let a = t.1.as_ref().and_then(|m| m.get(&handle));
        let s = a.ok_or(FPROBE_E_NOT_FOUND)?.stats();
        // SAFETY: checked non-null; writable by the contract.
        unsafe { *out = s.into() };
        Ok(())
    })
}

/// Lists the patchable functions (`-fpatchable-function-entry=7,5`) of
/// every loaded object: writes up to `cap` addresses, in address order,
/// to `out` (which may be NULL when `cap` is 0) and their number to
/// `*n_out`. Returns 0 for a sizing call (`out` NULL and `cap` 0: only
/// `*n_out` is written) and when all of them fit, [`FPROBE_E_NULL`],
/// [`FPROBE_E_OS`] (an object's file could not be read), or
/// [`FPROBE_E_CAPACITY`] when `cap > 0` and there are more than `cap` (the
/// first `cap` are written).
///
/// # Safety
///
/// `out` points to `cap` writable `u64`s (or is NULL with `cap = 0`);
/// `n_out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fprobe_patch_functions(
    out: *mut u64,
    cap: usize,
    n_out: *mut usize,
) -> c_int {
    ffi(|| {
        if n_out.is_null() || (out.is_null() && cap > 0) {
            return Err(FPROBE_E_NULL);
        }
        let fs: Vec<u64> = fprobe_patch::sites()
            .map_err(patch_code)?
            .iter()
            .filter(|s| s.layout == fprobe_patch::Layout::HotPatch)
            .map(|s| s.function)
            .collect();
        for (i, &f) in fs.iter().take(cap).enumerate() {
            // SAFETY: `i < cap` writable slots, by the contract.
            unsafe { out.add(i).write(f) };
        }
        // SAFETY: checked non-null; writable by the contract.
        unsafe { *n_out = fs.len() };
        if fs.len() > cap && !(out.is_null() && cap == 0) {
            Err(FPROBE_E_CAPACITY)
        } else {
            Ok(())
        }
    })
}
