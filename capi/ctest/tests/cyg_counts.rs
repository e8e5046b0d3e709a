//! A C program compiled with `-finstrument-functions`, every call of its
//! four functions probed through `fprobe.h` and the crate's
//! `__cyg_profile_func_enter/_exit` runtime: exact counts, exact pairing,
//! no misses, and the documented error codes for bad calls.

use fprobe_capi::{
    FPROBE_E_BUSY, FPROBE_E_DESTROYED, FPROBE_E_INVALID, FPROBE_E_NOT_FOUND, FPROBE_E_NULL,
};
use fprobe_capi_ctest::{FUNCS, Params, run};

/// Calls of `fib(n)` including itself: 2·F(n+1) − 1.
fn fib_calls(n: u64) -> u64 {
    let (mut a, mut b) = (0u64, 1u64);
    for _ in 0..n + 1 {
        (a, b) = (b, a + b);
    }
    2 * a - 1
}

#[test]
fn every_call_counted_and_paired() {
    let threads = 4u64;
    let p = Params {
        threads: threads as i32,
        fib_n: 20,
        parity_n: 600,
        leaf_calls: 10_000,
    };
    let r = run(p);
    let expect = [
        threads * fib_calls(20),
        threads * (600 / 2 + 1),
        threads * (600 / 2),
        threads * 10_000,
    ];
    for (i, name) in FUNCS.iter().enumerate() {
        assert_eq!(r.entries[i], expect[i], "{name}: entries");
        assert_eq!(r.exits[i], expect[i], "{name}: exits");
    }
    assert_eq!(r.mismatches, 0, "pairing violations");
    let total: u64 = expect.iter().sum();
    assert_eq!(r.stats_a.hits, total);
    assert_eq!(r.stats_a.exits, total);
    assert_eq!(r.second_probe_entries, expect[0]);
    assert_eq!(r.stats_b.hits, expect[0]);
    assert_eq!(r.stats_b.exits, 0);
    for s in [r.stats_a, r.stats_b] {
        assert_eq!(
            (s.missed_recursion, s.missed_depth, s.missed_disabled),
            (0, 0, 0),
            "misses by cause: {s:?}"
        );
    }
    assert_eq!(r.addresses, 4);
    assert_eq!(r.releases, 2, "each registered probe released once");
    assert_eq!(r.rc_null_register, FPROBE_E_NULL);
    assert_eq!(r.rc_no_handler, FPROBE_E_INVALID);
    assert_eq!(r.rc_unknown_handle, FPROBE_E_NOT_FOUND);
    assert_eq!(r.rc_double_unregister, FPROBE_E_NOT_FOUND);
    assert_eq!(r.rc_attach_twice, FPROBE_E_BUSY);
    assert_eq!(r.rc_after_destroy, FPROBE_E_DESTROYED);
    assert_eq!(r.rc_destroy_twice, FPROBE_E_DESTROYED);
}

#[test]
fn fib_calls_formula() {
    assert_eq!(fib_calls(0), 1);
    assert_eq!(fib_calls(1), 1);
    assert_eq!(fib_calls(2), 3);
    assert_eq!(fib_calls(5), 15);
}
