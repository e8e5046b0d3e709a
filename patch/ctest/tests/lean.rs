//! The argument-only register save, allowed before anything is attached
//! in this process (its own test binary: a stub never changes once made).

use std::hint::black_box;

use fprobe_patch::{RegisterSave, attach, detach, register_save};
use fprobe_patch_ctest::*;

/// With argument-only saves allowed, a function that calls out (through a
/// pointer or the PLT) clobbers every call-clobbered register for its
/// callers: its trampolines keep only the
/// argument and return registers, and its arguments, return values and
/// entry data still come through, integer and floating-point alike.
/// Functions that call nothing, or only functions of their object that
/// call nothing, keep the full save.
#[test]
fn functions_that_call_out_save_only_argument_and_return_registers() {
    fprobe_patch::set_argument_only_saves(fprobe_patch::ArgumentOnlySaves::WhereFunctionsCallOut);
    extern "C" fn inc(x: std::ffi::c_long) -> std::ffi::c_long {
        x + 1
    }
    extern "C" fn half(x: f64) -> f64 {
        x / 2.0
    }
    let (probe, seen) = arg_logging_probe(1);
    let lean = ["pt_call", "pt_fcall", "pt_jumper"];
    let full = ["pt_add", "pt_ipa_leaf", "pt_loop", "pt_fib", "pt_mix"];
    let fs: Vec<u64> = lean.iter().chain(&full).map(|n| addr(n)).collect();
    let a = attach(probe, &fs).unwrap();
    for n in lean {
        assert_eq!(
            register_save(addr(n)),
            Some(RegisterSave::ArgumentsOnly),
            "{n}"
        );
    }
    for n in full {
        assert_eq!(register_save(addr(n)), Some(RegisterSave::All), "{n}");
    }
    let r_call = unsafe { pt_call(inc, black_box(41)) };
    let r_fcall = unsafe { pt_fcall(half, black_box(5.0)) };
    let r_jump = unsafe { pt_jumper(black_box(3)) };
    let r_mix = unsafe { pt_mix(black_box(2), 0.5, 3, 0.25) };
    detach(a).unwrap();
    assert_eq!((r_call, r_fcall, r_mix), (43, 5.0, 1.75));
    assert_eq!(r_jump, unsafe { pt_jumper(3) }, "the same result unprobed");
    let of = |n: &str| logged(&seen, n);
    let (_, arg1, _, ret, _) = of("pt_call");
    assert_eq!((arg1, ret), (41, 43));
    let (_, _, farg0, _, fret) = of("pt_fcall");
    assert_eq!((farg0, fret), (5.0, 5.0));
    let (_, _, farg0, _, fret) = of("pt_mix");
    assert_eq!((farg0, fret), (0.5, 1.75));
}
