//! Rust side of the C test: the layout of `c/calls.c`'s parameter and
//! result structs and its entry point. `tests/cyg_counts.rs` asserts.

use std::ffi::c_int;

// Links the hooks and the ABI that `c/calls.c` calls.
pub use fprobe_capi;
use fprobe_capi::fprobe_stats;

/// Functions of the C program, by cookie.
pub const FUNCS: [&str; 4] = ["fib", "is_even", "is_odd", "leaf"];

/// `struct ctest_params`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Threads running the program at once.
    pub threads: c_int,
    /// `fib(fib_n)` per thread.
    pub fib_n: c_int,
    /// `is_even(parity_n)` per thread.
    pub parity_n: u32,
    /// Calls of `leaf` per thread.
    pub leaf_calls: u32,
}

/// `struct ctest_result`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Results {
    /// Entry-handler calls per function.
    pub entries: [u64; 4],
    /// Exit-handler calls per function.
    pub exits: [u64; 4],
    /// Entries seen by the second (entry-only) probe on `fib`.
    pub second_probe_entries: u64,
    /// Pairing violations the handlers saw.
    pub mismatches: u64,
    /// Release callbacks run.
    pub releases: u64,
    /// Counters of the entry+exit probe.
    pub stats_a: fprobe_stats,
    /// Counters of the entry-only probe.
    pub stats_b: fprobe_stats,
    /// Addresses with a probe.
    pub addresses: usize,
    /// First failing setup call's status (0: all succeeded).
    pub rc_setup: c_int,
    /// `fprobe_register` with a NULL probe.
    pub rc_null_register: c_int,
    /// `fprobe_enable` with a handle never returned.
    pub rc_unknown_handle: c_int,
    /// `fprobe_unregister` twice.
    pub rc_double_unregister: c_int,
    /// `fprobe_cyg_attach` twice.
    pub rc_attach_twice: c_int,
    /// `fprobe_enable` on a destroyed registry.
    pub rc_after_destroy: c_int,
    /// `fprobe_registry_destroy` twice.
    pub rc_destroy_twice: c_int,
    /// `fprobe_register` of a probe with no handler.
    pub rc_no_handler: c_int,
}

unsafe extern "C" {
    /// Runs the program on `threads` threads with every call probed.
    pub fn ctest_run(p: *const Params, out: *mut Results) -> c_int;
}

/// Runs the C test once.
pub fn run(p: Params) -> Results {
    let mut r = Results::default();
    // SAFETY: valid pointers to the structs `calls.c` declares.
    let rc = unsafe { ctest_run(&p, &mut r) };
    assert_eq!(rc, 0, "setup call failed: {rc}");
    r
}
