//! The entry and exit trampolines and the per-thread return stack.
//!
//! # Return stack invariants
//!
//! One array per thread of `(return address, address of its stack slot)`;
//! `top` counts the entries in use. Only the owning thread touches it, and
//! a signal handler running on that thread may enter and leave patched
//! functions between any two of its instructions, so:
//!
//! * **an entry raises `top` before calling the probe layer** (reserving
//!   its entry, behind a compiler fence), fills the entry only if the
//!   call's exit is wanted, and otherwise lowers `top` back;
//! * **an exit lowers `top` only after its last read of the entry and
//!   after the probe layer's exit ran**, behind a compiler fence.
//!
//! A nested handler's calls therefore push and pop strictly above the
//! entries in use and leave `top` as they found it. An entry is written
//! before the stub takes the return address's slot, so an exit always
//! finds what it needs.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering, compiler_fence};

use crate::Regs;
use crate::runtime;

/// Calls with an exit to run a thread can have open at once;
/// deeper calls run no probe and are counted in [`missed`](crate::missed).
pub const RETURN_DEPTH: usize = 4096;

#[derive(Clone, Copy)]
struct Ret {
    /// The caller's return address.
    ret: u64,
    /// Where it was on the stack (the slot the stub then gave to its own
    /// return address, and the exit trampoline writes it back into).
    slot: u64,
}

struct ReturnStack {
    top: Cell<usize>,
    /// `RETURN_DEPTH` entries, allocated on the thread's first probed call.
    buf: Cell<*mut Ret>,
}

impl Drop for ReturnStack {
    fn drop(&mut self) {
        let buf = self.buf.get();
        // A thread leaving with entries in use (its thread-local
        // destructors ran inside a probed call, as under `pthread_exit`,
        // which the crate docs rule out for exit probes) leaks the buffer
        // rather than free memory a stale pointer could still reach.
        if !buf.is_null() && self.top.get() == 0 {
            // SAFETY: from `Box::into_raw` of a boxed slice of
            // RETURN_DEPTH entries, freed once.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(buf, RETURN_DEPTH)) });
        }
    }
}

std::thread_local! {
    static STACK: ReturnStack = const {
        ReturnStack { top: Cell::new(0), buf: Cell::new(std::ptr::null_mut()) }
    };
}

/// Calls skipped because their thread's return stack was full or gone.
pub(crate) static MISSED: AtomicU64 = AtomicU64::new(0);

impl ReturnStack {
    fn buf(&self) -> *mut Ret {
        let b = self.buf.get();
        if !b.is_null() {
            return b;
        }
        let fresh: Box<[Ret]> = vec![Ret { ret: 0, slot: 0 }; RETURN_DEPTH].into_boxed_slice();
        let b = Box::into_raw(fresh).cast::<Ret>();
        self.buf.set(b);
        b
    }
}

/// Creates the calling thread's return stack and probe-layer state now,
/// so that no probed call on it allocates (a thread whose first probed
/// call may come from a signal handler should call this first).
///
/// # Examples
///
/// ```
/// fprobe_patch::prepare_thread();
/// ```
pub fn prepare_thread() {
    STACK.with(|s| {
        s.buf();
    });
    runtime::registry().prepare_thread();
}

/// Called by the entry trampoline with the function, the address of its
/// return address on the stack and the saved argument registers. Returns
/// 1 when the call's exit is to be dispatched (its return address is kept
/// on the return stack: the stub calls the function and then the exit
/// trampoline), 0 otherwise (the stub jumps into the function).
extern "C" fn on_entry(function: u64, ret_slot: *const u64, regs: *const Regs) -> u64 {
    let r = runtime::registry();
    let done = STACK.try_with(|s| {
        let t = s.top.get();
        if t == RETURN_DEPTH {
            return None;
        }
        let buf = s.buf();
        s.top.set(t + 1);
        // The reservation is in memory before anything a signal handler
        // could run on this thread (program order is all a handler on the
        // same thread needs).
        compiler_fence(Ordering::SeqCst);
        // SAFETY: the trampoline passes the slot of the function's return
        // address, in the caller's live frame.
        let ret = unsafe { *ret_slot };
        // SAFETY: the trampoline's save area, live for this call.
        let regs = unsafe { &*regs };
        if r.on_entry_for_exit(function, ret, regs) {
            // SAFETY: `t < RETURN_DEPTH`, reserved above. The stub gives
            // the slot to its own return address once we return; the exit
            // trampoline finds entry `t` then.
            unsafe {
                buf.add(t).write(Ret {
                    ret,
                    slot: ret_slot as u64,
                })
            };
            Some(1)
        } else {
            compiler_fence(Ordering::SeqCst);
            s.top.set(t);
            Some(0)
        }
    });
    match done {
        Ok(Some(exit)) => exit,
        _ => {
            // Relaxed: a statistic.
            MISSED.fetch_add(1, Ordering::Relaxed);
            0
        }
    }
}

