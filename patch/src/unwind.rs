//! Unwind information for the stubs, registered with the process's
//! unwinder when they are made, so that an exception, a forced unwind
//! (`pthread_exit`, `pthread_cancel`) or a backtrace (`backtrace(3)`,
//! `_Unwind_Backtrace`, profilers, debuggers that read `.eh_frame`) walks
//! through a stub to the function's real caller. The trampolines carry
//! theirs in `.cfi_*` directives (`tramp.rs`), which the assembler turns
//! into the executable's own `.eh_frame`.
//!
//! # Where the caller's return address is
//!
//! A stub is entered by a jump from its function's entry, with the
//! caller's return address at `[rsp]`: there the usual rule holds, `CFA =
//! rsp + 8`, return address at `CFA - 8`. A call whose exit is to run is
//! different: the stub gives the return address's slot to its own return
//! address, and the caller's is kept only in the call's frame on the probe
//! layer's shadow stack, thread-local memory that no DWARF expression can
//! reach. So the entry keeps, in that frame, the caller's value of `rbx`
//! as well ([`KeptReturn::saved`]), and the stub leaves the frame's
//! address ([`KeptReturn`]) in `rbx` while the function runs. The function
//! preserves `rbx` (it is callee-saved), so the stub's unwind information
//! can say, for the instructions from there until the stub puts both back:
//!
//! * the return address is at `[rbx + KeptReturn::RET_ADDR]`,
//! * the caller's `rbx` is at `[rbx + KeptReturn::SAVED]`
//!
//! (`DW_CFA_expression` with `DW_OP_breg3`), and, once the stub gave the
//! slot to the function, the caller's `rsp` is the stub's
//! (`DW_CFA_val_offset`), while the CFA stays `rsp + 8`: the stub's frame
//! holds nothing then, so the CFA the caller's `rsp` would give equals the
//! function's own, and unwinders tell frames apart by their CFA (libgcc's
//! second phase stops at the handler's frame by it, and aborts when
//! another frame has the same). Every DWARF unwinder evaluates these
//! (libgcc's, LLVM's libunwind, gdb): a throw through the function lands
//! in its caller with the caller's `rbx`, `rsp` and return address, and a
//! backtrace names the real caller. The shadow stack is one allocation that never moves, and a
//! frame stays in place until its call returns or a later dispatch finds
//! it abandoned (an unwind past it, which by then no longer reads it).
//!
//! The alternatives: wrapping `__cxa_throw` and `_Unwind_Resume` to put
//! return addresses back before an unwind (as uftrace does) covers C++
//! exceptions thrown through the wrapped entry points only, not forced
//! unwinds started inside libc, other languages' unwinds, `backtrace(3)`
//! or a profiler's walks; overwriting return addresses with a trampoline's
//! (the kernel's fgraph) has the same blind spot and costs a mispredicted
//! return per call. Describing the stubs' frames to the unwinder, as JITs
//! do for their code (LLVM's and wasmtime's register FDEs), works for
//! every walker; the register carries what the CFI cannot reach.
//!
//! # Registration
//!
//! One `.eh_frame` buffer per batch of stubs (one CIE, one FDE per stub,
//! then a zero terminator), passed to libgcc's `__register_frame`, which
//! takes a whole buffer (the unwinder of x86-64 Linux programs built by GCC
//! or rustc: `libgcc_s`). A process whose unwinder is LLVM's libunwind
//! instead may take the buffer's first FDE only, and then unwind through
//! that one stub alone. Stubs are never unmapped, so the buffers are
//! leaked and never deregistered.

use fprobe::probe::KeptReturn;
use gimli::write::{
    Address, CallFrameInstruction, CommonInformationEntry, EhFrame, EndianVec, Expression,
    FrameDescriptionEntry, FrameTable,
};
use gimli::{Encoding, Format, LittleEndian, X86_64};

/// Byte offsets in a stub (`stubs.rs`) where its unwind rule changes.
pub(crate) struct StubLayout {
    /// Where the stub is entered (its first instruction).
    pub start: u32,
    /// After `mov rbx, [rsp - 24]`: `rbx` holds the kept frame.
    pub frame_in_rbx: u32,
    /// After `add rsp, 8`: the return address is in the kept frame only,
    /// and the caller's `rsp` is the stub's.
    pub slot_given: u32,
    /// After `push [rbx + RET_ADDR]`: the return address is back at `[rsp]`.
    pub slot_back: u32,
    /// After `mov rbx, [rbx + SAVED]`: the caller's `rbx` is back.
    pub rbx_back: u32,
    /// The end of the stub's code.
    pub end: u32,
}

