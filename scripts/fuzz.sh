#!/usr/bin/env bash
# Bounded cargo-fuzz run of every target in fuzz/ (FUZZ_SECS each, default
# 60). Installs cargo-fuzz itself; uses nightly (sanitizer builds) when it is
# there, else stable with `-s none`. If an install fails it prints SKIPPED
# and the reason, and exits 0. A crash fails the step; the input is left in
# fuzz/artifacts/<target>/.
set -u
cd "$(dirname "$0")/.."
secs="${FUZZ_SECS:-60}"
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  if ! cargo install cargo-fuzz --locked >/tmp/cargo-fuzz-install.log 2>&1; then
    echo "fuzz: SKIPPED (cargo-fuzz install failed: $(tail -1 /tmp/cargo-fuzz-install.log))"
    exit 0
  fi
fi
if cargo +nightly --version >/dev/null 2>&1; then
  tc="+nightly"; san=()
else
  tc=""; san=(-s none)
fi
status=0
targets=$(cd fuzz && cargo fuzz list 2>/dev/null)
for t in index_ops index_concurrent objpool_ops probe_ops probe_returns; do
  echo "$targets" | grep -qx "$t" || { echo "fuzz: target $t missing from fuzz/Cargo.toml"; status=1; }
done
for target in $targets; do
  mkdir -p "fuzz/corpus/$target"
  echo "== fuzz: $target for ${secs}s"
  # shellcheck disable=SC2086
  cargo $tc fuzz run "${san[@]}" "$target" -- -max_total_time="$secs" -rss_limit_mb=4096 \
    >"/tmp/fuzz-$target.log" 2>&1
  rc=$?
  grep -E "^#[0-9]+ +DONE|cov:|ERROR|panicked|Test unit written" "/tmp/fuzz-$target.log" | tail -4
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: $target FAILED (exit $rc)"; tail -30 "/tmp/fuzz-$target.log"; status=1
  fi
done
# Canary: the library built with `--cfg fprobe_fuzz_canary` (AddrIndex::remove
# keeps every fifth id while claiming success) must make index_ops crash
# within FUZZ_CANARY_SECS, from its committed corpus.
canary_dir="${CARGO_TARGET_DIR:-$PWD/target}/fuzz-canary"
mkdir -p "$canary_dir/corpus" "$canary_dir/artifacts"
echo "== fuzz: canary (index_ops on a deliberately broken library, must crash)"
# shellcheck disable=SC2086
RUSTFLAGS="${RUSTFLAGS:-} --cfg fprobe_fuzz_canary" CARGO_TARGET_DIR="$canary_dir/target" \
  cargo $tc fuzz run "${san[@]}" index_ops "$canary_dir/corpus" fuzz/corpus/index_ops -- \
  -max_total_time="${FUZZ_CANARY_SECS:-60}" -artifact_prefix="$canary_dir/artifacts/" \
  >"$canary_dir/log" 2>&1
rc=$?
if [ "$rc" -eq 0 ]; then
  echo "fuzz canary: NOT CAUGHT (the fuzz target's checks are blind)"; status=1
elif grep -q "panicked at" "$canary_dir/log"; then
  echo "fuzz canary: canary caught"; grep -m1 -A1 "panicked at" "$canary_dir/log"
else
  echo "fuzz canary: failed for another reason (exit $rc):"; tail -20 "$canary_dir/log"; status=1
fi
exit $status
