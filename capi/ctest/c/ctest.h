/*
 * The C test program's interface (c/calls.c), shared by the Rust test
 * (src/lib.rs mirrors these structs) and the C driver (c/main.c).
 */
#ifndef FPROBE_CTEST_H
#define FPROBE_CTEST_H

#include <stddef.h>
#include <stdint.h>

#include "fprobe.h"

enum { F_FIB, F_EVEN, F_ODD, F_LEAF, NFUNC };

struct ctest_params {
    int threads;
    int fib_n;
    unsigned parity_n;
    unsigned leaf_calls;
};

struct ctest_result {
    uint64_t entries[NFUNC];
    uint64_t exits[NFUNC];
    uint64_t second_probe_entries; /* entry-only probe on fib */
    uint64_t mismatches;           /* pairing violations seen by handlers */
    uint64_t releases;             /* release callbacks run */
    struct fprobe_stats stats_a;   /* entry+exit probe on all four */
    struct fprobe_stats stats_b;   /* entry-only probe on fib */
    size_t addresses;
    /* Status codes of the calls the engine made, and of the bad calls it
     * made on purpose (each must be the documented error). */
    int rc_setup;
    int rc_null_register;
    int rc_unknown_handle;
    int rc_double_unregister;
    int rc_attach_twice;
    int rc_after_destroy;
    int rc_destroy_twice;
    int rc_no_handler;
};

/* Runs the program on p->threads threads with every call of its four
 * functions probed; 0, or the status of the first setup call that failed. */
int ctest_run(const struct ctest_params *p, struct ctest_result *out);

#endif
