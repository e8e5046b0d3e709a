/*
 * A plain C driver for c/calls.c, linked against the crate's C artifacts
 * (libfprobe_capi.so or libfprobe_capi.a) by scripts/capi-link.sh: proves
 * the shipped libraries export the ABI and the -finstrument-functions hooks
 * a C toolchain expects. Exits 0 when every count and status is exact.
 */
#include <stdio.h>

#include "ctest.h"

#define ENGINE __attribute__((no_instrument_function))

static int failures;

ENGINE static void expect(const char *what, unsigned long long got, unsigned long long want) {
    if (got != want) {
        printf("FAIL %s: got %llu, want %llu\n", what, got, want);
        failures++;
    }
}

ENGINE static void expect_rc(const char *what, int got, int want) {
    if (got != want) {
        printf("FAIL %s: got %d (%s), want %d (%s)\n", what, got, fprobe_strerror(got), want,
               fprobe_strerror(want));
        failures++;
    }
}

ENGINE int main(void) {
    struct ctest_params p = {4, 20, 600, 10000};
    struct ctest_result r;
    int rc = ctest_run(&p, &r);
    if (rc) {
        printf("FAIL setup: %d (%s)\n", rc, fprobe_strerror(rc));
        return 1;
    }
    /* fib(20) makes 2*F(21) - 1 = 21891 calls. */
    unsigned long long t = (unsigned long long)p.threads;
    unsigned long long want[NFUNC] = {t * 21891, t * (p.parity_n / 2 + 1), t * (p.parity_n / 2),
                                      t * p.leaf_calls};
    const char *names[NFUNC] = {"fib", "is_even", "is_odd", "leaf"};
    unsigned long long total = 0;
    for (int i = 0; i < NFUNC; i++) {
        expect(names[i], r.entries[i], want[i]);
        expect(names[i], r.exits[i], want[i]);
        total += want[i];
    }
    expect("pairing violations", r.mismatches, 0);
    expect("probe a hits", r.stats_a.hits, total);
    expect("probe a exits", r.stats_a.exits, total);
    expect("probe b hits", r.stats_b.hits, want[0]);
    expect("misses", r.stats_a.missed_recursion +
                         r.stats_a.missed_depth + r.stats_a.missed_disabled,
           0);
    expect("releases", r.releases, 2);
    expect_rc("register NULL probe", r.rc_null_register, FPROBE_E_NULL);
    expect_rc("register without handler", r.rc_no_handler, FPROBE_E_INVALID);
    expect_rc("unknown handle", r.rc_unknown_handle, FPROBE_E_NOT_FOUND);
    expect_rc("double unregister", r.rc_double_unregister, FPROBE_E_NOT_FOUND);
    expect_rc("attach twice", r.rc_attach_twice, FPROBE_E_BUSY);
    expect_rc("after destroy", r.rc_after_destroy, FPROBE_E_DESTROYED);
    expect_rc("destroy twice", r.rc_destroy_twice, FPROBE_E_DESTROYED);
    printf("%s: %llu calls probed, %s\n", failures ? "FAILED" : "ok", total,
           failures ? "see above" : "exact counts and pairing");
    return failures != 0;
}
