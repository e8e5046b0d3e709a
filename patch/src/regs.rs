//! The registers a probe's handlers see.

/// The saved registers of a probed call, the context every handler of the
/// patching runtime's registry gets (`EntryContext::ctx`,
/// `ExitContext::ctx`). At entry: the SysV argument registers; at exit:
/// the return registers ([`ret`](Self::ret), [`ret2`](Self::ret2),
/// [`float_ret`](Self::float_ret)), the others unspecified.
///
/// # Examples
///
/// ```
/// let r = fprobe_patch::Regs::default();
/// assert_eq!(r.arg(0), 0);
/// ```
///
/// The layout is fixed (`repr(C)`, 192 bytes, what the C ABI exposes as
/// `fprobe_patch_regs`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Regs {
    /// `rdi rsi rdx rcx r8 r9 rax r10`, at offset 0 (the trampolines'
    /// store order: `tramp.rs` writes these offsets).
    pub gp: [u64; 8],
    /// `xmm0`–`xmm7`, at offset 64.
    pub xmm: [u128; 8],
}

/// C handlers ([`FprobeBuilder::entry_c`](fprobe::probe::FprobeBuilder::entry_c))
/// see the registers as a pointer to them, laid out as above.
// SAFETY: `ByAddress` makes no claim on the layout.
unsafe impl fprobe::probe::CEngineCtx for Regs {
    const REPR: fprobe::probe::CEngineRepr = fprobe::probe::CEngineRepr::ByAddress;
}

const RAX: usize = 6;
const RDX: usize = 2;

impl Regs {
    /// Integer argument `i` (0–5: `rdi rsi rdx rcx r8 r9`), at entry.
    ///
    /// # Panics
    ///
    /// If `i > 5`.
    pub fn arg(&self, i: usize) -> u64 {
        assert!(i < 6, "SysV passes six integer arguments in registers");
        self.gp[i]
    }

    /// Vector register `xmm{i}` (0–7), at entry: floating-point argument
    /// `i` is its low 64 bits ([`float_arg`](Self::float_arg)).
    ///
    /// # Panics
    ///
    /// If `i > 7`.
    pub fn xmm(&self, i: usize) -> u128 {
        self.xmm[i]
    }

    /// Floating-point argument `i` (0–7), at entry.
    ///
    /// # Panics
    ///
    /// If `i > 7`.
    pub fn float_arg(&self, i: usize) -> f64 {
        f64::from_bits(self.xmm[i] as u64)
    }

    /// `rax`: the integer return value, at exit.
    pub fn ret(&self) -> u64 {
        self.gp[RAX]
    }

    /// `rdx`: the second integer return register, at exit.
    pub fn ret2(&self) -> u64 {
        self.gp[RDX]
    }

    /// The floating-point return value (`xmm0`'s low 64 bits), at exit.
    pub fn float_ret(&self) -> f64 {
        f64::from_bits(self.xmm[0] as u64)
    }
}
