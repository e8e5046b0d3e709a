//! Per-site stubs, in pages mapped near their module so that a site's
//! `jmp rel32` reaches its stub and the stub's `jmp rel32` reaches back.
//!
//! A page starts with the trampolines' addresses (for the stubs' `call
//! [rip + disp]`): entry and exit saving every caller-saved register, then
//! entry and exit saving only the argument and return registers, which a
//! function's stub calls instead when the function clobbers every
//! call-clobbered register anyway (`clobber.rs`); then one [`STUB`]-byte
//! stub per site. The site's prefix jumps to `stub + 8`:
//!
//! ```text
//!  0:       <f: 8 bytes>              the function, read by the entry trampoline
//!  8:       ff 15 <disp32>            call [entry]
//! 14:       48 83 7c 24 e8 00         cmp qword ptr [rsp - 24], 0  ; the entry's answer:
//! 20:       74 <rel8>                 je body                      ;   0, or the kept frame
//! 22:       48 8b 5c 24 e8            mov rbx, [rsp - 24]   ; the frame, which holds the
//! 27:       48 83 c4 08               add rsp, 8            ;   caller's rbx and return
//! 31:       e8 <rel32>                call f+2              ;   address: its slot is ours
//! 36:       ff 73 08                  push [rbx + 8]        ; the return address back,
//! 39:       48 8b 5b 00               mov rbx, [rbx + 0]    ;   and the caller's rbx
//! 43:       ff 15 <disp32>            call [exit]           ; the exit handlers
//! 49:       c3                        ret                   ; to the function's caller
//! 50: body: e9 <rel32>                jmp f+2               ; past the entry jump, into the body
//! ```
//!
//! (`8` and `0` are [`KeptReturn::RET_ADDR`] and [`KeptReturn::SAVED`].)
//! While the function runs, `rbx` holds the address of the call's kept
//! frame on the shadow stack: the function preserves it (callee-saved),
//! and the stub's unwind information finds the caller's return address and
//! `rbx` through it (`unwind.rs`), so that exceptions, forced unwinds and
//! backtraces cross the stub. The function sees that `rbx` at its entry,
//! which no function that follows the ABI reads; its caller sees its own
//! `rbx` back, and every other register as it left it.
//!
//! The stub is entered by a jump, so `[rsp]` is the function's own return
//! address when the entry trampoline runs. A call with an exit to run
//! calls the function's body from the stub with its own return address in
//! the slot the caller's was in (the arguments on the stack stay where the
//! function expects them), so the function returns into the stub, and the
//! stub returns to the caller: every return goes where the processor's
//! return-stack predictor expects, where overwriting the return address
//! would cost a mispredicted return per call.
//!
//! A stub with the full trampolines changes no register: a caller may keep
//! values in registers its compiler knows the callee leaves alone (GCC's
//! interprocedural register allocation, for a callee whose patchable entry
//! comes from an attribute rather than the command line), so they save
//! every caller-saved register and the stubs pass what they need through
//! memory. One with the argument-only trampolines keeps the argument
//! registers at entry and the return registers at exit, and may change the
//! other caller-saved registers, which its function clobbers anyway. The entry trampoline reads the function from the stub's first
//! 8 bytes (14 before its return address), keeps the caller's `rbx` in the
//! frame, and leaves its answer 24 bytes below the stub's stack pointer,
//! in memory no signal frame can reach (signal delivery skips the 128-byte
//! red zone below `rsp`). Only the flags change, as the caller sees it,
//! which no compiler keeps live across a call.
//!
//! Stubs are written while their pages are not executable, with their
//! unwind information registered before any site jumps to them, and never
//! change or get unmapped (a thread may be preempted inside one, or be
//! inside the function it called, at any time).

use fprobe::probe::KeptReturn;

use crate::error::Error;
use crate::text::jmp_rel32;
use crate::unwind::{self, StubLayout};

/// Bytes per stub.
pub(crate) const STUB: u64 = 64;

/// Where each stub's unwind rule changes (the offsets in the module docs).
const LAYOUT: StubLayout = StubLayout {
    start: 8,
    frame_in_rbx: 27,
    slot_given: 31,
    slot_back: 39,
    rbx_back: 43,
    end: 55,
};
/// Bytes before the first stub (the four trampolines' addresses).
const HEADER: u64 = 32;
const PAGE: u64 = 4096;
/// How far from its module a stub page may be (kept under rel32's 2 GiB
/// with room for the module's own size).
const REACH: u64 = 1 << 30;

