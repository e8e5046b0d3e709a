#!/usr/bin/env bash
# Instructions per hot-path operation under callgrind, against the committed
# baseline bench/instructions.baseline: fails when a mode costs more than 5%
# above its baseline.
#
#   scripts/instructions.sh            # measure, print a Markdown table, gate
#   scripts/instructions.sh --update   # measure and rewrite the baseline
#
# Each mode of benches/instructions.rs runs one million operations after
# its set-up; the `none` mode runs the set-up alone, and (mode − none) /
# 1,000,000 is one operation's instructions. Callgrind counts are
# deterministic: each run is made in a fixed, empty environment (the
# environment's size changes what the program's start-up executes), and the
# driver fixes its hash seeds (see its docs), so two runs of one build print
# the same numbers (whole runs differ by at most a few instructions: std's
# start-up parses /proc/self/maps). A mode missing from the baseline is
# reported, not failed. Without valgrind (and no way to install it) the
# script prints SKIPPED and exits 0. About 15 s after the build on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

modes=(rcu lookup-hit lookup-miss kprobe kretprobe kprobe-hitcache hitcache-hit hitcache-inline objpool)
ops=1000000
threshold=5 # percent above the baseline that fails
baseline=bench/instructions.baseline

update=0
case "${1:-}" in
  "") ;;
  --update) update=1 ;;
  -h | --help)
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "usage: scripts/instructions.sh [--update]" >&2
    exit 2
    ;;
esac

if ! command -v valgrind >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "instructions: valgrind not found; installing it with apt-get"
  { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq valgrind; } >/dev/null 2>&1 || true
fi
if ! command -v valgrind >/dev/null; then
  echo "instructions: SKIPPED (valgrind not available)"
  exit 0
fi
valgrind=$(command -v valgrind)

# Built as `cargo bench` builds it: the `bench` profile, which inherits
# `release` (the Cargo.toml sets `debug = 1` in both).
bin=$(scripts/bench-executable.sh instructions)

log=$(mktemp)
trap 'rm -f "$log"' EXIT

irefs() { # irefs MODE -> the run's total instruction count
  # A fixed environment: nothing of the caller's (VALGRIND_OPTS, the
  # environment's size) reaches the measured process.
  if ! env -i PATH=/usr/bin:/bin timeout 120 "$valgrind" --tool=callgrind \
    --callgrind-out-file=/dev/null "$bin" "$1" >"$log" 2>&1; then
    echo "instructions: mode $1 failed:" >&2
    tail -20 "$log" >&2
    exit 1
  fi
  awk '/I +refs:/ { gsub(",", "", $NF); n = $NF } END { if (n == "") exit 1; print n }' "$log" ||
    { echo "instructions: no 'I refs' line for mode $1" >&2; exit 1; }
}

none=$(irefs none)
declare -A now
for m in "${modes[@]}"; do
  total=$(irefs "$m")
  now[$m]=$(awk -v t="$total" -v z="$none" -v n="$ops" 'BEGIN { printf "%.1f", (t - z) / n }')
done

declare -A base
if [ -f "$baseline" ]; then
  while read -r m n _; do
    case "$m" in "" | "#"*) continue ;; esac
    base[$m]=$n
  done <"$baseline"
fi

echo
echo "| mode | baseline | now | change |"
echo "|---|---:|---:|---:|"
failed=() gained=()
for m in "${modes[@]}"; do
  b=${base[$m]:-}
  if [ -z "$b" ]; then
    echo "| $m | (none) | ${now[$m]} | not in the baseline |"
    continue
  fi
  read -r change over < <(awk -v b="$b" -v c="${now[$m]}" -v t="$threshold" 'BEGIN {
    d = b > 0 ? (c - b) / b * 100 : 0
    printf "%+.1f%% %d\n", d, (b > 0 && c > b * (1 + t / 100)) || (b <= 0 && c > b) }')
  echo "| $m | $b | ${now[$m]} | $change |"
  [ "$over" = 1 ] && failed+=("$m")
  awk -v b="$b" -v c="${now[$m]}" -v t="$threshold" 'BEGIN { exit !(c < b * (1 - t / 100)) }' && gained+=("$m")
done
echo
echo "Instructions per operation: (mode − none) / $ops; set-up (\`none\`): $(awk -v z="$none" 'BEGIN { printf "%.1f", z / 1e6 }') M instructions."

if [ "$update" = 1 ]; then
  {
    echo "# Instructions per operation of each benches/instructions.rs mode under"
    echo "# callgrind: (mode − none) / $ops, in a fixed environment."
    echo "# Made by scripts/instructions.sh --update, which rewrites this file;"
    echo "# scripts/instructions.sh (a required .ci/run step) fails when a mode"
    echo "# costs more than $threshold% above the figure here."
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(rustc --version); $("$valgrind" --version)"
    for m in "${modes[@]}"; do
      echo "$m ${now[$m]}"
    done
  } >"$baseline"
  echo "instructions: wrote $baseline"
  exit 0
fi

if [ "${#failed[@]}" -gt 0 ]; then
  echo "instructions: FAILED: more than $threshold% above $baseline: ${failed[*]}" >&2
  echo "(if the rise is intended, rerun with --update and commit the baseline)" >&2
  exit 1
fi
if [ "${#gained[@]}" -gt 0 ]; then
  echo "instructions: more than $threshold% below $baseline: ${gained[*]} (rerun with --update to keep the gain)"
fi
echo "instructions: no mode more than $threshold% above $baseline"
