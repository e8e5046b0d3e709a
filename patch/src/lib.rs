//! Attach probes at run time to functions compiled with
//! `-fpatchable-function-entry=7,5` (GCC or Clang, x86-64 Linux): the
//! userspace ftrace under fprobe's probe layer. A detached function runs
//! its two entry nops and nothing else; an attached one calls the probe
//! layer's entry and, when one of its probes has an exit handler, the
//! probe layer's exit when it returns.
//!
//! # Layout and patching
//!
//! The compiler leaves, for each function `f`, five one-byte nops before
//! `f` and two at `f`, and lists the first in the object's
//! `__patchable_function_entries` section ([`sites`] reads it for the
//! executable and every loaded shared object). Attaching `f`:
//!
//! 1. **Stub.** Every site of a module gets a 64-byte stub in a page
//!    mapped within ±2 GiB of the module, which calls the entry trampoline
//!    and then either jumps to `f+2` or, when the call's exit is wanted,
//!    calls `f+2` and then the exit trampoline (`stubs.rs`). As its caller
//!    sees it, it changes no register but the flags.
//!    Stubs are written once, with their unwind information registered
//!    (`unwind.rs`), before any site can reach them, and never change or go
//!    away.
//! 2. **Prefix.** The five bytes before `f` become `jmp stub` (`e9 rel32`).
//!    No thread executes them: they sit between two functions and are
//!    reached only through step 3, which is not there yet.
//! 3. **Serialise.** `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE)`
//!    makes every thread of the process execute a serialising instruction,
//!    so none holds stale bytes of the prefix (the cross-modifying-code rule
//!    of the Intel and AMD manuals). Without that command (kernels before
//!    4.16) the `mprotect` that restores the page's protections stands in:
//!    it shoots down the TLB of every CPU running the process, an interrupt,
//!    which serialises.
//! 4. **Entry.** The two nops at `f` become `jmp f-5` (`eb f9`) in one
//!    2-byte store, which x86-64 makes atomic for an access that does not
//!    cross an 8-byte boundary (checked; such a site is refused). A thread
//!    fetches either both nops or the jump. One that ran the first nop just
//!    before the store then runs `f9` alone: `stc`, which sets the carry
//!    flag, dead at a function's entry, and falls into `f+2` as before.
//! 5. **Serialise** again: every call entered after `attach` returns goes
//!    through the probes.
//!
//! Detaching stores the two nops back (one 2-byte store) and serialises.
//! A thread inside a detached function returns through its stub; its exit
//! handlers are skipped, unless the probe was detached with
//! [`detach_draining`], which first waits for such calls to return.
//! The prefix keeps its jump: it is reached only through the entry jump,
//! and a thread preempted between the two must still find it, so it is
//! never rewritten once written (a later attach reuses it). Pages are made
//! writable only around the stores, one `mprotect` per run of contiguous
//! pages, and get back the protections of their `PT_LOAD` segment. Every
//! patch and unpatch runs under one process-wide mutex.
//!
//! # Trampolines and the shadow stack
//!
//! The entry trampoline saves every caller-saved register (a caller may
//! keep values in some across the call when its compiler knows the callee
//! leaves them alone), the SysV argument registers (`rdi rsi rdx rcx r8
//! r9`, `rax` for variadic calls, `r10`, `xmm0`–`xmm7`) into a [`Regs`],
//! which the handlers see as their context. A function that makes a call
//! its compiler cannot see into (through the PLT or a pointer, itself or
//! through functions of its object it calls) clobbers every caller-saved
//! register as far as its callers know; with
//! [`ArgumentOnlySaves::WhereFunctionsCallOut`] (for SysV code, see
//! [`set_argument_only_saves`]) its trampolines keep only the argument
//! registers at entry and the return registers at exit, found by decoding
//! the object's functions when its stubs are made; with
//! [`ArgumentOnlySaves::Everywhere`] every function's do, for code whose
//! compiler allocated no registers across functions (GCC with
//! `-fpatchable-function-entry` on the command line, Clang).
//! ([`register_save`] says which a function got.) Then it calls
//! [`fprobe::probe::Registry::on_entry_keeping_return`]. When that keeps a
//! frame (some probe has an exit handler to run), the frame, on the
//! probe layer's per-thread shadow stack, also holds the caller's return
//! address, the address of its stack slot and the caller's `rbx`; the stub
//! puts the frame's address in `rbx` and calls the function's body with
//! its own
//! return address in that slot: stack arguments stay where the function
//! looks for them, and the function returns into the stub, where the
//! processor predicts it will (overwriting the return address with a
//! trampoline's, as the kernel's fgraph and uftrace do, costs a
//! mispredicted return per call: 7 ns of 58 in the SQLite profile). The
//! function preserves `rbx` (callee-saved), so while it runs the stub's
//! unwind information finds the caller's return address and `rbx` in the
//! frame through it (`DW_CFA_expression`s on `rbx`, `unwind.rs`): an
//! unwinder walks from the function, or from a handler through the
//! trampolines (which carry `.cfi` directives), to the real caller. When
//! the function returns, the stub pushes the return address back into its
//! slot and restores the caller's `rbx` from the frame, then calls the
//! exit trampoline, which saves every caller-saved register again, or only
//! the return value's `rax rdx xmm0 xmm1`, runs
//! [`fprobe::probe::Registry::on_return`], which pops the frame, runs the
//! exit handlers and hands the caller's return address back; the exit
//! trampoline writes it into the slot (it is there already), and the stub
//! returns there.
//!
//! The shadow stack follows the probe layer's rule against signals: an
//! entry reserves its frame before anything a signal handler could run,
//! an exit releases it only after its last read; a signal handler's own
//! calls push and pop above. Its depth is the registry's: a call deeper
//! than that runs its entry handlers only, counted in
//! [`fprobe::probe::Missed::depth`], and returns straight to its caller.
//!
//! # Hazards
//!
//! * **The optimiser calls less than the source does.** At `-O2` a
//!   compiler that sees a function's body may fold or skip calls to it
//!   even when it is not inlined: GCC's interprocedural passes find a
//!   `noinline` function pure and compute repeated calls once, or
//!   propagate a constant result, so an attached function is called
//!   fewer times than the source says (a hit count of 0 for a function
//!   the loop "calls" a million times). Probes see calls, not source: for
//!   a function whose every call must be seen (a test, a benchmark), use
//!   `__attribute__((noipa))` (GCC; Clang: `optnone`, or define it in
//!   another translation unit without LTO), or give it a side effect the
//!   compiler cannot remove (a `volatile` access).
//! * **Recursion.** A handler that calls a patched function enters the
//!   trampoline again; the probe layer's per-context guard refuses it
//!   (counted in [`fprobe::probe::Missed::recursion`]) and the call runs
//!   unprobed.
//! * **Signals.** A signal handler running patched code is a new context:
//!   its probes run, and it nests on the shadow stack as above. A thread's
//!   first probed call allocates its state; [`prepare_thread`] does it
//!   ahead for threads whose first probed call may come from a signal
//!   handler.
//! * **C++ exceptions, `pthread_exit`, `pthread_cancel`, backtraces.**
//!   Every stub and trampoline has unwind information, registered with
//!   libgcc's unwinder (`__register_frame`) when it is made, so an
//!   exception or a forced unwind crosses a call with an exit probe, its
//!   catch blocks and destructors run as without probes, and
//!   `backtrace(3)`, `_Unwind_Backtrace` and profilers that walk
//!   `.eh_frame` name the real callers (each stub shows as a frame of its
//!   own between them). The unwinder finds the caller's return address in
//!   the call's shadow-stack frame through `rbx` (`unwind.rs`), so a
//!   function that breaks the ABI by not preserving `rbx` (hand-written
//!   assembly) must not get an exit probe. A debugger that reads only the
//!   objects' files (gdb without the process's registered frames) stops at
//!   a stub. Asynchronous cancellation (`PTHREAD_CANCEL_ASYNCHRONOUS`) may
//!   strike inside a dispatch, in Rust code no unwind may cross: it is
//!   not supported on threads that run probed code (deferred cancellation,
//!   the default, is).
//! * **Calls that never return** (an exception, a forced unwind or a
//!   `longjmp` went past them). Each kept frame records where the return
//!   address was. An exit that finds frames kept deeper than its own, or
//!   an entry that finds frames kept deeper than the place it is called
//!   from, ends them without running their exit handlers (as the kernel's
//!   fgraph does for the calls it skips: such a call has no return value,
//!   and the registers at hand are another call's), counted in
//!   [`fprobe::probe::Missed::unwound`]: the pairing recovers. A frame
//!   kept at the very slot of a later call stays until a call made from
//!   higher up, or its caller's return, ends it (a tail call looks the
//!   same and must not end it). The frames of a thread that ended by
//!   `pthread_exit` or cancellation end as unrun when its state is reused.
//!   A `longjmp` out of a signal handler running on an alternate signal
//!   stack leaves frames above the thread's stack, and the next exit
//!   aborts the process (it cannot tell where to return); entries made on
//!   an alternate signal stack end no frames.
//! * **Shadow stacks and indirect-branch tracking** (Intel CET): every
//!   `ret` returns to the address its `call` pushed (the stub's last `ret`
//!   to the one the caller pushed), so a hardware shadow stack stays
//!   balanced, and the trampolines start with `endbr64`. Not tested here:
//!   no CET-enabled process was at hand.
//! * **Stack switching** (`ucontext`, coroutine libraries) across a call
//!   with an exit probe is not supported: it breaks the shadow stack's
//!   order (the exit finds another stack's frame on top and the process
//!   aborts, or an entry on another stack ends live frames as unwound).
//!   Use entry probes only on functions a coroutine may switch out of.
//! * **`long double` returns** (`st0`) stay on the x87 stack while the
//!   exit handlers run and are not in [`Regs`]; handlers must not use x87
//!   code (Rust and C handlers do not, unless they compute in `long
//!   double`).
//! * **`-fcf-protection`** (the default of some distributions' compilers)
//!   puts `endbr64` before the entry nops: such functions are listed with
//!   [`Layout::Other`] and refused, never patched.
//! * **Vector arguments wider than 128 bits** (`__m256`, `__m512` by value)
//!   and return values are not preserved above their low 128 bits if a
//!   handler touches the upper halves, as any libc call may (`vzeroupper`):
//!   the trampolines save `xmm`, not `ymm`/`zmm`.
//! * **`fork`** after attach: the child inherits the patched code and the
//!   registry; its thread's shadow stack is the parent's copy, whose
//!   frames are the child's own. Threads created after attach are probed
//!   from their first call.
//! * **`dlclose`** of a library with attached sites: detach first where you
//!   can. Never unload an object while an attach to one of its functions
//!   runs (the attach reads and patches its code). A detach after the unload unregisters the probe and writes
//!   nothing where the library was (nor into an object loaded there since:
//!   only bytes holding the runtime's own entry jump are restored). Its
//!   stubs stay mapped, unreachable; an attach scans the loaded objects
//!   again when it meets a function it does not know or whose object is
//!   gone or was loaded again, and counts users per loaded copy, so a
//!   stale attachment neither blocks nor unpatches a new copy. Probes are
//!   keyed by address, though: one still attached to an unloaded copy
//!   also runs for a new copy's function at the same address until it is
//!   detached. [`sites`] reads the objects loaded at the time of the call
//!   and skips one whose file on disk no longer matches what is loaded.
//!
//! # Examples
//!
//! ```no_run
//! use fprobe::probe::{EntryAction, Fprobe};
//!
//! // Every patchable function of the process.
//! let functions: Vec<u64> = fprobe_patch::sites()?.iter().map(|s| s.function).collect();
//! let probe = Fprobe::<fprobe_patch::Regs>::builder()
//!     .entry(|e| {
//!         eprintln!("{:#x}({})", e.addr, e.ctx.arg(0));
//!         EntryAction::Continue
//!     })
//!     .build();
//! let attached = fprobe_patch::attach(probe, &functions)?;
//! // ... the program runs, probed ...
//! fprobe_patch::detach(attached)?;
//! # Ok::<(), fprobe_patch::Error>(())
//! ```

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
compile_error!("fprobe-patch patches x86-64 code on Linux only");

mod clobber;
mod error;
mod layout;
mod registry;
mod regs;
mod runtime;
mod sites;
mod stubs;
mod text;
mod tramp;
mod unwind;

pub use error::Error;
pub use layout::Layout;
pub use registry::registry;
pub use regs::Regs;
pub use runtime::{
    ArgumentOnlySaves, Attached, RegisterSave, attach, attach_with_cookies, detach,
    detach_draining, prepare, register_save, set_argument_only_saves,
};
pub use sites::{Site, sites};
pub use tramp::prepare_thread;
