//! The number of the CPU the calling thread runs on, cheaply: the per-CPU
//! hit cache picks its shard with it on every lookup, and the RCU reclaimer
//! follows the CPU of the threads that retire objects. Also the number of
//! CPUs the system is configured with, which sizes the per-CPU cache.
//!
//! Sources, by platform:
//!
//! * Linux (x86-64, arm64): the rseq area glibc registers, else
//!   `sched_getcpu(3)` (a vDSO call);
//! * Windows: `GetCurrentProcessorNumber` (read from the processor's own
//!   state, no kernel entry), reported as [`CpuSource::SchedGetcpu`];
//! * macOS, FreeBSD, other systems: none (macOS offers no supported call;
//!   FreeBSD's `sched_getcpu(3)` is recent, 13.0, and a binary using it
//!   would not load on older releases). The hit cache is then per-thread.

/// Where the CPU number comes from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(
    not(all(target_os = "linux", not(any(miri, loom)))),
    allow(dead_code, reason = "only Linux has both sources; some systems none")
)]
pub(crate) enum CpuSource {
    /// The `cpu_id` of the rseq area glibc (≥ 2.35) registers for every
    /// thread: one thread-pointer-relative load.
    Rseq(isize),
    /// The system's call: `sched_getcpu(3)` on Linux (a vDSO call on
    /// x86-64 and arm64), `GetCurrentProcessorNumber` on Windows (the
    /// number within the caller's processor group).
    SchedGetcpu,
}

impl CpuSource {
    /// The best source that works on this machine, or `None`.
    fn detect() -> Option<CpuSource> {
        #[cfg(all(
            target_os = "linux",
            any(target_arch = "x86_64", target_arch = "aarch64"),
            not(miri),
            not(loom)
        ))]
        {
            // SAFETY: looking up glibc's exported data symbols by name;
            // absent (older glibc, musl) they are null.
            let (off, size) = unsafe {
                (
                    libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()),
                    libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()),
                )
            };
            if !off.is_null() && !size.is_null() {
                // SAFETY: glibc's `const ptrdiff_t __rseq_offset` and
                // `const unsigned int __rseq_size`, set before `main`.
                let (off, size) = unsafe { (*(off as *const isize), *(size as *const u32)) };
                // Size 0: registration disabled or refused by the kernel.
                if size >= 8 {
                    let src = CpuSource::Rseq(off);
                    if src.cpu().is_some() {
                        return Some(src);
                    }
                }
            }
        }
        #[cfg(all(target_os = "linux", not(any(miri, loom))))]
        {
            // SAFETY: no preconditions.
            if unsafe { libc::sched_getcpu() } >= 0 {
                return Some(CpuSource::SchedGetcpu);
            }
        }
        #[cfg(all(windows, not(any(miri, loom))))]
        {
            // GetCurrentProcessorNumber cannot fail.
            Some(CpuSource::SchedGetcpu)
        }
        #[cfg(not(all(windows, not(any(miri, loom)))))]
        {
            None
        }
    }

    /// The CPU the calling thread runs on now (it may move right after:
    /// callers use the number as a hint).
    #[inline(always)]
    pub(crate) fn cpu(self) -> Option<usize> {
        let id: i32 = match self {
            #[cfg(all(
                target_os = "linux",
                any(target_arch = "x86_64", target_arch = "aarch64"),
                not(miri),
                not(loom)
            ))]
            CpuSource::Rseq(off) => {
                let tp: usize;
                // SAFETY: reads the thread pointer, no side effects.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp,
                        options(nostack, readonly, preserves_flags));
                }
                // SAFETY: as above.
                #[cfg(target_arch = "aarch64")]
                unsafe {
                    std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp,
                        options(nostack, nomem, preserves_flags));
                }
                // `struct rseq { u32 cpu_id_start; u32 cpu_id; ... }` at
                // thread pointer + __rseq_offset, registered by glibc for
                // every thread for its whole life; the kernel rewrites
                // `cpu_id` on migration, hence the volatile read.
                let p = tp.wrapping_add_signed(off).wrapping_add(4) as *const u32;
                // SAFETY: see above; aligned (the rseq area is 32-aligned).
                unsafe { std::ptr::read_volatile(p) as i32 }
            }
            #[cfg(not(all(
                target_os = "linux",
                any(target_arch = "x86_64", target_arch = "aarch64"),
                not(miri),
                not(loom)
            )))]
            CpuSource::Rseq(_) => -1,
            CpuSource::SchedGetcpu => {
                #[cfg(all(target_os = "linux", not(any(miri, loom))))]
                {
                    // SAFETY: no preconditions.
                    unsafe { libc::sched_getcpu() }
                }
                #[cfg(all(windows, not(any(miri, loom))))]
                {
                    // SAFETY: no arguments and no preconditions.
                    let n = unsafe {
                        windows_sys::Win32::System::Threading::GetCurrentProcessorNumber()
                    };
                    n as i32
                }
                #[cfg(not(all(any(target_os = "linux", windows), not(any(miri, loom)))))]
                {
                    -1
                }
            }
        };
        usize::try_from(id).ok()
    }
}

/// The best source this machine has, detected once per process; `None`
/// where no source works (miri, loom, systems without one: module docs).
pub(crate) fn source() -> Option<CpuSource> {
    static SOURCE: std::sync::OnceLock<Option<CpuSource>> = std::sync::OnceLock::new();
    *SOURCE.get_or_init(CpuSource::detect)
}

/// The CPU the calling thread runs on now, from [`source`].
pub(crate) fn current() -> Option<usize> {
    source()?.cpu()
}

/// The number of CPUs the system is configured with (hot-pluggable ones
/// included), if the system says: `sysconf(_SC_NPROCESSORS_CONF)` on Unix;
/// on Windows the processors of the caller's group, the range
/// `GetCurrentProcessorNumber` reports in.
pub(crate) fn count() -> Option<usize> {
    #[cfg(unix)]
    {
        // SAFETY: no preconditions.
        let conf = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
        usize::try_from(conf).ok()
    }
    #[cfg(windows)]
    {
        let info = super::system_info();
        usize::try_from(info.dwNumberOfProcessors).ok()
    }
    #[cfg(not(any(unix, windows)))]
    {
        std::thread::available_parallelism().ok().map(usize::from)
    }
}
