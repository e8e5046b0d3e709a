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
//! xmm0 xmm1`).
//!
//! That holds for functions of the SysV calling convention whose every
//! call instruction is a call to the compiler. It fails for a function of
//! another convention (`ms_abi`, whose callers expect `rsi rdi` and
//! `xmm6`–`xmm15` kept; `preserve_most`, `no_caller_saved_registers`), and
//! for call instructions the compiler emits as text it does not count as
//! calls (`-pg`'s `mcount`). Nothing in the binary tells these apart, so
//! the runtime uses this only when asked to
//! ([`ArgumentOnlySaves::WhereFunctionsCallOut`](crate::ArgumentOnlySaves::WhereFunctionsCallOut)).
//!
//! The scan decodes each function of the object from its symbol's address
//! over its symbol's size. A direct `call` or `jmp` into a PLT section, and
//! an indirect `call`, mark a function; a direct `call`, or a `jmp` out of
//! the function, to another function's start links the two; a function
//! linked to a marked one is marked. Marking nothing: an indirect `jmp` (a
//! jump table or a tail call, which the scan cannot tell apart), a call to
//! a function without a symbol, and `call [rax]`, the form of a TLS
//! descriptor call (`-mtls-dialect=gnu2`), which preserves every register
//! but `rax` and which compilers do not count as a call (a C++ virtual
//! call through slot 0 has the same form and is missed too, which only
//! costs speed). The scan stops at the first instruction that does not
//! decode; one decoded from bytes that are not code could mark a function
//! wrongly (compilers put no data in functions' text).

use std::collections::{BTreeMap, HashMap, HashSet};

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};

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
        // SAFETY: inside the span of the object's executable segments
        // (checked against `mapped`; a function symbol's extent lies in
        // one of them), mapped readable while the object stays loaded: the
        // caller scans an object found loaded, under the runtime's mutex,
        // before any of its sites is patched, so nothing writes these
        // bytes meanwhile. (The crate docs rule out unloading an object
        // while an attach to one of its functions runs.)
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
                Mnemonic::Call if !direct && !is_tls_descriptor_call(&ins) => {
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

/// `call [rax]`: how a TLS descriptor is called (module docs).
fn is_tls_descriptor_call(ins: &Instruction) -> bool {
    ins.op0_kind() == OpKind::Memory
        && ins.memory_base() == Register::RAX
        && ins.memory_index() == Register::None
        && ins.memory_displacement64() == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_calls_out_and_their_callers_only() {
        // Functions laid out back to back in one buffer (read, never run):
        // f0: call rax; ret          an indirect call: marked
        // f1: call [rax]; ret        a TLS descriptor call: not marked
        // f2: call f0; ret           calls a marked function: marked
        // f3: call f1; ret           not marked
        // f4: jmp plt                a tail call into the PLT: marked
        // f5: lea rax, [rax+1]; ret  a leaf: not marked
        // f6: call f5; jmp f4        a tail call to a marked one: marked
        // then 16 bytes standing for the PLT.
        let bodies: [&[u8]; 8] = [
            &[0xff, 0xd0, 0xc3],
            &[0xff, 0x10, 0xc3],
            &[0xe8, 0, 0, 0, 0, 0xc3],
            &[0xe8, 0, 0, 0, 0, 0xc3],
            &[0xe9, 0, 0, 0, 0],
            &[0x48, 0x8d, 0x40, 0x01, 0xc3],
            &[0xe8, 0, 0, 0, 0, 0xe9, 0, 0, 0, 0],
            &[0xcc; 16],
        ];
        let mut buf: Vec<u8> = bodies.concat();
        let mut off = vec![0usize];
        for b in &bodies {
            off.push(off.last().unwrap() + b.len());
        }
        // rel32 at byte `at` of the buffer, of an instruction ending at
        // `end`, to function `to`.
        let mut branch = |at: usize, end: usize, to: usize| {
            let rel = (off[to] as i64 - end as i64) as i32;
            buf[at..at + 4].copy_from_slice(&rel.to_le_bytes());
        };
        branch(off[2] + 1, off[2] + 5, 0);
        branch(off[3] + 1, off[3] + 5, 1);
        branch(off[4] + 1, off[4] + 5, 7);
        branch(off[6] + 1, off[6] + 5, 5);
        branch(off[6] + 6, off[6] + 10, 4);
        let base = buf.as_ptr() as u64;
        let addr = |i: usize| base + off[i] as u64;
        let code = Code {
            functions: (0..7).map(|i| (addr(i), bodies[i].len() as u64)).collect(),
            plt: vec![(addr(7), addr(8))],
        };
        let marked = clobbers_all(&code, (addr(0), addr(8)));
        let want = [true, false, true, false, true, false, true];
        for (i, w) in want.iter().enumerate() {
            assert_eq!(marked.contains(&addr(i)), *w, "function {i}");
        }
        drop(buf);
    }
}
