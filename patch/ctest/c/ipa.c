/* Built without -fpatchable-function-entry: only the callee has the
 * attribute, so GCC's interprocedural register allocation may keep the
 * caller's values in registers it knows the callee leaves alone (the
 * callee is hidden, so it cannot be interposed). */
__attribute__((noinline, visibility("hidden"), patchable_function_entry(7, 5))) long pt_ipa_leaf(long a) {
    return a * 3 + 1;
}

__attribute__((noinline)) long pt_ipa_caller(long x, long y, long z) {
    long t = x * y, u = y * z, v = x * z;
    long r = pt_ipa_leaf(x);
    return r + t + u + v;
}
