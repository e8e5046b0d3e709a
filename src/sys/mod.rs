//! Everything the crate asks of the operating system, one small interface
//! per concern, so that the rest of the crate is the same on every
//! platform (README, "Platforms"):
//!
//! | concern | Linux | Windows | macOS, FreeBSD |
//! |---|---|---|---|
//! | process-wide barrier ([`barrier`]) | `membarrier(2)` | `FlushProcessWriteBuffers` | none: symmetric fences |
//! | CPU number ([`cpu`]) | rseq area, `sched_getcpu(3)` | `GetCurrentProcessorNumber` | none: per-thread cache |
//! | CPU count ([`cpu::count`]) | `sysconf` | `GetSystemInfo` | `sysconf` |
//! | page size ([`page_size`]) | `sysconf` | `GetSystemInfo` | `sysconf` |
//! | wait for a word ([`wait`]) | futex | `WaitOnAddress` | bounded sleep |
//! | fork handler ([`fork`]) | `pthread_atfork(3)` | (no `fork`) | `pthread_atfork(3)` |
//! | signal mask ([`signal`]) | `rt_sigprocmask` | (no signals) | `pthread_sigmask(3)` |
//! | thread affinity ([`affinity`]) | `sched_setaffinity(2)` | none | none |
//!
//! Under miri and loom the crate uses none of them that it can avoid: the
//! barrier is not compiled, no CPU number is read, and waits poll.

#[cfg(not(loom))]
pub(crate) mod affinity;
#[cfg(not(any(loom, miri)))]
pub(crate) mod barrier;
pub(crate) mod cpu;
#[cfg(not(miri))]
pub(crate) mod fork;
pub(crate) mod signal;
pub(crate) mod wait;

/// The size of a page of memory, if the system says.
#[cfg_attr(
    not(all(target_os = "linux", not(miri), not(loom))),
    allow(dead_code, reason = "only the huge-page mapping, Linux only, needs it")
)]
pub(crate) fn page_size() -> Option<usize> {
    #[cfg(unix)]
    {
        // SAFETY: `sysconf` reads a system constant.
        usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()
    }
    #[cfg(windows)]
    {
        usize::try_from(system_info().dwPageSize).ok()
    }
    #[cfg(not(any(unix, windows)))]
    {
        None
    }
}

/// The system's description of itself (processors, page size).
#[cfg(windows)]
fn system_info() -> windows_sys::Win32::System::SystemInformation::SYSTEM_INFO {
    // SAFETY: `SYSTEM_INFO` is plain integers and pointers; all-zero is a
    // valid value, which the call overwrites.
    let mut info = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a live, writable `SYSTEM_INFO`; the call cannot
    // fail.
    unsafe { windows_sys::Win32::System::SystemInformation::GetSystemInfo(&mut info) };
    info
}
