//! Which functions need only their argument and return registers kept.
//!
//! # Why the trampolines save every caller-saved register
//!
//! A compiler that sees a callee's whole body may keep a caller's values
//! in caller-saved registers the callee never writes (GCC's
//! interprocedural register allocation, `-fipa-ra`, on by default at
//! `-O2`). A trampoline run at that callee's entry or return must then
//! leave every such register as it found it, which the full save does.
//!
//! # When the argument and return registers are enough
//!
//! The compiler's view of what a function clobbers includes what its calls
//! clobber, and a call it cannot see into (through the PLT, or through a
//! pointer) clobbers every call-clobbered register by the ABI. A function
//! making such a call anywhere in its body, or calling (or tail-calling)
//! a function of its own object that does, therefore clobbers them all as
//! far as any caller knows: no caller keeps a value in one across it. For
//! such a function the entry trampoline needs to keep only what the
//! function reads (the argument registers, `rax` for a variadic call and
//! `r10`), and the exit trampoline only the return registers (`rax rdx
//! xmm0 xmm1`). This is a property of the function's own code, so it
//! holds whatever the callers' compilers did.
//!
//! The scan decodes each function of the object from its symbol's address
//! over its symbol's size. A direct `call` or `jmp` into a PLT section, and
//! an indirect `call`, mark a function; a direct `call`, or a `jmp` out of
//! the function, to another function's start links the two; a function
//! linked to a marked one is marked. Everything else marks nothing: an
//! indirect `jmp` (a jump table or a tail call, which the scan cannot tell
//! apart), a call to a function without a symbol, a body that does not
//! decode. So an error in the scan can only leave a function with the
//! full save.

use std::collections::{BTreeMap, HashMap, HashSet};

use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind};

/// Functions of one loaded object (`start → size`, loaded addresses) and
/// its PLT sections (`start, end`), read from its file.
#[derive(Clone, Debug, Default)]
pub(crate) struct Code {
    pub(crate) functions: BTreeMap<u64, u64>,
    pub(crate) plt: Vec<(u64, u64)>,
}

impl Code {
    fn in_plt(&self, a: u64) -> bool {
        self.plt.iter().any(|&(s, e)| s <= a && a < e)
    }
}

/// The functions of `code` that clobber every call-clobbered register for
/// their callers (module docs). `mapped` is the object's executable span:
/// functions outside it are not read.
pub(crate) fn clobbers_all(code: &Code, mapped: (u64, u64)) -> HashSet<u64> {
    let mut marked = HashSet::new();
    // Callee → callers.
    let mut callers: HashMap<u64, Vec<u64>> = HashMap::new();
    for (&f, &size) in &code.functions {
        if size == 0 || f < mapped.0 || f.saturating_add(size) > mapped.1 {
            continue;
        }
        // SAFETY: inside the object's executable segments (checked against
        // `mapped`), which stay mapped while the object is loaded: the
        // caller scans objects found loaded, under the runtime's mutex.
        // Only the 7 bytes around a site change while we read, each store
        // a whole instruction that decodes either way.
        let body = unsafe { std::slice::from_raw_parts(f as *const u8, size as usize) };
        let mut decoder = Decoder::with_ip(64, body, f, DecoderOptions::NONE);
        for ins in &mut decoder {
            if ins.is_invalid() {
                break;
            }
            let direct = matches!(
                ins.op0_kind(),
                OpKind::NearBranch64 | OpKind::NearBranch32 | OpKind::NearBranch16
            );
            match ins.mnemonic() {
                Mnemonic::Call if !direct => {
                    marked.insert(f);
                }
                Mnemonic::Call | Mnemonic::Jmp if direct => {
                    let t = ins.near_branch_target();
                    let inside = f <= t && t < f + size;
                    if code.in_plt(t) {
                        marked.insert(f);
                    } else if !inside && code.functions.contains_key(&t) {
                        callers.entry(t).or_default().push(f);
                    }
                }
                _ => {}
            }
        }
    }
    // Marks flow from callees to their callers.
    let mut work: Vec<u64> = marked.iter().copied().collect();
    while let Some(t) = work.pop() {
        for &c in callers.get(&t).map_or(&[][..], Vec::as_slice) {
            if marked.insert(c) {
                work.push(c);
            }
        }
    }
    marked
}
