//! The entry and exit trampolines' Rust halves.
//!
//! A call whose exit is to run keeps the caller's return address, the
//! address of the stack slot it was in and the caller's `rbx` in the probe
//! layer's frame for the call ([`Registry::on_entry_keeping_return`](fprobe::probe::Registry::on_entry_keeping_return)),
//! on the thread's one shadow stack, which follows the probe layer's rule
//! against signals (a frame is reserved before anything a signal handler
//! could run and released only after its last read; a handler's own calls
//! push and pop above it). The frame is complete before the entry returns
//! to the stub, which only then gives the slot to its own return address,
//! so an exit always finds what it needs. Its depth is the registry's
//! (`max_depth`): a deeper call runs its entry handlers only, counted in
//! [`fprobe::probe::Missed::depth`], and returns straight to its caller.

use crate::registry::registry;
use crate::regs::Regs;

/// Creates the calling thread's probe-layer state now, so that no probed
/// call on it allocates (a thread whose first probed call may come from a
/// signal handler should call this first).
///
/// # Examples
///
/// ```
/// fprobe_patch::prepare_thread();
/// ```
pub fn prepare_thread() {
    registry().prepare_thread();
}

/// Called by the entry trampoline with the function, the address of its
/// return address on the stack, the saved argument registers and the
/// caller's `rbx`. Returns the address of the call's
/// [`KeptReturn`](fprobe::probe::KeptReturn) when the call's exit is to be
/// dispatched (its return address and `rbx` are kept in the probe layer's
/// frame: the stub puts the address in `rbx`, calls the function and then
/// the exit trampoline), 0 otherwise (the stub jumps into the function).
extern "C" fn on_entry(function: u64, ret_slot: *const u64, regs: *const Regs, rbx: u64) -> u64 {
    // SAFETY: the trampoline passes the slot of the function's return
    // address, in the caller's live frame.
    let ret = unsafe { *ret_slot };
    // SAFETY: the trampoline's save area, live for this call.
    let regs = unsafe { &*regs };
    registry()
        .on_entry_keeping_return(function, ret, ret_slot as u64, rbx, regs)
        .map_or(0, |k| k.as_ptr() as u64)
}

/// Called by the exit trampoline with the saved return registers and the
/// stack pointer after the function's `ret` (one above the slot its return
/// address was in); returns the caller's return address.
extern "C" fn on_exit(regs: *const Regs, sp: u64) -> u64 {
    // SAFETY: the trampoline's save area, live for this call.
    let regs = unsafe { &*regs };
    match registry().on_return(sp - 8, regs) {
        Some(ret) => ret,
        None => {
            fatal(b"fprobe-patch: a return through the exit trampoline has no return address\n")
        }
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
// r12–r15 are kept by the Rust callee (rbp restored here). Their `.cfi_*`
// directives describe that frame (`CFA = rbp + 16` once rbp is set), so a
// walk from a handler reaches the stub, whose own unwind information
// (`unwind.rs`) leads to the function's caller.
//
// The entry trampoline, called from `stub + 8`: [rbp + 8] is the stub's
// return address, 14 bytes past the function's address stored at the
// stub's start; [rbp + 16] is the function's return address. It leaves
// `on_entry`'s answer at [rbp - 8], which is 24 bytes below the stub's
// stack pointer once it returns (where the stub reads it): the address of
// the call's kept frame, or 0. It passes the stub's rbx (the caller's) to
// `on_entry`, which keeps it in that frame.
//
// The exit trampoline, called by the stub once the function returned into
// it and the stub pushed the caller's return address back into its slot
// (and restored the caller's rbx): [rbp + 16] is that slot, rbp + 24 the
// stack pointer after the function's `ret`. It writes the caller's return
// address from `on_exit` into the slot again (the same, from the frame
// `on_return` pops).
// The offsets above are `Regs`'s layout, which handlers read.
const _: () = {
    assert!(std::mem::offset_of!(Regs, gp) == 0);
    assert!(std::mem::offset_of!(Regs, xmm) == 64);
    assert!(std::mem::size_of::<Regs>() == 192);
};

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
    // A trampoline's frame, with its CFI: the prologue (an rbp frame, the
    // CFA then tracked through rbp) and the epilogue that returns.
    ".macro fprobe_patch_enter",
    ".cfi_startproc",
    "endbr64",
    "push rbp",
    ".cfi_def_cfa_offset 16",
    ".cfi_offset rbp, -16",
    "mov rbp, rsp",
    ".cfi_def_cfa_register rbp",
    ".endm",
    ".macro fprobe_patch_leave",
    "mov rsp, rbp",
    ".cfi_def_cfa_register rsp",
    "pop rbp",
    ".cfi_def_cfa_offset 8",
    ".cfi_restore rbp",
    "ret",
    ".cfi_endproc",
    ".endm",
    // The entry trampoline's body with a save and restore macro.
    ".macro fprobe_patch_entry_body save, restore",
    "fprobe_patch_enter",
    "sub rsp, 16",
    "and rsp, -16",
    "sub rsp, 336",
    "\\save",
    "mov rdi, [rbp + 8]",
    "mov rdi, [rdi - 14]",
    "lea rsi, [rbp + 16]",
    "mov rdx, rsp",
    "mov rcx, rbx",
    "call {on_entry}",
    "mov [rbp - 8], rax",
    "\\restore",
    "fprobe_patch_leave",
    ".endm",
    ".macro fprobe_patch_exit_body save, restore",
    "fprobe_patch_enter",
    "and rsp, -16",
    "sub rsp, 336",
    "\\save",
    "mov rdi, rsp",
    "lea rsi, [rbp + 24]",
    "call {on_exit}",
    "mov [rbp + 16], rax",
    "\\restore",
    "fprobe_patch_leave",
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
