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
for target in $(cd fuzz && cargo fuzz list 2>/dev/null); do
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
exit $status
