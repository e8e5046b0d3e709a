//! Per-site stubs, in pages mapped near their module so that a site's
//! `jmp rel32` reaches its stub and the stub's `jmp rel32` reaches back.
//!
//! A page starts with the entry trampoline's address (for the stubs'
//! `call [rip + disp]`); then one [`STUB`]-byte stub per site:
//!
//! ```text
//! 49 bb <f: 8 bytes>     mov r11, f            ; the function, for the trampoline
//! ff 15 <disp32>         call [entry trampoline]
//! e9 <rel32>             jmp f+2               ; past the entry jump, into the body
//! cc ...                 int3 padding
//! ```
//!
//! The stub is entered by a jump, so `[rsp]` is still the function's own
//! return address when the trampoline runs, and the trampoline returns to
//! the stub's `jmp` (a call and its return, which the processor predicts).
//! Stubs are written while their pages are not executable and never
//! change or get unmapped (a thread may be preempted inside one at any
//! time).

use crate::Error;
use crate::text::jmp_rel32;

/// Bytes per stub.
pub(crate) const STUB: u64 = 32;
/// Bytes before the first stub (the trampoline's address, padded).
const HEADER: u64 = 16;
const PAGE: u64 = 4096;
/// How far from its module a stub page may be (kept under rel32's 2 GiB
/// with room for the module's own size).
const REACH: u64 = 1 << 30;

/// Maps stubs for `functions` (all in one module whose code spans
/// `code`), each jumping to `entry` and back to its function + 2. Returns
/// each function's stub address, in order.
pub(crate) fn make(
    module: &str,
    code: (u64, u64),
    functions: &[u64],
    entry: u64,
) -> Result<Vec<u64>, Error> {
    let len = (HEADER + STUB * functions.len() as u64).div_ceil(PAGE) * PAGE;
    let base = map_near(code, len).ok_or_else(|| Error::OutOfReach {
        module: module.to_string(),
    })?;
    let mut bytes = vec![0xccu8; len as usize];
    bytes[..8].copy_from_slice(&entry.to_le_bytes());
    let mut out = Vec::with_capacity(functions.len());
    for (i, &f) in functions.iter().enumerate() {
        let at = base + HEADER + STUB * i as u64;
        let b = &mut bytes[(at - base) as usize..][..STUB as usize];
        b[0] = 0x49;
        b[1] = 0xbb;
        b[2..10].copy_from_slice(&f.to_le_bytes());
        // call [rip + disp32]: rip is the next instruction, at + 16.
        let disp = base as i64 - (at as i64 + 16);
        b[10] = 0xff;
        b[11] = 0x15;
        b[12..16].copy_from_slice(&(disp as i32).to_le_bytes());
        let Some(jmp) = jmp_rel32(at + 16, f + 2) else {
            // SAFETY: our own fresh mapping, nothing uses it yet.
            unsafe { libc::munmap(base as *mut libc::c_void, len as usize) };
            return Err(Error::OutOfReach {
                module: module.to_string(),
            });
        };
        b[16..21].copy_from_slice(&jmp);
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
    Ok(out)
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
