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
