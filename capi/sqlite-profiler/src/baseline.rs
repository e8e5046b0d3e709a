//! The comparison dispatcher: what an engine writes without this crate, a
//! `Mutex<HashMap<address, handlers>>` looked up on every call, and a
//! per-thread shadow stack pairing exits with entries. It backs the hooks
//! of `libsqlite_instr_wrapped.so` (`__wrap___cyg_profile_func_*`, see
//! `build.rs`) and calls the same handlers with the same contexts as the
//! crate's runtime.
//!
//! Limits (enough for the profiler): at most [`MAX_PER_ADDR`] handlers per
//! address, at most [`DATA`] bytes of per-call data each.

use std::cell::{Cell, UnsafeCell};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use fprobe_capi::{
    FPROBE_SKIP_EXIT, fprobe_entry_ctx, fprobe_entry_fn, fprobe_exit_ctx, fprobe_exit_fn,
};

/// Handlers kept per address.
pub const MAX_PER_ADDR: usize = 2;
/// Per-call data bytes per handler.
pub const DATA: usize = 16;

/// One registration.
#[derive(Clone, Copy)]
pub struct Handler {
    /// Entry handler.
    pub entry: fprobe_entry_fn,
    /// Exit handler.
    pub exit: fprobe_exit_fn,
    /// Cookie passed to both.
    pub cookie: u64,
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static MAP: Mutex<Option<HashMap<u64, Vec<Handler>>>> = Mutex::new(None);

#[derive(Clone, Copy)]
struct Frame {
    addr: u64,
    n: usize,
    h: [Option<Handler>; MAX_PER_ADDR],
    data: [[u8; DATA]; MAX_PER_ADDR],
}

std::thread_local! {
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
    static STACK: UnsafeCell<Vec<Frame>> = UnsafeCell::new(Vec::with_capacity(4096));
}

/// Installs the table and starts dispatching.
pub fn install(map: HashMap<u64, Vec<Handler>>) {
    *MAP.lock().unwrap() = Some(map);
    ACTIVE.store(true, Ordering::Release);
}

/// Stops dispatching and drops the table.
pub fn uninstall() {
    ACTIVE.store(false, Ordering::Release);
    *MAP.lock().unwrap() = None;
}

fn guarded(f: impl FnOnce()) {
    if !ACTIVE.load(Ordering::Acquire) {
        return;
    }
    if IN_HOOK.with(|c| c.replace(true)) {
        return;
    }
    f();
    IN_HOOK.with(|c| c.set(false));
}

/// The entry hook of the wrapped SQLite.
///
/// # Safety
///
/// Called by compiler-generated code.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __wrap___cyg_profile_func_enter(this_fn: *mut c_void, site: *mut c_void) {
    guarded(|| {
        let addr = this_fn as u64;
        let mut fr = Frame {
            addr,
            n: 0,
            h: [None; MAX_PER_ADDR],
            data: [[0; DATA]; MAX_PER_ADDR],
        };
        {
            let map = MAP.lock().unwrap();
            if let Some(hs) = map.as_ref().and_then(|m| m.get(&addr)) {
                for h in hs.iter().take(MAX_PER_ADDR) {
                    fr.h[fr.n] = Some(*h);
                    fr.n += 1;
                }
            }
        }
        for i in 0..fr.n {
            let h = fr.h[i].unwrap();
            let mut ctx = fprobe_entry_ctx {
                addr,
                ret_addr: site as u64,
                cookie: h.cookie,
                engine_ctx: std::ptr::null_mut(),
                data: fr.data[i].as_mut_ptr().cast(),
                data_size: DATA,
            };
            if let Some(entry) = h.entry {
                // SAFETY: the registered handler with a valid context.
                if unsafe { entry(std::ptr::null_mut(), &mut ctx) } == FPROBE_SKIP_EXIT {
                    fr.h[i] = None;
                }
            }
        }
        // SAFETY: this thread's stack; hooks do not nest (IN_HOOK).
        STACK.with(|s| unsafe { (*s.get()).push(fr) });
    });
}

/// The exit hook of the wrapped SQLite.
///
/// # Safety
///
/// Called by compiler-generated code.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __wrap___cyg_profile_func_exit(_this_fn: *mut c_void, site: *mut c_void) {
    guarded(|| {
        // SAFETY: as in the entry hook.
        let Some(fr) = STACK.with(|s| unsafe { (*s.get()).pop() }) else {
            return;
        };
        for i in (0..fr.n).rev() {
            let Some(h) = fr.h[i] else { continue };
            if let Some(exit) = h.exit {
                let ctx = fprobe_exit_ctx {
                    addr: fr.addr,
                    ret_addr: site as u64,
                    cookie: h.cookie,
                    engine_ctx: std::ptr::null_mut(),
                    data: fr.data[i].as_ptr().cast(),
                    data_size: DATA,
                };
                // SAFETY: the registered handler with a valid context.
                unsafe { exit(std::ptr::null_mut(), &ctx) };
            }
        }
    });
}
