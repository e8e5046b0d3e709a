//! The process-wide memory barrier: the writer half of the RCU's asymmetric
//! fence (`rcu::raw`, "The protocol").
//!
//! A reader enters a read-side section with a store to its own record
//! followed by a *compiler* fence only; `synchronize` then runs [`barrier`],
//! which must leave every thread of the process as if it had executed a full
//! memory barrier at some point between the call and its return. For each
//! reader, either its record store was made visible by that barrier before
//! the scan reads it, or the reader's later loads come after the barrier and
//! see every store the writer made before it: the store-buffering pattern,
//! forbidden once both sides have a full fence.
//!
//! Each platform gets the best barrier it has:
//!
//! * **Linux**: `membarrier(2)` with `MEMBARRIER_CMD_PRIVATE_EXPEDITED`
//!   makes every CPU currently running a thread of this process execute a
//!   full memory barrier before the call returns (by IPI); CPUs not running
//!   one pass a barrier at their next context switch, before that thread
//!   runs again. The process registers its intent once
//!   (`REGISTER_PRIVATE_EXPEDITED`, Linux ≥ 4.14). Where the system call is
//!   missing or refused (old kernel, seccomp, some emulators), [`register`]
//!   returns `false`.
//! * **Windows**: `FlushProcessWriteBuffers` gives the same guarantee: it
//!   flushes the write buffers of every processor running a thread of the
//!   process, by IPI, and returns after each has done so (a full barrier on
//!   each; a thread not running then passes one at its context switch).
//!   Available on every supported Windows; no registration.
//! * **macOS, FreeBSD and other systems**: no such call, so [`register`]
//!   returns `false`.
//!
//! When [`register`] returns `false` (or `FPROBE_RCU_NO_MEMBARRIER` is set,
//! on any platform) the RCU uses symmetric fences instead: each reader runs
//! a `SeqCst` fence after its record store and the writer a `SeqCst` fence
//! where it would have called [`barrier`]. With a full fence on both sides
//! of the store-buffering pattern, at least one side sees the other's
//! store, which is all the protocol needs; readers pay one fence per
//! outermost section.

/// Makes [`barrier`] usable, registering as the system requires. Returns
/// whether it may be used: `false` where the system has no process-wide
/// barrier, refuses it, or `FPROBE_RCU_NO_MEMBARRIER` is set.
pub(crate) fn register() -> bool {
    if std::env::var_os("FPROBE_RCU_NO_MEMBARRIER").is_some() {
        return false;
    }
    imp::register()
}

/// Runs a full memory barrier on every CPU running a thread of this
/// process (module docs). Only after [`register`] returned `true`.
pub(crate) fn barrier() {
    imp::barrier();
}

#[cfg(target_os = "linux")]
mod imp {
    const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    fn membarrier(cmd: libc::c_long) -> libc::c_long {
        // SAFETY: membarrier takes (cmd, flags, cpu_id) integers and touches
        // no memory of ours; an unsupported command returns -1/EINVAL or
        // ENOSYS.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                cmd,
                0 as libc::c_long,
                0 as libc::c_long,
            )
        }
    }

    pub(super) fn register() -> bool {
        let supported = membarrier(MEMBARRIER_CMD_QUERY);
        if supported < 0
            || supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED == 0
            || supported & MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED == 0
        {
            return false;
        }
        membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0
    }

    pub(super) fn barrier() {
        let r = membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
        // Registration succeeded, and the command cannot fail afterwards
        // except on EINTR-free kernels' internal errors; a failure here
        // would silently break the grace-period guarantee, so it is fatal.
        if r != 0 {
            eprintln!(
                "fprobe::rcu: membarrier(PRIVATE_EXPEDITED) failed: {}",
                std::io::Error::last_os_error()
            );
            std::process::abort();
        }
    }
}

#[cfg(windows)]
mod imp {
    pub(super) fn register() -> bool {
        true
    }

    pub(super) fn barrier() {
        // SAFETY: no arguments and no preconditions; it cannot fail.
        unsafe { windows_sys::Win32::System::Threading::FlushProcessWriteBuffers() };
    }
}

#[cfg(not(any(target_os = "linux", windows)))]
mod imp {
    pub(super) fn register() -> bool {
        false
    }

    pub(super) fn barrier() {
        unreachable!("no process-wide barrier on this system: `register` returned false")
    }
}
