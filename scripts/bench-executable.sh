#!/usr/bin/env bash
# Builds one bench target of the fprobe crate (benches/NAME.rs) the way
# `cargo bench` does (the `bench` profile, in CARGO_TARGET_DIR if set) and
# prints the absolute path of its executable on stdout; cargo's progress
# and diagnostics go to stderr.
#
#   scripts/bench-executable.sh NAME
#
# Used by scripts/instructions.sh and scripts/cachegrind-lookup.sh, which
# run the executable under valgrind themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { echo "usage: scripts/bench-executable.sh NAME" >&2; exit 2; }
name=$1
# One JSON object per line on stdout; the bench target's artifact is the
# line naming it with kind "bench", and its "executable" field the path.
bin=$(cargo bench --bench "$name" --no-run --message-format=json-render-diagnostics |
  grep '"reason":"compiler-artifact"' |
  grep '"kind":\["bench"\]' |
  grep "\"name\":\"$name\"" |
  sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' |
  tail -n 1)
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "bench-executable: cargo named no executable for bench target $name" >&2
  exit 1
fi
echo "$bin"
