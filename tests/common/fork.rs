//! Waiting for a forked child in tests: its exit status, or a kill and a
//! panic when it takes longer than the bound (a child that hangs must fail
//! the test, not hang it).

use std::time::{Duration, Instant};

/// Waits up to `bound` for child `pid`; panics (after killing it) with
/// `what` when it is still running then. Returns `waitpid`'s status.
pub fn wait_child(pid: libc::pid_t, bound: Duration, what: &str) -> libc::c_int {
    let mut status = 0;
    let t = Instant::now();
    loop {
        // SAFETY: (test) plain libc process calls with valid arguments.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return status;
        }
        if t.elapsed() > bound {
            // SAFETY: (test) as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{what}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `status` is a normal exit with code 0.
pub fn exited_cleanly(status: libc::c_int) -> bool {
    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
}

/// Whether the fork tests must be left out: `FPROBE_TEST_QEMU_USER` is set
/// (by `scripts/platforms.sh`) when the tests run under qemu-user, where
/// the child of a multi-threaded process crashes as soon as it creates a
/// thread (an assertion inside qemu: a plain C program that forks with
/// threads running and starts one in the child fails the same way), and
/// the crate's child starts its reclaimer thread. Says so on stderr.
pub fn left_out_under_qemu_user(test: &str) -> bool {
    let qemu = std::env::var_os("FPROBE_TEST_QEMU_USER").is_some();
    if qemu {
        eprintln!(
            "{test}: left out under qemu-user (a child of a multi-threaded process cannot create threads there)"
        );
    }
    qemu
}

/// Sets its flag when dropped, also while a failed assertion unwinds: a
/// thread the test parked (inside a read-side section, a handler) is let
/// go, so a failing test does not wedge the other tests of its binary.
#[allow(
    dead_code,
    reason = "not every test binary that includes this file parks a thread"
)]
pub struct SetOnDrop(pub std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
