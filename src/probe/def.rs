//! What a probe is: its handlers, the contexts they see, and its per-call
//! data size.

use std::any::Any;
use std::ffi::c_void;
use std::fmt;

use super::ffi::{CEngineCtx, CEntryFn, CExitFn, CHandler};

/// What an entry handler sees.
pub struct EntryContext<'a, C> {
    /// The probed function's address.
    pub addr: u64,
    /// The return (caller) address the engine passed.
    pub ret_addr: u64,
    /// The cookie given for this (probe, address) at registration.
    pub cookie: u64,
    /// The engine's context (registers, arguments…).
    pub ctx: &'a C,
    /// Per-call data for the exit handler: `data_size` bytes, 8-byte
    /// aligned, zeroed only the first time the thread's shadow stack is
    /// used (its previous contents are unspecified). Empty when the probe
    /// has no exit handler or the thread's shadow stack is full
    /// ([`Missed::depth`](super::Missed::depth)).
    pub data: &'a mut [u8],
}

/// What an exit handler sees.
///
/// Exit handlers run inside the exit's RCU read-side section, as entry
/// handlers run inside the entry's: they must not wait for a grace period
/// ([`rcu::synchronize`](crate::rcu::synchronize) panics there), and
/// [`Registry::unregister`](super::Registry::unregister) returns once every
/// running exit handler of the probe has returned.
pub struct ExitContext<'a, C> {
    /// The probed function's address.
    pub addr: u64,
    /// The return address the engine passed to `on_exit`.
    pub ret_addr: u64,
    /// The cookie given for this (probe, address) at registration.
    pub cookie: u64,
    /// The engine's context at return.
    pub ctx: &'a C,
    /// The data the entry handler wrote.
    pub data: &'a [u8],
}

/// An entry handler's verdict on the exit handler of this call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryAction {
    /// Call the exit handler when the function returns.
    Continue,
    /// Do not call the exit handler for this call.
    SkipExit,
}

pub(super) type EntryFn<C> = dyn Fn(&mut EntryContext<'_, C>) -> EntryAction + Send + Sync;
pub(super) type ExitFn<C> = dyn Fn(&ExitContext<'_, C>) + Send + Sync;

/// A probe definition: handlers and per-call data size. Build with
/// [`Fprobe::builder`].
///
/// # Examples
///
/// ```
/// use fprobe::probe::{EntryAction, Fprobe};
///
/// let probe: Fprobe<()> = Fprobe::builder()
///     .data_size(8)
///     .entry(|e| {
///         e.data.copy_from_slice(&e.ret_addr.to_ne_bytes());
///         EntryAction::Continue
///     })
///     .exit(|x| assert_eq!(x.data, x.ret_addr.to_ne_bytes()))
///     .build();
/// assert_eq!(probe.data_size(), 8);
/// ```
pub struct Fprobe<C> {
    /// At most one of `entry` and `c_entry` is set, and of `exit` and
    /// `c_exit` (the builder's). Separate fields rather than an enum, so
    /// that a Rust handler costs dispatch one test, as with no C kind.
    pub(super) entry: Option<Box<EntryFn<C>>>,
    pub(super) exit: Option<Box<ExitFn<C>>>,
    pub(super) c_entry: Option<CHandler<CEntryFn>>,
    pub(super) c_exit: Option<CHandler<CExitFn>>,
    pub(super) data_size: usize,
    /// The message of the first panic of its handlers (`panics.rs`).
    pub(super) first_panic: super::panics::FirstPanic,
    /// Dropped with the probe, after its handlers (field order).
    owned: Option<Box<dyn Any + Send + Sync>>,
}

impl<C> fmt::Debug for Fprobe<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fprobe")
            .field("entry", &(self.entry.is_some() || self.c_entry.is_some()))
            .field("exit", &self.has_exit())
            .field("data_size", &self.data_size)
            .finish()
    }
}

impl<C> Fprobe<C> {
    /// A probe with no handlers yet.
    ///
    /// # Examples
    ///
    /// ```
    /// let probe = fprobe::probe::Fprobe::<()>::builder().build();
    /// assert_eq!(probe.data_size(), 0);
    /// ```
    pub fn builder() -> FprobeBuilder<C> {
        FprobeBuilder {
            probe: Fprobe {
                entry: None,
                exit: None,
                c_entry: None,
                c_exit: None,
                data_size: 0,
                first_panic: super::panics::FirstPanic::new(),
                owned: None,
            },
        }
    }

    /// Bytes of per-call data passed from entry to exit.
    pub fn data_size(&self) -> usize {
        self.data_size
    }