unsafe extern "C" {
    /// libgcc's (`libgcc_s`): registers an `.eh_frame` buffer (CIEs and
    /// FDEs up to a zero length word) with the unwinder; the buffer must
    /// live while registered.
    fn __register_frame(begin: *const u8);
}

/// The `.eh_frame` buffer for stubs at `stubs`, each laid out as `layout`
/// says, terminated by a zero length word.
pub(crate) fn eh_frame(stubs: &[u64], layout: &StubLayout) -> Vec<u8> {
    let encoding = Encoding {
        format: Format::Dwarf32,
        version: 1,
        address_size: 8,
    };
    let mut table = FrameTable::default();
    // Entered by a jump: the caller's return address at [rsp].
    let mut cie = CommonInformationEntry::new(encoding, 1, -8, X86_64::RA);
    cie.add_instruction(CallFrameInstruction::Cfa(X86_64::RSP, 8));
    cie.add_instruction(CallFrameInstruction::Offset(X86_64::RA, -8));
    let cie = table.add_cie(cie);
    let at_frame = |off: usize| {
        let mut e = Expression::new();
        e.op_breg(X86_64::RBX, off as i64);
        e
    };
    for &s in stubs {
        let mut fde = FrameDescriptionEntry::new(
            Address::Constant(s + u64::from(layout.start)),
            layout.end - layout.start,
        );
        let at = |o: u32| o - layout.start;
        fde.add_instruction(
            at(layout.frame_in_rbx),
            CallFrameInstruction::Expression(X86_64::RBX, at_frame(KeptReturn::SAVED)),
        );
        // The slot given to the function: the return address is in the
        // frame, and the caller's rsp is the stub's. The CFA stays `rsp +
        // 8`, 8 above the function's own: unwinders tell frames apart by
        // their CFA (libgcc stops at the handler's frame by it), so the
        // stub's must differ from the function's.
        fde.add_instruction(
            at(layout.slot_given),
            CallFrameInstruction::Expression(X86_64::RA, at_frame(KeptReturn::RET_ADDR)),
        );
        fde.add_instruction(
            at(layout.slot_given),
            CallFrameInstruction::ValOffset(X86_64::RSP, -8),
        );
        fde.add_instruction(
            at(layout.slot_back),
            CallFrameInstruction::Offset(X86_64::RA, -8),
        );
        fde.add_instruction(
            at(layout.slot_back),
            CallFrameInstruction::Restore(X86_64::RSP),
        );
        fde.add_instruction(
            at(layout.rbx_back),
            CallFrameInstruction::SameValue(X86_64::RBX),
        );
        table.add_fde(cie, fde);
    }
    let mut out = EhFrame(EndianVec::new(LittleEndian));
    // Fails only for rules that cannot be encoded: these are fixed.
    table
        .write_eh_frame(&mut out)
        .expect("the stubs' unwind rules encode");
    let mut bytes = out.0.into_vec();
    bytes.extend([0u8; 4]);
    bytes
}

/// Registers `eh_frame` ([`eh_frame`]'s) with the process's unwinder, for
/// good: the buffer is leaked, as the code it describes is never unmapped.
pub(crate) fn register(eh_frame: Vec<u8>) {
    // Word-aligned, as the unwinder reads its length words.
    let mut words = vec![0u64; eh_frame.len().div_ceil(8)];
    // SAFETY: `words` holds at least `eh_frame.len()` bytes; the two do
    // not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            eh_frame.as_ptr(),
            words.as_mut_ptr().cast::<u8>(),
            eh_frame.len(),
        )
    };
    let buf: &'static [u64] = Box::leak(words.into_boxed_slice());
    // SAFETY: a complete `.eh_frame` buffer (CIE, FDEs, zero terminator)
    // that lives for the rest of the process; registration is
    // thread-safe (the unwinder takes its own lock).
    unsafe { __register_frame(buf.as_ptr().cast::<u8>()) };
}
