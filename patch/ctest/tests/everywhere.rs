//! The argument-only register save for every function
//! (`ArgumentOnlySaves::Everywhere`), chosen before anything is attached
//! in this process (its own test binary: a stub never changes once made).
//! Only functions of `c/targets.c` are attached: it is built with
//! `-fpatchable-function-entry` on the command line, which turns GCC's
//! interprocedural register allocation off; `c/ipa.c`, whose callee has
//! the attribute only, is the case this policy must not be chosen for.

use std::hint::black_box;

use fprobe_patch::{ArgumentOnlySaves, RegisterSave, attach, detach, register_save};
use fprobe_patch_ctest::*;

/// Leaves and callers alike get the argument-only save; arguments, return
/// values and entry data come through, and a caller with values live
/// across a call to a patched leaf gets them back (the lean exit changes
/// caller-saved registers, which a caller keeping values there across the
/// call, as GCC's interprocedural allocation would, would see).
#[test]
fn every_function_saves_only_argument_and_return_registers() {
    fprobe_patch::set_argument_only_saves(ArgumentOnlySaves::Everywhere);
    let (probe, seen) = arg_logging_probe(0);
    let names = [
        "pt_add",
        "pt_cmd_leaf",
        "pt_loop",
        "pt_fib",
        "pt_mix",
        "pt_sum6",
    ];
    let fs: Vec<u64> = names.iter().map(|n| addr(n)).collect();
    let a = attach(probe, &fs).unwrap();
    for n in names {
        assert_eq!(
            register_save(addr(n)),
            Some(RegisterSave::ArgumentsOnly),
            "{n}"
        );
    }
    let (x, y, z) = (black_box(3), black_box(5), black_box(7));
    // SAFETY: plain C functions of this crate.
    let (r_cmd, r_loop, r_fib, r_mix, r_sum) = unsafe {
        (
            pt_cmd_caller(x, y, z),
            pt_loop(black_box(100)),
            pt_fib(black_box(10)),
            pt_mix(black_box(2), 0.5, 3, 0.25),
            pt_sum6(1, 2, 3, 4, 5, 6),
        )
    };
    detach(a).unwrap();
    assert_eq!(r_cmd, (3 * x + 1) + x * y + y * z + x * z);
    assert_eq!((r_loop, r_fib, r_mix, r_sum), (5050, 55, 1.75, 91));
    let of = |n: &str| logged(&seen, n);
    let (_, arg0, _, ret, _) = of("pt_cmd_leaf");
    assert_eq!((arg0, ret), (3, 10));
    let (_, _, farg0, _, fret) = of("pt_mix");
    assert_eq!((farg0, fret), (0.5, 1.75));
    let (_, arg0, _, ret, _) = of("pt_sum6");
    assert_eq!((arg0, ret), (1, 91));
    let loops = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.0 == addr("pt_add"))
        .count();
    assert_eq!(loops, 100, "every pt_add call of the loop");
}
