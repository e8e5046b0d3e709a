/* A shared object of its own (libpt_dl.so, and a stripped copy), loaded,
 * patched and unloaded by the tests. `twice` has no symbol once stripped:
 * its site must not be taken for the next function's. */
__attribute__((noinline)) static int twice(int a) { return a + a; }

__attribute__((noinline)) int pt_dl_mul(int a, int b) { return a * b + twice(0); }

__attribute__((noinline)) int pt_dl_twice(int a) { return twice(a); }
