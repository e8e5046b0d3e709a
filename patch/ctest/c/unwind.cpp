// C++ built with -O2 -fpatchable-function-entry=7,5 (build.rs): exceptions,
// forced unwinds and backtraces crossing functions that the tests attach
// with exit probes (tests/unwind.rs).

#include <atomic>
#include <execinfo.h>
#include <pthread.h>
#include <sched.h>
#include <stdexcept>

// pu_exit_deep and pu_cancel_deep never return: by design.
#pragma GCC diagnostic ignored "-Winfinite-recursion"

#define T extern "C" __attribute__((noipa))
// No patchable entry: a function with no probe at all.
#define NOPATCH extern "C" __attribute__((noipa, patchable_function_entry(0, 0)))
// Keeps a call from being a tail call.
#define AFTER_CALL() __asm__ volatile("" ::: "memory")

static std::atomic<long> dtors{0};
static std::atomic<int> ready{0};

T long pu_leaf(long x) { return x + 1; }

T long pu_dtors(void) { return dtors.load(); }

// Run by every unwind that leaves a frame holding one: a probed call
// made while the unwind is under way.
struct Guard {
    ~Guard() {
        dtors.fetch_add(1);
        pu_leaf(1);
    }
};

// `n` probed frames and then a throw: a std::runtime_error (kind 0) or an
// int (kind 1, of value 100 + n at the bottom).
T long pu_throw_deep(int n, int kind) {
    Guard g;
    if (n <= 0) {
        if (kind == 0) throw std::runtime_error("deep");
        throw 100 + n;
    }
    long r = pu_throw_deep(n - 1, kind);
    AFTER_CALL();
    return r + 1;
}

T int pu_catch_deep(int n) {
    try {
        pu_throw_deep(n, 0);
    } catch (const std::runtime_error &) {
        return 1;
    }
    return 0;
}

// Rethrows, from a catch block of a probed frame, what `n + 1` frames threw.
T void pu_rethrow(int n) {
    try {
        pu_throw_deep(n, 0);
    } catch (const std::exception &) {
        pu_leaf(2);
        throw;
    }
}

T int pu_catch_rethrow(int n) {
    try {
        pu_rethrow(n);
    } catch (const std::runtime_error &) {
        return 1;
    }
    return 0;
}

// Nested try blocks: an inner handler that does not match and an outer one
// that does; inside it, another throw caught at once, and a throw from a
// catch block caught one level out. Returns 111.
T int pu_nested(int n) {
    int r = 0;
    try {
        try {
            pu_throw_deep(n, 1);
        } catch (const std::exception &) {
            r += 1000;
        }
    } catch (int v) {
        r += v;
        try {
            pu_leaf(0);
            pu_throw_deep(n, 0);
        } catch (const std::runtime_error &) {
            r += 1;
        }
        try {
            try {
                pu_throw_deep(1, 1);
            } catch (int) {
                pu_leaf(3);
                throw std::logic_error("again");
            }
        } catch (const std::logic_error &) {
            r += 10;
        }
    }
    return r;
}

T void pu_thrower(int v) { throw v; }

// The thrower's caller with an exit probe.
T int pu_probed_caller(int v) {
    pu_thrower(v);
    AFTER_CALL();
    return 0;
}

// And one with no probe at all.
NOPATCH int pu_unprobed_caller(int v) {
    pu_thrower(v);
    AFTER_CALL();
    return 0;
}

T int pu_catch_thrower(int v, int probed) {
    try {
        return probed ? pu_probed_caller(v) : pu_unprobed_caller(v);
    } catch (int x) {
        return x;
    }
}

// A catcher with no probe: the frames it catches from are ended by the
// thread's next probed call.
NOPATCH int pu_catch_unprobed(int n) {
    try {
        pu_throw_deep(n, 0);
    } catch (const std::runtime_error &) {
        return 1;
    }
    return 0;
}

// No throw: the pairing phase after each scenario.
T long pu_plain(int n) {
    if (n <= 0) return pu_leaf(0);
    long r = pu_plain(n - 1);
    AFTER_CALL();
    return r + 1;
}

// `n` probed frames, then pthread_exit.
T void pu_exit_deep(int n) {
    Guard g;
    if (n <= 0)
        pthread_exit((void *)7);
    else
        pu_exit_deep(n - 1);
    AFTER_CALL();
}

// `n` probed frames, then a wait for cancellation.
T void pu_cancel_deep(int n) {
    Guard g;
    if (n > 0) {
        pu_cancel_deep(n - 1);
        AFTER_CALL();
        return;
    }
    ready.store(1);
    for (;;) {
        pthread_testcancel();
        pu_leaf(0);
        sched_yield();
    }
}

T void *pu_exit_main(void *n) {
    pu_plain(2);
    pu_exit_deep((int)(long)n);
    return nullptr;
}

T void *pu_cancel_main(void *n) {
    pu_plain(2);
    pu_cancel_deep((int)(long)n);
    return nullptr;
}

// Runs a thread that goes `n` probed frames deep and leaves by pthread_exit
// (`cancel` 0) or is cancelled there (1). Returns 7 for an exit, -1 for a
// cancellation, -2 on error.
T long pu_run_thread(int cancel, int n) {
    pthread_t t;
    ready.store(0);
    if (pthread_create(&t, nullptr, cancel ? pu_cancel_main : pu_exit_main, (void *)(long)n) != 0)
        return -2;
    if (cancel) {
        while (!ready.load()) sched_yield();
        pthread_cancel(t);
    }
    void *r = nullptr;
    if (pthread_join(t, &r) != 0) return -2;
    if (r == PTHREAD_CANCELED) return -1;
    return (long)r;
}

// A backtrace from two probed callers deep.
T int pu_bt_leaf(void **out, int max) {
    int n = backtrace(out, max);
    AFTER_CALL();
    return n;
}

T int pu_bt_mid(void **out, int max) {
    int n = pu_bt_leaf(out, max);
    AFTER_CALL();
    return n;
}

T int pu_bt_top(void **out, int max) {
    int n = pu_bt_mid(out, max);
    AFTER_CALL();
    return n;
}
