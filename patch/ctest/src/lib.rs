//! The C functions of `c/targets.c`, for the patching runtime's tests.

use std::ffi::{c_double, c_int, c_long};

/// `struct pt_pair`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair {
    /// `a + 1`.
    pub lo: c_long,
    /// `a * 2`.
    pub hi: c_long,
}

#[allow(missing_docs)]
unsafe extern "C" {
    pub static mut pt_fib_calls: c_long;
    pub fn pt_add(a: c_int, b: c_int) -> c_int;
    pub fn pt_call(f: extern "C" fn(c_long) -> c_long, x: c_long) -> c_long;
    pub fn pt_fcall(f: extern "C" fn(c_double) -> c_double, x: c_double) -> c_double;
    pub fn pt_fadd(a: c_double, b: c_double) -> c_double;
    pub fn pt_sum6(a: c_long, b: c_long, c: c_long, d: c_long, e: c_long, f: c_long) -> c_long;
    pub fn pt_pair(a: c_long) -> Pair;
    pub fn pt_mix(n: c_int, x: c_double, m: c_long, y: c_double) -> c_double;
    pub fn pt_va(n: c_int, ...) -> c_double;
    pub fn pt_fib(n: c_int) -> c_long;
    pub fn pt_loop(n: c_long) -> c_long;
    pub fn pt_jumper(n: c_int) -> c_int;
    pub fn pt_deep(n: c_int, env: *mut u8);
    pub fn pt_other_layout(a: c_int) -> c_int;
    pub fn pt_ipa_leaf(a: c_long) -> c_long;
    pub fn pt_ipa_caller(x: c_long, y: c_long, z: c_long) -> c_long;
    pub fn pt_cmd_leaf(a: c_long) -> c_long;
    pub fn pt_cmd_caller(x: c_long, y: c_long, z: c_long) -> c_long;
}

/// The address of a C function of this crate, by name.
pub fn addr(name: &str) -> u64 {
    let f: *const () = match name {
        "pt_add" => pt_add as *const (),
        "pt_call" => pt_call as *const (),
        "pt_fcall" => pt_fcall as *const (),
        "pt_fadd" => pt_fadd as *const (),
        "pt_sum6" => pt_sum6 as *const (),
        "pt_pair" => pt_pair as *const (),
        "pt_mix" => pt_mix as *const (),
        "pt_va" => pt_va as *const (),
        "pt_fib" => pt_fib as *const (),
        "pt_loop" => pt_loop as *const (),
        "pt_jumper" => pt_jumper as *const (),
        "pt_deep" => pt_deep as *const (),
        "pt_other_layout" => pt_other_layout as *const (),
        "pt_ipa_leaf" => pt_ipa_leaf as *const (),
        "pt_cmd_leaf" => pt_cmd_leaf as *const (),
        other => panic!("no C function {other}"),
    };
    f as u64
}

/// What [`arg_logging_probe`] logs per exit: the function, integer
/// argument `arg`, the first floating-point argument, and the integer and
/// floating-point return values.
pub type ArgLog = std::sync::Arc<std::sync::Mutex<Vec<(u64, u64, f64, u64, f64)>>>;

/// A probe whose entry keeps integer argument `arg` and the first
/// floating-point argument as 16 bytes of per-call data and whose exit
/// logs them with the return values.
pub fn arg_logging_probe(arg: usize) -> (fprobe::probe::Fprobe<fprobe_patch::Regs>, ArgLog) {
    let log = ArgLog::default();
    let l = log.clone();
    let probe = fprobe::probe::Fprobe::<fprobe_patch::Regs>::builder()
        .data_size(16)
        .entry(move |e| {
            e.data[..8].copy_from_slice(&e.ctx.arg(arg).to_ne_bytes());
            e.data[8..].copy_from_slice(&e.ctx.float_arg(0).to_ne_bytes());
            fprobe::probe::EntryAction::Continue
        })
        .exit(move |x| {
            let a = u64::from_ne_bytes(x.data[..8].try_into().unwrap());
            let f = f64::from_ne_bytes(x.data[8..].try_into().unwrap());
            l.lock()
                .unwrap()
                .push((x.addr, a, f, x.ctx.ret(), x.ctx.float_ret()));
        })
        .build();
    (probe, log)
}

/// The first entry of `log` for the C function `name`.
pub fn logged(log: &ArgLog, name: &str) -> (u64, u64, f64, u64, f64) {
    *log.lock()
        .unwrap()
        .iter()
        .find(|s| s.0 == addr(name))
        .unwrap_or_else(|| panic!("{name} not seen"))
}

/// The C++ functions of `c/unwind.cpp` (`extern "C"`, compiled with the
/// same patchable entries): exceptions, forced unwinds and backtraces.
/// Every one but `pu_unprobed_caller` and `pu_catch_unprobed` has a
/// patchable entry. None lets an exception out.
pub mod cxx {
    use std::ffi::{c_int, c_long, c_void};

    #[allow(missing_docs)]
    unsafe extern "C" {
        pub fn pu_leaf(x: c_long) -> c_long;
        pub fn pu_dtors() -> c_long;
        pub fn pu_catch_deep(n: c_int) -> c_int;
        pub fn pu_catch_rethrow(n: c_int) -> c_int;
        pub fn pu_nested(n: c_int) -> c_int;
        pub fn pu_catch_thrower(v: c_int, probed: c_int) -> c_int;
        pub fn pu_catch_unprobed(n: c_int) -> c_int;
        pub fn pu_plain(n: c_int) -> c_long;
        pub fn pu_run_thread(cancel: c_int, n: c_int) -> c_long;
        pub fn pu_bt_leaf(out: *mut *mut c_void, max: c_int) -> c_int;
        pub fn pu_bt_mid(out: *mut *mut c_void, max: c_int) -> c_int;
        pub fn pu_bt_top(out: *mut *mut c_void, max: c_int) -> c_int;
    }
}
