//! What a probe is: its handlers, the contexts they see, and its per-call
//! data size.

use std::fmt;

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
    pub(super) entry: Option<Box<EntryFn<C>>>,
    pub(super) exit: Option<Box<ExitFn<C>>>,
    pub(super) data_size: usize,
}

impl<C> fmt::Debug for Fprobe<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fprobe")
            .field("entry", &self.entry.is_some())
            .field("exit", &self.exit.is_some())
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
                data_size: 0,
            },
        }
    }

    /// Bytes of per-call data passed from entry to exit.
    pub fn data_size(&self) -> usize {
        self.data_size
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
        self
    }

    /// The exit handler; with one, every hit keeps the probe's identity and
    /// per-call data on the thread's shadow stack until the return.
    pub fn exit(mut self, f: impl Fn(&ExitContext<'_, C>) + Send + Sync + 'static) -> Self {
        self.probe.exit = Some(Box::new(f));
        self
    }

    /// Bytes of per-call data passed from entry to exit (default 0; at
    /// most the registry's `data_size`).
    pub fn data_size(mut self, bytes: usize) -> Self {
        self.probe.data_size = bytes;
        self
    }

    /// The probe.
    pub fn build(self) -> Fprobe<C> {
        self.probe
    }
}