/// Called by the exit trampoline with the saved return registers and the
/// stack pointer after the function's `ret` (one above the slot its return
/// address was in); returns the caller's return address.
extern "C" fn on_exit(regs: *const Regs, sp: u64) -> u64 {
    let slot = sp - 8;
    // SAFETY: the trampoline's save area, live for this call.
    let regs = unsafe { &*regs };
    let r = runtime::registry();
    let ret = STACK.try_with(|s| {
        let buf = s.buf.get();
        loop {
            let t = s.top.get();
            if t == 0 || buf.is_null() {
                return None;
            }
            // SAFETY: `t - 1 < top ≤ RETURN_DEPTH`, an entry in use.
            let e = unsafe { buf.add(t - 1).read() };
            if e.slot > slot {
                return None; // an entry of a frame above ours: corrupt
            }
            r.on_exit(e.ret, regs);
            compiler_fence(Ordering::SeqCst);
            s.top.set(t - 1);
            if e.slot == slot {
                return Some(e.ret);
            }
            // Deeper than ours: a call that `longjmp` skipped. Its exit ran
            // just now; go on to ours.
        }
    });
    match ret {
        Ok(Some(ret)) => ret,
        _ => fatal(b"fprobe-patch: a return through the exit trampoline has no return address\n"),
    }
}

/// Writes `msg` to stderr and aborts: the return address is lost, there is
/// nowhere to return to.
fn fatal(msg: &[u8]) -> ! {
    // SAFETY: write(2) from a valid buffer; async-signal-safe.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    std::process::abort()
}

/// The entry and exit trampolines' addresses (the stubs call them): those
/// that save every caller-saved register, then those that save only the
/// argument (entry) and return (exit) registers, for functions that
/// clobber every call-clobbered register anyway (`clobber.rs`).
pub(crate) fn trampolines() -> [u64; 4] {
    [
        fprobe_patch_entry as *const () as u64,
        fprobe_patch_exit as *const () as u64,
        fprobe_patch_entry_args as *const () as u64,
        fprobe_patch_exit_ret as *const () as u64,
    ]
}

unsafe extern "C" {
    fn fprobe_patch_entry();
    fn fprobe_patch_exit();
    fn fprobe_patch_entry_args();
    fn fprobe_patch_exit_ret();
}

