#!/usr/bin/env bash
# AddressSanitizer (with LeakSanitizer) on the concurrency tests (rcu,
# index, objpool, retinst, probe, the allocation tests, the fuzz corpus
# replay and the patching runtime's; short FPROBE_STRESS_MS), then the canary: a deliberate
# use-after-free (tests/canary.rs) that ASan must report. Installs nightly +
# rust-src itself; if that fails it prints SKIPPED and the reason, and exits 0.
set -u
cd "$(dirname "$0")/.."
. scripts/sanitizer-common.sh
san_need_nightly asan
export RUSTFLAGS="-Zsanitizer=address"
export RUSTDOCFLAGS="$RUSTFLAGS"
export CARGO_TARGET_DIR="$san_dir"
export ASAN_OPTIONS="detect_stack_use_after_return=1 ${ASAN_OPTIONS:-}"
export FPROBE_STRESS_MS="${FPROBE_STRESS_MS:-1000}" PROPTEST_CASES="${PROPTEST_CASES:-32}"
tests=(rcu index objpool retinst probe retinst_alloc probe_alloc hit_cache fuzz_replay)
cargo_asan() { cargo +nightly test -Zbuild-std --target "$san_target" "$@"; }
status=0
args=(); for t in "${tests[@]}"; do args+=(--test "$t"); done
echo "== asan: building std and the tests with -Zsanitizer=address"
san_build asan cargo_asan --no-run "${args[@]}" --test canary
for t in "${tests[@]}"; do
  echo "== asan: --test $t (FPROBE_STRESS_MS=$FPROBE_STRESS_MS)"
  cargo_asan --test "$t" || status=1
done
# The patching runtime: trampolines, shadow-stack frames, patched C code under
# threads, signals, longjmp, fork, and C++ exceptions, forced unwinds and
# backtraces.
echo "== asan: patching runtime (fprobe-patch-ctest)"
cargo_asan -p fprobe-patch-ctest --test patch --test lean --test everywhere --test signals --test capi --test unwind || status=1
san_canary asan "AddressSanitizer: heap-use-after-free" \
  cargo_asan --test canary -- --ignored --exact canary_free_without_grace_period || status=1
exit $status
