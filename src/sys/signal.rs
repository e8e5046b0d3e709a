//! The calling thread's signal mask, which tells the probe layer's
//! recursion guard that a signal handler interrupted a dispatch (a handler
//! runs with its signal blocked: `probe::recursion`).

/// The calling thread's blocked signals 1 to 64 as bits 0 to 63, if the
/// system has signal masks and they can be read. Async-signal-safe.
pub(crate) fn blocked() -> Option<u64> {
    #[cfg(all(target_os = "linux", not(miri)))]
    {
        let mut set: u64 = 0;
        // SAFETY: reads the mask into `set` (8 bytes, the kernel's sigset
        // size on Linux); `how` is ignored with a null new set.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_BLOCK,
                std::ptr::null::<u64>(),
                &mut set as *mut u64,
                std::mem::size_of::<u64>(),
            )
        };
        (rc == 0).then_some(set)
    }
    #[cfg(all(unix, not(target_os = "linux"), not(miri)))]
    {
        // SAFETY: `sigset_t` is plain bits; all-zero is a valid value.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: reads the mask into `set`, a live `sigset_t`; `how` is
        // ignored with a null new set. pthread_sigmask is async-signal-safe
        // (POSIX.1-2017).
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set) };
        if rc != 0 {
            return None;
        }
        // The first 64 bits of the set (all of macOS's 32-bit one; signals
        // 1 to 64 of FreeBSD's 128-bit one): equal masks give equal words.
        let mut word = [0u8; 8];
        let n = size_of::<libc::sigset_t>().min(word.len());
        // SAFETY: copies `n` bytes, within both `set` and `word`.
        unsafe {
            std::ptr::copy_nonoverlapping((&raw const set).cast::<u8>(), word.as_mut_ptr(), n)
        };
        Some(u64::from_ne_bytes(word))
    }
    #[cfg(not(all(unix, not(miri))))]
    {
        None
    }
}
