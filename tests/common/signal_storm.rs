//! The set-up the signal-storm tests share (included with `#[path]`): a
//! `SIGUSR1` handler installed for the process, the storm's length, the
//! sender loop, and errno kept for the interrupted code.

#![allow(dead_code)] // each includer uses a part

use std::ffi::c_int;
use std::time::{Duration, Instant};

/// Installs `handler` for `SIGUSR1`, `SA_RESTART`, nothing else blocked.
pub fn install(handler: extern "C" fn(c_int)) {
    // SAFETY: a zeroed `sigaction` is a valid starting value; the handler
    // is an `extern "C" fn(c_int)` (no SA_SIGINFO), and `sa_mask` is
    // initialised by `sigemptyset` before use.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()),
            0,
            "sigaction"
        );
    }
}

/// How long a storm lasts: `FPROBE_SIGNAL_SECS` seconds, 2 by default.
pub fn duration() -> Duration {
    let secs = std::env::var("FPROBE_SIGNAL_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    Duration::from_secs(secs)
}

/// Runs `f` (a signal handler's body) with the interrupted code's errno
/// saved and restored around it.
pub fn keeping_errno(f: impl FnOnce()) {
    // SAFETY: reads the calling thread's errno location.
    let saved = unsafe { *libc::__errno_location() };
    f();
    // SAFETY: restores the interrupted code's errno.
    unsafe { *libc::__errno_location() = saved };
}

/// Sends `SIGUSR1` to `target` as fast as it can until `keep_going`
/// returns false; returns how many were sent.
///
/// `target` must stay alive until this returns.
pub fn send_while(target: libc::pthread_t, mut keep_going: impl FnMut() -> bool) -> u64 {
    let mut sent = 0u64;
    while keep_going() {
        // SAFETY: `target` is alive (the caller's contract).
        let rc = unsafe { libc::pthread_kill(target, libc::SIGUSR1) };
        assert_eq!(rc, 0, "pthread_kill");
        sent += 1;
    }
    sent
}

/// [`send_while`] for [`duration`].
pub fn send_for_duration(target: libc::pthread_t) -> u64 {
    let deadline = Instant::now() + duration();
    send_while(target, || Instant::now() < deadline)
}

/// Runs `work` on a new thread and storms that thread with `SIGUSR1` for
/// [`duration`]; returns what `work` returned. `prepare` runs on the
/// thread first, before the storm (a handler must not allocate: make the
/// thread's state there); `work` runs until the flag it is given is set.
pub fn storm_a_worker<T: Send + 'static>(
    prepare: impl FnOnce() + Send + 'static,
    work: impl FnOnce(&std::sync::atomic::AtomicBool) -> T + Send + 'static,
) -> T {
    use std::os::unix::thread::JoinHandleExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Barrier};

    let ready = Arc::new(Barrier::new(2));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (ready, stop) = (ready.clone(), stop.clone());
        std::thread::spawn(move || {
            prepare();
            ready.wait();
            work(&stop)
        })
    };
    let target = worker.as_pthread_t();
    ready.wait();
    // `worker` is alive until it is joined below.
    send_for_duration(target);
    stop.store(true, Ordering::Relaxed);
    worker.join().unwrap()
}
