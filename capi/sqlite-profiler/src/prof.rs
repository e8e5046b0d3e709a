//! The profiler's handlers: calls, inclusive and self time per function,
//! kept per thread (no shared writes on the hot path) and merged when a
//! thread exits. The same two handlers serve both dispatchers, so the
//! comparison measures dispatch only.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use fprobe_capi::{FPROBE_SKIP_EXIT, fprobe_entry_ctx, fprobe_exit_ctx};

/// Per-function totals.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stat {
    /// Calls (entries).
    pub calls: u64,
    /// Inclusive ticks.
    pub total: u64,
    /// Ticks not spent in probed callees.
    pub self_: u64,
}

/// Functions (cookies are indices below this).
pub static NFUNCS: AtomicUsize = AtomicUsize::new(0);
static TOTALS: Mutex<Vec<Stat>> = Mutex::new(Vec::new());

struct ThreadProf {
    stats: Vec<Stat>,
    /// Ticks spent in callees, one per open probed call.
    children: Vec<u64>,
}

impl Drop for ThreadProf {
    fn drop(&mut self) {
        let mut t = TOTALS.lock().unwrap();
        if t.len() < self.stats.len() {
            t.resize(self.stats.len(), Stat::default());
        }
        for (a, b) in t.iter_mut().zip(&self.stats) {
            a.calls += b.calls;
            a.total += b.total;
            a.self_ += b.self_;
        }
    }
}

std::thread_local! {
    static PROF: UnsafeCell<Option<ThreadProf>> = const { UnsafeCell::new(None) };
}

/// Takes the totals merged from exited threads.
pub fn take_totals() -> Vec<Stat> {
    std::mem::take(&mut *TOTALS.lock().unwrap())
}

/// A timestamp in ticks (TSC on x86-64).
#[inline(always)]
pub fn now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86-64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::sync::OnceLock;
        static T0: OnceLock<std::time::Instant> = OnceLock::new();
        T0.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
    }
}

/// Ticks per nanosecond, measured over `ms` milliseconds.
pub fn calibrate(ms: u64) -> f64 {
    let (t0, c0) = (std::time::Instant::now(), now());
    std::thread::sleep(std::time::Duration::from_millis(ms));
    (now() - c0) as f64 / t0.elapsed().as_nanos() as f64
}

#[inline(always)]
fn with<R>(f: impl FnOnce(&mut ThreadProf) -> R) -> R {
    PROF.with(|p| {
        // SAFETY: this thread's state; the handlers are not re-entered
        // (both dispatchers suppress recursion), so no other borrow exists.
        let p = unsafe { &mut *p.get() };
        let tp = p.get_or_insert_with(|| ThreadProf {
            stats: vec![Stat::default(); NFUNCS.load(Ordering::Relaxed)],
            children: Vec::with_capacity(1024),
        });
        f(tp)
    })
}

/// Counts a call of function `cookie`; with `timed`, opens its timing
/// and returns the start time (for the call's data).
#[inline(always)]
pub fn enter(cookie: u64, timed: bool) -> Option<u64> {
    with(|tp| {
        if let Some(s) = tp.stats.get_mut(cookie as usize) {
            s.calls += 1;
        }
        if timed {
            tp.children.push(0);
        }
    });
    timed.then(now)
}

/// Closes the timing of a call of function `cookie` that started at
/// `start`: inclusive and self time.
#[inline(always)]
pub fn leave(cookie: u64, start: u64) {
    let end = now();
    let incl = end.wrapping_sub(start);
    with(|tp| {
        let child = tp.children.pop().unwrap_or(0);
        if let Some(parent) = tp.children.last_mut() {
            *parent += incl;
        }
        if let Some(s) = tp.stats.get_mut(cookie as usize) {
            s.total += incl;
            s.self_ += incl.saturating_sub(child);
        }
    });
}

/// Entry handler: counts the call and stamps the start time into the
/// per-call data.
///
/// # Safety
///
/// Called by a dispatcher with a valid context whose cookie is a function
/// index.
pub unsafe extern "C" fn on_entry(_user: *mut c_void, ctx: *mut fprobe_entry_ctx) -> c_int {
    // SAFETY: valid for the call.
    let ctx = unsafe { &mut *ctx };
    let has_data = !ctx.data.is_null() && ctx.data_size >= 8;
    match enter(ctx.cookie, has_data) {
        Some(start) => {
            // SAFETY: at least 8 bytes; no alignment promised.
            unsafe { ctx.data.cast::<u64>().write_unaligned(start) };
            0
        }
        None => FPROBE_SKIP_EXIT,
    }
}

/// Exit handler: inclusive and self time.
///
/// # Safety
///
/// As [`on_entry`]; the data is what `on_entry` wrote.
pub unsafe extern "C" fn on_exit(_user: *mut c_void, ctx: *const fprobe_exit_ctx) {
    // SAFETY: valid for the call.
    let ctx = unsafe { &*ctx };
    // SAFETY: the 8 bytes `on_entry` wrote.
    let start = unsafe { ctx.data.cast::<u64>().read_unaligned() };
    leave(ctx.cookie, start);
}

/// Entry handler that does nothing but ask for the exit (for measuring
/// dispatch alone).
///
/// # Safety
///
/// Any context.
pub unsafe extern "C" fn noop_entry(_user: *mut c_void, _ctx: *mut fprobe_entry_ctx) -> c_int {
    0
}

/// Exit handler that does nothing.
///
/// # Safety
///
/// Any context.
pub unsafe extern "C" fn noop_exit(_user: *mut c_void, _ctx: *const fprobe_exit_ctx) {}
