//! The registers a probe's handlers see.

/// A patched call's saved registers, what every handler's context points
/// at (`EntryContext::ctx` and `ExitContext::ctx` in Rust, `engine_ctx` in
/// C, where this type is named `fprobe_patch_regs`). At entry: the SysV
/// argument registers; at exit: `rax` (`gp[6]`), `rdx` (`gp[2]`), `xmm0`
/// and `xmm1` hold the return value, the rest is unspecified.
///
/// The layout is fixed: 192 bytes, `gp` at offset 0 and `xmm` at 64, the
/// offsets the trampolines store at.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Regs {
    /// `rdi rsi rdx rcx r8 r9 rax r10`.
    pub gp: [u64; 8],
    /// `xmm0`–`xmm7`, 16 bytes each (a `double` argument is the first 8).
    pub xmm: [[u8; 16]; 8],
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
    /// # Examples
    ///
    /// ```
    /// let mut r = fprobe_patch::Regs::default();
    /// r.gp[1] = 7;
    /// assert_eq!(r.arg(1), 7);
    /// ```
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
        u128::from_ne_bytes(self.xmm[i])
    }

    /// Floating-point argument `i` (0–7), at entry.
    ///
    /// # Panics
    ///
    /// If `i > 7`.
    pub fn float_arg(&self, i: usize) -> f64 {
        f64::from_bits(self.xmm(i) as u64)
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
        f64::from_bits(self.xmm(0) as u64)
    }
}
