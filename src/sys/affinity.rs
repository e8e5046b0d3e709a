//! Thread affinity, where the system has it (Linux, outside miri): the RCU
//! reclaimer follows the CPUs of the threads that retire objects
//! (`rcu::reclaim`, "placement"). Elsewhere every call is a no-op that
//! reports failure, and the reclaimer stays where the scheduler puts it.

#[cfg(all(target_os = "linux", not(miri)))]
mod imp {
    /// A set of CPUs.
    #[derive(Clone, Copy)]
    pub(crate) struct Mask(libc::cpu_set_t);

    impl Mask {
        pub(crate) fn single(cpu: usize) -> Mask {
            // SAFETY: `cpu_set_t` is plain bits; all-zero is the empty set.
            let mut m: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            if cpu < libc::CPU_SETSIZE as usize {
                // SAFETY: `cpu` is below `CPU_SETSIZE`, inside the set.
                unsafe { libc::CPU_SET(cpu, &mut m) };
            }
            Mask(m)
        }

        pub(crate) fn contains(&self, cpu: usize) -> bool {
            // SAFETY: `cpu` is below `CPU_SETSIZE`, inside the set.
            cpu < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(cpu, &self.0) }
        }
    }

    /// Thread `tid`'s affinity (0: the calling thread).
    fn of(tid: i32) -> Option<Mask> {
        // SAFETY: as in `Mask::single`.
        let mut m: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `m` is a live `cpu_set_t` of the size passed.
        let ok = unsafe { libc::sched_getaffinity(tid, size_of::<libc::cpu_set_t>(), &mut m) };
        (ok == 0).then_some(Mask(m))
    }

    /// The calling thread's id, and the home mask (module docs:
    /// placement): the main thread's affinity, else the caller's.
    pub(crate) fn current() -> Option<(i32, Mask)> {
        // SAFETY: no preconditions. (The raw system call rather than
        // glibc's `gettid`, which needs glibc 2.30 at link time.)
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
        // SAFETY: no preconditions.
        let main = unsafe { libc::getpid() };
        Some((tid, of(main).or_else(|| of(0))?))
    }

    /// Whether the calling thread runs under a real-time policy.
    pub(crate) fn real_time() -> bool {
        // SAFETY: no preconditions; 0 is the calling thread.
        let policy = unsafe { libc::sched_getscheduler(0) };
        // SCHED_DEADLINE (6) is not in every libc version's constants.
        matches!(policy, libc::SCHED_FIFO | libc::SCHED_RR | 6)
    }

    /// Sets the calling thread's affinity; whether the kernel took it.
    pub(crate) fn set_own(m: &Mask) -> bool {
        set_thread(0, m)
    }

    /// Sets thread `tid`'s affinity; whether the kernel took it.
    pub(crate) fn set_thread(tid: i32, m: &Mask) -> bool {
        // SAFETY: `m.0` is a live `cpu_set_t` of the size passed. A stale
        // `tid` cannot name another process's thread: the reclaimer
        // never exits while its process lives (and a fork's child
        // starts a fresh state).
        unsafe { libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &m.0) == 0 }
    }
}

#[cfg(not(all(target_os = "linux", not(miri))))]
mod imp {
    #[derive(Clone, Copy)]
    pub(crate) struct Mask;

    impl Mask {
        pub(crate) fn single(_cpu: usize) -> Mask {
            Mask
        }
        pub(crate) fn contains(&self, _cpu: usize) -> bool {
            false
        }
    }

    pub(crate) fn current() -> Option<(i32, Mask)> {
        None
    }
    pub(crate) fn real_time() -> bool {
        false
    }
    pub(crate) fn set_own(_m: &Mask) -> bool {
        false
    }
    pub(crate) fn set_thread(_tid: i32, _m: &Mask) -> bool {
        false
    }
}

pub(crate) use imp::*;
