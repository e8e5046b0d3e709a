#!/usr/bin/env bash
# ThreadSanitizer on the concurrency tests (rcu, index, objpool, retinst,
# probe, hit_cache; short FPROBE_STRESS_MS), then the canary: a deliberate data race
# (tests/canary.rs) that TSan must report.
#
# Built with `--cfg fprobe_tsan`: TSan ignores standalone fences and cannot
# see membarrier(2), so under that cfg the RCU runs its symmetric mode with
# each fence replaced by a SeqCst read-modify-write TSan tracks (src/sync.rs,
# src/rcu/raw.rs). Installs nightly + rust-src itself; if that fails it prints
# SKIPPED and the reason, and exits 0.
set -u
cd "$(dirname "$0")/.."
. scripts/sanitizer-common.sh
san_setup tsan "-Zsanitizer=thread --cfg fprobe_tsan" 16
# halt_on_error: the first report fails the test binary.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
status=0
echo "== tsan: building std and the tests with -Zsanitizer=thread"
san_build tsan san_cargo --no-run --test rcu --test index --test objpool --test retinst --test probe --test hit_cache --test canary
# fork(2) from a multi-threaded process is outside what TSan supports (it
# may hang or report in the child), so the fork test is skipped here.
for t in rcu index objpool retinst probe hit_cache; do
  echo "== tsan: --test $t (FPROBE_STRESS_MS=$FPROBE_STRESS_MS)"
  skip=()
  [ "$t" = rcu ] && skip=(--skip fork_child_can_synchronize)
  [ "$t" = hit_cache ] && skip=(--skip cached_index_works_in_a_forked_child)
  [ "$t" = probe ] && skip=(--skip fork_child_does_not_wait_for_exits)
  san_cargo --test "$t" -- "${skip[@]}" || status=1
done
# The patching runtime while threads run patched code (fork skipped as
# above; its code writes are outside TSan's view, the registry and the
# runtime's own state are not).
echo "== tsan: patching runtime (fprobe-patch-ctest)"
san_cargo -p fprobe-patch-ctest --test patch --test lean --test everywhere --test signals -- --skip a_forked_child || status=1
san_canary tsan "ThreadSanitizer: data race" \
  san_cargo --test canary -- --ignored --exact canary_relaxed_publication || status=1
exit $status
