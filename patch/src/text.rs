//! Writing code while other threads run it: the bytes the runtime writes,
//! page protections around the writes, the atomic entry store and the
//! serialisation of every thread (see the crate docs, "Layout and
//! patching", for why each step is safe).

use std::sync::OnceLock;

use crate::error::Error;

/// The two entry nops.
pub(crate) const ENTRY_NOPS: [u8; 2] = [0x90, 0x90];
/// `jmp f-5` from `f`: `eb f9` (rel8 −7 from `f+2`).
pub(crate) const ENTRY_JMP: [u8; 2] = [0xeb, 0xf9];
/// The five nops before the function.
pub(crate) const PREFIX_NOPS: [u8; 5] = [0x90; 5];

const PAGE: u64 = 4096;

/// `jmp target` (`e9 rel32`) placed at `at`, or `None` out of rel32 reach.
pub(crate) fn jmp_rel32(at: u64, target: u64) -> Option<[u8; 5]> {
    let rel = i32::try_from(target as i64 - (at as i64 + 5)).ok()?;
    let r = rel.to_le_bytes();
    Some([0xe9, r[0], r[1], r[2], r[3]])
}

/// The seven bytes from `site` (the first prefix nop).
///
/// # Safety
///
/// `site .. site + 7` is mapped and readable (a site of a loaded object).
pub(crate) unsafe fn read7(site: u64) -> [u8; 7] {
    // SAFETY: by the caller's contract.
    unsafe { (site as *const [u8; 7]).read() }
}

/// Runs `f` with the pages holding `spans` (`(address, length, the
/// protections of its segment)`) writable, one `mprotect` per run of
/// contiguous pages with the same protections, and restores them after.
pub(crate) fn with_writable<R>(
    spans: &[(u64, u64, i32)],
    f: impl FnOnce() -> R,
) -> Result<R, Error> {
    let mut pages: Vec<(u64, i32)> = Vec::new();
    for &(at, len, prot) in spans {
        let mut p = at & !(PAGE - 1);
        while p < at + len {
            pages.push((p, prot));
            p += PAGE;
        }
    }
    pages.sort_unstable();
    pages.dedup();
    let mut runs: Vec<(u64, u64, i32)> = Vec::new();
    for (p, prot) in pages {
        match runs.last_mut() {
            Some((_, end, rp)) if *end == p && *rp == prot => *end += PAGE,
            _ => runs.push((p, p + PAGE, prot)),
        }
    }
    let mut opened = 0;
    let mut failed = None;
    for &(start, end, prot) in &runs {
        // SAFETY: whole pages of a loaded object's code; adding write
        // access changes no byte and keeps execute access, so threads
        // running there go on.
        if unsafe { mprotect(start, end - start, prot | libc::PROT_WRITE) } != 0 {
            failed = Some(Error::os("mprotect"));
            break;
        }
        opened += 1;
    }
    let out = if failed.is_none() { Some(f()) } else { None };
    for &(start, end, prot) in &runs[..opened] {
        // SAFETY: as above; back to the segment's own protections.
        if unsafe { mprotect(start, end - start, prot) } != 0 && failed.is_none() {
            failed = Some(Error::os("mprotect (restore)"));
        }
    }
    match (out, failed) {
        (Some(r), None) => Ok(r),
        (_, Some(e)) => Err(e),
        (None, None) => unreachable!("f runs unless a protection change failed"),
    }
}

/// # Safety
///
/// `start .. start + len` are whole pages the caller may change.
unsafe fn mprotect(start: u64, len: u64, prot: i32) -> i32 {
    // SAFETY: by the caller's contract.
    unsafe { libc::mprotect(start as *mut libc::c_void, len as usize, prot) }
}

/// Stores two bytes at `at` in one instruction.
///
/// # Safety
///
/// `at .. at + 2` is writable and does not cross an 8-byte boundary (a
/// store within one is single-copy atomic on x86-64).
pub(crate) unsafe fn store2(at: u64, bytes: [u8; 2]) {
    debug_assert!(at % 8 != 7);
    // SAFETY: by the caller's contract; one `mov` of 16 bits, so a
    // thread fetching these bytes sees the old pair or the new one.
    unsafe {
        std::arch::asm!(
            "mov word ptr [{at}], {v:x}",
            at = in(reg) at,
            v = in(reg) u16::from_le_bytes(bytes),
            options(nostack, preserves_flags)
        );
    }
}

/// Copies `bytes` to `at` (not executable by anyone while written).
///
/// # Safety
///
/// `at .. at + bytes.len()` is writable and no thread executes it until
/// the next [`sync_core`].
pub(crate) unsafe fn store(at: u64, bytes: &[u8]) {
    // SAFETY: by the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at as *mut u8, bytes.len()) }
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_long = 1 << 5;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_long = 1 << 6;

/// Whether this process is registered for the sync-core membarrier
/// (registering, the first time, waits for a grace period of the kernel's
/// when the process has several threads: milliseconds).
pub(crate) fn sync_core_registered() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        // SAFETY: membarrier takes no pointers.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE,
                0,
                0,
            ) == 0
        }
    })
}

/// Makes every thread of the process execute a serialising instruction
/// before it runs another instruction of ours. Returns whether the
/// membarrier did it; `false` means the kernel lacks the command and the
/// caller relies on its `mprotect` TLB shootdown (crate docs).
pub(crate) fn sync_core() -> bool {
    if !sync_core_registered() {
        return false;
    }
    // SAFETY: membarrier takes no pointers.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE,
            0,
            0,
        ) == 0
    }
}
