/* Functions the patching runtime's tests attach to. Built with
 * -fpatchable-function-entry=7,5 (build.rs); `noinline` keeps every call
 * a real call at -O2. */
#include <setjmp.h>
#include <stdarg.h>

#define T __attribute__((noinline))

T int pt_add(int a, int b) { return a + b; }

/* Calls back: a call that stays open as long as the callback runs. */
T long pt_call(long (*f)(long), long x) { return f(x) + 1; }
T double pt_fcall(double (*f)(double), double x) { return f(x) * 2.0; }

T double pt_fadd(double a, double b) { return a + b; }

T long pt_sum6(long a, long b, long c, long d, long e, long f) {
    return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f;
}

struct pt_pair { long lo, hi; };

T struct pt_pair pt_pair(long a) {
    struct pt_pair p = { a + 1, a * 2 };
    return p;
}

T double pt_mix(int n, double x, long m, double y) { return n * x + m * y; }

/* Variadic: `al` carries the number of vector registers used. */
T double pt_va(int n, ...) {
    va_list ap;
    double s = 0;
    va_start(ap, n);
    for (int i = 0; i < n; i++) s += va_arg(ap, double);
    va_end(ap);
    return s;
}

/* Counts its own calls; kept from turning its second call into a loop
 * (tail recursion with an accumulator), so each count is a real call. */
long pt_fib_calls;

__attribute__((optimize("no-optimize-sibling-calls"))) T long pt_fib(int n) {
    pt_fib_calls++;
    return n < 2 ? n : pt_fib(n - 1) + pt_fib(n - 2);
}

/* n adds; the loop the threads of the stress test run. */
T long pt_loop(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += pt_add((int)i, 1);
    return s;
}

/* Depth `n` of hooked frames, then a longjmp over all of them. */
T void pt_deep(int n, jmp_buf *env) {
    if (!env) return;
    if (n <= 0) longjmp(*env, 7);
    pt_deep(n - 1, env);
    __asm__ volatile("" ::: "memory"); /* not a tail call */
}

T int pt_jumper(int n) {
    jmp_buf env;
    int r = setjmp(env);
    if (r == 0) pt_deep(n, &env);
    return r;
}

/* Another layout, refused by the runtime. */
__attribute__((patchable_function_entry(3, 1))) T int pt_other_layout(int a) { return a * 5; }

/* A hidden leaf (it binds locally, as a static function would) and a
 * caller with values live across the call, built like the rest of this
 * file with -fpatchable-function-entry on the command line: GCC then
 * allocates no registers across functions, so the caller keeps nothing in
 * caller-saved registers across the call (what an argument-only save of
 * every function relies on; c/ipa.c is the attribute-only counterpart). */
__attribute__((noinline, visibility("hidden"))) long pt_cmd_leaf(long a) { return a * 3 + 1; }

T long pt_cmd_caller(long x, long y, long z) {
    long t = x * y, u = y * z, v = x * z;
    long r = pt_cmd_leaf(x);
    return r + t + u + v;
}