    /// Whether the probe has an exit handler (Rust or C).
    pub(super) fn has_exit(&self) -> bool {
        self.exit.is_some() || self.c_exit.is_some()
    }

    /// Whether the probe has an entry handler (Rust or C).
    pub(super) fn has_entry(&self) -> bool {
        self.entry.is_some() || self.c_entry.is_some()
    }
}

/// Builds an [`Fprobe`].
#[must_use]
pub struct FprobeBuilder<C> {
    probe: Fprobe<C>,
}

impl<C> FprobeBuilder<C> {
    /// The entry handler.
    pub fn entry(
        mut self,
        f: impl Fn(&mut EntryContext<'_, C>) -> EntryAction + Send + Sync + 'static,
    ) -> Self {
        self.probe.entry = Some(Box::new(f));
        self.probe.c_entry = None;
        self
    }

    /// The exit handler; with one, every hit keeps the probe's identity and
    /// per-call data on the thread's shadow stack until the return.
    pub fn exit(mut self, f: impl Fn(&ExitContext<'_, C>) + Send + Sync + 'static) -> Self {
        self.probe.exit = Some(Box::new(f));
        self.probe.c_exit = None;
        self
    }

    /// Bytes of per-call data passed from entry to exit (default 0; at
    /// most the registry's `data_size`).
    pub fn data_size(mut self, bytes: usize) -> Self {
        self.probe.data_size = bytes;
        self
    }

    /// A value the probe owns: dropped when the probe is, after its last
    /// handler call (a registered probe is dropped after the grace period
    /// of its unregistering). For what a foreign handler's `user` pointer
    /// needs released.
    pub fn owns(mut self, value: impl Any + Send + Sync) -> Self {
        self.probe.owned = Some(Box::new(value));
        self
    }

    /// The probe.
    pub fn build(self) -> Fprobe<C> {
        self.probe
    }
}

impl<C: CEngineCtx> FprobeBuilder<C> {
    /// The entry handler, a C function called with `user` and a
    /// [`CEntryContext`](super::CEntryContext) whose `engine_ctx` is the
    /// engine's context as [`CEngineCtx::REPR`] says. Dispatch calls
    /// it directly (no closure, no context copied in between) and does not
    /// catch unwinding: a C function cannot unwind.
    ///
    /// # Safety
    ///
    /// `f` may be called with `user` and a valid context from any thread,
    /// concurrently, as long as the probe lives.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::ffi::{c_int, c_void};
    /// use fprobe::probe::{CEngineCtx, CEngineRepr, CEntryContext, Fprobe, Registry};
    ///
    /// struct Ctx;
    /// // SAFETY: `ByAddress` makes no claim on the layout.
    /// unsafe impl CEngineCtx for Ctx {
    ///     const REPR: CEngineRepr = CEngineRepr::ByAddress;
    /// }
    ///
    /// unsafe extern "C" fn count(user: *mut c_void, _: *mut CEntryContext) -> c_int {
    ///     // SAFETY: `user` is the `AtomicU64` below, alive while the probe is.
    ///     let n = unsafe { &*user.cast::<std::sync::atomic::AtomicU64>() };
    ///     n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ///     0
    /// }
    ///
    /// static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    /// let registry = Registry::<Ctx>::builder().build().unwrap();
    /// // SAFETY: `count` takes any thread, and `CALLS` lives forever.
    /// let probe = unsafe { Fprobe::builder().entry_c(count, (&raw const CALLS).cast_mut().cast()) };
    /// registry.register(probe.build(), &[0x1000]).unwrap();
    /// registry.on_entry(0x1000, 0, &Ctx);
    /// registry.on_exit(0, &Ctx);
    /// assert_eq!(CALLS.load(std::sync::atomic::Ordering::Relaxed), 1);
    /// ```
    pub unsafe fn entry_c(mut self, f: CEntryFn, user: *mut c_void) -> Self {
        self.probe.c_entry = Some(CHandler {
            f,
            user,
            repr: C::REPR,
        });
        self.probe.entry = None;
        self
    }

    /// The exit handler, a C function called with `user` and a
    /// [`CExitContext`](super::CExitContext); as [`entry_c`](Self::entry_c).
    ///
    /// # Safety
    ///
    /// As [`entry_c`](Self::entry_c).
    pub unsafe fn exit_c(mut self, f: CExitFn, user: *mut c_void) -> Self {
        self.probe.c_exit = Some(CHandler {
            f,
            user,
            repr: C::REPR,
        });
        self.probe.exit = None;
        self
    }
}
