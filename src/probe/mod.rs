//! The probe layer: the kernel's fprobe in userspace.
//!
//! A [`Fprobe`] bundles an entry handler, an optional exit handler and the
//! size of the per-call data passed from one to the other. A [`Registry`]
//! attaches probes to many addresses at once (all or nothing) and
//! dispatches: an engine calls [`Registry::on_entry`] from its hook or
//! trampoline when a function is entered and [`Registry::on_exit`] when it
//! returns, once for every `on_entry`, in LIFO order (as a return
//! trampoline or `-finstrument-functions` does). An engine that replaces
//! return addresses calls [`Registry::on_entry_taking_return`] instead,
//! which keeps the caller's return address in the call's frame when an
//! exit is to run, and [`Registry::on_return`] gives it back.
//!
//! # Design
//!
//! * **Definition** (`def.rs`): handlers are boxed closures; the contexts
//!   they see carry the address, the return address, the attachment's
//!   cookie, the engine's context and the per-call data. A foreign-function
//!   layer gives C functions instead (`ffi.rs`,
//!   [`FprobeBuilder::entry_c`]): dispatch builds their `#[repr(C)]`
//!   contexts and calls them directly, with no closure in between.
//! * **Registry** (`registry.rs`): an [`AddrIndex`](crate::AddrIndex) from
//!   address to attachments `(slot, generation, cookie, probe)`, and a
//!   fixed array of probe slots whose generation word tells live probes
//!   from unregistered ones, even across slot reuse.
//! * **Dispatch** (`dispatch.rs`): entry is one lookup and one pass over
//!   the address's attachments; it pushes one frame on the thread's shadow
//!   stack holding every exit handler's identity, cookie and per-call data
//!   (`shadow.rs`). Exit pops the frame and never queries the index.
//! * **Freeing a probe**: every dispatch, entry or exit, runs inside a
//!   read-side section of the thread's RCU record; `unregister` changes
//!   the probe's generation, waits for a grace period, then frees it.
//! * **One per-thread context** (`crate::context`): the thread's RCU
//!   record, whose one word is the read-side nesting, the mark of a
//!   running dispatch and the recursion guard's first level; the registry
//!   the thread dispatched through last and its state there; the
//!   recursion guard's other levels. A dispatch reaches it once.
//! * **Per-thread state** (the shadow stack and counters) is found in the
//!   context, else through the crate's `PerThread`: one thread-local load
//!   and one compare, no walk over other registries; it is freed with the
//!   registry, and the state of an exited thread is adopted by the next
//!   thread given its index.
//! * **Recursion guard per context** (`recursion.rs`): a probed call made
//!   while a handler of the same context runs is refused and counted; a
//!   signal handler that interrupted a handler is another context, and its
//!   probes run.
//! * **Counters** (`stats.rs`) are per thread and per slot, stored by their
//!   thread only and summed on read: a plain add in the outermost dispatch,
//!   a one-instruction increment in a nested one (a bank of their own), so
//!   no shared-line write on the hit path and no lost increment.
//!
//! # Consistency
//!
//! * A probe's handlers run for every call entered after
//!   [`register`](Registry::register) returned, at every address it was
//!   attached to, and for no call entered after
//!   [`unregister`](Registry::unregister) began.
//! * An exit handler runs only for a call whose entry ran the same probe
//!   (same registration) and kept a frame, with the data that entry wrote;
//!   never for a probe unregistered in between, even if its slot was
//!   reused.
//! * When `unregister` returns no handler of the probe is running or will
//!   run. It never waits for a thread parked between entry and exit (that
//!   call's exit handler is skipped), so it cannot hang on one, nor for a
//!   thread that did not survive a `fork` (the RCU's fork handler marks
//!   such threads' records quiescent).
//! * [`drain`](Registry::drain) stops a probe's entries and waits, up to a
//!   timeout, until its calls in flight on other threads have returned
//!   ([`ProbeStats::in_flight`], less the caller's own, reaches 0): drained,
//!   then unregistered, a probe has ended every call that kept its exit by
//!   running the exit handler, unless the exit was refused (recursion, an
//!   ignored thread, counted) or the call forgotten by a pairing reset.
//! * A pairing reset never forgets a call whose return was taken over
//!   (nor the frames below it): [`on_return`](Registry::on_return) hands
//!   its return address back whatever happened in between.
//! * A call that never returns (an exception, a forced unwind or a
//!   `longjmp` went past it) runs no exit handler, as in the kernel's
//!   fgraph: an engine that takes returns over finds it by stack address
//!   ([`on_return`](Registry::on_return) of a caller, or the next entry
//!   taking its return from higher up the stack) and ends it, counted in
//!   [`Missed::unwound`].
//!
//! # Execution context
//!
//! | operation | blocks? | allocates? | async-signal-safe? |
//! |---|---|---|---|
//! | [`on_entry`](Registry::on_entry), [`on_exit`](Registry::on_exit), [`on_entry_taking_return`](Registry::on_entry_taking_return), [`on_return`](Registry::on_return) | never | a thread's first dispatch through a registry only (its state; [`prepare_thread`](Registry::prepare_thread) does it ahead) | yes, once the thread's state exists |
//! | [`register`](Registry::register) | briefly (registry mutex, index stripes) | yes | no |
//! | [`unregister`](Registry::unregister) | yes: a grace period (every dispatch running on another thread ends) | no | no |
//! | [`drain`](Registry::drain) | yes: a grace period, then until the calls in flight return or the timeout | no | no |
//! | [`enable`](Registry::enable), [`disable`](Registry::disable), [`stats`](Registry::stats) | briefly (registry mutex) | no | no |
//! | [`reset_pairing`](Registry::reset_pairing) | never | no | yes |
//! | [`prepare_thread`](Registry::prepare_thread) | briefly, once per thread (thread-index mutex) | the thread's state in the registry, once (and the thread's RCU record and index, if new) | no |
//! | [`ignore_current_thread`] | never | no | no (a handler may call it) |
//!
//! **Signals.** A signal handler may dispatch at any instruction of
//! another dispatch on the same thread, through the same registry or
//! another: the shadow stack, the counters and the recursion guard are
//! kept consistent by nested code restoring what it changed before it
//! returns, with the word that publishes a change written last (the
//! arguments are in `shadow.rs` and `recursion.rs`). The interrupted
//! call's pairing and data are unaffected, and the signal handler's probes
//! run unless a handler of its own context is running. A signal handler
//! that does not return (`longjmp` out of it) abandons the frames it
//! pushed: the engine must then call [`Registry::reset_pairing`].
//!
//! A handler that panics is caught at the dispatch boundary (unwinding into
//! an engine's trampoline or C frames would be undefined behaviour), counted
//! in [`ProbeStats::panics`], and dispatch goes on. Its message is printed
//! once per probe and kept ([`Registry::first_panic`]), not printed on every
//! call: the first registry built chains a panic hook that keeps the
//! messages of panics raised during a dispatch off the output (`panics.rs`).
//!
//! # Performance
//!
//! An entry is: the thread's context (one thread-local block), its
//! dispatch section (one load and one store of the thread's RCU word, and
//! the epoch's load when no section is open), the cached state's key
//! compare, the index lookup, per attachment one load of the slot's state
//! word, a counter increment (a plain add) and the handler call, and a
//! frame push or one added to the bare word. An exit that ends a bare
//! call is the context, a key compare and one store, with no section; an
//! exit with handlers adds the section and, per kept handler, three stack
//! reads, the state load, the call and a counter increment. Nested
//! dispatches (a handler's, a signal handler's) and a thread's first one
//! take a cold path. `scripts/instructions.sh` counts an entry + exit
//! pair's instructions under callgrind, without an exit handler and with
//! one (`benches/instructions.rs`, modes `kprobe` and `kretprobe`), and
//! fails when either rises. A lock-free exit and per-thread everything
//! make dispatch scale with threads where a locked table collapses.
//! Figures: `BENCHMARKS.md`, sections "Probe dispatch" and "Instruction
//! counts (callgrind)".
//!
//! # Examples
//!
//! ```
//! use fprobe::probe::{EntryAction, Fprobe, Registry};
//!
//! let registry = Registry::<()>::builder().build().unwrap();
//! let probe = Fprobe::builder()
//!     .data_size(8)
//!     .entry(|e| {
//!         e.data.copy_from_slice(&e.ret_addr.to_ne_bytes());
//!         EntryAction::Continue
//!     })
//!     .exit(|x| assert_eq!(x.data, x.ret_addr.to_ne_bytes()))
//!     .build();
//! let h = registry.register(probe, &[0x4011d0]).unwrap();
//! registry.on_entry(0x4011d0, 0x400500, &());
//! registry.on_exit(0x400500, &());
//! assert_eq!(registry.stats(h).unwrap().exits, 1);
//! ```

mod def;
mod dispatch;
mod ffi;
mod panics;
mod recursion;
mod registry;
mod section;
mod shadow;
mod stats;

pub use def::{EntryAction, EntryContext, ExitContext, Fprobe, FprobeBuilder};
pub use dispatch::{KeptReturn, ignore_current_thread, in_handler};
pub use ffi::{
    C_SKIP_EXIT, CEngineCtx, CEngineRepr, CEntryContext, CEntryFn, CExitContext, CExitFn,
};
pub use registry::{MAX_DATA_SIZE, ProbeHandle, Registry, RegistryBuilder};
pub use section::DispatchSection;
pub use stats::{Missed, ProbeStats};
