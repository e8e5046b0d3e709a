/* A shared object of its own (libpt_dl.so), loaded, patched and unloaded
 * by the tests. */
__attribute__((noinline)) int pt_dl_mul(int a, int b) { return a * b; }
