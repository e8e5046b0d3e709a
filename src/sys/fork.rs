//! Fork handling: a handler that runs in the child of `fork`, where `fork`
//! exists (Unix). Elsewhere (Windows) no process is a copy of another, and
//! there is nothing to handle.

/// Registers `child` to run in the child of every later `fork`, in its one
/// thread, before `fork` returns there (`pthread_atfork(3)`'s child
/// handler). `child` must do only what is safe in the child of a
/// multi-threaded process (async-signal-safe work). `Err` carries the
/// system's error number; `Ok` where the system has no `fork`.
pub(crate) fn on_fork_child(child: extern "C" fn()) -> Result<(), i32> {
    #[cfg(unix)]
    {
        // SAFETY: `child` is an `extern "C" fn()`, valid for the life of the
        // process; pthread_atfork only stores the pointers.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(child)) };
        if rc == 0 { Ok(()) } else { Err(rc) }
    }
    #[cfg(not(unix))]
    {
        let _ = child;
        Ok(())
    }
}
