//! `membarrier(2)`: the writer half of the asymmetric fence.
//!
//! `MEMBARRIER_CMD_PRIVATE_EXPEDITED` makes every CPU currently running a
//! thread of this process execute a full memory barrier before the call
//! returns (by IPI); CPUs not running one pass a barrier at their next
//! context switch. That lets the RCU read side get by with a compiler fence.
//! The process must register its intent once (`REGISTER_PRIVATE_EXPEDITED`,
//! Linux ≥ 4.14). Where the syscall is missing or refused (old kernel,
//! seccomp), [`register`] returns `false` and the RCU falls back to
//! symmetric `SeqCst` fences.

const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

fn membarrier(cmd: libc::c_long) -> libc::c_long {
    // SAFETY: membarrier takes (cmd, flags, cpu_id) integers and touches no
    // memory of ours; an unsupported command returns -1/EINVAL or ENOSYS.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    }
}

/// Registers the process for private expedited barriers. Returns whether
/// [`barrier`] may be used.
pub(crate) fn register() -> bool {
    if std::env::var_os("FPROBE_RCU_NO_MEMBARRIER").is_some() {
        return false;
    }
    let supported = membarrier(MEMBARRIER_CMD_QUERY);
    if supported < 0
        || supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED == 0
        || supported & MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED == 0
    {
        return false;
    }
    membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0
}

/// Runs a full memory barrier on every CPU running a thread of this process.
///
/// Only after [`register`] returned `true`.
pub(crate) fn barrier() {
    let r = membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
    // Registration succeeded, and the command cannot fail afterwards except
    // on EINTR-free kernels' internal errors; a failure here would silently
    // break the grace-period guarantee, so it is fatal.
    if r != 0 {
        eprintln!(
            "fprobe::rcu: membarrier(PRIVATE_EXPEDITED) failed: {}",
            std::io::Error::last_os_error()
        );
        std::process::abort();
    }
}
