#!/usr/bin/env bash
# Per-lookup instructions, simulated L1 data misses and simulated branch
# mispredicts of fprobe's `get` and of an unsynchronised hashbrown map, on the
# same 50,000 addresses and streams (benches/lookup_counts.rs), under
# cachegrind. Deterministic: unlike timings on a shared machine, these
# counts do not move between runs. Each figure is (run with lookups − run
# without) ÷ lookups. Needs valgrind.
set -eu
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "cachegrind-lookup: SKIPPED (valgrind not installed)"; exit 0; }
bin=$(scripts/bench-executable.sh lookup_counts 2>/dev/null) ||
  { echo "cachegrind-lookup: building benches/lookup_counts.rs failed (scripts/bench-executable.sh lookup_counts says why)" >&2; exit 1; }
lookups=2000000
counts() { # counts ARGS... -> "instructions d1_misses mispredicts"
  valgrind --tool=cachegrind --cache-sim=yes --branch-sim=yes --cachegrind-out-file=/dev/null \
    "$bin" "$@" 2>&1 | awk '
      /I *refs:/ {gsub(",","",$4); i=$4}
      /D1  misses:/ {gsub(",","",$4); d=$4}
      /Mispredicts:/ {gsub(",","",$3); m=$3}
      END {print i, d, m}'
}
printf '| workload | implementation | instructions | L1d misses | branch mispredicts |\n|---|---|---:|---:|---:|\n'
for work in hot uniform; do
  for imp in fprobe hashbrown; do
    read -r i1 d1 m1 <<<"$(counts "$imp" "$work" "$lookups")"
    read -r i0 d0 m0 <<<"$(counts "$imp" "$work" "$lookups" skip)"
    awk -v w="$work" -v p="$imp" -v n="$lookups" -v i="$((i1 - i0))" -v d="$((d1 - d0))" -v m="$((m1 - m0))" \
      'BEGIN {printf "| %s | %s | %.1f | %.3f | %.3f |\n", w, p, i / n, d / n, m / n}'
  done
done