/// Maps stubs for `functions` (all in one module whose code spans
/// `code`), each calling the trampolines (`[entry, exit, entry_args,
/// exit_ret]`: the last two for a function marked `true`) and running its
/// function from + 2. Returns each function's stub address, in order.
pub(crate) fn make(
    module: &str,
    code: (u64, u64),
    functions: &[(u64, bool)],
    trampolines: [u64; 4],
) -> Result<Vec<u64>, Error> {
    let len = (HEADER + STUB * functions.len() as u64).div_ceil(PAGE) * PAGE;
    let base = map_near(code, len).ok_or_else(|| Error::OutOfReach {
        module: module.to_string(),
    })?;
    let mut bytes = vec![0xccu8; len as usize];
    for (i, t) in trampolines.iter().enumerate() {
        bytes[8 * i..][..8].copy_from_slice(&t.to_le_bytes());
    }
    let mut out: Vec<u64> = Vec::with_capacity(functions.len());
    for (i, &(f, lean)) in functions.iter().enumerate() {
        let at = base + HEADER + STUB * i as u64;
        let slots = if lean { base + 16 } else { base };
        let Some(b) = stub(at, f, slots, slots + 8) else {
            // SAFETY: our own fresh mapping, nothing uses it yet.
            unsafe { libc::munmap(base as *mut libc::c_void, len as usize) };
            return Err(Error::OutOfReach {
                module: module.to_string(),
            });
        };
        bytes[(at - base) as usize..][..b.len()].copy_from_slice(&b);
        out.push(at);
    }
    // SAFETY: `base .. base + len` is our fresh read-write mapping.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), base as *mut u8, len as usize);
        if libc::mprotect(
            base as *mut libc::c_void,
            len as usize,
            libc::PROT_READ | libc::PROT_EXEC,
        ) != 0
        {
            let e = Error::os("mprotect (stubs)");
            libc::munmap(base as *mut libc::c_void, len as usize);
            return Err(e);
        }
    }
    unwind::register(unwind::eh_frame(&out, &LAYOUT));
    Ok(out)
}

/// Where the site's prefix jumps: past the stub's 8 data bytes.
pub(crate) const ENTRY_OFFSET: u64 = 8;

/// The stub for function `f` placed at `at`, with the trampolines'
/// addresses at `entry_slot` and `exit_slot` (the layout in the module
/// docs); `None` when `f + 2` is out of rel32 reach.
fn stub(at: u64, f: u64, entry_slot: u64, exit_slot: u64) -> Option<Vec<u8>> {
    // rel32 from the end of an instruction ending at `end`.
    let rel = |end: u64, target: u64| i32::try_from(target as i64 - end as i64).ok();
    let mut b = Vec::with_capacity(STUB as usize);
    b.extend(f.to_le_bytes());
    b.extend([0xff, 0x15]);
    b.extend(rel(at + 14, entry_slot)?.to_le_bytes());
    b.extend([0x48, 0x83, 0x7c, 0x24, 0xe8, 0x00]); // cmp qword ptr [rsp - 24], 0
    b.extend([0x74, 28]); // je body: over the next 28 bytes
    b.extend([0x48, 0x8b, 0x5c, 0x24, 0xe8]); // mov rbx, [rsp - 24]
    debug_assert_eq!(b.len() as u32, LAYOUT.frame_in_rbx);
    b.extend([0x48, 0x83, 0xc4, 0x08]); // add rsp, 8
    debug_assert_eq!(b.len() as u32, LAYOUT.slot_given);
    b.push(0xe8);
    b.extend(rel(at + 36, f + 2)?.to_le_bytes());
    b.extend([0xff, 0x73, KeptReturn::RET_ADDR as u8]); // push qword ptr [rbx + RET_ADDR]
    debug_assert_eq!(b.len() as u32, LAYOUT.slot_back);
    b.extend([0x48, 0x8b, 0x5b, KeptReturn::SAVED as u8]); // mov rbx, [rbx + SAVED]
    debug_assert_eq!(b.len() as u32, LAYOUT.rbx_back);
    b.extend([0xff, 0x15]);
    b.extend(rel(at + 49, exit_slot)?.to_le_bytes());
    b.push(0xc3); // ret
    debug_assert_eq!(b.len(), 50);
    b.extend(jmp_rel32(at + 50, f + 2)?);
    debug_assert_eq!(b.len() as u32, LAYOUT.end);
    debug_assert!(b.len() as u64 <= STUB);
    Some(b)
}

/// A fresh read-write mapping of `len` bytes within [`REACH`] of `code`,
/// tried below the code first, then above, 2 MiB apart.
fn map_near((lo, hi): (u64, u64), len: u64) -> Option<u64> {
    const STEP: u64 = 2 << 20;
    let below = (1..).map(|k| lo.checked_sub(len + k * STEP));
    let above = (0..).map(|k| hi.checked_add(k * STEP + STEP));
    let candidates = below
        .take_while(|a| a.is_some_and(|a| lo - a <= REACH))
        .chain(above.take_while(|a| a.is_some_and(|a| a + len - hi <= REACH)));
    for want in candidates.flatten() {
        let want = want & !(PAGE - 1);
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping;
        // the result is checked before use.
        let got = unsafe {
            libc::mmap(
                want as *mut libc::c_void,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if got == libc::MAP_FAILED {
            continue;
        }
        if got as u64 == want {
            return Some(want);
        }
        // A kernel without MAP_FIXED_NOREPLACE took it as a hint.
        // SAFETY: the mapping just made, unused.
        unsafe { libc::munmap(got, len as usize) };
    }
    None
}
