#!/usr/bin/env bash
# loom model checks of the RCU grace-period protocol, the index's slot
# migration, the hit cache's never-stale protocol and the objpool, bounded.
# Then the canary: the same models built with `--cfg fprobe_canary` (the
# RCU read-side fences removed, the hit cache's sequence loaded after the
# index lookup, the object pool's magazine handshake without its fences)
# must FAIL, proving loom still catches a broken protocol.
#
# Usage: scripts/loom.sh            -> exit 0 when models pass and canary fails
set -u
cd "$(dirname "$0")/.."
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
status=0
echo "== loom: models (LOOM_MAX_PREEMPTIONS=$LOOM_MAX_PREEMPTIONS)"
if RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
    timeout 1200 cargo test -p fprobe --release --lib loom -- --test-threads=1 &&
   RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
    timeout 1200 cargo test -p fprobe --release --test loom_objpool -- --test-threads=1; then
  echo "loom models: PASSED"
else
  echo "loom models: FAILED"; status=1
fi
echo "== loom: canary (must fail)"
if RUSTFLAGS="--cfg loom --cfg fprobe_canary" CARGO_TARGET_DIR=target/loom-canary \
    timeout 1200 cargo test -p fprobe --release --lib loom -- --test-threads=1 >target/loom-canary.log 2>&1; then
  echo "loom canary: NOT CAUGHT (the checker is blind)"; status=1
else
  if grep -q "reader saw a reclaimed object\|new reader saw the old object\|panicked" target/loom-canary.log; then
    echo "loom canary: caught as expected"
    grep -m3 "panicked" target/loom-canary.log || true
  else
    echo "loom canary: build or run failed for another reason:"; tail -20 target/loom-canary.log; status=1
  fi
fi
echo "== loom: objpool canary (must fail)"
if RUSTFLAGS="--cfg loom --cfg fprobe_canary" CARGO_TARGET_DIR=target/loom-canary \
    timeout 1200 cargo test -p fprobe --release --test loom_objpool -- --test-threads=1 >target/loom-canary-objpool.log 2>&1; then
  echo "loom objpool canary: NOT CAUGHT (the checker is blind)"; status=1
else
  if grep -q "panicked" target/loom-canary-objpool.log; then
    echo "loom objpool canary: caught as expected"
    grep -m3 "panicked" target/loom-canary-objpool.log || true
  else
    echo "loom objpool canary: build or run failed for another reason:"; tail -20 target/loom-canary-objpool.log; status=1
  fi
fi
exit $status
