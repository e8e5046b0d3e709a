//! Handlers called through C function pointers, for foreign-function
//! layers: dispatch builds a `#[repr(C)]` context and calls the function
//! directly, with no Rust closure in between to copy one context into the
//! other.

use std::ffi::{c_int, c_void};

/// What a C entry handler sees: `fprobe_entry_ctx` in `fprobe.h`, and
/// the context of a Rust engine's `FprobeBuilder::entry_c` handlers.
#[repr(C)]
#[derive(Debug)]
pub struct CEntryContext {
    /// The probed function's address.
    pub addr: u64,
    /// The return (caller) address the engine passed.
    pub ret_addr: u64,
    /// The cookie given for this (probe, address) at registration.
    pub cookie: u64,
    /// The engine's context: the pointer the engine passed to the entry
    /// (`fprobe_on_entry`), or for a Rust engine what its type's
    /// `CEngineCtx::REPR` says.
    pub engine_ctx: *mut c_void,
    /// `data_size` bytes of per-call data for the exit handler; null when
    /// there are none (the probe has no exit handler or asks for no data,
    /// or the thread's shadow stack is full). 8-byte aligned.
    pub data: *mut c_void,
    /// Bytes at `data` (0 when `data` is null).
    pub data_size: usize,
}

/// What a C exit handler sees: `fprobe_exit_ctx` in `fprobe.h`, and the
/// context of a Rust engine's `FprobeBuilder::exit_c` handlers.
#[repr(C)]
#[derive(Debug)]
pub struct CExitContext {
    /// The probed function's address.
    pub addr: u64,
    /// The return address the engine passed.
    pub ret_addr: u64,
    /// The cookie given for this (probe, address) at registration.
    pub cookie: u64,
    /// The engine's context at return: the pointer the engine passed to
    /// the exit (`fprobe_on_exit`), or as for the entry.
    pub engine_ctx: *mut c_void,
    /// The bytes the entry handler wrote (never null).
    pub data: *const c_void,
    /// Bytes at `data`.
    pub data_size: usize,
}

/// A C entry handler: `user` is the pointer given with it. Returns
/// [`C_SKIP_EXIT`] to skip this call's exit handler, anything else to run
/// it.
pub type CEntryFn = unsafe extern "C" fn(user: *mut c_void, ctx: *mut CEntryContext) -> c_int;

/// A C exit handler.
pub type CExitFn = unsafe extern "C" fn(user: *mut c_void, ctx: *const CExitContext);

/// What a [`CEntryFn`] returns to skip the call's exit handler.
pub const C_SKIP_EXIT: c_int = 1;

/// How C handlers see an engine context: as one pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CEngineRepr {
    /// The address of the context value.
    ByAddress,
    /// The pointer the context value is: the type is
    /// `#[repr(transparent)]` over a `*mut c_void`.
    ByValue,
}

/// An engine context that C handlers see as one pointer, without a call
/// to find it: what [`REPR`](Self::REPR) says.
///
/// # Safety
///
/// With [`CEngineRepr::ByValue`], `Self` is `#[repr(transparent)]` over
/// a `*mut c_void` (dispatch reads that pointer out of the value).
///
/// # Examples
///
/// ```
/// use fprobe::probe::{CEngineCtx, CEngineRepr};
///
/// // The handlers get a pointer to the saved registers.
/// struct Regs([u64; 8]);
/// // SAFETY: `ByAddress` makes no claim on the layout.
/// unsafe impl CEngineCtx for Regs {
///     const REPR: CEngineRepr = CEngineRepr::ByAddress;
/// }
///
/// // The handlers get the engine's own pointer.
/// #[repr(transparent)]
/// struct Engine(*mut std::ffi::c_void);
/// // SAFETY: `#[repr(transparent)]` over the pointer.
/// unsafe impl CEngineCtx for Engine {
///     const REPR: CEngineRepr = CEngineRepr::ByValue;
/// }
/// ```
pub unsafe trait CEngineCtx {
    /// How the handlers see the context.
    const REPR: CEngineRepr;
}

/// A C handler with its `user` pointer, and how to find the engine's
/// pointer in the context.
pub(super) struct CHandler<F> {
    pub(super) f: F,
    pub(super) user: *mut c_void,
    pub(super) repr: CEngineRepr,
}

impl<F> CHandler<F> {
    /// The `engine_ctx` of `ctx` for the handler.
    #[inline(always)]
    pub(super) fn engine_ctx<C>(&self, ctx: &C) -> *mut c_void {
        let p = (ctx as *const C).cast_mut().cast::<c_void>();
        match self.repr {
            CEngineRepr::ByAddress => p,
            // SAFETY: `CHandler`s are made only for a `C: CEngineCtx`
            // with this `REPR` (`entry_c`, `exit_c`), whose contract makes
            // `C` a pointer in a transparent wrapper.
            CEngineRepr::ByValue => unsafe { p.cast::<*mut c_void>().read() },
        }
    }
}

// SAFETY: the builder's contract (`entry_c`, `exit_c`): `f` may be called
// with `user` from any thread, concurrently.
unsafe impl<F> Send for CHandler<F> {}
// SAFETY: as above.
unsafe impl<F> Sync for CHandler<F> {}
