#!/usr/bin/env bash
# AddressSanitizer (with LeakSanitizer) on the concurrency tests (rcu,
# index, objpool, retinst, probe, the allocation tests, the fuzz corpus
# replay and the patching runtime's; short FPROBE_STRESS_MS), then the canary: a deliberate
# use-after-free (tests/canary.rs) that ASan must report. Installs nightly +
# rust-src itself; if that fails it prints SKIPPED and the reason, and exits 0.
set -u
cd "$(dirname "$0")/.."
. scripts/sanitizer-common.sh
san_setup asan "-Zsanitizer=address" 32
export ASAN_OPTIONS="detect_stack_use_after_return=1 ${ASAN_OPTIONS:-}"
tests=(rcu index objpool retinst probe retinst_alloc probe_alloc hit_cache fuzz_replay)
status=0
args=(); for t in "${tests[@]}"; do args+=(--test "$t"); done
echo "== asan: building std and the tests with -Zsanitizer=address"
san_build asan san_cargo --no-run "${args[@]}" --test canary
for t in "${tests[@]}"; do
  echo "== asan: --test $t (FPROBE_STRESS_MS=$FPROBE_STRESS_MS)"
  san_cargo --test "$t" || status=1
done
# The patching runtime: trampolines, shadow-stack frames, patched C code under
# threads, signals, longjmp, fork, and C++ exceptions, forced unwinds and
# backtraces.
echo "== asan: patching runtime (fprobe-patch-ctest)"
san_cargo -p fprobe-patch-ctest --test patch --test lean --test everywhere --test signals --test capi --test unwind || status=1
san_canary asan "AddressSanitizer: heap-use-after-free" \
  san_cargo --test canary -- --ignored --exact canary_free_without_grace_period || status=1
exit $status