// Both full trampolines save every caller-saved register (the stub's
// callers may keep values in any of them across the call, see
// `clobber.rs`): a 336-byte frame, rsp rounded down to 16 first (GCC calls static
// functions that need no alignment with whatever rsp it has,
// `-fipa-stack-alignment`; rbp keeps the entry rsp). Offsets: `Regs::gp`
// at 0 (rdi rsi rdx rcx r8 r9 rax r10), `Regs::xmm` at 64 (xmm0–7), then
// r11 at 192 and xmm8–15 at 208, which handlers do not see. rbx, rbp,
// r12–r15 are kept by the Rust callee (rbp restored here).
//
// The entry trampoline, called from `stub + 8`: [rbp + 8] is the stub's
// return address, 14 bytes past the function's address stored at the
// stub's start; [rbp + 16] is the function's return address. It leaves
// `on_entry`'s answer at [rbp - 8], which is 24 bytes below the stub's
// stack pointer once it returns (where the stub reads it).
//
// The exit trampoline, called by the stub once the function returned into
// it and the stub reserved the return-address slot again: [rbp + 16] is
// that slot, rbp + 24 the stack pointer after the function's `ret`. It
// writes the caller's return address from `on_exit` into the slot.
std::arch::global_asm!(
    ".pushsection .text.fprobe_patch,\"ax\",@progbits",
    // The frame layout above, at rsp. The argument registers, what `Regs`
    // holds (all an argument-only entry saves, `clobber.rs`).
    ".macro fprobe_patch_save_args",
    "mov [rsp + 0], rdi",
    "mov [rsp + 8], rsi",
    "mov [rsp + 16], rdx",
    "mov [rsp + 24], rcx",
    "mov [rsp + 32], r8",
    "mov [rsp + 40], r9",
    "mov [rsp + 48], rax",
    "mov [rsp + 56], r10",
    "movaps [rsp + 64], xmm0",
    "movaps [rsp + 80], xmm1",
    "movaps [rsp + 96], xmm2",
    "movaps [rsp + 112], xmm3",
    "movaps [rsp + 128], xmm4",
    "movaps [rsp + 144], xmm5",
    "movaps [rsp + 160], xmm6",
    "movaps [rsp + 176], xmm7",
    ".endm",
    ".macro fprobe_patch_restore_args",
    "mov rdi, [rsp + 0]",
    "mov rsi, [rsp + 8]",
    "mov rdx, [rsp + 16]",
    "mov rcx, [rsp + 24]",
    "mov r8, [rsp + 32]",
    "mov r9, [rsp + 40]",
    "mov rax, [rsp + 48]",
    "mov r10, [rsp + 56]",
    "movaps xmm0, [rsp + 64]",
    "movaps xmm1, [rsp + 80]",
    "movaps xmm2, [rsp + 96]",
    "movaps xmm3, [rsp + 112]",
    "movaps xmm4, [rsp + 128]",
    "movaps xmm5, [rsp + 144]",
    "movaps xmm6, [rsp + 160]",
    "movaps xmm7, [rsp + 176]",
    ".endm",
    // Every caller-saved register: the argument registers, then r11 and
    // xmm8-15.
    ".macro fprobe_patch_save",
    "fprobe_patch_save_args",
    "mov [rsp + 192], r11",
    "movaps [rsp + 208], xmm8",
    "movaps [rsp + 224], xmm9",
    "movaps [rsp + 240], xmm10",
    "movaps [rsp + 256], xmm11",
    "movaps [rsp + 272], xmm12",
    "movaps [rsp + 288], xmm13",
    "movaps [rsp + 304], xmm14",
    "movaps [rsp + 320], xmm15",
    ".endm",
    ".macro fprobe_patch_restore",
    "fprobe_patch_restore_args",
    "mov r11, [rsp + 192]",
    "movaps xmm8, [rsp + 208]",
    "movaps xmm9, [rsp + 224]",
    "movaps xmm10, [rsp + 240]",
    "movaps xmm11, [rsp + 256]",
    "movaps xmm12, [rsp + 272]",
    "movaps xmm13, [rsp + 288]",
    "movaps xmm14, [rsp + 304]",
    "movaps xmm15, [rsp + 320]",
    ".endm",
    // The return registers only (an argument-only exit).
    ".macro fprobe_patch_save_ret",
    "mov [rsp + 16], rdx",
    "mov [rsp + 48], rax",
    "movaps [rsp + 64], xmm0",
    "movaps [rsp + 80], xmm1",
    ".endm",
    ".macro fprobe_patch_restore_ret",
    "mov rdx, [rsp + 16]",
    "mov rax, [rsp + 48]",
    "movaps xmm0, [rsp + 64]",
    "movaps xmm1, [rsp + 80]",
    ".endm",
    // The entry trampoline's body with a save and restore macro.
    ".macro fprobe_patch_entry_body save, restore",
    "endbr64",
    "push rbp",
    "mov rbp, rsp",
    "sub rsp, 16",
    "and rsp, -16",
    "sub rsp, 336",
    "\\save",
    "mov rdi, [rbp + 8]",
    "mov rdi, [rdi - 14]",
    "lea rsi, [rbp + 16]",
    "mov rdx, rsp",
    "call {on_entry}",
    "mov [rbp - 8], rax",
    "\\restore",
    "mov rsp, rbp",
    "pop rbp",
    "ret",
    ".endm",
    ".macro fprobe_patch_exit_body save, restore",
    "endbr64",
    "push rbp",
    "mov rbp, rsp",
    "and rsp, -16",
    "sub rsp, 336",
    "\\save",
    "mov rdi, rsp",
    "lea rsi, [rbp + 24]",
    "call {on_exit}",
    "mov [rbp + 16], rax",
    "\\restore",
    "mov rsp, rbp",
    "pop rbp",
    "ret",
    ".endm",
    ".globl fprobe_patch_entry",
    ".type fprobe_patch_entry,@function",
    ".p2align 4",
    "fprobe_patch_entry:",
    // Reached by `call [..]`: a landing pad for indirect-branch tracking.
    "fprobe_patch_entry_body fprobe_patch_save, fprobe_patch_restore",
    ".size fprobe_patch_entry, . - fprobe_patch_entry",
    "",
    ".globl fprobe_patch_exit",
    ".type fprobe_patch_exit,@function",
    ".p2align 4",
    "fprobe_patch_exit:",
    "fprobe_patch_exit_body fprobe_patch_save, fprobe_patch_restore",
    ".size fprobe_patch_exit, . - fprobe_patch_exit",
    "",
    ".globl fprobe_patch_entry_args",
    ".type fprobe_patch_entry_args,@function",
    ".p2align 4",
    "fprobe_patch_entry_args:",
    "fprobe_patch_entry_body fprobe_patch_save_args, fprobe_patch_restore_args",
    ".size fprobe_patch_entry_args, . - fprobe_patch_entry_args",
    "",
    ".globl fprobe_patch_exit_ret",
    ".type fprobe_patch_exit_ret,@function",
    ".p2align 4",
    "fprobe_patch_exit_ret:",
    "fprobe_patch_exit_body fprobe_patch_save_ret, fprobe_patch_restore_ret",
    ".size fprobe_patch_exit_ret, . - fprobe_patch_exit_ret",
    ".popsection",
    on_entry = sym on_entry,
    on_exit = sym on_exit,
);
