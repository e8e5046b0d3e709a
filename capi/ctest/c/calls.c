/*
 * A small deterministic program compiled with -finstrument-functions, and a
 * C engine that probes it through fprobe.h: every instrumented call goes
 * through the crate's __cyg_profile_func_enter/_exit runtime.
 *
 * The engine counts entries and exits per function and checks the pairing
 * on every exit: the per-call data written at entry (a per-thread sequence
 * number, the function and the call site) must be what the exit handler
 * gets back, and the sequence number must be the top of the thread's own
 * shadow stack.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "fprobe.h"

#define ENGINE __attribute__((no_instrument_function))

/* ------------------------------------------------------------------ the
 * program */

int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

int is_odd(unsigned n);
int is_even(unsigned n) { return n == 0 ? 1 : is_odd(n - 1); }
int is_odd(unsigned n) { return n == 0 ? 0 : is_even(n - 1); }

static volatile unsigned sink;
__attribute__((noinline)) static void leaf(unsigned i) { sink += i; }

/* Instrumented but never probed: dispatch finds no probe here. */
__attribute__((noinline)) int unprobed(int x) { return x + (int)sink; }

/* ------------------------------------------------------------------ the
 * engine */

#include "ctest.h"

static _Atomic uint64_t entries[NFUNC], exits_[NFUNC], second, mismatches, releases;

#define DEPTH 4096
static __thread uint64_t shadow[DEPTH];
static __thread int depth;
static __thread uint64_t seq;

struct call_data {
    uint64_t token, addr, site;
};

ENGINE static int entry_a(void *user, struct fprobe_entry_ctx *c) {
    (void)user;
    atomic_fetch_add_explicit(&entries[c->cookie], 1, memory_order_relaxed);
    if (c->data == NULL || c->data_size != sizeof(struct call_data) || depth == DEPTH) {
        atomic_fetch_add(&mismatches, 1);
        return FPROBE_SKIP_EXIT;
    }
    struct call_data d = {++seq, c->addr, c->ret_addr};
    shadow[depth++] = d.token;
    memcpy(c->data, &d, sizeof d);
    return 0;
}

ENGINE static void exit_a(void *user, const struct fprobe_exit_ctx *c) {
    (void)user;
    atomic_fetch_add_explicit(&exits_[c->cookie], 1, memory_order_relaxed);
    struct call_data d;
    memcpy(&d, c->data, sizeof d);
    if (c->data_size != sizeof d || depth == 0 || shadow[--depth] != d.token ||
        d.addr != c->addr || d.site != c->ret_addr)
        atomic_fetch_add(&mismatches, 1);
}

ENGINE static int entry_b(void *user, struct fprobe_entry_ctx *c) {
    (void)user;
    (void)c;
    atomic_fetch_add_explicit(&second, 1, memory_order_relaxed);
    return 0;
}

ENGINE static void release(void *user) {
    (void)user;
    atomic_fetch_add(&releases, 1);
}

ENGINE static void *worker(void *arg) {
    const struct ctest_params *p = arg;
    unsigned total = (unsigned)fib(p->fib_n);
    total += (unsigned)is_even(p->parity_n);
    for (unsigned i = 0; i < p->leaf_calls; i++) leaf(i);
    total += (unsigned)unprobed(1);
    sink += total;
    return NULL;
}

ENGINE int ctest_run(const struct ctest_params *p, struct ctest_result *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < NFUNC; i++) entries[i] = exits_[i] = 0;
    second = mismatches = releases = 0;

    struct fprobe_config cfg = {0};
    cfg.max_depth = 1024;
    cfg.data_size = sizeof(struct call_data);
    struct fprobe_registry *r = NULL;
    int rc = fprobe_registry_new(&cfg, &r);
    if (rc) return out->rc_setup = rc;

    uint64_t addrs[NFUNC] = {(uint64_t)(uintptr_t)&fib, (uint64_t)(uintptr_t)&is_even,
                             (uint64_t)(uintptr_t)&is_odd, (uint64_t)(uintptr_t)&leaf};
    uint64_t cookies[NFUNC] = {F_FIB, F_EVEN, F_ODD, F_LEAF};
    struct fprobe_probe a = {entry_a, exit_a, release, NULL, sizeof(struct call_data)};
    struct fprobe_probe b = {entry_b, NULL, release, NULL, 0};
    struct fprobe_probe none = {NULL, NULL, release, NULL, 0};
    uint64_t ha = 0, hb = 0, hx = 0;

    out->rc_null_register = fprobe_register(r, NULL, addrs, cookies, NFUNC, &ha);
    out->rc_no_handler = fprobe_register(r, &none, addrs, NULL, NFUNC, &hx);
    if ((rc = fprobe_register(r, &a, addrs, cookies, NFUNC, &ha))) return out->rc_setup = rc;
    if ((rc = fprobe_register(r, &b, addrs, NULL, 1, &hb))) return out->rc_setup = rc;
    out->rc_unknown_handle = fprobe_enable(r, ha ^ (1ull << 20));
    if ((rc = fprobe_registry_addresses(r, &out->addresses))) return out->rc_setup = rc;

    if ((rc = fprobe_cyg_attach(r))) return out->rc_setup = rc;
    out->rc_attach_twice = fprobe_cyg_attach(r);

    pthread_t t[64];
    int n = p->threads < 64 ? p->threads : 64;
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, worker, (void *)p);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);

    if ((rc = fprobe_cyg_detach())) return out->rc_setup = rc;
    if ((rc = fprobe_probe_stats(r, ha, &out->stats_a))) return out->rc_setup = rc;
    if ((rc = fprobe_probe_stats(r, hb, &out->stats_b))) return out->rc_setup = rc;
    if ((rc = fprobe_unregister(r, ha))) return out->rc_setup = rc;
    out->rc_double_unregister = fprobe_unregister(r, ha);
    /* hb stays registered: destroy releases it. */
    if ((rc = fprobe_registry_destroy(r))) return out->rc_setup = rc;
    out->rc_after_destroy = fprobe_enable(r, hb);
    out->rc_destroy_twice = fprobe_registry_destroy(r);
    if ((rc = fprobe_barrier())) return out->rc_setup = rc;

    for (int i = 0; i < NFUNC; i++) {
        out->entries[i] = entries[i];
        out->exits[i] = exits_[i];
    }
    out->second_probe_entries = second;
    out->mismatches = mismatches;
    out->releases = releases;
    return 0;
}
