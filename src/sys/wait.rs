//! Waiting for a 32-bit word to change, and waking the waiter: a futex on
//! Linux, `WaitOnAddress` / `WakeByAddressSingle` on Windows, and a bounded
//! sleep (polling) elsewhere and under miri. Only the hit cache's re-arm
//! agent waits, off every hot path, so polling costs a few wake-ups a
//! second at most.

use std::time::Duration;

use crate::sync::unmodelled::AtomicU32;

/// Wakes one thread waiting in [`wait`] on `word`, if any. Async-signal-safe
/// (one system call on Linux; Windows has no signals). A no-op where
/// [`wait`] polls.
pub(crate) fn wake_one(word: &AtomicU32) {
    #[cfg(all(target_os = "linux", target_pointer_width = "64", not(miri)))]
    // SAFETY: FUTEX_WAKE on a live word; no other memory is passed.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        );
    }
    #[cfg(all(windows, not(miri)))]
    // SAFETY: wakes waiters on a live word; reads nothing else.
    unsafe {
        windows_sys::Win32::System::Threading::WakeByAddressSingle(word.as_ptr().cast());
    }
    #[cfg(not(any(
        all(target_os = "linux", target_pointer_width = "64", not(miri)),
        all(windows, not(miri))
    )))]
    let _ = word;
}

/// Sleeps while `word` holds `seen`, at most `timeout` (forever if none),
/// until [`wake_one`]; may return early (callers look again). Where the
/// system cannot wait on a word, sleeps for `timeout` or `poll`, whichever
/// is shorter.
pub(crate) fn wait(word: &AtomicU32, seen: u32, timeout: Option<Duration>, poll: Duration) {
    // 64-bit Linux: `SYS_futex` takes this `timespec` (32-bit targets may
    // define a 64-bit `time_t` that it does not).
    #[cfg(all(target_os = "linux", target_pointer_width = "64", not(miri)))]
    {
        let _ = poll;
        let ts = timeout.map(|t| libc::timespec {
            tv_sec: t.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
        });
        let tsp = ts.as_ref().map_or(std::ptr::null(), std::ptr::from_ref);
        // SAFETY: FUTEX_WAIT on a live word with a timespec that outlives
        // the call (or none). A spurious return only makes the caller look
        // again.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                seen,
                tsp,
            );
        }
    }
    #[cfg(all(windows, not(miri)))]
    {
        let _ = poll;
        // Milliseconds, rounded up so that a short timeout does not spin;
        // INFINITE (u32::MAX) without one.
        let ms = timeout.map_or(u32::MAX, |t| {
            let ms = u32::try_from(t.as_nanos().div_ceil(1_000_000)).unwrap_or(u32::MAX);
            ms.min(u32::MAX - 1)
        });
        // SAFETY: `word` and `seen` are live 4-byte values for the whole
        // call; the system only reads them. A spurious or timed-out return
        // only makes the caller look again.
        unsafe {
            windows_sys::Win32::System::Threading::WaitOnAddress(
                word.as_ptr().cast(),
                std::ptr::from_ref(&seen).cast(),
                size_of::<u32>(),
                ms,
            );
        }
    }
    #[cfg(not(any(
        all(target_os = "linux", target_pointer_width = "64", not(miri)),
        all(windows, not(miri))
    )))]
    {
        // No wait on a word here (nor under miri): poll.
        let _ = (word, seen);
        std::thread::sleep(timeout.unwrap_or(poll).min(poll));
    }
}
